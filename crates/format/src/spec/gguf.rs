//! `ArchSpec` from GGUF metadata, following llama.cpp's reading of the same
//! keys (`llama-model.cpp`, `llama-arch.cpp`): `<arch>.embedding_length`,
//! `<arch>.block_count`, `<arch>.attention.head_count`, and so on.
//!
//! Two conventions of llama.cpp's converter matter here:
//! - llama-architecture q/k rows are permuted for interleaved ("normal")
//!   rope, so GGUF llama/mixtral use [`RopeKind::Interleaved`]; every other
//!   family keeps HF's neox layout.
//! - Gemma norm weights are stored with the `+1` already added, so GGUF
//!   Gemma norms are plain where HF's are centered.

use super::SpecError;
use crate::identity::{family_for_gguf, supported_gguf_architectures};
use turbospark_core::arch::*;

/// Read access to GGUF metadata and tensor presence.
pub trait GgufMeta {
    fn meta_u64(&self, key: &str) -> Option<u64>;
    fn meta_f64(&self, key: &str) -> Option<f64>;
    fn meta_str(&self, key: &str) -> Option<&str>;
    fn meta_bool(&self, key: &str) -> Option<bool>;
    fn meta_array_len(&self, key: &str) -> Option<usize>;
    /// An integer array (any integer element type).
    fn meta_u64s(&self, key: &str) -> Option<Vec<u64>>;
    fn meta_bools(&self, key: &str) -> Option<Vec<bool>>;
    fn has_tensor(&self, name: &str) -> bool;
    /// The values of an F32 tensor (None when absent or of another type).
    fn tensor_f32s(&self, name: &str) -> Option<Vec<f32>>;
}

struct Meta<'a, M: GgufMeta + ?Sized> {
    m: &'a M,
    arch: &'a str,
    family: Family,
}

impl<M: GgufMeta + ?Sized> Meta<'_, M> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    fn req(&self, k: &str) -> Result<usize, SpecError> {
        let key = self.key(k);
        self.m
            .meta_u64(&key)
            .map(|v| v as usize)
            .ok_or(SpecError::MissingField {
                field: key,
                family: self.family.to_string(),
                source_kind: "GGUF metadata",
            })
    }
    fn opt(&self, k: &str) -> Option<usize> {
        self.m.meta_u64(&self.key(k)).map(|v| v as usize)
    }
    fn f(&self, k: &str, default: f64) -> f64 {
        self.m.meta_f64(&self.key(k)).unwrap_or(default)
    }
    fn b(&self, k: &str) -> Option<bool> {
        self.m.meta_bool(&self.key(k))
    }
    /// A per-layer value written either as one number or as an array of
    /// `n` (llama.cpp's `get_key_or_arr`).
    fn per_layer(&self, k: &str, n: usize) -> Result<Option<Vec<usize>>, SpecError> {
        let key = self.key(k);
        if let Some(v) = self.m.meta_u64(&key) {
            return Ok(Some(vec![v as usize; n]));
        }
        match self.m.meta_u64s(&key) {
            None => Ok(None),
            Some(v) if v.len() == n => Ok(Some(v.into_iter().map(|x| x as usize).collect())),
            Some(v) => Err(SpecError::BadField {
                field: key,
                found: format!("an array of {}", v.len()),
                expected: format!("one number or an array of {n} (block_count)"),
                source_kind: "GGUF metadata",
            }),
        }
    }
    /// `<arch>.attention.sliding_window_pattern` (true = sliding layer).
    fn swa_pattern(&self, n: usize) -> Result<Option<Vec<bool>>, SpecError> {
        let key = self.key("attention.sliding_window_pattern");
        match self.m.meta_bools(&key) {
            None => Ok(None),
            Some(v) if v.len() == n => Ok(Some(v)),
            Some(v) => Err(SpecError::BadField {
                field: key,
                found: format!("{} entries", v.len()),
                expected: format!("{n} (block_count)"),
                source_kind: "GGUF metadata",
            }),
        }
    }
}

/// Builds the spec from a GGUF file's metadata.
pub fn spec_from_gguf<M: GgufMeta + ?Sized>(m: &M) -> Result<ArchSpec, SpecError> {
    let arch = m
        .meta_str("general.architecture")
        .ok_or(SpecError::MissingField {
            field: "general.architecture".into(),
            family: "any model".into(),
            source_kind: "GGUF metadata",
        })?;
    let experts = m.meta_u64(&format!("{arch}.expert_count")).unwrap_or(0);
    let family = family_for_gguf(arch, experts).ok_or_else(|| SpecError::UnknownArchitecture {
        found: arch.to_string(),
        source_kind: "GGUF general.architecture",
        supported: supported_gguf_architectures(),
    })?;
    let g = Meta { m, arch, family };

    let hidden = g.req("embedding_length")?;
    // llama.cpp counts multi-token-prediction layers in block_count.
    let n_layers = g
        .req("block_count")?
        .checked_sub(g.opt("nextn_predict_layers").unwrap_or(0))
        .ok_or_else(|| SpecError::Inconsistent("nextn_predict_layers > block_count".into()))?;
    let heads = g.req("attention.head_count")?;
    if heads == 0 {
        return Err(SpecError::Inconsistent("attention.head_count is 0".into()));
    }
    let kv_heads_per_layer = g.per_layer("attention.head_count_kv", n_layers)?;
    let kv_heads = kv_heads_per_layer
        .as_ref()
        .and_then(|v| v.first().copied())
        .unwrap_or(heads);
    let head_dim = g.opt("attention.key_length").unwrap_or(hidden / heads);
    let vocab = g
        .opt("vocab_size")
        .or_else(|| m.meta_array_len("tokenizer.ggml.tokens"))
        .ok_or(SpecError::MissingField {
            field: "tokenizer.ggml.tokens".into(),
            family: family.to_string(),
            source_kind: "GGUF metadata",
        })?;
    let eps = g.f("attention.layer_norm_rms_epsilon", 1e-5) as f32;
    let max_position = g.opt("context_length").unwrap_or(4096);
    let intermediate = g.opt("feed_forward_length").unwrap_or(0);
    let rotary_dim = g.opt("rope.dimension_count").unwrap_or(head_dim);
    let theta = g.f("rope.freq_base", 10000.0) as f32;
    let window = g.opt("attention.sliding_window").filter(|w| *w > 0);

    // llama.cpp's converter permutes llama q/k rows for interleaved rope and
    // un-permutes Muse Glimmer's (HF stores it in rotate_half layout).
    let rope_kind = match family {
        Family::Llama | Family::Mixtral | Family::MuseGlimmer => RopeKind::Interleaved,
        _ => RopeKind::Neox,
    };
    let scaling = match m.meta_str(&g.key("rope.scaling.type")) {
        Some("yarn") => {
            let factor = g.f("rope.scaling.factor", 1.0);
            RopeScaling::Yarn {
                factor: factor as f32,
                original_max_position: g
                    .opt("rope.scaling.original_context_length")
                    .unwrap_or(4096),
                beta_fast: g.f("rope.scaling.yarn_beta_fast", 32.0) as f32,
                beta_slow: g.f("rope.scaling.yarn_beta_slow", 1.0) as f32,
                attention_factor: if factor > 1.0 {
                    (0.1 * factor.ln() + 1.0) as f32
                } else {
                    1.0
                },
                // gpt-oss was trained with an untruncated correction range
                // (HF config `truncate: false`, not carried into GGUF);
                // ggml always rounds it (`ggml_rope_yarn_corr_dims`).
                truncate: family != Family::GptOss,
            }
        }
        Some("linear") => RopeScaling::Linear {
            factor: g.f("rope.scaling.factor", 1.0) as f32,
        },
        Some("none") | None => RopeScaling::None,
        Some(other) => {
            return Err(SpecError::Unsupported {
                what: "rope scaling".into(),
                detail: other.to_string(),
            })
        }
    };
    let rope = RopeSpec {
        kind: rope_kind,
        theta,
        rotary_dim,
        scaling,
    };
    let plain = NormSpec::plain(eps);
    let has = |n: &str| m.has_tensor(n);
    let tied = !has("output.weight");

    let mut spec = ArchSpec {
        family,
        vocab_size: vocab,
        hidden_size: hidden,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        intermediate_size: intermediate,
        max_position,
        embedding: EmbeddingSpec {
            scale: 1.0,
            norm: None,
        },
        norms: NormsSpec {
            attn_input: plain,
            attn_post: None,
            ffn_input: plain,
            ffn_post: None,
            q: has("blk.0.attn_q_norm.weight").then_some(plain),
            k: has("blk.0.attn_k_norm.weight").then_some(plain),
            v: None,
            output: plain,
            dense_branch_post: None,
            moe_input: None,
            moe_post: None,
        },
        attention: AttentionSpec {
            q_bias: has("blk.0.attn_q.bias"),
            k_bias: has("blk.0.attn_k.bias"),
            v_bias: has("blk.0.attn_v.bias"),
            o_bias: has("blk.0.attn_output.bias"),
            sinks: has("blk.0.attn_sinks.weight"),
            output_gate: false,
            scale: (head_dim as f32).powf(-0.5),
            softcap: None,
        },
        activation: Activation::Swiglu,
        moe: None,
        head: HeadSpec {
            tied,
            multiplier: 1.0,
            softcap: None,
        },
        layer_scalar: false,
        layers: (0..n_layers)
            .map(|i| LayerSpec {
                head_dim,
                num_kv_heads: kv_heads_per_layer.as_ref().map_or(kv_heads, |v| v[i]),
                window: None,
                rope: Some(rope),
                ffn: FfnKind::Dense,
                value_from_key: false,
            })
            .collect(),
    };

    match family {
        Family::Llama | Family::Qwen2 => {
            if let Some(w) = window {
                spec.layers.iter_mut().for_each(|l| l.window = Some(w));
            }
        }
        Family::Gemma3 => {
            // llama.cpp: 5 sliding : 1 full unless the file has a pattern;
            // local rope base `rope.freq_base_swa`, else 10000.
            spec.embedding.scale = (hidden as f32).sqrt();
            spec.norms.attn_post = Some(plain);
            spec.norms.ffn_post = Some(plain);
            spec.activation = Activation::GeluTanh;
            spec.head.softcap = m
                .meta_f64(&g.key("final_logit_softcapping"))
                .map(|v| v as f32);
            spec.attention.softcap = m
                .meta_f64(&g.key("attn_logit_softcapping"))
                .map(|v| v as f32);
            let local = RopeSpec {
                theta: g.f("rope.freq_base_swa", 10000.0) as f32,
                ..rope
            };
            let pattern = g
                .swa_pattern(n_layers)?
                .unwrap_or_else(|| (0..n_layers).map(|i| (i + 1) % 6 != 0).collect());
            for (l, sliding) in spec.layers.iter_mut().zip(pattern) {
                if sliding {
                    l.window = window;
                    l.rope = Some(local);
                }
            }
        }
        Family::MuseGlimmer => muse_glimmer(&g, &mut spec, window, eps)?,
        Family::Gemma4 => gemma4(&g, &mut spec, window, eps)?,
        Family::Mixtral | Family::Qwen3Moe | Family::GptOss | Family::Glm4Moe => {
            let experts = g.req("expert_count")?;
            let top_k = g.req("expert_used_count")?;
            let expert_inter = g.opt("expert_feed_forward_length").unwrap_or(intermediate);
            let leading_dense = g.opt("leading_dense_block_count").unwrap_or(0);
            let router = match family {
                Family::GptOss => RouterKind::TopKSoftmax,
                Family::Glm4Moe => RouterKind::SigmoidGrouped {
                    n_group: g.opt("expert_group_count").unwrap_or(1).max(1),
                    topk_group: g.opt("expert_group_used_count").unwrap_or(1).max(1),
                    renormalize: g.b("expert_weights_norm").unwrap_or(true),
                    scaling: g.f("expert_weights_scale", 1.0) as f32,
                },
                _ => RouterKind::SoftmaxTopK {
                    renormalize: g.b("expert_weights_norm").unwrap_or(true),
                },
            };
            let shared = g.opt("expert_shared_count").unwrap_or(0);
            spec.moe = Some(MoeSpec {
                num_experts: experts,
                top_k,
                expert_intermediate: expert_inter,
                router,
                router_bias: has(&format!("blk.{leading_dense}.ffn_gate_inp.bias")),
                expert_biases: has(&format!("blk.{leading_dense}.ffn_gate_exps.bias")),
                shared_intermediate: (shared > 0).then(|| {
                    g.opt("expert_shared_feed_forward_length")
                        .unwrap_or(expert_inter * shared)
                }),
                parallel_dense: false,
            });
            for (i, l) in spec.layers.iter_mut().enumerate() {
                l.ffn = if i < leading_dense {
                    FfnKind::Dense
                } else {
                    FfnKind::Moe
                };
            }
            if family == Family::GptOss {
                spec.activation = Activation::ClampedSwiglu {
                    alpha: 1.702,
                    limit: g.f("swiglu_limit", 7.0) as f32,
                };
                // llama.cpp: sliding window on even layers.
                for (i, l) in spec.layers.iter_mut().enumerate() {
                    if i % 2 == 0 {
                        l.window = window;
                    }
                }
            } else if let Some(w) = window {
                spec.layers.iter_mut().for_each(|l| l.window = Some(w));
            }
        }
    }
    spec.validate().map_err(SpecError::Inconsistent)?;
    Ok(spec)
}

/// Muse Glimmer as llama.cpp's converter writes it (`muse-glimmer`,
/// conversion/muse_glimmer.py; graph in src/models/muse-glimmer.cpp): the
/// four layer norms have the HF `+1` folded in (plain here), the two post
/// norms use eps 1e-8, the embedding is RMS-normed without a weight, q/k
/// rows are un-permuted for interleaved rope, the q/k norms carry weights
/// that absorb `qk_scale_factor` (so the attention scale is head_dim^-0.5),
/// rope runs on the sliding layers only (NoPE on full ones), and logits are
/// multiplied by `logit_scale` before the final softcap.
fn muse_glimmer<M: GgufMeta + ?Sized>(
    g: &Meta<'_, M>,
    spec: &mut ArchSpec,
    window: Option<usize>,
    eps: f32,
) -> Result<(), SpecError> {
    const POST_NORM_EPS: f32 = 1e-8;
    let n = spec.layers.len();
    let pattern = g
        .swa_pattern(n)?
        .unwrap_or_else(|| (0..n).map(|i| (n - 1 - i) % 4 != 0).collect());
    for (l, sliding) in spec.layers.iter_mut().zip(pattern) {
        l.window = if sliding { window } else { None };
        if !sliding {
            l.rope = None;
        }
    }
    let plain = NormSpec::plain(eps);
    spec.embedding.norm = Some(NormSpec::no_scale(eps));
    spec.norms.attn_post = Some(NormSpec::plain(POST_NORM_EPS));
    spec.norms.ffn_post = Some(NormSpec::plain(POST_NORM_EPS));
    spec.norms.q = Some(plain);
    spec.norms.k = Some(plain);
    spec.attention.output_gate = true;
    spec.head.multiplier = g.f("logit_scale", 1.0) as f32;
    spec.head.softcap =
        g.m.meta_f64(&g.key("final_logit_softcapping"))
            .map(|v| v as f32);
    Ok(())
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
fn gemma4<M: GgufMeta + ?Sized>(
    g: &Meta<'_, M>,
    spec: &mut ArchSpec,
    window: Option<usize>,
    eps: f32,
) -> Result<(), SpecError> {
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
        });
        spec.layers.iter_mut().for_each(|l| l.ffn = FfnKind::Moe);
        spec.norms.dense_branch_post = Some(plain);
        spec.norms.moe_input = Some(plain);
        spec.norms.moe_post = Some(plain);
    }
    Ok(())
}
