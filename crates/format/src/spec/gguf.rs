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
use crate::families::{self, supported_gguf_architectures, FamilyDef};
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

/// A GGUF file's metadata under its architecture's key prefix, with
/// errors naming the key.
pub(crate) struct Meta<'a> {
    pub m: &'a dyn GgufMeta,
    pub arch: &'a str,
    /// The family whose reader reads it.
    pub def: &'static FamilyDef,
}

/// What every family reads the same way, for its own reading to build on.
pub(crate) struct Common {
    /// `attention.sliding_window` (when non-zero).
    pub window: Option<usize>,
    /// `attention.layer_norm_rms_epsilon`.
    pub eps: f32,
    /// The rope every layer starts with.
    pub rope: RopeSpec,
    /// `feed_forward_length`.
    pub intermediate: usize,
}

impl Meta<'_> {
    pub(crate) fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    pub(crate) fn req(&self, k: &str) -> Result<usize, SpecError> {
        let key = self.key(k);
        self.m
            .meta_u64(&key)
            .map(|v| v as usize)
            .ok_or(SpecError::MissingField {
                field: key,
                family: self.def.name.to_string(),
                source_kind: "GGUF metadata",
            })
    }
    pub(crate) fn opt(&self, k: &str) -> Option<usize> {
        self.m.meta_u64(&self.key(k)).map(|v| v as usize)
    }
    pub(crate) fn f(&self, k: &str, default: f64) -> f64 {
        self.m.meta_f64(&self.key(k)).unwrap_or(default)
    }
    pub(crate) fn b(&self, k: &str) -> Option<bool> {
        self.m.meta_bool(&self.key(k))
    }
    /// A per-layer value written either as one number or as an array of
    /// `n` (llama.cpp's `get_key_or_arr`).
    pub(crate) fn per_layer(&self, k: &str, n: usize) -> Result<Option<Vec<usize>>, SpecError> {
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
    pub(crate) fn swa_pattern(&self, n: usize) -> Result<Option<Vec<bool>>, SpecError> {
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
pub fn spec_from_gguf(m: &dyn GgufMeta) -> Result<ArchSpec, SpecError> {
    let arch = m
        .meta_str("general.architecture")
        .ok_or(SpecError::MissingField {
            field: "general.architecture".into(),
            family: "any model".into(),
            source_kind: "GGUF metadata",
        })?;
    let experts = m.meta_u64(&format!("{arch}.expert_count")).unwrap_or(0);
    let def = families::for_gguf(arch, experts).ok_or_else(|| SpecError::UnknownArchitecture {
        found: arch.to_string(),
        source_kind: "GGUF general.architecture",
        supported: supported_gguf_architectures(),
    })?;
    let g = Meta { m, arch, def };

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
            family: def.name.to_string(),
            source_kind: "GGUF metadata",
        })?;
    let eps = g.f("attention.layer_norm_rms_epsilon", 1e-5) as f32;
    let max_position = g.opt("context_length").unwrap_or(4096);
    let intermediate = g.opt("feed_forward_length").unwrap_or(0);
    let rotary_dim = g.opt("rope.dimension_count").unwrap_or(head_dim);
    let theta = g.f("rope.freq_base", 10000.0) as f32;
    let window = g.opt("attention.sliding_window").filter(|w| *w > 0);

    let rope_kind = def.gguf_rope;
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
                // ggml always rounds the correction range
                // (`ggml_rope_yarn_corr_dims`); a family trained otherwise
                // says so in its own reading.
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
        family: def.family(),
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
            gate_in_q: false,
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
        mla: None,
        delta_net: None,
        layers: (0..n_layers)
            .map(|i| LayerSpec {
                head_dim,
                num_kv_heads: kv_heads_per_layer.as_ref().map_or(kv_heads, |v| v[i]),
                window: None,
                rope: Some(rope),
                ffn: FfnKind::Dense,
                value_from_key: false,
                mixer: Mixer::Attention,
            })
            .collect(),
    };

    let common = Common {
        window,
        eps,
        rope,
        intermediate,
    };
    (def.from_gguf)(&g, &common, &mut spec)?;
    spec.validate().map_err(SpecError::Inconsistent)?;
    Ok(spec)
}

/// Every layer slides over `window`, when the file sets one.
pub(crate) fn slide_all(spec: &mut ArchSpec, window: Option<usize>) {
    if let Some(w) = window {
        spec.layers.iter_mut().for_each(|l| l.window = Some(w));
    }
}

/// The routed experts of llama.cpp's MoE architectures: `expert_count`
/// experts, `expert_used_count` chosen by `router`, of width
/// `expert_feed_forward_length`, optional shared experts, the first
/// `leading_dense_block_count` layers dense, router and expert biases where
/// the file has them.
pub(crate) fn routed_experts(
    g: &Meta<'_>,
    c: &Common,
    spec: &mut ArchSpec,
    router: impl FnOnce(&Meta<'_>) -> RouterKind,
) -> Result<(), SpecError> {
    let experts = g.req("expert_count")?;
    let top_k = g.req("expert_used_count")?;
    let expert_inter = g
        .opt("expert_feed_forward_length")
        .unwrap_or(c.intermediate);
    let leading_dense = g.opt("leading_dense_block_count").unwrap_or(0);
    let router = router(g);
    let shared = g.opt("expert_shared_count").unwrap_or(0);
    let has = |n: &str| g.m.has_tensor(n);
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
        shared_gate: false,
    });
    for (i, l) in spec.layers.iter_mut().enumerate() {
        l.ffn = if i < leading_dense {
            FfnKind::Dense
        } else {
            FfnKind::Moe
        };
    }
    Ok(())
}

/// llama.cpp's softmax router: softmax over all experts, top-k,
/// renormalised unless `expert_weights_norm` is false.
pub(crate) fn softmax_router(g: &Meta<'_>) -> RouterKind {
    RouterKind::SoftmaxTopK {
        renormalize: g.b("expert_weights_norm").unwrap_or(true),
    }
}
