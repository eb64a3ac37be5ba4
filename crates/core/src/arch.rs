//! `ArchSpec`: what a decoder-only transformer computes, as data.
//!
//! Every supported family is one value of this type; the generic decoder reads
//! it and contains no per-family flow. The axes follow the checklist in
//! FAMILIES.md; the normative reference for each family is its
//! `modeling_<type>.py` in HF transformers 5.24.0.
//!
//! Per layer `l` with residual stream `h` (all norms RMS):
//!
//! ```text
//! a   = attn_norm(h)
//! q,k,v = a·Wq (+bq), a·Wk (+bk), a·Wv (+bv)       heads: q [n_heads, d], k/v [n_kv, d]
//! q,k = q_norm(q), k_norm(k) (per head, optional);  v = v_norm(v) (optional)
//! q,k = rope(q,k, pos)   (layer's rope; none on NoPE layers; only `rotary_dim` dims)
//! o   = softmax(q·kᵀ·scale [softcap] [+sink], window) · v ;  o *= sigmoid(a·Wg) (output gate)
//! h  += post_attn_norm(o·Wo (+bo))                 (post norm only for sandwich families)
//! f   = ffn_norm(h)
//! h  += post_ffn_norm(FFN(f))                       FFN = dense | MoE (+ shared / dense branch)
//! logits = softcap(multiplier · final_norm(h)·W_out)
//! ```

use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// A model family, by its id: what an install's manifest stores (`llama`,
/// `qwen3_moe`, `gpt_oss`, ...). Everything else about a family (its
/// display name, its names in each source format, how it is read) lives
/// in its module of `turbospark_format::families`, whose registry resolves
/// the id; a family is known to a build when a module there declares it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Family(Cow<'static, str>);

impl Family {
    /// The family whose id is `id` (snake_case, as manifests store it).
    pub const fn new(id: &'static str) -> Self {
        Family(Cow::Borrowed(id))
    }

    pub fn id(&self) -> &str {
        &self.0
    }
}

/// How an RMS norm applies its weight: `x / rms(x) * s` where `s` is
/// `w` (plain), `1 + w` (centered, Gemma's zero-initialised weights) or 1
/// (no-scale: the norm has no weight tensor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormScale {
    Plain,
    Centered,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NormSpec {
    pub scale: NormScale,
    pub eps: f32,
}

impl NormSpec {
    pub const fn plain(eps: f32) -> Self {
        NormSpec {
            scale: NormScale::Plain,
            eps,
        }
    }
    pub const fn centered(eps: f32) -> Self {
        NormSpec {
            scale: NormScale::Centered,
            eps,
        }
    }
    pub const fn no_scale(eps: f32) -> Self {
        NormSpec {
            scale: NormScale::None,
            eps,
        }
    }
    /// Whether the checkpoint carries a weight vector for this norm.
    pub const fn has_weight(&self) -> bool {
        !matches!(self.scale, NormScale::None)
    }
}

/// Which dimension pairs a rotary embedding rotates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RopeKind {
    /// Pairs `(i, i + rotary_dim/2)`: HF `rotate_half`, llama.cpp NEOX.
    Neox,
    /// Adjacent pairs `(2i, 2i+1)`: llama.cpp NORMAL, used by GGUF llama
    /// checkpoints whose q/k rows the converter permuted.
    Interleaved,
}

/// Frequency scaling on top of `theta^(-2i/d)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RopeScaling {
    None,
    /// Position interpolation: frequencies divided by `factor`.
    Linear {
        factor: f32,
    },
    /// YaRN (Peng et al. 2023) as in HF `_compute_yarn_parameters`:
    /// interpolation/extrapolation blend between `beta_slow` and `beta_fast`
    /// rotations, cos/sin multiplied by `attention_factor`.
    Yarn {
        factor: f32,
        original_max_position: usize,
        beta_fast: f32,
        beta_slow: f32,
        attention_factor: f32,
        /// HF `truncate` (default true): round the correction range to integers.
        truncate: bool,
    },
    /// Gemma 4 "proportional": pairs span the whole head but only the first
    /// `rotated_pairs` rotate (the rest have frequency 0); frequencies are
    /// divided by `factor`.
    Proportional {
        factor: f32,
        rotated_pairs: usize,
    },
    /// Llama 3.1 frequency-dependent scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RopeSpec {
    pub kind: RopeKind,
    pub theta: f32,
    /// Number of leading head dimensions that rotate (head_dim unless the
    /// family uses partial rotary).
    pub rotary_dim: usize,
    pub scaling: RopeScaling,
}

/// Gated feed-forward activation `act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Activation {
    /// `silu(g) * u`.
    Swiglu,
    /// gpt-oss: `g = min(g, limit)`, `u = clamp(u, -limit, limit)`,
    /// `(u + 1) * g * sigmoid(alpha * g)`.
    ClampedSwiglu { alpha: f32, limit: f32 },
    /// `gelu_tanh(g) * u`.
    GeluTanh,
}

/// How router logits become (expert, weight) pairs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RouterKind {
    /// softmax over all experts → top-k → optional renormalisation
    /// (Mixtral, Qwen3-MoE).
    SoftmaxTopK { renormalize: bool },
    /// top-k on raw logits (router has a bias) → softmax over the k (gpt-oss).
    TopKSoftmax,
    /// DeepSeek-V3 / GLM-4.5: `s = sigmoid(logits)`; groups ranked by the sum
    /// of their top-2 `s + bias`, best `topk_group` kept; top-k on `s + bias`
    /// inside them; weights are the chosen `s`, optionally renormalised, times
    /// `scaling`.
    SigmoidGrouped {
        n_group: usize,
        topk_group: usize,
        renormalize: bool,
        scaling: f32,
    },
    /// Gemma 4: router input is `rms_noscale(h) * scale * hidden^-0.5` where
    /// `h` is the residual stream entering the FFN block and `scale` the
    /// learned `ffn_gate_inp.scale` vector; linear → softmax → top-k →
    /// renormalise → times `ffn_gate_inp.expert_scale[e]`.
    Gemma4,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MoeSpec {
    pub num_experts: usize,
    pub top_k: usize,
    /// Intermediate size of one routed expert.
    pub expert_intermediate: usize,
    pub router: RouterKind,
    /// The router linear has a bias (gpt-oss).
    pub router_bias: bool,
    /// Routed experts carry gate/up/down biases (gpt-oss).
    pub expert_biases: bool,
    /// Intermediate size of the always-on shared expert, if any.
    pub shared_intermediate: Option<usize>,
    /// A dense MLP runs beside the experts and is summed with them (Gemma 4).
    pub parallel_dense: bool,
    /// The shared expert's output is scaled by `sigmoid(w·x)`, one learned
    /// row `ffn_gate_inp_shexp` (Qwen2-MoE, Qwen3.5).
    #[serde(default)]
    pub shared_gate: bool,
}

/// Feed-forward block of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FfnKind {
    Dense,
    Moe,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LayerSpec {
    /// Head dimension of this layer's q/k/v (families such as Gemma 4 use a
    /// wider head on full-attention layers).
    pub head_dim: usize,
    pub num_kv_heads: usize,
    /// Sliding-window size in tokens (`None` = full causal attention). A
    /// query at position `p` sees keys at positions `> p - window`.
    pub window: Option<usize>,
    /// Rotary embedding of this layer (`None` = NoPE).
    pub rope: Option<RopeSpec>,
    pub ffn: FfnKind,
    /// The layer has no v projection: values are the raw k projection
    /// (before k norm and rope), then the v norm (Gemma 4 full layers with
    /// `attention_k_eq_v`).
    pub value_from_key: bool,
    /// What mixes the tokens: attention over a KV cache, or a gated
    /// DeltaNet recurrence ([`DeltaNetSpec`]).
    #[serde(default, skip_serializing_if = "Mixer::is_attention")]
    pub mixer: Mixer,
}

/// The token mixer of a layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mixer {
    /// Softmax attention over the layer's KV cache.
    #[default]
    Attention,
    /// Gated DeltaNet linear attention ([`ArchSpec::delta_net`]): a
    /// constant-size recurrent state per sequence instead of a KV cache.
    DeltaNet,
}

impl Mixer {
    pub fn is_attention(&self) -> bool {
        *self == Mixer::Attention
    }
}

/// Gated DeltaNet (Yang et al. 2024; HF `Qwen3_5MoeGatedDeltaNet` of
/// transformers 5.24.0), the linear-attention layers of Qwen3-Next and
/// Qwen3.5/3.6. For a token `x` (after the layer's input norm):
///
/// ```text
/// c      = silu(conv1d_causal(W_qkv·x))    depthwise, kernel `conv_kernel`, state: the last k−1 inputs
/// q, k, v = split(c)                        q, k [k_heads, k_head_dim], v [v_heads, v_head_dim]
/// q, k   = l2norm(q)·k_head_dim^-½, l2norm(k);  each k head serves v_heads/k_heads consecutive v heads
/// β      = sigmoid(W_b·x) ;  g = −exp(A_log) · softplus(W_a·x + dt_bias)      per v head
/// S      = S·exp(g) ;  S += k ⊗ β(v − Sᵀk) ;  o = Sᵀq                        S [v_heads, k_head_dim, v_head_dim]
/// out    = W_out · (rms(o)·w ⊙ silu(W_z·x))                                  per v head, plain weight
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeltaNetSpec {
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_head_dim: usize,
    pub v_head_dim: usize,
    pub conv_kernel: usize,
}

impl DeltaNetSpec {
    /// Width of the q and k parts of the mixed projection.
    pub const fn key_dim(&self) -> usize {
        self.k_heads * self.k_head_dim
    }
    /// Width of the v part (and of the output before `W_out`).
    pub const fn value_dim(&self) -> usize {
        self.v_heads * self.v_head_dim
    }
    /// Channels of the convolution: `[q, k, v]`.
    pub const fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    /// Elements of one layer's convolution state, `[conv_kernel − 1, conv_dim]`.
    pub const fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }
    /// Elements of one layer's recurrent state, `[v_heads, k_head_dim, v_head_dim]`.
    pub const fn recurrent_state_len(&self) -> usize {
        self.v_heads * self.k_head_dim * self.v_head_dim
    }
}

/// Attention options shared by all layers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AttentionSpec {
    pub q_bias: bool,
    pub k_bias: bool,
    pub v_bias: bool,
    pub o_bias: bool,
    /// A learned per-head logit joins the softmax denominator (gpt-oss).
    pub sinks: bool,
    /// `o *= sigmoid(x · W_gate)` before the output projection (Muse Glimmer).
    pub output_gate: bool,
    /// The same output gate, its rows inside the q projection: per head,
    /// `head_dim` query rows then `head_dim` gate rows (Qwen3.5 `q_proj`,
    /// llama.cpp's `attn_q` of `qwen35moe`).
    #[serde(default)]
    pub gate_in_q: bool,
    /// Multiplier on `q·k` (usually `head_dim^-0.5`).
    pub scale: f32,
    /// `c · tanh(s / c)` on attention scores.
    pub softcap: Option<f32>,
}

impl AttentionSpec {
    /// Biases on all four projections, or on none (HF `attention_bias`).
    pub fn set_biases(&mut self, on: bool) {
        self.q_bias = on;
        self.k_bias = on;
        self.v_bias = on;
        self.o_bias = on;
    }
}

/// Multi-head latent attention (DeepSeek-V2/V3, HF `DeepseekV3Attention`),
/// replacing the q/k/v projections of every layer:
///
/// ```text
/// q      = q_b(rms(q_a·x))  (or q·x without q_lora_rank)  per head [nope, rope]
/// [c, kr] = kv_a·x ;  c = rms(c)                           c [kv_lora_rank], kr [rope] shared
/// k_h, v_h = kv_b[h]·c                                     [nope], [v_head_dim]
/// o_h    = softmax((q_nope·k_h + q_rope·rope(kr)) · scale) · v_h
/// ```
///
/// The decoder runs the absorbed form: head `h`'s query in latent space is
/// `[rope(q_rope), W_uk[h]ᵀ·q_nope]`, the cache holds one row `[rope(kr), c]`
/// per position (one KV head of `qk_rope_head_dim + kv_lora_rank`, keys and
/// values alike), and `o_h = W_uv[h]·(Σ p·c)`. Each layer's [`LayerSpec`]
/// carries that latent head (`head_dim = qk_rope_head_dim + kv_lora_rank`,
/// one KV head, rope over its first `qk_rope_head_dim` dims).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MlaSpec {
    /// Rank of the low-rank query (`q_a`/`q_b`); `None`: one `q` projection.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// How the checkpoint stores `kv_b`.
    #[serde(default)]
    pub kv_b: KvBLayout,
    /// Eps of the `q_a` and `kv_a` norms: 1e-6 in HF (`DeepseekV3RMSNorm`'s
    /// default, whatever `rms_norm_eps` says); llama.cpp uses the file's
    /// one `layer_norm_rms_epsilon` for every norm.
    #[serde(default = "MlaSpec::default_norm_eps")]
    pub norm_eps: f32,
}

/// The layout of latent attention's key/value up-projection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvBLayout {
    /// HF `kv_b_proj`: one `attn_kv_b` `[heads · (nope + v), kv_lora]`,
    /// per head `W_uk[h]` `[nope, kv_lora]` over `W_uv[h]` `[v, kv_lora]`.
    #[default]
    Fused,
    /// llama.cpp's converter (`deepseek2`): `attn_k_b` `[heads, kv_lora,
    /// nope]` holding each `W_uk[h]ᵀ`, and `attn_v_b` `[heads, v, kv_lora]`
    /// holding each `W_uv[h]`.
    Split,
}

impl MlaSpec {
    /// Width of one head's query and key in the checkpoint (nope + rope).
    pub const fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
    /// Width of one cached row and of the absorbed per-head query.
    pub const fn latent_head_dim(&self) -> usize {
        self.qk_rope_head_dim + self.kv_lora_rank
    }
    /// Eps of HF's `q_a` and `kv_a` norms (it builds them with the default
    /// `DeepseekV3RMSNorm` eps, not `rms_norm_eps`).
    pub const HF_NORM_EPS: f32 = 1e-6;

    fn default_norm_eps() -> f32 {
        Self::HF_NORM_EPS
    }
}

/// Embedding lookup post-processing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingSpec {
    /// Multiplier applied to the looked-up row (Gemma: `sqrt(hidden)`).
    pub scale: f32,
    /// A norm applied to the looked-up row (Muse Glimmer).
    pub norm: Option<NormSpec>,
}

/// The norms of one layer and the final norm.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NormsSpec {
    pub attn_input: NormSpec,
    /// Sandwich norm on the attention output before the residual add.
    pub attn_post: Option<NormSpec>,
    pub ffn_input: NormSpec,
    /// Sandwich norm on the FFN output before the residual add.
    pub ffn_post: Option<NormSpec>,
    /// Per-head norms on q and k, applied before rope.
    pub q: Option<NormSpec>,
    pub k: Option<NormSpec>,
    pub v: Option<NormSpec>,
    pub output: NormSpec,
    /// Gemma 4's parallel dense + MoE block: a norm on the dense branch's
    /// output, a norm on the experts' input (taken from the residual
    /// stream), and a norm on the experts' output; their sum then goes
    /// through `ffn_post`.
    pub dense_branch_post: Option<NormSpec>,
    pub moe_input: Option<NormSpec>,
    pub moe_post: Option<NormSpec>,
}

/// Output head.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HeadSpec {
    /// The head reuses the token embedding matrix.
    pub tied: bool,
    pub multiplier: f32,
    /// `c · tanh(z / c)` on the final logits.
    pub softcap: Option<f32>,
}

/// Everything the generic decoder needs to know about a model, as data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArchSpec {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_heads: usize,
    /// Default kv-head count and head dimension; each [`LayerSpec`] carries
    /// its own (equal to these unless the family varies them per layer).
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Intermediate size of the dense FFN (dense layers, and Gemma 4's
    /// parallel dense branch).
    pub intermediate_size: usize,
    pub max_position: usize,
    pub embedding: EmbeddingSpec,
    pub norms: NormsSpec,
    pub attention: AttentionSpec,
    pub activation: Activation,
    pub moe: Option<MoeSpec>,
    pub head: HeadSpec,
    /// Each layer's output is multiplied by a learned scalar
    /// (`blk.{L}.layer_output_scale.weight`, Gemma 4).
    pub layer_scalar: bool,
    /// Multi-head latent attention in every layer (DeepSeek-V3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<MlaSpec>,
    /// The gated DeltaNet of the layers whose mixer is
    /// [`Mixer::DeltaNet`] (Qwen3.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_net: Option<DeltaNetSpec>,
    pub layers: Vec<LayerSpec>,
}

impl ArchSpec {
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Layers whose FFN is a routed MoE block.
    pub fn moe_layers(&self) -> impl Iterator<Item = usize> + '_ {
        self.layers
            .iter()
            .enumerate()
            .filter(|(_, l)| l.ffn == FfnKind::Moe)
            .map(|(i, _)| i)
    }

    /// Compact description of the attention pattern, e.g. `5×sliding(512), full`
    /// repeated, for `inspect`.
    pub fn layer_pattern(&self) -> String {
        let describe = |l: &LayerSpec| {
            let attn = match (l.mixer, l.window) {
                (Mixer::DeltaNet, _) => "deltanet".to_string(),
                (Mixer::Attention, Some(w)) => format!("swa{w}"),
                (Mixer::Attention, None) => "full".to_string(),
            };
            let rope = match &l.rope {
                Some(r) => format!("rope{}", r.theta),
                None => "nope".to_string(),
            };
            let ffn = match l.ffn {
                FfnKind::Dense => "dense",
                FfnKind::Moe => "moe",
            };
            format!("{attn}/{rope}/{ffn}")
        };
        let mut runs: Vec<(String, usize)> = Vec::new();
        for l in &self.layers {
            let d = describe(l);
            match runs.last_mut() {
                Some((last, n)) if *last == d => *n += 1,
                _ => runs.push((d, 1)),
            }
        }
        runs.iter()
            .map(|(d, n)| {
                if *n > 1 {
                    format!("{n}×{d}")
                } else {
                    d.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Checks internal consistency; returns a description of the first problem.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("layers", self.layers.len()),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        for (i, l) in self.layers.iter().enumerate() {
            if l.head_dim == 0 || l.num_kv_heads == 0 || self.num_heads % l.num_kv_heads != 0 {
                return Err(format!(
                    "layer {i}: num_heads {} must be a positive multiple of num_kv_heads {} (head_dim {})",
                    self.num_heads, l.num_kv_heads, l.head_dim
                ));
            }
            if let Some(r) = &l.rope {
                if r.rotary_dim == 0 || r.rotary_dim > l.head_dim || r.rotary_dim % 2 != 0 {
                    return Err(format!(
                        "layer {i}: rotary_dim {} must be even and in 2..={}",
                        r.rotary_dim, l.head_dim
                    ));
                }
            }
            if l.window == Some(0) {
                return Err(format!("layer {i}: sliding window of 0 tokens"));
            }
            if l.ffn == FfnKind::Moe && self.moe.is_none() {
                return Err(format!("layer {i} is MoE but the spec has no MoE block"));
            }
        }
        if let Some(a) = &self.mla {
            let latent = a.latent_head_dim();
            if a.kv_lora_rank == 0 || a.qk_rope_head_dim == 0 || a.v_head_dim == 0 {
                return Err("latent attention with a zero rank or head width".into());
            }
            if let Some((i, _)) = self.layers.iter().enumerate().find(|(_, l)| {
                l.head_dim != latent
                    || l.num_kv_heads != 1
                    || l.window.is_some()
                    || l.rope.is_some_and(|r| r.rotary_dim != a.qk_rope_head_dim)
            }) {
                return Err(format!(
                    "layer {i}: latent attention needs one KV head of {latent} \
                     (rope over {}), no window",
                    a.qk_rope_head_dim
                ));
            }
        }
        let delta_layers = self.layers.iter().any(|l| l.mixer == Mixer::DeltaNet);
        match (&self.delta_net, delta_layers) {
            (None, true) => return Err("DeltaNet layers without a DeltaNet spec".into()),
            (Some(d), _) => {
                if [d.k_heads, d.v_heads, d.k_head_dim, d.v_head_dim].contains(&0)
                    || d.conv_kernel < 2
                    || d.v_heads % d.k_heads != 0
                {
                    return Err(format!(
                        "DeltaNet: {} value heads of {} over {} key heads of {}, conv kernel {} \
                         (heads and widths positive, value heads a multiple of key heads, kernel ≥ 2)",
                        d.v_heads, d.v_head_dim, d.k_heads, d.k_head_dim, d.conv_kernel
                    ));
                }
            }
            (None, false) => {}
        }
        if let Some(m) = &self.moe {
            if m.top_k == 0 || m.top_k > m.num_experts {
                return Err(format!(
                    "top_k {} must be in 1..={} (num_experts)",
                    m.top_k, m.num_experts
                ));
            }
            if let RouterKind::SigmoidGrouped {
                n_group,
                topk_group,
                ..
            } = m.router
            {
                if n_group == 0 || m.num_experts % n_group != 0 || topk_group > n_group {
                    return Err(format!(
                        "grouped router: {} experts in {n_group} groups keeping {topk_group}",
                        m.num_experts
                    ));
                }
            }
        }
        Ok(())
    }
}
