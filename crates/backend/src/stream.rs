//! The [`Stream`] trait: a per-session queue of ops with its own scratch.
//!
//! Ops are enqueued in call order and may run after the call returns (a GPU
//! stream); they complete in order. Nothing a caller can observe changes
//! out of order: a buffer written by one op is read by the next as if each
//! had finished. The host sees device data only at a synchronisation point:
//! [`Stream::read`], [`Stream::read_routes`], or [`Stream::synchronize`]
//! after [`Stream::read_async`]. Host data handed to an op (tokens, a
//! written slice, an expert slot's bytes) may be reused as soon as the call
//! returns: the stream stages it. On the CPU every op completes before it
//! returns, so every call is trivially a synchronisation point.
//!
//! Shapes: a batch of `n` rows of width `d` occupies the first `n · d`
//! elements of a buffer, row-major. Matrices are `[out, in]`, so `matmul`
//! computes `out[t, o] = Σ_i W[o, i] · x[t, i]`. Every op checks its
//! buffers (length and [`DType`](crate::DType)) against the shapes it is
//! given and fails with [`BackendError`] rather than reading or writing out
//! of bounds. Ops never allocate: a stream's scratch is sized when it is
//! created ([`Device::stream`](crate::Device::stream)).

use crate::{
    BackendError, ConvParams, DeltaNetInput, DeltaNetParams, Device, ExpertBank, ExpertTensors,
    MoeInput, MoeScratch, Projection, RopeTable, Route, RouterSpec, RouterTables,
};
use turbospark_core::arch::{Activation, NormSpec};

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

impl AttentionParams {
    /// The first key position a query at `pos` sees.
    pub fn first_key(&self, pos: usize) -> usize {
        match self.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        }
    }

    /// Checks the heads and that the cache still holds every key the
    /// queries see; returns the most keys one query sees. Call with
    /// `n_tokens > 0`.
    pub fn check(&self) -> Result<usize, BackendError> {
        if self.n_kv_heads == 0
            || self.n_heads % self.n_kv_heads != 0
            || self.head_dim == 0
            || self.capacity == 0
        {
            return Err(BackendError::Shape {
                op: "attention",
                detail: format!(
                    "{} heads over {} kv heads of {} dims, capacity {}",
                    self.n_heads, self.n_kv_heads, self.head_dim, self.capacity
                ),
            });
        }
        let newest = self.first_pos + self.n_tokens - 1;
        let oldest = self.first_key(self.first_pos);
        if newest - oldest + 1 > self.capacity {
            return Err(BackendError::KeysEvicted {
                position: self.first_pos,
                oldest,
                newest,
                capacity: self.capacity,
            });
        }
        Ok(newest - self.first_key(newest) + 1)
    }
}

/// One sequence's queries in [`Stream::attention_parts`]: `params.n_tokens`
/// rows of the queries, attending to this sequence's own cache.
#[derive(Debug)]
pub struct AttentionPart<'a, B> {
    pub k_cache: &'a B,
    pub v_cache: &'a B,
    pub params: AttentionParams,
}

// By hand: a derive would ask `B: Copy`, and only references are copied.
impl<B> Clone for AttentionPart<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for AttentionPart<'_, B> {}

/// One per-head matmul ([`Stream::head_matmul`]) over a weight matrix
/// `W` `[rows_total, cols]` that stacks a block of `head_stride` rows per
/// head: head `h`'s matrix `W_h` is rows `h · head_stride + first_row ..
/// + rows` (DeepSeek's `attn_kv_b` stacks `W_uk[h]` `[nope, kv_lora]` over
/// `W_uv[h]` `[v, kv_lora]` for each head). The input of token `t`, head
/// `h` is `x[(t · n_heads + h) · x_stride + x_at ..]`, its output
/// `out[(t · n_heads + h) · out_stride + out_at ..]`:
///
/// ```text
/// plain:      out[t, h, o] = Σ_{i < cols} W_h[o, i] · x[t, h, i]   (o < rows)
/// transposed: out[t, h, j] = Σ_{i < rows} W_h[i, j] · x[t, h, i]   (j < cols)
/// ```
///
/// Elements of `out` outside each head's output are left as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadMatmul {
    pub n_tokens: usize,
    pub n_heads: usize,
    pub head_stride: usize,
    pub first_row: usize,
    pub rows: usize,
    /// Multiply by each head's matrix transposed.
    pub transpose: bool,
    pub x_stride: usize,
    pub x_at: usize,
    pub out_stride: usize,
    pub out_at: usize,
}

impl HeadMatmul {
    /// The lengths of one head's input and output for a matrix of `cols`
    /// columns.
    pub fn widths(&self, cols: usize) -> (usize, usize) {
        if self.transpose {
            (self.rows, cols)
        } else {
            (cols, self.rows)
        }
    }

    /// Checks the head blocks against the matrix `[w_rows, cols]` and the
    /// strided rows against `x_len` and `out_len` elements.
    pub fn check(
        &self,
        w_rows: usize,
        cols: usize,
        x_len: usize,
        out_len: usize,
    ) -> Result<(), BackendError> {
        const OP: &str = "head_matmul";
        let (input, output) = self.widths(cols);
        let last_row = (self.n_heads.max(1) - 1)
            .checked_mul(self.head_stride)
            .and_then(|r| r.checked_add(self.first_row))
            .and_then(|r| r.checked_add(self.rows));
        let bad = |detail: String| Err(BackendError::Shape { op: OP, detail });
        if self.rows == 0 || self.first_row + self.rows > self.head_stride {
            return bad(format!(
                "rows {}..{} of a {}-row head block",
                self.first_row,
                self.first_row + self.rows,
                self.head_stride
            ));
        }
        if last_row.is_none_or(|r| r > w_rows) {
            return bad(format!(
                "{} heads of {} rows need more than the matrix's {w_rows}",
                self.n_heads, self.head_stride
            ));
        }
        if self.x_at + input > self.x_stride || self.out_at + output > self.out_stride {
            return bad(format!(
                "a head's input ({input} at {} of {}) or output ({output} at {} of {}) \
                 overruns its stride",
                self.x_at, self.x_stride, self.out_at, self.out_stride
            ));
        }
        let heads = self.n_tokens * self.n_heads;
        crate::check_len(OP, "x", x_len, heads * self.x_stride)?;
        crate::check_len(OP, "out", out_len, heads * self.out_stride)
    }
}

/// Checks that `table` rotates at most `head_dim` dimensions in pairs.
pub fn check_rope(table: &RopeTable, head_dim: usize) -> Result<(), BackendError> {
    if table.rotary_dim > head_dim || table.rotary_dim != 2 * table.pairs() {
        return Err(BackendError::Shape {
            op: "rope",
            detail: format!(
                "{} rotary dims ({} pairs) on a {head_dim}-wide head",
                table.rotary_dim,
                table.pairs()
            ),
        });
    }
    Ok(())
}

/// Checks that every token names a row of a `rows`-row embedding table.
pub fn check_tokens(tokens: &[u32], rows: usize) -> Result<(), BackendError> {
    match tokens.iter().find(|&&t| t as usize >= rows) {
        Some(&tok) => Err(BackendError::Shape {
            op: "embed",
            detail: format!("token {tok} outside the {rows}-row table"),
        }),
        None => Ok(()),
    }
}

/// The mismatch of an expert's biases with its bank's (one has a bias the
/// other lacks).
pub fn bias_mismatch(expert: &ExpertTensors) -> BackendError {
    BackendError::Shape {
        op: "fill_slot",
        detail: format!(
            "{} has other biases than the bank's experts",
            expert.gate.name
        ),
    }
}

/// A per-session queue of ops on device `D` (see the module docs).
///
/// An op borrows its buffers only for the call: the caller may drop a
/// buffer as soon as the call returns, even while the op is still queued
/// (or, on the CUDA backend, held back for the next op to join, or
/// recorded in a step that is replayed later). A stream whose ops run
/// later keeps what they use alive until they have run (`check_add`'s
/// dropped-source cases in the conformance suite).
pub trait Stream<D: Device>: Send {
    /// Waits until every queued op and copy has completed.
    fn synchronize(&mut self) -> Result<(), BackendError>;

    /// Whether this stream can record a decode step (one token, every
    /// op on the device, no host round trip) once and replay it for later
    /// tokens ([`Stream::replay_step`]). A GPU stream does (a CUDA graph);
    /// the CPU does not.
    fn records_steps(&self) -> bool {
        false
    }
    /// Starts recording the decode step of `token` at `position`: the ops
    /// queued until [`Stream::end_step`] run (as usual) and are kept, with
    /// the token and position they were given bound to the step's
    /// parameters rather than to these values, so that a replay at another
    /// token and position computes what the same calls would. Only ops
    /// that need no host data beyond their arguments may be queued while
    /// recording (no `write`, `read`, `write_routes`, `fill_slot`).
    fn begin_step(&mut self, token: u32, position: usize) -> Result<(), BackendError> {
        let _ = (token, position);
        Err(BackendError::Device(
            "this backend does not record decode steps".into(),
        ))
    }
    /// Ends the recording started by [`Stream::begin_step`] and queues the
    /// recorded step.
    fn end_step(&mut self) -> Result<(), BackendError> {
        Err(BackendError::Device(
            "this backend does not record decode steps".into(),
        ))
    }
    /// Queues the recorded step for `token` at `position`; `false` (and
    /// nothing queued) when no step is recorded.
    fn replay_step(&mut self, token: u32, position: usize) -> Result<bool, BackendError> {
        let _ = (token, position);
        Ok(false)
    }
    /// Forgets the recorded step (the next decode records a new one).
    fn forget_step(&mut self) {}

    /// Queues a copy of `src` into the start of `dst` (an f32 buffer).
    fn write(&mut self, dst: &mut D::Buf, src: &[f32]) -> Result<(), BackendError>;
    /// Queues a copy of the first `len` elements of `src` into `dst`, valid
    /// after the next [`Stream::synchronize`].
    fn read_async(
        &mut self,
        src: &D::Buf,
        len: usize,
        dst: &mut D::HostBuf,
    ) -> Result<(), BackendError>;
    /// A synchronisation point: waits for the queue, then copies the start
    /// of `src` into `dst`.
    fn read(&mut self, src: &D::Buf, dst: &mut [f32]) -> Result<(), BackendError>;
    /// `dst[dst_at .. dst_at + len] = src[src_at .. src_at + len]`.
    fn copy(
        &mut self,
        src: &D::Buf,
        src_at: usize,
        dst: &mut D::Buf,
        dst_at: usize,
        len: usize,
    ) -> Result<(), BackendError>;
    /// Queues a copy of `src` (`[n_tokens, top_k]`) into the start of `dst`.
    fn write_routes(&mut self, dst: &mut D::Routes, src: &[Route]) -> Result<(), BackendError>;
    /// A synchronisation point: the first `dst.len()` routes of `src`.
    fn read_routes(&mut self, src: &D::Routes, dst: &mut [Route]) -> Result<(), BackendError>;
    /// Queues replacing slot `slot` of `bank` with `expert` (same shapes as
    /// the bank's), e.g. after the expert store read it into host memory.
    /// A backend may go on computing from `expert`'s bytes in place until
    /// the slot is filled again (the CPU does, so the expert store fills
    /// slot `s` from its host slot `s` only); a device that copies them
    /// from memory it pinned ([`Device::pin_host`]) reads them
    /// asynchronously, so they may be rewritten only after
    /// [`Stream::wait_slot_fills`].
    fn fill_slot(
        &mut self,
        bank: &mut D::Bank,
        slot: usize,
        expert: &ExpertTensors,
    ) -> Result<(), BackendError>;

    /// Whether this stream fills a slot in pieces
    /// ([`Stream::fill_slot_rows`], [`Stream::fill_slot_biases`]), so that
    /// a caller receiving an expert's bytes in pieces (the expert store's
    /// parallel reads) can hand each on as it arrives. Without it, only
    /// [`Stream::fill_slot`].
    fn fills_slot_rows(&self) -> bool {
        false
    }

    /// Queues replacing rows `rows` of projection `part` of slot `slot` of
    /// `bank` with those rows of `expert` (whose projections have the
    /// bank's shapes; only the rows named are read, and they follow the
    /// same rules as [`Stream::fill_slot`]'s bytes). A slot is complete once
    /// every row of the three projections and the biases
    /// ([`Stream::fill_slot_biases`]) have been filled, in any order; the
    /// bits are those [`Stream::fill_slot`] gives. Only where
    /// [`Stream::fills_slot_rows`].
    fn fill_slot_rows(
        &mut self,
        _bank: &mut D::Bank,
        _slot: usize,
        _expert: &ExpertTensors,
        _part: Projection,
        _rows: std::ops::Range<usize>,
    ) -> Result<(), BackendError> {
        Err(BackendError::Unsupported {
            op: "fill_slot_rows",
        })
    }

    /// Queues replacing the biases of slot `slot` of `bank` with `expert`'s
    /// (see [`Stream::fill_slot_rows`]). Only where
    /// [`Stream::fills_slot_rows`].
    fn fill_slot_biases(
        &mut self,
        _bank: &mut D::Bank,
        _slot: usize,
        _expert: &ExpertTensors,
    ) -> Result<(), BackendError> {
        Err(BackendError::Unsupported {
            op: "fill_slot_biases",
        })
    }

    /// Waits until no [`Stream::fill_slot`] queued so far still reads host
    /// bytes (only copies from pinned memory can; see [`Device::pin_host`]).
    fn wait_slot_fills(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
    /// `out[t] = table[tokens[t]]`, dequantized (`table` is `[vocab, d]`).
    fn embed(
        &mut self,
        table: &D::Matrix,
        tokens: &[u32],
        out: &mut D::Buf,
    ) -> Result<(), BackendError>;
    /// `out[t, o] = Σ_i W[o, i] · x[t, i]` for `t < n`.
    fn matmul(
        &mut self,
        w: &D::Matrix,
        x: &D::Buf,
        n: usize,
        out: &mut D::Buf,
    ) -> Result<(), BackendError>;
    /// The per-head matmul `p` describes (see [`HeadMatmul`]): one small
    /// matrix per head, stored as row blocks of one (possibly quantized)
    /// weight, used as it is or transposed. Latent attention needs it; a
    /// backend without it says so.
    fn head_matmul(
        &mut self,
        w: &D::Matrix,
        x: &D::Buf,
        p: &HeadMatmul,
        out: &mut D::Buf,
    ) -> Result<(), BackendError> {
        let _ = (w, x, p, out);
        Err(BackendError::Unsupported { op: "head_matmul" })
    }
    /// `x[t, i] += bias[i]` for `t < n`.
    fn add_bias(&mut self, x: &mut D::Buf, bias: &D::Vector, n: usize) -> Result<(), BackendError>;
    /// RMS norm of each of `rows` rows of width `dim`, in place:
    /// `x / sqrt(mean(x²) + eps) · s`, `s` per [`NormSpec::scale`] (`w`,
    /// `1 + w`, or 1 with no weight).
    fn rms_norm(
        &mut self,
        x: &mut D::Buf,
        rows: usize,
        dim: usize,
        spec: NormSpec,
        weight: Option<&D::Vector>,
    ) -> Result<(), BackendError>;
    /// Rotates `x` `[n_tokens, n_heads, head_dim]` in place; token `t` is at
    /// position `first_pos + t`.
    fn rope(
        &mut self,
        x: &mut D::Buf,
        n_tokens: usize,
        n_heads: usize,
        head_dim: usize,
        first_pos: usize,
        table: &RopeTable,
    ) -> Result<(), BackendError>;
    /// Stores `n_tokens` rows of `row_len` from `src` at cache rows
    /// `(first_pos + t) % capacity`, converted to the cache's dtype.
    fn kv_write(
        &mut self,
        cache: &mut D::Buf,
        src: &D::Buf,
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
        &mut self,
        q: &D::Buf,
        k_cache: &D::Buf,
        v_cache: &D::Buf,
        params: &AttentionParams,
        sinks: Option<&D::Vector>,
        out: &mut D::Buf,
    ) -> Result<(), BackendError>;
    /// Whether [`Stream::attention_parts`] is implemented.
    fn attends_parts(&self) -> bool {
        false
    }
    /// [`Stream::attention`] of several sequences in one call (one launch,
    /// one split of the work between threads): part `i`'s queries are the
    /// `parts[i].params.n_tokens` rows of `q` that follow the rows of the
    /// parts before it, and its outputs the same rows of `out`. Every part
    /// has the same `n_heads`, `n_kv_heads` and `head_dim`, and each row is
    /// computed exactly as [`Stream::attention`] computes it for its part
    /// alone. Backends without it say so ([`Stream::attends_parts`]).
    fn attention_parts(
        &mut self,
        q: &D::Buf,
        parts: &[AttentionPart<'_, D::Buf>],
        sinks: Option<&D::Vector>,
        out: &mut D::Buf,
    ) -> Result<(), BackendError> {
        let _ = (q, parts, sinks, out);
        Err(BackendError::Unsupported {
            op: "attention_parts",
        })
    }
    /// `gate[i] = act(gate[i]) · up[i]` (or gpt-oss's clamped form) for `i < len`.
    fn glu(
        &mut self,
        gate: &mut D::Buf,
        up: &D::Buf,
        len: usize,
        act: Activation,
    ) -> Result<(), BackendError>;
    /// `dst[i] += src[i]` for `i < len`.
    fn add(&mut self, dst: &mut D::Buf, src: &D::Buf, len: usize) -> Result<(), BackendError>;
    /// Moves each of `n` rows along a unit vector `u` (`[d]`, `d` its
    /// length): `x[t] += (alpha · (u · x[t]) + beta) · u`, the dot product
    /// accumulated in f64. With `alpha = −1, beta = 0` it projects `u` out
    /// of every row (ablation); with `alpha = −1, beta = c` it sets every
    /// row's component along `u` to `c` (clamping). Steering uses it.
    fn adjust_projection(
        &mut self,
        x: &mut D::Buf,
        n: usize,
        u: &D::Vector,
        alpha: f32,
        beta: f32,
    ) -> Result<(), BackendError>;
    /// `x[i] *= s` for `i < len`.
    fn scale(&mut self, x: &mut D::Buf, len: usize, s: f32) -> Result<(), BackendError>;
    /// `x[i] *= sigmoid(gate[i])` for `i < len`.
    fn mul_sigmoid(
        &mut self,
        x: &mut D::Buf,
        gate: &D::Buf,
        len: usize,
    ) -> Result<(), BackendError>;
    /// `x[t, i] *= sigmoid(gate[t])` for `t < rows`, `i < dim`: one gate
    /// logit per row (a gated shared expert).
    fn mul_sigmoid_rows(
        &mut self,
        x: &mut D::Buf,
        gate: &D::Buf,
        rows: usize,
        dim: usize,
    ) -> Result<(), BackendError> {
        let _ = (x, gate, rows, dim);
        Err(BackendError::Unsupported {
            op: "mul_sigmoid_rows",
        })
    }
    /// Depthwise causal convolution with SiLU over `x` `[n_tokens,
    /// channels]` into `out`, continuing from `state` (the last `kernel −
    /// 1` inputs before `x`, oldest first), which it then replaces by the
    /// last `kernel − 1` inputs including `x`; see [`ConvParams`]. A
    /// backend without gated DeltaNet says so.
    fn causal_conv1d_silu(
        &mut self,
        x: &D::Buf,
        state: &mut D::Buf,
        weight: &D::Vector,
        params: &ConvParams,
        out: &mut D::Buf,
    ) -> Result<(), BackendError> {
        let _ = (x, state, weight, params, out);
        Err(BackendError::Unsupported {
            op: "causal_conv1d_silu (gated DeltaNet)",
        })
    }
    /// The gated delta rule over `n_tokens` tokens, continuing from
    /// `state` `[v_heads, k_head_dim, v_head_dim]` and leaving the state
    /// after the last token there; `out` is `[n_tokens, v_heads ·
    /// v_head_dim]`. See [`DeltaNetParams`]. A backend may run a long call
    /// (a prefill) in chunks of tokens, as HF's
    /// `torch_chunk_gated_delta_rule` does, and a short one token by
    /// token: the same function, summed in another order. A backend
    /// without gated DeltaNet says so.
    fn gated_delta_rule(
        &mut self,
        input: DeltaNetInput<'_, D>,
        params: &DeltaNetParams,
        state: &mut D::Buf,
        out: &mut D::Buf,
    ) -> Result<(), BackendError> {
        let _ = (input, params, state, out);
        Err(BackendError::Unsupported {
            op: "gated_delta_rule (gated DeltaNet)",
        })
    }
    /// `x[i] = c · tanh(x[i] / c)` for `i < len`.
    fn softcap(&mut self, x: &mut D::Buf, len: usize, cap: f32) -> Result<(), BackendError>;

    /// Routes `n_tokens` tokens from their router logits (`[n_tokens,
    /// num_experts]`, bias included) into `out`, exactly as
    /// [`route_token`](crate::routing::route_token) does, on the device:
    /// a resident MoE step needs no host round trip.
    fn route(
        &mut self,
        logits: &D::Buf,
        n_tokens: usize,
        router: &RouterSpec,
        tables: RouterTables<'_, D::Vector>,
        out: &mut D::Routes,
    ) -> Result<(), BackendError>;
    /// Routed experts: `out[t] = Σ_r w[t, r] · E_slot[t, r](x[t])`, summed in
    /// rank order `r = 0, 1, …` so that the result depends only on the
    /// route. `x` and `out` are `[n_tokens, hidden]`.
    fn moe(
        &mut self,
        input: MoeInput<'_, D>,
        scratch: &mut MoeScratch<D::Buf>,
        out: &mut D::Buf,
    ) -> Result<(), BackendError> {
        let hidden = input.bank.hidden();
        self.moe_experts(input, scratch, None)?;
        self.moe_combine(input.n_tokens, hidden, input.routes, scratch, out)
    }
    /// The first half of [`Stream::moe`]: `scratch.y[i] = E_slot(x[t])` for
    /// each route `i = t·k + r`, restricted to the routes whose slot has
    /// `only[slot] == true` when `only` is given (other rows of `y` are left
    /// as they are). Lets a caller compute the slots it has while others
    /// are still being filled; each row is computed the same way whatever
    /// the split.
    fn moe_experts(
        &mut self,
        input: MoeInput<'_, D>,
        scratch: &mut MoeScratch<D::Buf>,
        only: Option<&[bool]>,
    ) -> Result<(), BackendError>;
    /// The GLU intermediate of every route, for inspection (the FFN
    /// census), not for decoding: `out[i] = act(gate_e·x[t] + bg) ⊙
    /// (up_e·x[t] + bu)` for route `i = t·k + r` to slot `e`, with `out`
    /// `[n_tokens · top_k, intermediate]`; `scratch` is clobbered. A
    /// backend without it says so.
    fn moe_intermediate(
        &mut self,
        input: MoeInput<'_, D>,
        scratch: &mut MoeScratch<D::Buf>,
        out: &mut D::Buf,
    ) -> Result<(), BackendError> {
        let _ = (input, scratch, out);
        Err(BackendError::Unsupported {
            op: "moe_intermediate",
        })
    }
    /// The second half of [`Stream::moe`]: `out[t] = Σ_r w[t, r] ·
    /// scratch.y[t·k + r]`, in rank order, rows of `hidden`.
    fn moe_combine(
        &mut self,
        n_tokens: usize,
        hidden: usize,
        routes: &D::Routes,
        scratch: &MoeScratch<D::Buf>,
        out: &mut D::Buf,
    ) -> Result<(), BackendError>;
}
