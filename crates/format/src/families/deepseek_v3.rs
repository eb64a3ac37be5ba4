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
//!
//! GGUF files (llama.cpp's `deepseek2`, as its `convert_hf_to_gguf.py`
//! writes them; llama.cpp's `src/models/deepseek2.cpp` reads them):
//!
//! - the spec is already the absorbed one: `attention.head_count_kv` 1,
//!   `attention.key_length` `kv_lora + rope`, `attention.value_length`
//!   `kv_lora`; the checkpoint's head widths are `key_length_mla` (nope +
//!   rope) and `value_length_mla`, the rope width `rope.dimension_count`;
//! - `kv_b_proj` is split ([`KvBLayout::Split`]): `attn_k_b` `[heads,
//!   kv_lora, nope]` holds each head's key block transposed, `attn_v_b`
//!   `[heads, v, kv_lora]` its value block;
//! - every norm, the `q_a` and `kv_a` ones included, uses
//!   `layer_norm_rms_epsilon`;
//! - YaRN: the converter writes `0.1 · mscale_all_dim` as
//!   `rope.scaling.yarn_log_multiplier` and no `mscale`; llama.cpp takes
//!   `mscale = mscale_all_dim`, so the cos/sin factor is 1 and the score
//!   scale `qk_head_dim^-0.5 · (0.1 · mscale_all_dim · ln(factor) + 1)²`;
//! - routing by `expert_gating_func` (2 = sigmoid, the grouped router;
//!   llama.cpp reads a file without it as DeepSeek-V2's softmax, which is
//!   not supported here), `expert_group_count`, `expert_group_used_count`,
//!   `expert_weights_norm`, `expert_weights_scale`, and the correction bias
//!   `exp_probs_b.bias`.

use super::FamilyDef;
use crate::convert::hf_names::Target;
use crate::spec::gguf::{routed_experts, Common, Meta};
use crate::spec::hf::{
    activation_for, build_layers, dims, rope_spec, set_deepseek_moe, Cfg, DeepseekMoeDefaults, Dims,
};
use crate::spec::SpecError;
use serde_json::Value;
use turbospark_core::arch::{
    ArchSpec, FfnKind, KvBLayout, MlaSpec, NormSpec, RopeKind, RopeScaling, RouterKind,
};

pub const FAMILY: FamilyDef = FamilyDef {
    id: "deepseek_v3",
    name: "deepseek_v3",
    hf_model_types: &["deepseek_v3"],
    gguf_architectures: &["deepseek2"],
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
        kv_b: KvBLayout::Fused,
        norm_eps: MlaSpec::HF_NORM_EPS,
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
    let mut spec = latent.base_spec(FAMILY.family(), NormSpec::plain(eps), layers);
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

    set_deepseek_moe(
        c,
        &mut spec,
        DeepseekMoeDefaults {
            moe_intermediate: 2048,
            routed_experts: 256,
            n_group: 8,
            topk_group: 4,
            scaling: 2.5,
            first_dense: 3,
        },
    )?;
    Ok(spec)
}

/// llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID`.
const GATING_SIGMOID: usize = 2;

fn from_gguf(g: &Meta<'_>, c: &Common, spec: &mut ArchSpec) -> Result<(), SpecError> {
    let rope = c.rope.rotary_dim;
    let kv_lora = g.req("attention.kv_lora_rank")?;
    let key_mla = g.req("attention.key_length_mla")?;
    let mla = MlaSpec {
        q_lora_rank: g.opt("attention.q_lora_rank").filter(|&r| r > 0),
        kv_lora_rank: kv_lora,
        qk_nope_head_dim: key_mla.checked_sub(rope).filter(|&d| d > 0).ok_or_else(|| {
            SpecError::Inconsistent(format!(
                "deepseek2.attention.key_length_mla {key_mla} is not above rope.dimension_count {rope}"
            ))
        })?,
        qk_rope_head_dim: rope,
        v_head_dim: g.req("attention.value_length_mla")?,
        kv_b: KvBLayout::Split,
        norm_eps: c.eps,
    };
    // The absorbed layout the converter declares: one KV head as wide as a
    // cached row.
    let latent = mla.latent_head_dim();
    let (kv_heads, head_dim, value) = (
        spec.num_kv_heads,
        spec.head_dim,
        g.opt("attention.value_length").unwrap_or(kv_lora),
    );
    if (kv_heads, head_dim, value) != (1, latent, kv_lora) {
        return Err(SpecError::Inconsistent(format!(
            "deepseek2: head_count_kv {kv_heads}, key_length {head_dim}, value_length {value}; \
             expected 1, kv_lora_rank + rope ({latent}), kv_lora_rank ({kv_lora}) (the MLA \
             layout of llama.cpp's converter; older files with attn_kv_b are not read)"
        )));
    }
    if mla.q_lora_rank.is_none() != g.m.has_tensor("blk.0.attn_q.weight") {
        return Err(SpecError::Inconsistent(
            "deepseek2: attention.q_lora_rank and the query tensors (attn_q_a / attn_q) disagree"
                .into(),
        ));
    }

    // YaRN as llama.cpp computes it for deepseek2 (llama-context.cpp and
    // src/models/deepseek2.cpp): `mscale` is taken to equal
    // `mscale_all_dim`, so the cos/sin factor is 1, and the scores carry
    // `yarn_get_mscale(factor, mscale_all_dim)²`.
    let mut scale = (mla.qk_head_dim() as f64).powf(-0.5);
    for l in spec.layers.iter_mut() {
        if let Some(r) = l.rope.as_mut() {
            if let RopeScaling::Yarn {
                attention_factor, ..
            } = &mut r.scaling
            {
                if g.m
                    .meta_f64(&g.key("rope.scaling.yarn_log_multiplier"))
                    .is_some()
                {
                    *attention_factor = 1.0;
                }
            }
        }
    }
    if let RopeScaling::Yarn { factor, .. } = c.rope.scaling {
        let log_mul =
            g.m.meta_f64(&g.key("rope.scaling.yarn_log_multiplier"))
                .map_or(1.0, |v| v / 0.1);
        let m = mscale(f64::from(factor), log_mul);
        scale *= m * m;
    }
    spec.attention.scale = scale as f32;
    spec.mla = Some(mla);

    let gating = g.opt("expert_gating_func");
    if g.opt("expert_count").unwrap_or(0) > 0 && gating != Some(GATING_SIGMOID) {
        return Err(SpecError::Unsupported {
            what: "deepseek2 expert routing".into(),
            detail: format!(
                "expert_gating_func {} (only 2, sigmoid, DeepSeek-V3's router, is supported; \
                 llama.cpp reads a missing value as DeepSeek-V2's softmax)",
                gating.map_or("missing".to_string(), |v| v.to_string())
            ),
        });
    }
    routed_experts(g, c, spec, |g| RouterKind::SigmoidGrouped {
        n_group: g.opt("expert_group_count").unwrap_or(1).max(1),
        topk_group: g.opt("expert_group_used_count").unwrap_or(1).max(1),
        renormalize: g.b("expert_weights_norm").unwrap_or(false),
        scaling: g.f("expert_weights_scale", 1.0) as f32,
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::gguf::{spec_from_gguf, GgufMeta};
    use serde_json::json;
    use std::collections::HashMap;

    /// GGUF metadata as llama.cpp's converter writes it for the tiny
    /// fixture (tests/fixtures/tiny-gguf/deepseek_v3.f32.gguf).
    struct Md(HashMap<String, Value>);

    impl GgufMeta for Md {
        fn meta_u64(&self, k: &str) -> Option<u64> {
            self.0.get(k)?.as_u64()
        }
        fn meta_f64(&self, k: &str) -> Option<f64> {
            self.0.get(k)?.as_f64()
        }
        fn meta_str(&self, k: &str) -> Option<&str> {
            self.0.get(k)?.as_str()
        }
        fn meta_bool(&self, k: &str) -> Option<bool> {
            self.0.get(k)?.as_bool()
        }
        fn meta_array_len(&self, _: &str) -> Option<usize> {
            None
        }
        fn meta_u64s(&self, _: &str) -> Option<Vec<u64>> {
            None
        }
        fn meta_bools(&self, _: &str) -> Option<Vec<bool>> {
            None
        }
        fn has_tensor(&self, name: &str) -> bool {
            name == "output.weight" || name == "blk.0.attn_q_a.weight"
        }
        fn tensor_f32s(&self, _: &str) -> Option<Vec<f32>> {
            None
        }
    }

    fn tiny_deepseek2() -> Md {
        let kv = json!({
            "general.architecture": "deepseek2",
            "deepseek2.block_count": 3, "deepseek2.context_length": 1024,
            "deepseek2.embedding_length": 64, "deepseek2.feed_forward_length": 128,
            "deepseek2.attention.head_count": 4, "deepseek2.attention.head_count_kv": 1,
            "deepseek2.rope.scaling.type": "yarn", "deepseek2.rope.scaling.factor": 4.0,
            "deepseek2.rope.scaling.original_context_length": 256,
            "deepseek2.rope.freq_base": 10000.0,
            "deepseek2.attention.layer_norm_rms_epsilon": 1e-5,
            "deepseek2.expert_count": 8, "deepseek2.expert_used_count": 2,
            "deepseek2.expert_group_count": 2, "deepseek2.expert_group_used_count": 1,
            "deepseek2.attention.key_length": 32, "deepseek2.attention.value_length": 24,
            "deepseek2.leading_dense_block_count": 1, "deepseek2.vocab_size": 256,
            "deepseek2.attention.q_lora_rank": 32, "deepseek2.attention.kv_lora_rank": 24,
            "deepseek2.attention.key_length_mla": 24, "deepseek2.attention.value_length_mla": 12,
            "deepseek2.expert_feed_forward_length": 16, "deepseek2.expert_shared_count": 1,
            "deepseek2.expert_weights_scale": 2.5, "deepseek2.expert_weights_norm": true,
            "deepseek2.expert_gating_func": 2, "deepseek2.rope.dimension_count": 8,
            "deepseek2.rope.scaling.yarn_log_multiplier": 0.1,
        });
        Md(kv.as_object().unwrap().clone().into_iter().collect())
    }

    #[test]
    fn gguf_split_kv_b_file_eps_and_yarn_as_llamacpp_reads_them() {
        let spec = spec_from_gguf(&tiny_deepseek2()).unwrap();
        let mla = spec.mla.unwrap();
        assert_eq!(
            mla,
            MlaSpec {
                q_lora_rank: Some(32),
                kv_lora_rank: 24,
                qk_nope_head_dim: 16,
                qk_rope_head_dim: 8,
                v_head_dim: 12,
                kv_b: KvBLayout::Split,
                norm_eps: 1e-5,
            }
        );
        assert_eq!(
            (spec.layers[0].head_dim, spec.layers[0].num_kv_heads),
            (32, 1)
        );
        let rope = spec.layers[0].rope.unwrap();
        assert_eq!(rope.kind, RopeKind::Interleaved);
        match rope.scaling {
            RopeScaling::Yarn {
                attention_factor, ..
            } => assert_eq!(attention_factor, 1.0),
            other => panic!("{other:?}"),
        }
        // 24^-0.5 · (0.1 · 1 · ln 4 + 1)²
        let m = 0.1 * 4f64.ln() + 1.0;
        assert!((spec.attention.scale - (m * m / 24f64.sqrt()) as f32).abs() < 1e-7);
        assert_eq!(
            spec.moe.unwrap().router,
            RouterKind::SigmoidGrouped {
                n_group: 2,
                topk_group: 1,
                renormalize: true,
                scaling: 2.5
            }
        );
        assert_eq!(spec.layers[0].ffn, FfnKind::Dense);
        assert_eq!(spec.layers[1].ffn, FfnKind::Moe);
    }

    #[test]
    fn gguf_softmax_routing_and_unabsorbed_layout_are_typed_errors() {
        let mut md = tiny_deepseek2();
        md.0.remove("deepseek2.expert_gating_func");
        let e = spec_from_gguf(&md).unwrap_err();
        assert!(matches!(e, SpecError::Unsupported { .. }), "{e}");
        assert!(e.to_string().contains("expert_gating_func"), "{e}");

        let mut md = tiny_deepseek2();
        md.0.insert("deepseek2.attention.head_count_kv".into(), json!(4));
        let e = spec_from_gguf(&md).unwrap_err();
        assert!(matches!(e, SpecError::Inconsistent(_)), "{e}");

        let mut md = tiny_deepseek2();
        md.0.remove("deepseek2.attention.key_length_mla");
        let e = spec_from_gguf(&md).unwrap_err();
        assert!(matches!(e, SpecError::MissingField { .. }), "{e}");
    }

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
            def: &FAMILY,
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
