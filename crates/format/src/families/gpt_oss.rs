//! gpt-oss (HF `gpt_oss`; GGUF `gpt-oss`).
//! Reference: HF `modeling_gpt_oss.py` of transformers 5.24.0.

use super::FamilyDef;
use crate::convert::hf_names::Target;
use crate::spec::gguf::{routed_experts, Common, Meta};
use crate::spec::hf::{build_layers, dims, rope_spec, Cfg, Dims};
use crate::spec::SpecError;
use turbospark_core::arch::*;

pub const FAMILY: FamilyDef = FamilyDef {
    id: "gpt_oss",
    name: "gpt-oss",
    hf_model_types: &["gpt_oss"],
    gguf_architectures: &["gpt-oss"],
    gguf_experts_of: None,
    // llama.cpp's gpt-oss names the pre-FFN norm ATTN_POST_NORM.
    gguf_renames: &[("ffn_norm.weight", "post_attention_norm.weight")],
    default_chat_template: None,
    gguf_rope: RopeKind::Neox,
    sandwich_norms: false,
    extra_layers_are_mtp: false,
    hf_layer_names,
    from_hf,
    from_gguf,
};

/// The routed experts as HF stores them: MXFP4 `gate_up_proj` (gate and
/// up rows interleaved) and `down_proj` as `_blocks` + `_scales`, and
/// biases stacked over the experts.
fn hf_layer_names(rest: &str, layer: usize) -> Option<Option<Target>> {
    if rest.starts_with("block_sparse_moe.experts.") || rest.starts_with("experts.") {
        // Other families' expert layouts mean nothing here.
        return Some(None);
    }
    let target = match rest.strip_prefix("mlp.experts.")? {
        "gate_up_proj_blocks" => Some(Target::Mxfp4GateUp { layer }),
        "down_proj_blocks" => Some(Target::Mxfp4Down { layer }),
        "gate_up_proj_scales" | "down_proj_scales" => Some(Target::Mxfp4Scales),
        "gate_up_proj_bias" => Some(Target::GateUpBiasInterleaved { layer }),
        "down_proj_bias" => Some(Target::DownBiasStack { layer }),
        _ => None,
    };
    Some(target)
}

/// gpt-oss: biased attention with sinks, YaRN rope, alternating sliding
/// layers, every layer MoE with a biased router (top-k on raw logits, softmax
/// over the k) and biased clamped-SwiGLU experts.
pub(crate) fn from_hf(c: &Cfg) -> Result<ArchSpec, SpecError> {
    let d = dims(c, 131072)?;
    let d = Dims {
        head_dim: c.usize_or("head_dim", 64)?,
        ..d
    };
    let eps = c.f64_or("rms_norm_eps", 1e-5)? as f32;
    let sliding = match c.layer_types(d.layers)? {
        Some(t) => t,
        None => (0..d.layers).map(|i| i % 2 == 0).collect(),
    };
    let window = c.opt_usize("sliding_window")?.or(Some(128));
    let rope = rope_spec(c.v, "full_attention", d.head_dim, 150000.0, d.max_position)?;
    let layers = build_layers(
        &d,
        &sliding,
        window,
        &|_, _| Ok(Some(rope)),
        &vec![FfnKind::Moe; d.layers],
    )?;
    let bias = c.bool_or("attention_bias", true)?;
    let norm = NormSpec::plain(eps);
    let mut spec = d.base_spec(c.def.family(), norm, layers);
    spec.intermediate_size = 0;
    spec.attention.set_biases(bias);
    spec.attention.sinks = true;
    spec.activation = Activation::ClampedSwiglu {
        alpha: c.f64_or("swiglu_alpha", 1.702)? as f32,
        limit: c.f64_or("swiglu_limit", 7.0)? as f32,
    };
    spec.moe = Some(MoeSpec {
        num_experts: c.usize_or("num_local_experts", 128)?,
        top_k: c.usize_or("num_experts_per_tok", 4)?,
        expert_intermediate: c.usize_or("intermediate_size", 2880)?,
        router: RouterKind::TopKSoftmax,
        router_bias: true,
        expert_biases: true,
        shared_intermediate: None,
        parallel_dense: false,
        shared_gate: false,
    });
    spec.head.tied = c.bool_or("tie_word_embeddings", false)?;
    Ok(spec)
}

/// llama.cpp's gpt-oss: top-k on the raw router logits then softmax,
/// clamped SwiGLU, the sliding window on even layers. gpt-oss was trained
/// with an untruncated YaRN correction range (HF config `truncate: false`,
/// not carried into GGUF).
fn from_gguf(g: &Meta<'_>, c: &Common, spec: &mut ArchSpec) -> Result<(), SpecError> {
    routed_experts(g, c, spec, |_| RouterKind::TopKSoftmax)?;
    spec.activation = Activation::ClampedSwiglu {
        alpha: 1.702,
        limit: g.f("swiglu_limit", 7.0) as f32,
    };
    for (i, l) in spec.layers.iter_mut().enumerate() {
        if i % 2 == 0 {
            l.window = c.window;
        }
        if let Some(RopeSpec {
            scaling: RopeScaling::Yarn { truncate, .. },
            ..
        }) = &mut l.rope
        {
            *truncate = false;
        }
    }
    Ok(())
}
