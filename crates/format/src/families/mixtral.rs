//! Mixtral (HF `mixtral`; llama.cpp writes it as GGUF `llama` with
//! experts): llama attention, every layer a MoE of SwiGLU experts (w1 =
//! gate, w3 = up, w2 = down) behind a softmax → top-k → renormalise router,
//! rope theta 1e6, an optional sliding window on every layer.
//! Reference: HF `modeling_mixtral.py` of transformers 5.24.0.

use super::FamilyDef;
use crate::spec::gguf::{routed_experts, slide_all, softmax_router, Common, Meta};
use crate::spec::hf::{llama_like, set_moe_layers, Biases, Cfg, LlamaLike, QkNorm, Sliding};
use crate::spec::SpecError;
use turbospark_core::arch::{ArchSpec, MoeSpec, RopeKind, RouterKind};

pub const FAMILY: FamilyDef = FamilyDef {
    id: "mixtral",
    name: "mixtral",
    hf_model_types: &["mixtral"],
    gguf_architectures: &[],
    gguf_experts_of: Some("llama"),
    gguf_renames: &[],
    default_chat_template: Some("mistral"),
    // Written as llama, with llama's permuted q/k rows.
    gguf_rope: RopeKind::Interleaved,
    sandwich_norms: false,
    extra_layers_are_mtp: false,
    hf_layer_names: super::no_hf_layer_names,
    from_hf,
    from_gguf,
};

const MIXTRAL: LlamaLike = LlamaLike {
    default_eps: 1e-5,
    biases: Biases::AttentionBias,
    qk_norm: QkNorm::None,
    tied_default: false,
    default_theta: 1e6,
    sliding: Sliding::AllWhenWindowSet,
};

fn from_hf(c: &Cfg) -> Result<ArchSpec, SpecError> {
    let mut spec = llama_like(c, &MIXTRAL)?;
    spec.moe = Some(MoeSpec {
        num_experts: c.usize_or("num_local_experts", 8)?,
        top_k: c.usize_or("num_experts_per_tok", 2)?,
        expert_intermediate: spec.intermediate_size,
        router: RouterKind::SoftmaxTopK { renormalize: true },
        router_bias: false,
        expert_biases: false,
        shared_intermediate: None,
        parallel_dense: false,
        shared_gate: false,
    });
    set_moe_layers(&mut spec, |_| true);
    Ok(spec)
}

fn from_gguf(g: &Meta<'_>, c: &Common, spec: &mut ArchSpec) -> Result<(), SpecError> {
    routed_experts(g, c, spec, softmax_router)?;
    slide_all(spec, c.window);
    Ok(())
}
