//! Qwen2 (HF `qwen2`; GGUF `qwen2`): Qwen2.5. Llama with biases on q/k/v
//! (never o), eps 1e-6, a tied head by default, and Qwen's sliding rule
//! (`use_sliding_window` from `max_window_layers` on).
//! Reference: HF `modeling_qwen2.py` of transformers 5.24.0.

use super::FamilyDef;
use crate::spec::gguf::{slide_all, Common, Meta};
use crate::spec::hf::{llama_like, Biases, Cfg, LlamaLike, QkNorm, Sliding};
use crate::spec::SpecError;
use turbospark_core::arch::{ArchSpec, RopeKind};

pub const FAMILY: FamilyDef = FamilyDef {
    id: "qwen2",
    name: "qwen2",
    hf_model_types: &["qwen2"],
    gguf_architectures: &["qwen2"],
    gguf_experts_of: None,
    gguf_renames: &[],
    default_chat_template: Some("chatml"),
    gguf_rope: RopeKind::Neox,
    sandwich_norms: false,
    extra_layers_are_mtp: false,
    hf_layer_names: super::no_hf_layer_names,
    from_hf,
    from_gguf,
};

const QWEN2: LlamaLike = LlamaLike {
    default_eps: 1e-6,
    biases: Biases::QkvAlways,
    qk_norm: QkNorm::None,
    tied_default: true,
    default_theta: 10000.0,
    sliding: Sliding::QwenMaxWindowLayers,
};

fn from_hf(c: &Cfg) -> Result<ArchSpec, SpecError> {
    llama_like(c, &QWEN2)
}

fn from_gguf(_: &Meta<'_>, c: &Common, spec: &mut ArchSpec) -> Result<(), SpecError> {
    slide_all(spec, c.window);
    Ok(())
}
