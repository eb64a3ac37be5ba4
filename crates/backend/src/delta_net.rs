//! Parameter types of the gated DeltaNet ops ([`Stream::causal_conv1d_silu`],
//! [`Stream::gated_delta_rule`]), the token mixer of Qwen3-Next and
//! Qwen3.5/3.6's linear-attention layers (Yang, Kautz, Hatamizadeh 2024,
//! "Gated Delta Networks"; normative reference: HF
//! `modeling_qwen3_5_moe.py` of transformers 5.24.0, `causal_conv1d_fn` /
//! `causal_conv1d_update`, and `torch_recurrent_gated_delta_rule` token by
//! token or `torch_chunk_gated_delta_rule` in chunks of 64 tokens, the same
//! recurrence summed in another order).
//!
//! Both ops carry a per-sequence state that replaces a KV cache and does
//! not grow with the sequence:
//!
//! - convolution: the last `kernel − 1` inputs `[kernel − 1, channels]`,
//!   oldest first;
//! - recurrence: `S [v_heads, k_head_dim, v_head_dim]`.
//!
//! A call with `fresh` set starts the sequence: it reads both states as
//! zeros (whatever the buffers hold) and writes them. So a sequence that
//! restarts at position 0 never sees a stale state.
//!
//! [`Stream::causal_conv1d_silu`]: crate::Stream::causal_conv1d_silu
//! [`Stream::gated_delta_rule`]: crate::Stream::gated_delta_rule

use crate::{check_len, BackendError, Device};

/// One depthwise causal convolution call: `n_tokens` rows of `channels`,
/// a kernel of `kernel` taps per channel (`weight[c · kernel + j]`, tap
/// `kernel − 1` on the current token):
///
/// ```text
/// out[t, c] = silu(Σ_j weight[c, j] · in[t − (kernel − 1) + j, c])
/// ```
///
/// where inputs before the call's first token come from the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvParams {
    pub n_tokens: usize,
    pub channels: usize,
    pub kernel: usize,
    /// The first call of a sequence: the state reads as zeros.
    pub fresh: bool,
}

impl ConvParams {
    /// Elements of the convolution state.
    pub const fn state_len(&self) -> usize {
        (self.kernel - 1) * self.channels
    }

    /// Checks the shape and the lengths of the op's buffers.
    pub fn check(
        &self,
        x: usize,
        state: usize,
        weight: usize,
        out: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "causal_conv1d_silu";
        if self.kernel < 2 || self.channels == 0 || self.n_tokens == 0 {
            return Err(BackendError::Shape {
                op: OP,
                detail: format!(
                    "{} tokens of {} channels, kernel {} (kernel ≥ 2)",
                    self.n_tokens, self.channels, self.kernel
                ),
            });
        }
        if weight != self.channels * self.kernel {
            return Err(BackendError::Shape {
                op: OP,
                detail: format!(
                    "weight of {weight} elements for {} channels of {} taps",
                    self.channels, self.kernel
                ),
            });
        }
        check_len(OP, "x", x, self.n_tokens * self.channels)?;
        check_len(OP, "state", state, self.state_len())?;
        check_len(OP, "out", out, self.n_tokens * self.channels)
    }
}

/// One gated delta rule call over `n_tokens` tokens. Per token `t` and
/// value head `h` (key head `h / (v_heads / k_heads)`):
///
/// ```text
/// q, k  = l2norm(q)·k_head_dim^-½, l2norm(k)          l2norm(x) = x / sqrt(Σx² + 1e-6)
/// β     = sigmoid(beta[t, h]) ;  g = −exp(a_log[h]) · softplus(alpha[t, h] + dt_bias[h])
/// S_h   = S_h · exp(g) ;  S_h += k ⊗ β(v − S_hᵀk) ;  out[t, h] = S_hᵀq
/// ```
///
/// The mixed input row is `[q (k_heads · k_head_dim), k (same), v (v_heads
/// · v_head_dim)]`, the convolution's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaNetParams {
    pub n_tokens: usize,
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_head_dim: usize,
    pub v_head_dim: usize,
    /// The first call of a sequence: the state reads as zeros.
    pub fresh: bool,
}

impl DeltaNetParams {
    /// Width of a mixed `[q, k, v]` row.
    pub const fn row(&self) -> usize {
        2 * self.k_heads * self.k_head_dim + self.v_heads * self.v_head_dim
    }
    /// Elements of the recurrent state.
    pub const fn state_len(&self) -> usize {
        self.v_heads * self.k_head_dim * self.v_head_dim
    }

    /// Checks the shape and the lengths of the op's buffers.
    pub fn check(&self, lens: &DeltaNetLens) -> Result<(), BackendError> {
        const OP: &str = "gated_delta_rule";
        let dims = [self.k_heads, self.v_heads, self.k_head_dim, self.v_head_dim];
        if dims.contains(&0) || self.n_tokens == 0 || self.v_heads % self.k_heads != 0 {
            return Err(BackendError::Shape {
                op: OP,
                detail: format!(
                    "{} tokens, {} value heads of {} over {} key heads of {} \
                     (value heads a multiple of key heads)",
                    self.n_tokens, self.v_heads, self.v_head_dim, self.k_heads, self.k_head_dim
                ),
            });
        }
        for (what, len) in [("a_log", lens.a_log), ("dt_bias", lens.dt_bias)] {
            if len != self.v_heads {
                return Err(BackendError::Shape {
                    op: OP,
                    detail: format!("{what} has {len} elements for {} value heads", self.v_heads),
                });
            }
        }
        let n = self.n_tokens;
        check_len(OP, "qkv", lens.qkv, n * self.row())?;
        check_len(OP, "alpha", lens.alpha, n * self.v_heads)?;
        check_len(OP, "beta", lens.beta, n * self.v_heads)?;
        check_len(OP, "state", lens.state, self.state_len())?;
        check_len(OP, "out", lens.out, n * self.v_heads * self.v_head_dim)
    }
}

/// Lengths (elements) of the buffers and vectors of one
/// [`crate::Stream::gated_delta_rule`] call, for [`DeltaNetParams::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaNetLens {
    pub qkv: usize,
    pub alpha: usize,
    pub beta: usize,
    pub a_log: usize,
    pub dt_bias: usize,
    pub state: usize,
    pub out: usize,
}

/// The per-token inputs and weights of [`crate::Stream::gated_delta_rule`].
pub struct DeltaNetInput<'a, D: Device> {
    /// `[n_tokens, 2 · k_heads · k_head_dim + v_heads · v_head_dim]`
    pub qkv: &'a D::Buf,
    /// Decay-rate logits `[n_tokens, v_heads]` (`in_proj_a · x`).
    pub alpha: &'a D::Buf,
    /// Write-strength logits `[n_tokens, v_heads]` (`in_proj_b · x`).
    pub beta: &'a D::Buf,
    /// `[v_heads]`
    pub a_log: &'a D::Vector,
    /// `[v_heads]`
    pub dt_bias: &'a D::Vector,
}

impl<D: Device> Clone for DeltaNetInput<'_, D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D: Device> Copy for DeltaNetInput<'_, D> {}
