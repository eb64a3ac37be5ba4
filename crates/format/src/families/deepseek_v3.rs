//! DeepSeek-V3 / R1 and Kimi-K2 (HF `deepseek_v3`). Reference: HF
//! `modeling_deepseek_v3.py` of transformers 5.24.0.
//!
//! What differs from llama:
//!
//! - Multi-head latent attention ([`MlaSpec`]): `q = q_b(rms(q_a·x))` (or
//!   `q_proj·x` when `q_lora_rank` is null), per head `qk_nope_head_dim`
//!   then `qk_rope_head_dim`; `kv_a_proj_with_mqa·x` is a latent
//!   `c` (`kv_lora_rank`, then `kv_a_layernorm`) and one rope key shared by
//!   every head; `kv_b_proj·c` gives each head's `k_nope` and `v`
//!   (`v_head_dim`). The `q_a` and `kv_a` norms use eps 1e-6 whatever
//!   `rms_norm_eps` says (HF builds them with the class default). The spec's
//!   layers describe the absorbed form the decoder runs: one KV head of
//!   `qk_rope_head_dim + kv_lora_rank` holding `[rope(k_rope), c]`.
//! - Rope on the rope parts only, adjacent pairs when `rope_interleave`
//!   (the default; HF rotates `x[0::2]`, `x[1::2]` and writes them back
//!   de-interleaved, which leaves every q·k unchanged), neox halves
//!   otherwise; frequencies over `qk_rope_head_dim`.
//! - Attention scale `qk_head_dim^-0.5`, times `mscale²` with `mscale =
//!   0.1 · mscale_all_dim · ln(factor) + 1` when the rope is scaled and
//!   `mscale_all_dim` is set (HF `yarn_apply_mscale`), on top of YaRN's own
//!   cos/sin factor.
//! - The first `first_k_dense_replace` layers dense, then MoE: the sigmoid
//!   group-limited router of GLM-4.5 (`RouterKind::SigmoidGrouped`, with
//!   `e_score_correction_bias`, `routed_scaling_factor`) and
//!   `n_shared_experts × moe_intermediate_size` shared experts always added.
//! - Checkpoints may carry multi-token-prediction layers past the decoder
//!   stack (`num_nextn_predict_layers`); `convert` skips them.
//!
//! GGUF files (llama.cpp's `deepseek2`) are not read yet.

use super::FamilyDef;
use crate::convert::hf_names::Target;
use crate::spec::gguf::{Common, Meta};
use crate::spec::hf::{activation_for, build_layers, dims, rope_spec, set_moe_layers, Cfg, Dims};
use crate::spec::SpecError;
use serde_json::Value;
use turbospark_core::arch::{
    ArchSpec, Family, FfnKind, MlaSpec, MoeSpec, NormSpec, RopeKind, RouterKind,
};

pub const FAMILY: FamilyDef = FamilyDef {
    family: Family::DeepseekV3,
    hf_model_types: &["deepseek_v3"],
    gguf_architectures: &[],
    gguf_experts_of: None,
    gguf_renames: &[],
    default_chat_template: None,
    gguf_rope: RopeKind::Interleaved,
    sandwich_norms: false,
    extra_layers_are_mtp: true,
    hf_layer_names,
    from_hf,
    from_gguf,
};

/// The latent-attention tensors, which only this family has.
fn hf_layer_names(rest: &str, layer: usize) -> Option<Option<Target>> {
    let r = rest.strip_prefix("self_attn.")?;
    let canonical = match r {
        "q_a_proj.weight" => "attn_q_a.weight",
        "q_a_layernorm.weight" => "attn_q_a_norm.weight",
        "q_b_proj.weight" => "attn_q_b.weight",
        "kv_a_proj_with_mqa.weight" => "attn_kv_a_mqa.weight",
        "kv_a_layernorm.weight" => "attn_kv_a_norm.weight",
        "kv_b_proj.weight" => "attn_kv_b.weight",
        _ => return None,
    };
    Some(Some(Target::Resident(format!("blk.{layer}.{canonical}"))))
}

/// `yarn_get_mscale` of HF.
fn mscale(factor: f64, m: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * m * factor.ln() + 1.0
    }
}

fn from_hf(c: &Cfg) -> Result<ArchSpec, SpecError> {
    let d = dims(c, 4096)?;
    let eps = c.f64_or("rms_norm_eps", 1e-6)? as f32;
    if c.bool_or("attention_bias", false)? {
        return Err(c.bad(
            "attention_bias",
            "false (biases on the latent projections are not supported)",
        ));
    }
    let mla = MlaSpec {
        q_lora_rank: c.opt_usize("q_lora_rank")?,
        kv_lora_rank: c.usize_or("kv_lora_rank", 512)?,
        qk_nope_head_dim: c.usize_or("qk_nope_head_dim", 128)?,
        qk_rope_head_dim: c.usize_or("qk_rope_head_dim", 64)?,
        v_head_dim: c.usize_or("v_head_dim", 128)?,
    };
    let mut rope = rope_spec(
        c.v,
        "full_attention",
        mla.qk_rope_head_dim,
        10000.0,
        d.max_position,
    )?;
    rope.kind = if c.bool_or("rope_interleave", true)? {
        RopeKind::Interleaved
    } else {
        RopeKind::Neox
    };
    // The absorbed form: one KV head as wide as a cached row.
    let latent = Dims {
        kv_heads: 1,
        head_dim: mla.latent_head_dim(),
        ..d
    };
    let layers = build_layers(
        &latent,
        &vec![false; d.layers],
        None,
        &|_, _| Ok(Some(rope)),
        &vec![FfnKind::Dense; d.layers],
    )?;
    let mut spec = latent.base_spec(Family::DeepseekV3, NormSpec::plain(eps), layers);
    spec.activation = activation_for(c, "hidden_act", "silu")?;
    spec.head.tied = c.bool_or("tie_word_embeddings", false)?;

    // HF `yarn_apply_mscale`: any scaled rope with `mscale_all_dim` set.
    let rp =
        c.v.get("rope_parameters")
            .filter(|v| v.is_object())
            .or_else(|| c.v.get("rope_scaling").filter(|v| v.is_object()));
    let field = |k: &str| rp.and_then(|p| p.get(k)).and_then(Value::as_f64);
    let scaled = rp
        .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
        .and_then(Value::as_str)
        .is_some_and(|t| t != "default");
    let mut scale = (mla.qk_head_dim() as f64).powf(-0.5);
    if let (true, Some(all_dim), Some(factor)) = (scaled, field("mscale_all_dim"), field("factor"))
    {
        if all_dim != 0.0 {
            let m = mscale(factor, all_dim);
            scale *= m * m;
        }
    }
    spec.attention.scale = scale as f32;
    spec.mla = Some(mla);

    let moe_inter = c.usize_or("moe_intermediate_size", 2048)?;
    let shared = c.usize_or("n_shared_experts", 1)?;
    spec.moe = Some(MoeSpec {
        num_experts: c.usize_or("n_routed_experts", 256)?,
        top_k: c.usize_or("num_experts_per_tok", 8)?,
        expert_intermediate: moe_inter,
        router: RouterKind::SigmoidGrouped {
            n_group: c.usize_or("n_group", 8)?,
            topk_group: c.usize_or("topk_group", 4)?,
            renormalize: c.bool_or("norm_topk_prob", true)?,
            scaling: c.f64_or("routed_scaling_factor", 2.5)? as f32,
        },
        router_bias: false,
        expert_biases: false,
        shared_intermediate: (shared > 0).then_some(moe_inter * shared),
        parallel_dense: false,
        shared_gate: false,
    });
    let first_dense = c.usize_or("first_k_dense_replace", 3)?;
    set_moe_layers(&mut spec, |i| i >= first_dense);
    Ok(spec)
}

fn from_gguf(_: &Meta<'_>, _: &Common, _: &mut ArchSpec) -> Result<(), SpecError> {
    Err(SpecError::Unsupported {
        what: "GGUF source".into(),
        detail: "deepseek_v3 converts from its HF checkpoint only".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn latent_heads_yarn_mscale_and_null_q_lora() {
        let v = json!({
            "model_type": "deepseek_v3", "vocab_size": 256, "hidden_size": 64,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
            "head_dim": 8, "intermediate_size": 128, "q_lora_rank": null,
            "kv_lora_rank": 24, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
            "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
            "first_k_dense_replace": 1,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                "original_max_position_embeddings": 256, "mscale": 0.9, "mscale_all_dim": 1.0},
        });
        let spec = from_hf(&Cfg {
            v: &v,
            top: &v,
            family: Family::DeepseekV3,
        })
        .unwrap();
        spec.validate().unwrap();
        let mla = spec.mla.unwrap();
        assert_eq!(mla.q_lora_rank, None);
        assert_eq!(spec.layers[0].head_dim, 32);
        assert_eq!(spec.layers[0].num_kv_heads, 1);
        let rope = spec.layers[0].rope.unwrap();
        assert_eq!((rope.kind, rope.rotary_dim), (RopeKind::Interleaved, 8));
        let m = 0.1 * 4f64.ln() + 1.0;
        let want = (24f64.powf(-0.5) * m * m) as f32;
        assert!((spec.attention.scale - want).abs() < 1e-7);
        assert_eq!(spec.layers[0].ffn, FfnKind::Dense);
        assert_eq!(spec.layers[2].ffn, FfnKind::Moe);
    }
}
