//! Llama (HF `llama` and `mistral`; GGUF `llama`): SmolLM2, TinyLlama,
//! Mistral. Pre-norm RMS decoder, GQA, neox rope in HF layout, SwiGLU,
//! optional tied head — the plain row every llama-like family starts from.
//! Reference: HF `modeling_llama.py` of transformers 5.24.0.

use super::FamilyDef;
use crate::spec::gguf::{slide_all, Common, Meta};
use crate::spec::hf::{llama_like, Biases, Cfg, LlamaLike, QkNorm, Sliding};
use crate::spec::SpecError;
use turbospark_core::arch::{ArchSpec, RopeKind};

pub const FAMILY: FamilyDef = FamilyDef {
    id: "llama",
    name: "llama",
    hf_model_types: &["llama", "mistral"],
    gguf_architectures: &["llama"],
    gguf_experts_of: None,
    gguf_renames: &[],
    // Llama 2, Llama 3 and ChatML checkpoints disagree.
    default_chat_template: None,
    // llama.cpp's converter permutes llama q/k rows for interleaved rope.
    gguf_rope: RopeKind::Interleaved,
    sandwich_norms: false,
    extra_layers_are_mtp: false,
    hf_layer_names: super::no_hf_layer_names,
    from_hf,
    from_gguf,
};

const LLAMA: LlamaLike = LlamaLike {
    default_eps: 1e-5,
    biases: Biases::AttentionBias,
    qk_norm: QkNorm::None,
    tied_default: false,
    default_theta: 10000.0,
    sliding: Sliding::None,
};

fn from_hf(c: &Cfg) -> Result<ArchSpec, SpecError> {
    llama_like(c, &LLAMA)
}

fn from_gguf(_: &Meta<'_>, c: &Common, spec: &mut ArchSpec) -> Result<(), SpecError> {
    slide_all(spec, c.window);
    Ok(())
}
