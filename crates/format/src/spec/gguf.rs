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
    fn has_tensor(&self, name: &str) -> bool;
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
    if matches!(family, Family::MuseGlimmer | Family::Gemma4) {
        return Err(SpecError::Unsupported {
            what: format!("GGUF architecture {arch}"),
            detail: "convert this family from its HF checkpoint".into(),
        });
    }

    let hidden = g.req("embedding_length")?;
    let n_layers = g.req("block_count")?;
    let heads = g.req("attention.head_count")?;
    if heads == 0 {
        return Err(SpecError::Inconsistent("attention.head_count is 0".into()));
    }
    let kv_heads = g.opt("attention.head_count_kv").unwrap_or(heads);
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

    let rope_kind = match family {
        Family::Llama | Family::Mixtral => RopeKind::Interleaved,
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
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: if factor > 1.0 {
                    (0.1 * factor.ln() + 1.0) as f32
                } else {
                    1.0
                },
                truncate: true,
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
            .map(|_| LayerSpec {
                head_dim,
                num_kv_heads: kv_heads,
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
            // llama.cpp: 5 sliding : 1 full, local rope base 10000.
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
                theta: 10000.0,
                ..rope
            };
            for (i, l) in spec.layers.iter_mut().enumerate() {
                if (i + 1) % 6 != 0 {
                    l.window = window;
                    l.rope = Some(local);
                }
            }
        }
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
        // Refused before any metadata was read.
        Family::MuseGlimmer | Family::Gemma4 => {}
    }
    spec.validate().map_err(SpecError::Inconsistent)?;
    Ok(spec)
}
