//! Gemma 4 text (HF `gemma4_text`, the language model of `gemma4`, the
//! 26B-A4B MoE; GGUF `gemma4`).
//! Reference: HF `modeling_gemma4.py` of transformers 5.24.0.

use super::FamilyDef;
use crate::spec::gguf::{Common, Meta};
use crate::spec::hf::{activation_for, dims, rope_spec, Cfg, Dims};
use crate::spec::SpecError;
use turbospark_core::arch::*;

pub const FAMILY: FamilyDef = FamilyDef {
    id: "gemma4",
    name: "gemma4",
    hf_model_types: &["gemma4_text", "gemma4"],
    gguf_architectures: &["gemma4"],
    gguf_experts_of: None,
    // llama.cpp applies the router's per-expert scale to the expert
    // outputs, so its converter files it with the down projections.
    gguf_renames: &[("ffn_gate_inp.expert_scale", "ffn_down_exps.scale")],
    default_chat_template: None,
    gguf_rope: RopeKind::Neox,
    sandwich_norms: true,
    extra_layers_are_mtp: false,
    hf_layer_names: super::no_hf_layer_names,
    from_hf,
    from_gguf,
};

/// Gemma 4 text (HF `modeling_gemma4.py`): plain norms everywhere, q/k
/// norms with weights and a weightless v norm, attention scale 1, embedding
/// × sqrt(hidden), 5 sliding : 1 full layers where full layers have their
/// own head geometry (`per_layer_config`, or `global_head_dim` /
/// `num_global_key_value_heads`), K = V on full layers with
/// `attention_k_eq_v`, proportional rope on full layers, a dense GELU-tanh
/// MLP beside the routed experts, a learned per-layer output scalar, and a
/// final softcap. Per-layer inputs (on by default: HF's
/// `hidden_size_per_layer_input` is 256 unless set) and KV sharing are
/// refused; `use_bidirectional_attention: "vision"` only changes the mask
/// around image tokens, so text runs causally under it.
pub(crate) fn from_hf(c: &Cfg) -> Result<ArchSpec, SpecError> {
    let d = dims(c, 131072)?;
    let d = Dims {
        kv_heads: c.usize_or("num_key_value_heads", 4)?,
        head_dim: c.usize_or("head_dim", 256)?,
        intermediate: c.usize_or("intermediate_size", 9216)?,
        ..d
    };
    if c.usize_or("hidden_size_per_layer_input", 256)? > 0 {
        return Err(SpecError::Unsupported {
            what: "gemma4 per-layer inputs".into(),
            detail: "hidden_size_per_layer_input > 0, or absent (HF default 256): the dense Gemma 4 variants".into(),
        });
    }
    if c.usize_or("num_kv_shared_layers", 0)? > 0 {
        return Err(SpecError::Unsupported {
            what: "gemma4 KV sharing".into(),
            detail: "num_kv_shared_layers > 0".into(),
        });
    }
    match c.present("use_bidirectional_attention") {
        None => {}
        Some(v) if v.as_str() == Some("vision") => {}
        Some(_) => {
            return Err(c.bad(
                "use_bidirectional_attention",
                "null or \"vision\" (causal text model)",
            ))
        }
    }
    if c.bool_or("use_double_wide_mlp", false)? {
        return Err(c.bad("use_double_wide_mlp", "false"));
    }
    let eps = c.f64_or("rms_norm_eps", 1e-6)? as f32;
    let norm = NormSpec::plain(eps);
    let n = d.layers;
    let mut sliding = match c.layer_types(n)? {
        Some(t) => t,
        None => (0..n).map(|i| (i + 1) % 6 != 0).collect(),
    };
    // HF forces the last layer to full attention, whatever `layer_types` says.
    if let Some(last) = sliding.last_mut() {
        *last = false;
    }
    // HF's rope when `rope_parameters` is absent.
    let default_rope = serde_json::json!({
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": 0.25,
                "rope_theta": 1000000.0
            }
        }
    });
    let rope_cfg = if c.present("rope_parameters").is_some() {
        c.v
    } else {
        &default_rope
    };
    let k_eq_v = c.bool_or("attention_k_eq_v", false)?;
    // Full-layer geometry: `per_layer_config` as save_pretrained writes it,
    // else the released config's `global_head_dim` / `num_global_key_value_heads`.
    let overrides = c.present("per_layer_config");
    let global_head_dim = c.usize_or("global_head_dim", 512)?;
    let global_kv = c.opt_usize("num_global_key_value_heads")?;
    let geometry = |i: usize| -> Result<(usize, usize), SpecError> {
        if let Some(o) = overrides.and_then(|o| o.get(i.to_string())) {
            let get = |k: &str, dflt: usize| {
                o.get(k)
                    .map(|v| {
                        v.as_u64()
                            .map(|x| x as usize)
                            .ok_or_else(|| c.bad("per_layer_config", "integers"))
                    })
                    .unwrap_or(Ok(dflt))
            };
            return Ok((
                get("head_dim", d.head_dim)?,
                get("num_key_value_heads", d.kv_heads)?,
            ));
        }
        if overrides.is_some() || sliding[i] {
            return Ok((d.head_dim, d.kv_heads));
        }
        let kv = if k_eq_v {
            global_kv.unwrap_or(d.kv_heads)
        } else {
            d.kv_heads
        };
        Ok((global_head_dim, kv))
    };
    let window = Some(c.usize_or("sliding_window", 512)?);
    let enable_moe = c.bool_or("enable_moe_block", false)?;
    let mut layers = Vec::with_capacity(n);
    for (i, &is_sliding) in sliding.iter().enumerate() {
        let (head_dim, num_kv_heads) = geometry(i)?;
        let layer_type = if is_sliding {
            "sliding_attention"
        } else {
            "full_attention"
        };
        let default_theta = if is_sliding { 10000.0 } else { 1e6 };
        layers.push(LayerSpec {
            head_dim,
            num_kv_heads,
            window: if is_sliding { window } else { None },
            rope: Some(rope_spec(
                rope_cfg,
                layer_type,
                head_dim,
                default_theta,
                d.max_position,
            )?),
            ffn: if enable_moe {
                FfnKind::Moe
            } else {
                FfnKind::Dense
            },
            value_from_key: k_eq_v && !is_sliding,
            mixer: Mixer::Attention,
        });
    }
    let moe = if enable_moe {
        Some(MoeSpec {
            num_experts: c.usize("num_experts")?,
            top_k: c.usize("top_k_experts")?,
            expert_intermediate: c.usize("moe_intermediate_size")?,
            router: RouterKind::Gemma4,
            router_bias: false,
            expert_biases: false,
            shared_intermediate: None,
            parallel_dense: true,
            shared_gate: false,
        })
    } else {
        None
    };
    let bias = c.bool_or("attention_bias", false)?;
    let mut spec = d.base_spec(c.def.family(), norm, layers);
    spec.embedding.scale = (d.hidden as f32).sqrt();
    spec.norms.attn_post = Some(norm);
    spec.norms.ffn_post = Some(norm);
    spec.norms.q = Some(norm);
    spec.norms.k = Some(norm);
    spec.norms.v = Some(NormSpec::no_scale(eps));
    spec.norms.dense_branch_post = enable_moe.then_some(norm);
    spec.norms.moe_input = enable_moe.then_some(norm);
    spec.norms.moe_post = enable_moe.then_some(norm);
    spec.attention.set_biases(bias);
    spec.attention.scale = 1.0;
    spec.activation = activation_for(c, "hidden_activation", "gelu_pytorch_tanh")?;
    spec.moe = moe;
    spec.head.tied = c.bool_or("tie_word_embeddings", true)?;
    spec.head.softcap = c.opt_f64("final_logit_softcapping")?.map(|v| v as f32);
    spec.layer_scalar = true;
    Ok(spec)
}

/// Gemma 4 (the MoE text model) as llama.cpp's converter writes it
/// (conversion/gemma.py `Gemma4Model`, src/models/gemma4.cpp): plain norms
/// (no `+1` in Gemma 4), per-layer KV head counts, full layers with
/// `attention.key_length` and sliding ones with `key_length_swa`, K = V
/// where a layer has no `attn_v`, sliding layers by
/// `attention.sliding_window_pattern` with `rope.freq_base_swa`, full
/// layers' proportional rope as `rope_freqs.weight` (factor 1 on the pairs
/// that rotate, 1e30 on the rest), experts with gate/up fused beside a
/// dense MLP, the router's per-expert scale filed as
/// `ffn_down_exps.scale`, a per-layer output scale and a final softcap.
/// Per-layer inputs and KV sharing are refused, as from HF.
pub(crate) fn from_gguf(g: &Meta<'_>, c: &Common, spec: &mut ArchSpec) -> Result<(), SpecError> {
    let (window, eps) = (c.window, c.eps);
    if g.opt("embedding_length_per_layer_input").unwrap_or(0) > 0 {
        return Err(SpecError::Unsupported {
            what: "gemma4 per-layer inputs".into(),
            detail: "embedding_length_per_layer_input > 0: the dense Gemma 4 variants".into(),
        });
    }
    if g.opt("attention.shared_kv_layers").unwrap_or(0) > 0 {
        return Err(SpecError::Unsupported {
            what: "gemma4 KV sharing".into(),
            detail: "attention.shared_kv_layers > 0".into(),
        });
    }
    let n = spec.layers.len();
    let pattern = g
        .swa_pattern(n)?
        .unwrap_or_else(|| (0..n).map(|i| (i + 1) % 6 != 0).collect());
    let full_dim = g.req("attention.key_length")?;
    let swa_dim = g.opt("attention.key_length_swa").unwrap_or(full_dim);
    let theta = g.f("rope.freq_base", 1e6) as f32;
    let swa_theta = g.f("rope.freq_base_swa", 10000.0) as f32;
    let swa_rot = g.opt("rope.dimension_count_swa").unwrap_or(swa_dim);
    let full_rot = g.opt("rope.dimension_count").unwrap_or(full_dim);
    let freqs = g.m.tensor_f32s("rope_freqs.weight");
    let full_scaling = match &freqs {
        Some(f) => {
            if f.len() != full_rot / 2 {
                return Err(SpecError::Inconsistent(format!(
                    "rope_freqs.weight has {} factors, expected rope.dimension_count / 2 = {}",
                    f.len(),
                    full_rot / 2
                )));
            }
            let rotated_pairs = f.iter().take_while(|&&x| x == 1.0).count();
            if f[rotated_pairs..].iter().any(|&x| x < 1e20) {
                return Err(SpecError::Unsupported {
                    what: "gemma4 rope_freqs.weight".into(),
                    detail: "factors other than 1 (rotate) then 1e30 (do not rotate)".into(),
                });
            }
            RopeScaling::Proportional {
                factor: 1.0,
                rotated_pairs,
            }
        }
        None => RopeScaling::None,
    };
    for (i, (l, sliding)) in spec.layers.iter_mut().zip(pattern).enumerate() {
        l.head_dim = if sliding { swa_dim } else { full_dim };
        l.value_from_key = !g.m.has_tensor(&format!("blk.{i}.attn_v.weight"));
        l.window = if sliding { window } else { None };
        l.rope = Some(if sliding {
            RopeSpec {
                kind: RopeKind::Neox,
                theta: swa_theta,
                rotary_dim: swa_rot,
                scaling: RopeScaling::None,
            }
        } else {
            RopeSpec {
                kind: RopeKind::Neox,
                theta,
                rotary_dim: full_rot,
                scaling: full_scaling,
            }
        });
    }
    spec.head_dim = swa_dim;
    spec.num_kv_heads = spec.layers[0].num_kv_heads;
    let plain = NormSpec::plain(eps);
    spec.embedding.scale = (spec.hidden_size as f32).sqrt();
    spec.norms.attn_post = Some(plain);
    spec.norms.ffn_post = Some(plain);
    spec.norms.v = Some(NormSpec::no_scale(eps));
    spec.attention.scale = 1.0;
    spec.activation = Activation::GeluTanh;
    spec.head.softcap =
        g.m.meta_f64(&g.key("final_logit_softcapping"))
            .map(|v| v as f32);
    spec.layer_scalar = g.m.has_tensor("blk.0.layer_output_scale.weight");
    if let Some(experts) = g.opt("expert_count").filter(|&e| e > 0) {
        spec.moe = Some(MoeSpec {
            num_experts: experts,
            top_k: g.req("expert_used_count")?,
            expert_intermediate: g.req("expert_feed_forward_length")?,
            router: RouterKind::Gemma4,
            router_bias: false,
            expert_biases: false,
            shared_intermediate: None,
            parallel_dense: true,
            shared_gate: false,
        });
        spec.layers.iter_mut().for_each(|l| l.ffn = FfnKind::Moe);
        spec.norms.dense_branch_post = Some(plain);
        spec.norms.moe_input = Some(plain);
        spec.norms.moe_post = Some(plain);
    }
    Ok(())
}
