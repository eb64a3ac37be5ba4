//! Qwen3-MoE (HF `qwen3_moe`; GGUF `qwen3moe`): llama attention with
//! per-head q/k RMS norms (eps 1e-6), SwiGLU experts behind a softmax →
//! top-k router renormalised iff `norm_topk_prob`; `mlp_only_layers` and
//! `decoder_sparse_step` make some layers dense.
//! Reference: HF `modeling_qwen3_moe.py` of transformers 5.24.0.

use super::FamilyDef;
use crate::spec::gguf::{routed_experts, slide_all, softmax_router, Common, Meta};
use crate::spec::hf::{llama_like, set_moe_layers, Biases, Cfg, LlamaLike, QkNorm, Sliding};
use crate::spec::SpecError;
use turbospark_core::arch::{ArchSpec, MoeSpec, RopeKind, RouterKind};

pub const FAMILY: FamilyDef = FamilyDef {
    id: "qwen3_moe",
    name: "qwen3moe",
    hf_model_types: &["qwen3_moe"],
    gguf_architectures: &["qwen3moe"],
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

const QWEN3_MOE: LlamaLike = LlamaLike {
    default_eps: 1e-6,
    biases: Biases::AttentionBias,
    qk_norm: QkNorm::Always,
    tied_default: false,
    default_theta: 10000.0,
    sliding: Sliding::QwenMaxWindowLayers,
};

fn from_hf(c: &Cfg) -> Result<ArchSpec, SpecError> {
    let mut spec = llama_like(c, &QWEN3_MOE)?;
    let moe = MoeSpec {
        // transformers 5.x writes `num_local_experts`; released configs `num_experts`.
        num_experts: match c.opt_usize("num_experts")? {
            Some(n) => n,
            None => c.usize_or("num_local_experts", 128)?,
        },
        top_k: c.usize_or("num_experts_per_tok", 8)?,
        expert_intermediate: c.usize_or("moe_intermediate_size", 768)?,
        router: RouterKind::SoftmaxTopK {
            renormalize: c.bool_or("norm_topk_prob", false)?,
        },
        router_bias: false,
        expert_biases: false,
        shared_intermediate: None,
        parallel_dense: false,
        shared_gate: false,
    };
    let mlp_only = c.usize_list("mlp_only_layers")?.unwrap_or_default();
    let step = c.usize_or("decoder_sparse_step", 1)?.max(1);
    let has_experts = moe.num_experts > 0;
    set_moe_layers(&mut spec, |i| {
        !mlp_only.contains(&i) && has_experts && (i + 1) % step == 0
    });
    spec.moe = Some(moe);
    Ok(spec)
}

fn from_gguf(g: &Meta<'_>, c: &Common, spec: &mut ArchSpec) -> Result<(), SpecError> {
    routed_experts(g, c, spec, softmax_router)?;
    slide_all(spec, c.window);
    Ok(())
}
