//! The [`Backend`] trait and the parameter types of its ops.
//!
//! Shapes: a batch of `n` rows of width `d` occupies the first `n · d`
//! elements of a [`Backend::Buf`], row-major. Matrices are `[out, in]`, so
//! `matmul` computes `out[t, o] = Σ_i W[o, i] · x[t, i]`. Every op checks its
//! buffers against the shapes it is given and fails with
//! [`BackendError`] rather than reading or writing out of bounds.

use crate::{BackendError, HostTensor, RopeTable};
use turbospark_core::arch::{Activation, NormSpec};

/// Sizes a session will use, so that ops can run without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Most rows (tokens) in one op call (the prefill chunk).
    pub max_tokens: usize,
    /// Most keys one query attends to (the largest KV capacity).
    pub max_keys: usize,
    /// Widest attention head.
    pub max_head_dim: usize,
}

/// One attention call over a KV cache.
///
/// The cache holds `capacity` rows of `n_kv_heads · head_dim`; position `p`
/// lives in row `p % capacity` (a ring for sliding layers, a plain array when
/// the capacity covers the whole context). Query `t` is at position
/// `first_pos + t` and attends causally to keys `j ≤ first_pos + t`, and only
/// to `j > first_pos + t − window` when a window is set. Query head `h` reads
/// KV head `h / (n_heads / n_kv_heads)` (grouped-query attention).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    pub n_tokens: usize,
    pub first_pos: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub capacity: usize,
    pub window: Option<usize>,
    /// Multiplier on `q · k`.
    pub scale: f32,
    /// `c · tanh(s / c)` on the scaled scores.
    pub softcap: Option<f32>,
}

/// `(expert slot, weight)` for one token and one router rank.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Route {
    /// Index into the `experts` slice given to [`Backend::moe`].
    pub slot: u32,
    pub weight: f32,
}

/// The weights of one routed expert: `down(act(gate·x + bg) ⊙ (up·x + bu)) + bd`.
pub struct ExpertWeights<M, V> {
    /// `[intermediate, hidden]`
    pub gate: M,
    /// `[intermediate, hidden]`
    pub up: M,
    /// `[hidden, intermediate]`
    pub down: M,
    pub gate_bias: Option<V>,
    pub up_bias: Option<V>,
    pub down_bias: Option<V>,
}

/// What [`Backend::moe`] computes on.
pub struct MoeInput<'a, B, M, V> {
    /// `[n_tokens, hidden]`
    pub x: &'a B,
    pub n_tokens: usize,
    /// `[n_tokens, top_k]`, best rank first.
    pub routes: &'a [Route],
    /// The experts the routes' slots index.
    pub experts: &'a [ExpertWeights<M, V>],
    pub activation: Activation,
}

/// Buffers [`Backend::moe`] works in, allocated once per session.
pub struct MoeScratch<B> {
    /// Rows routed to one expert, gathered, then that expert's outputs:
    /// `[max_tokens, hidden]`.
    pub x: B,
    /// `[max_tokens, expert_intermediate]`
    pub gate: B,
    /// `[max_tokens, expert_intermediate]`
    pub up: B,
    /// Unweighted expert outputs per (token, rank): `[max_tokens · top_k, hidden]`.
    pub y: B,
}

/// A compute device: buffers, uploaded weights, and the ops of a decoder.
///
/// Ops take `&self`; a backend that needs internal scratch keeps it behind
/// its own synchronisation and sizes it in [`Backend::reserve`].
pub trait Backend: Send + Sync {
    /// An f32 activation buffer.
    type Buf: Send;
    /// A weight matrix `[out, in]` in its storage format.
    type Matrix: Send + Sync;
    /// An f32 vector (norm weight, bias, sink logits).
    type Vector: Send + Sync;

    /// A short name for logs (`cpu`, `cuda`).
    fn name(&self) -> &'static str;

    /// Uploads a 2-D tensor `[out, in]`.
    fn upload_matrix(&self, t: &HostTensor) -> Result<Self::Matrix, BackendError>;
    /// Uploads a 1-D tensor, widened to f32.
    fn upload_vector(&self, t: &HostTensor) -> Result<Self::Vector, BackendError>;
    /// `[out, in]` of an uploaded matrix.
    fn matrix_shape(&self, m: &Self::Matrix) -> [usize; 2];
    /// Length of an uploaded vector.
    fn vector_len(&self, v: &Self::Vector) -> usize;
    /// Replaces an uploaded matrix's contents with `t`, which has the same
    /// format and shape (streamed expert slots reuse one matrix per slot).
    /// Backends override it to refresh in place without allocating; the
    /// default uploads anew.
    fn reload_matrix(&self, dst: &mut Self::Matrix, t: &HostTensor) -> Result<(), BackendError> {
        *dst = self.upload_matrix(t)?;
        Ok(())
    }
    /// Replaces an uploaded vector's contents with `t` (same length), as
    /// [`Backend::reload_matrix`] does for matrices.
    fn reload_vector(&self, dst: &mut Self::Vector, t: &HostTensor) -> Result<(), BackendError> {
        *dst = self.upload_vector(t)?;
        Ok(())
    }

    /// A zeroed buffer of `len` f32.
    fn alloc(&self, len: usize) -> Result<Self::Buf, BackendError>;
    /// Sizes internal scratch for a session; ops never allocate afterwards.
    fn reserve(&self, limits: &Limits) -> Result<(), BackendError>;
    /// Copies `src` into the start of `dst`.
    fn write(&self, dst: &mut Self::Buf, src: &[f32]) -> Result<(), BackendError>;
    /// Copies the start of `src` into `dst`.
    fn read(&self, src: &Self::Buf, dst: &mut [f32]) -> Result<(), BackendError>;
    /// `dst[dst_at .. dst_at + len] = src[src_at .. src_at + len]`.
    fn copy(
        &self,
        src: &Self::Buf,
        src_at: usize,
        dst: &mut Self::Buf,
        dst_at: usize,
        len: usize,
    ) -> Result<(), BackendError>;

    /// `out[t] = table[tokens[t]]`, dequantized (`table` is `[vocab, d]`).
    fn embed(
        &self,
        table: &Self::Matrix,
        tokens: &[u32],
        out: &mut Self::Buf,
    ) -> Result<(), BackendError>;
    /// `out[t, o] = Σ_i W[o, i] · x[t, i]` for `t < n`.
    fn matmul(
        &self,
        w: &Self::Matrix,
        x: &Self::Buf,
        n: usize,
        out: &mut Self::Buf,
    ) -> Result<(), BackendError>;
    /// `x[t, i] += bias[i]` for `t < n`.
    fn add_bias(
        &self,
        x: &mut Self::Buf,
        bias: &Self::Vector,
        n: usize,
    ) -> Result<(), BackendError>;
    /// RMS norm of each of `rows` rows of width `dim`, in place:
    /// `x / sqrt(mean(x²) + eps) · s`, `s` per [`NormSpec::scale`] (`w`,
    /// `1 + w`, or 1 with no weight).
    fn rms_norm(
        &self,
        x: &mut Self::Buf,
        rows: usize,
        dim: usize,
        spec: NormSpec,
        weight: Option<&Self::Vector>,
    ) -> Result<(), BackendError>;
    /// Rotates `x` `[n_tokens, n_heads, head_dim]` in place; token `t` is at
    /// position `first_pos + t`.
    fn rope(
        &self,
        x: &mut Self::Buf,
        n_tokens: usize,
        n_heads: usize,
        head_dim: usize,
        first_pos: usize,
        table: &RopeTable,
    ) -> Result<(), BackendError>;
    /// Stores `n_tokens` rows of `row_len` from `src` at cache rows
    /// `(first_pos + t) % capacity`.
    fn kv_write(
        &self,
        cache: &mut Self::Buf,
        src: &Self::Buf,
        n_tokens: usize,
        row_len: usize,
        first_pos: usize,
        capacity: usize,
    ) -> Result<(), BackendError>;
    /// `out[t, h] = Σ_j softmax_j(s_j) · v_j` with `s_j = scale · q[t,h]·k_j`
    /// (soft-capped if asked) over the keys described by [`AttentionParams`].
    /// A sink logit per head (`sinks[h]`) joins the softmax denominator and
    /// is then dropped.
    fn attention(
        &self,
        q: &Self::Buf,
        k_cache: &Self::Buf,
        v_cache: &Self::Buf,
        params: &AttentionParams,
        sinks: Option<&Self::Vector>,
        out: &mut Self::Buf,
    ) -> Result<(), BackendError>;
    /// `gate[i] = act(gate[i]) · up[i]` (or gpt-oss's clamped form) for `i < len`.
    fn glu(
        &self,
        gate: &mut Self::Buf,
        up: &Self::Buf,
        len: usize,
        act: Activation,
    ) -> Result<(), BackendError>;
    /// `dst[i] += src[i]` for `i < len`.
    fn add(&self, dst: &mut Self::Buf, src: &Self::Buf, len: usize) -> Result<(), BackendError>;
    /// `x[i] *= s` for `i < len`.
    fn scale(&self, x: &mut Self::Buf, len: usize, s: f32) -> Result<(), BackendError>;
    /// `x[i] *= sigmoid(gate[i])` for `i < len`.
    fn mul_sigmoid(
        &self,
        x: &mut Self::Buf,
        gate: &Self::Buf,
        len: usize,
    ) -> Result<(), BackendError>;
    /// `x[i] = c · tanh(x[i] / c)` for `i < len`.
    fn softcap(&self, x: &mut Self::Buf, len: usize, cap: f32) -> Result<(), BackendError>;
    /// Routed experts: `out[t] = Σ_r routes[t·k + r].weight · E_slot(x[t])`
    /// with `k = routes.len() / n_tokens`, summed in rank order `r = 0, 1, …`
    /// so that the result depends only on the route. `x` and `out` are
    /// `[n_tokens, hidden]`.
    fn moe(
        &self,
        input: MoeInput<'_, Self::Buf, Self::Matrix, Self::Vector>,
        scratch: &mut MoeScratch<Self::Buf>,
        out: &mut Self::Buf,
    ) -> Result<(), BackendError> {
        let (n, routes) = (input.n_tokens, input.routes);
        let Some(first) = routes.first() else {
            return Ok(());
        };
        let hidden = input
            .experts
            .get(first.slot as usize)
            .map(|e| self.matrix_shape(&e.gate)[1])
            .ok_or(BackendError::BadRoute {
                slot: first.slot as usize,
                available: input.experts.len(),
            })?;
        self.moe_experts(input, scratch, None)?;
        self.moe_combine(n, hidden, routes, scratch, out)
    }
    /// The first half of [`Backend::moe`]: `scratch.y[i] = E_slot(x[t])` for
    /// each route `i = t·k + r`, restricted to the routes whose slot has
    /// `only[slot] == true` when `only` is given (other rows of `y` are left
    /// as they are). Lets a caller compute the experts it has while others
    /// are still being fetched; each row is computed the same way whatever
    /// the split.
    fn moe_experts(
        &self,
        input: MoeInput<'_, Self::Buf, Self::Matrix, Self::Vector>,
        scratch: &mut MoeScratch<Self::Buf>,
        only: Option<&[bool]>,
    ) -> Result<(), BackendError>;
    /// The second half of [`Backend::moe`]: `out[t] = Σ_r routes[t·k +
    /// r].weight · scratch.y[t·k + r]`, in rank order, rows of `hidden`.
    fn moe_combine(
        &self,
        n_tokens: usize,
        hidden: usize,
        routes: &[Route],
        scratch: &MoeScratch<Self::Buf>,
        out: &mut Self::Buf,
    ) -> Result<(), BackendError>;
}
