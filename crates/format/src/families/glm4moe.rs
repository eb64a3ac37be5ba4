//! GLM-4.5/4.6/4.7 MoE (HF `glm4_moe`; GGUF `glm4moe`): DeepSeek-V3's
//! sigmoid router (group-limited top-k on `sigmoid + e_score_correction_bias`,
//! weights the chosen sigmoids, renormalised iff `norm_topk_prob`, ×
//! `routed_scaling_factor`) on GQA attention with q/k/v biases and optional
//! q/k norms; shared experts always added; the first
//! `first_k_dense_replace` layers dense. Checkpoints carry
//! multi-token-prediction layers past the decoder stack, which inference
//! skips. Reference: HF `modeling_glm4_moe.py` of transformers 5.24.0.

use super::FamilyDef;
use crate::spec::gguf::{routed_experts, slide_all, Common, Meta};
use crate::spec::hf::{
    llama_like, set_deepseek_moe, Biases, Cfg, DeepseekMoeDefaults, LlamaLike, QkNorm, Sliding,
};
use crate::spec::SpecError;
use turbospark_core::arch::{ArchSpec, RopeKind, RouterKind};

pub const FAMILY: FamilyDef = FamilyDef {
    id: "glm4_moe",
    name: "glm4_moe",
    hf_model_types: &["glm4_moe"],
    gguf_architectures: &["glm4moe"],
    gguf_experts_of: None,
    // llama.cpp's glm4moe, like its gpt-oss, names the pre-FFN norm
    // ATTN_POST_NORM.
    gguf_renames: &[("ffn_norm.weight", "post_attention_norm.weight")],
    default_chat_template: Some("glm4"),
    gguf_rope: RopeKind::Neox,
    sandwich_norms: false,
    extra_layers_are_mtp: true,
    hf_layer_names: super::no_hf_layer_names,
    from_hf,
    from_gguf,
};

const GLM4_MOE: LlamaLike = LlamaLike {
    default_eps: 1e-5,
    biases: Biases::QkvByAttentionBias,
    qk_norm: QkNorm::ByConfig,
    tied_default: false,
    default_theta: 10000.0,
    sliding: Sliding::None,
};

fn from_hf(c: &Cfg) -> Result<ArchSpec, SpecError> {
    let mut spec = llama_like(c, &GLM4_MOE)?;
    set_deepseek_moe(
        c,
        &mut spec,
        DeepseekMoeDefaults {
            moe_intermediate: 1408,
            routed_experts: 128,
            n_group: 1,
            topk_group: 1,
            scaling: 1.0,
            first_dense: 1,
        },
    )?;
    Ok(spec)
}

fn from_gguf(g: &Meta<'_>, c: &Common, spec: &mut ArchSpec) -> Result<(), SpecError> {
    routed_experts(g, c, spec, |g| RouterKind::SigmoidGrouped {
        n_group: g.opt("expert_group_count").unwrap_or(1).max(1),
        topk_group: g.opt("expert_group_used_count").unwrap_or(1).max(1),
        renormalize: g.b("expert_weights_norm").unwrap_or(true),
        scaling: g.f("expert_weights_scale", 1.0) as f32,
    })?;
    slide_all(spec, c.window);
    Ok(())
}
