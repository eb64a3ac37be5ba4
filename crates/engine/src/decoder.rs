//! The generic decoder: one pass over a batch of tokens, for every family,
//! driven by the [`ArchSpec`] alone (the math is in `turbospark_core::arch`;
//! the normative references are the HF `modeling_<type>.py` files of
//! transformers 5.24.0: llama, qwen2, gemma3, muse_glimmer, mixtral,
//! qwen3_moe, gpt_oss, glm4_moe, gemma4).
//!
//! ```text
//! h = embed(tokens) · embedding.scale ; h = embedding.norm(h)
//! per layer (head_dim and n_kv_heads are the layer's own):
//!   a = attn_norm(h)
//!   DeltaNet layer (the recurrence in `turbospark_core::arch::DeltaNetSpec`):
//!     c = conv1d_silu(a·W_qkv) ; o = delta_rule(c, a·W_alpha, a·W_beta)   (state per sequence)
//!     h += W_out · (rms(o)·w ⊙ silu(a·W_z))
//!   attention layer:
//!   q, k = a·Wq (+b), a·Wk (+b) ; v = a·Wv (+b), or k itself (value_from_key)
//!     (latent attention: q = [q_rope, W_ukᵀ·q_nope], k = v = [k_rope, rms(c)])
//!   q, k, v = per-head q/k/v norms ; q, k = rope(q, k)
//!   cache k, v ; o = attention(q, cache)          (window, sinks, softcap, GQA)
//!   o ⊙= sigmoid(a·Wgate)                          (output gate)
//!   h += attn_post_norm(o·Wo (+b))                (latent: o_h = W_uv[h]·o_h first)
//!   a = ffn_norm(h)
//!   dense layer: f = dense(a)
//!   (shared expert × sigmoid(a·w_shexp_gate) where the spec gates it)
//!   MoE layer:   z = router(a), or (Gemma 4) router(rms(h) · router.scale · hidden^-½)
//!                routes = route(z)                 (a device op: no host round trip)
//!                x = a, or moe_input_norm(h) when the spec has one
//!                f = moe_post_norm(Σ_r w_r expert_r(x))
//!                    [+ shared(a)] [+ dense_branch_post_norm(dense(a))]
//!   h += ffn_post_norm(f)
//!   h ·= layer_output_scale                        (scales the residual too)
//!   h = steer(h) ; capture(h)                      (hooks, when set: crate::hooks)
//!   (census of each FFN intermediate, when set: crate::census)
//! logits = softcap(multiplier · (output_norm(h) · W_out))   (W_out = token_embd if tied)
//! ```

use crate::census::FfnSite;
use crate::experts::routed::{RoutedInput, SessionExperts};
use crate::hooks::{Hooks, PreparedSteering};
use crate::kv::{KvCache, KvLayer, RecurrentState};
use crate::model::Model;
use crate::scratch::{Buffers, DeltaRow, DeltaScratch};
use crate::timing::{Phase, PhaseTimes};
use crate::weights::{
    DeltaNetWeights, DenseWeights, FfnWeights, KvB, LayerWeights, MlaWeights, MoeWeights,
};
use crate::EngineError;
use std::time::Instant;
use turbospark_backend::{
    AttentionParams, AttentionPart, ConvParams, DeltaNetInput, DeltaNetParams, Device, HeadMatmul,
    RouterTables, Stream,
};
use turbospark_core::arch::{Activation, ArchSpec, DeltaNetSpec, LayerSpec, MlaSpec, NormSpec};

/// Where the tokens of a pass sit and which KV cache each attends to.
pub(crate) enum At<'a, 'b, D: Device> {
    /// Consecutive positions from the given one, in the session's own cache.
    Own(usize),
    /// Row `i` is the next position of `rows[i].kv`, a sequence of its own:
    /// rope, cache write and attention are per row, everything else is one
    /// batched op over all rows.
    Rows(&'a mut [BatchRow<'b, D>]),
    /// Consecutive rows per sequence: chunk `c`'s tokens are at the next
    /// positions of `chunks[c].kv`, after the rows of the chunks before it.
    Chunks(&'a mut [BatchChunk<'b, D>]),
}

/// One sequence of a batched decode step: its cache and the token fed at
/// the cache's next position.
pub struct BatchRow<'k, D: Device> {
    pub kv: &'k mut KvCache<D>,
    pub token: u32,
}

/// One sequence's part of a pass over several sequences
/// (`Session::forward_chunks`): `tokens` at the next positions of `kv`
/// (one token of a decode step, or a chunk of a prompt), whether the pass
/// returns the logits of its last token, and control vectors that steer
/// this sequence's rows alone (after the session's own steering, if any).
pub struct BatchChunk<'k, D: Device> {
    pub kv: &'k mut KvCache<D>,
    pub tokens: &'k [u32],
    pub logits: bool,
    pub steering: Option<&'k PreparedSteering<D>>,
}

/// Scratch of [`dense_mlp`]: `[n, intermediate]` each.
struct MlpScratch<'a, B> {
    gate: &'a mut B,
    up: &'a mut B,
}

/// `out = down(act(gate·x) ⊙ up·x)` for `n` rows.
fn dense_mlp<D: Device>(
    st: &mut D::Stream,
    m: &Model<D>,
    w: &DenseWeights<D>,
    x: &D::Buf,
    n: usize,
    tmp: MlpScratch<'_, D::Buf>,
    out: &mut D::Buf,
) -> Result<(), EngineError> {
    st.matmul(&w.gate, x, n, tmp.gate)?;
    st.matmul(&w.up, x, n, tmp.up)?;
    st.glu(tmp.gate, tmp.up, n * w.intermediate, m.spec.activation)?;
    st.matmul(&w.down, tmp.gate, n, out)?;
    Ok(())
}

/// Latent attention's query and cache rows for `n` tokens (see
/// [`MlaSpec`]): `bufs.q` `[n, n_heads, rope + kv_lora]` is the absorbed
/// query `[q_rope, W_uk[h]ᵀ·q_nope]` of each head, `W_uk[h]` the first
/// `nope` rows of head `h`'s block in `attn_kv_b` (multiplied transposed),
/// or head `h`'s block of `attn_k_b`, which holds `W_uk[h]ᵀ` (multiplied
/// as it is), in its own format ([`Stream::head_matmul`]); `bufs.k`
/// `[n, rope + kv_lora]` the row
/// `[k_rope, rms(c)]` the cache keeps (rope is applied later, to the first
/// `rope` dims of both).
fn latent_qk<D: Device>(
    st: &mut D::Stream,
    b: &mut Buffers<D>,
    a: &MlaSpec,
    n_heads: usize,
    attn_q: &D::Matrix,
    w: &MlaWeights<D>,
    n: usize,
) -> Result<(), EngineError> {
    let Some(s) = b.mla.as_mut() else {
        return Err(EngineError::NotImplemented {
            feature: "latent attention without its scratch",
        });
    };
    let norm = NormSpec::plain(a.norm_eps);
    match (&w.q_a, a.q_lora_rank) {
        (Some((q_a, q_a_norm)), Some(rank)) => {
            st.matmul(q_a, &b.a, n, &mut s.q_a)?;
            st.rms_norm(&mut s.q_a, n, rank, norm, Some(q_a_norm))?;
            st.matmul(attn_q, &s.q_a, n, &mut s.q)?;
        }
        _ => st.matmul(attn_q, &b.a, n, &mut s.q)?,
    }
    let (r, dn, dr, dv) = (
        a.kv_lora_rank,
        a.qk_nope_head_dim,
        a.qk_rope_head_dim,
        a.v_head_dim,
    );
    let (qk, row) = (a.qk_head_dim(), a.latent_head_dim());
    // Each head's query is `[q_nope, q_rope]`: the rope part goes to the
    // front of its absorbed row as it is, the rest is `W_uk[h]ᵀ·q_nope`.
    for th in 0..n * n_heads {
        st.copy(&s.q, th * qk + dn, &mut b.q, th * row, dr)?;
    }
    let (w_uk, head_stride, rows, transpose) = match &w.kv_b {
        KvB::Fused(kv_b) => (kv_b, dn + dv, dn, true),
        KvB::Split { k_b, .. } => (k_b, r, r, false),
    };
    let absorb = HeadMatmul {
        n_tokens: n,
        n_heads,
        head_stride,
        first_row: 0,
        rows,
        transpose,
        x_stride: qk,
        x_at: 0,
        out_stride: row,
        out_at: dr,
    };
    st.head_matmul(w_uk, &s.q, &absorb, &mut b.q)?;
    st.matmul(&w.kv_a_latent, &b.a, n, &mut s.latent)?;
    st.rms_norm(&mut s.latent, n, r, norm, Some(&w.kv_a_norm))?;
    st.matmul(&w.kv_a_rope, &b.a, n, &mut s.rope)?;
    for t in 0..n {
        st.copy(&s.rope, t * dr, &mut b.k, t * row, dr)?;
        st.copy(&s.latent, t * r, &mut b.k, t * row + dr, r)?;
    }
    Ok(())
}

/// Latent attention's values for `n` tokens: head `h`'s attention output
/// `[n, n_heads, rope + kv_lora]` is a weighted sum of cached `[k_rope,
/// c]` rows; its value is `W_uv[h]·(Σ p·c)` (`W_uv[h]` the last `v` rows
/// of head `h`'s block in `attn_kv_b`, or head `h`'s block of
/// `attn_v_b`), written to `out` `[n, n_heads · v]`, the input of
/// `attn_output`.
fn latent_values<D: Device>(
    st: &mut D::Stream,
    a: &MlaSpec,
    n_heads: usize,
    kv_b: &KvB<D>,
    att: &D::Buf,
    n: usize,
    out: &mut D::Buf,
) -> Result<(), EngineError> {
    let (dn, dr, dv) = (a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim);
    let (w_uv, head_stride, first_row) = match kv_b {
        KvB::Fused(kv_b) => (kv_b, dn + dv, dn),
        KvB::Split { v_b, .. } => (v_b, dv, 0),
    };
    let values = HeadMatmul {
        n_tokens: n,
        n_heads,
        head_stride,
        first_row,
        rows: dv,
        transpose: false,
        x_stride: a.latent_head_dim(),
        x_at: dr,
        out_stride: dv,
        out_at: 0,
    };
    st.head_matmul(w_uv, att, &values, out)?;
    Ok(())
}

fn add_bias<D: Device>(
    st: &mut D::Stream,
    x: &mut D::Buf,
    bias: Option<&D::Vector>,
    n: usize,
) -> Result<(), EngineError> {
    if let Some(b) = bias {
        st.add_bias(x, b, n)?;
    }
    Ok(())
}

/// The convolution and the recurrence of one DeltaNet layer for `n` rows
/// of one sequence, from `r.mixed`, `r.alpha`, `r.beta` into `r.core`;
/// `fresh` when the sequence starts.
fn delta_recurrence<D: Device>(
    st: &mut D::Stream,
    d: &DeltaNetSpec,
    w: &DeltaNetWeights<D>,
    r: &mut DeltaRow<D>,
    state: &mut RecurrentState<D>,
    n: usize,
    fresh: bool,
) -> Result<(), EngineError> {
    let conv = ConvParams {
        n_tokens: n,
        channels: d.conv_dim(),
        kernel: d.conv_kernel,
        fresh,
    };
    st.causal_conv1d_silu(&r.mixed, &mut state.conv, &w.conv, &conv, &mut r.conv)?;
    let params = DeltaNetParams {
        n_tokens: n,
        k_heads: d.k_heads,
        v_heads: d.v_heads,
        k_head_dim: d.k_head_dim,
        v_head_dim: d.v_head_dim,
        fresh,
    };
    let input = DeltaNetInput {
        qkv: &r.conv,
        alpha: &r.alpha,
        beta: &r.beta,
        a_log: &w.a_log,
        dt_bias: &w.dt_bias,
    };
    st.gated_delta_rule(input, &params, &mut state.recurrent, &mut r.core)?;
    Ok(())
}

/// The convolution and the recurrence of one DeltaNet layer `l` for batch
/// rows `first .. first + n`, a sequence of their own at the next
/// positions of `kv`, over that sequence's own state: the rows are copied
/// to `s.row` and their output back to `s.batch.core`.
#[allow(clippy::too_many_arguments)]
fn delta_part<D: Device>(
    st: &mut D::Stream,
    d: &DeltaNetSpec,
    w: &DeltaNetWeights<D>,
    s: &mut DeltaScratch<D>,
    kv: &mut KvCache<D>,
    l: usize,
    first: usize,
    n: usize,
) -> Result<(), EngineError> {
    let (c, hv, vd) = (d.conv_dim(), d.v_heads, d.value_dim());
    let fresh = kv.position() == 0;
    let state = kv.layers[l]
        .state
        .as_mut()
        .ok_or(EngineError::NotImplemented {
            feature: "a DeltaNet layer whose cache holds no recurrent state",
        })?;
    let r = &mut s.row;
    st.copy(&s.batch.mixed, first * c, &mut r.mixed, 0, n * c)?;
    st.copy(&s.batch.alpha, first * hv, &mut r.alpha, 0, n * hv)?;
    st.copy(&s.batch.beta, first * hv, &mut r.beta, 0, n * hv)?;
    delta_recurrence(st, d, w, r, state, n, fresh)?;
    st.copy(&r.core, 0, &mut s.batch.core, first * vd, n * vd)?;
    Ok(())
}

/// The query, key and value rows of `n` tokens at consecutive positions
/// from `pos`, and where their attention output goes.
struct Rows<'a, B> {
    q: &'a mut B,
    k: &'a mut B,
    v: &'a B,
    out: &'a mut B,
    n: usize,
    pos: usize,
}

/// Rope and cache write of layer `l` for the rows `r` (their queries
/// roped in place; `r.out` untouched), into the layer cache `kv`.
fn rope_and_write<D: Device>(
    st: &mut D::Stream,
    m: &Model<D>,
    l: usize,
    kv: &mut KvLayer<D>,
    r: &mut Rows<'_, D::Buf>,
) -> Result<(), EngineError> {
    let (n, pos) = (r.n, r.pos);
    let spec = &m.spec;
    let ls = &spec.layers[l];
    let (nh, nkv, hd) = (spec.num_heads, ls.num_kv_heads, ls.head_dim);
    if let Some(rope) = &m.ropes[l] {
        st.rope(r.q, n, nh, hd, pos, rope)?;
        st.rope(r.k, n, nkv, hd, pos, rope)?;
    }
    // Latent attention reads its one cached row as keys and values.
    st.kv_write(&mut kv.k, r.k, n, kv.row, pos, kv.capacity)?;
    if spec.mla.is_none() {
        st.kv_write(&mut kv.v, r.v, n, kv.row, pos, kv.capacity)?;
    }
    Ok(())
}

/// The attention parameters of `n` queries of layer `l` at consecutive
/// positions from `pos`, over the layer cache `kv`.
fn attention_params<D: Device>(
    m: &Model<D>,
    l: usize,
    kv: &KvLayer<D>,
    n: usize,
    pos: usize,
) -> AttentionParams {
    let spec = &m.spec;
    let ls = &spec.layers[l];
    AttentionParams {
        n_tokens: n,
        first_pos: pos,
        n_heads: spec.num_heads,
        n_kv_heads: ls.num_kv_heads,
        head_dim: ls.head_dim,
        capacity: kv.capacity,
        window: ls.window,
        scale: spec.attention.scale,
        softcap: spec.attention.softcap,
    }
}

/// Rope, cache write and attention of layer `l` for the rows `r`, into
/// the layer cache `kv`: the one block both the session's own tokens and
/// each sequence of a batch of sequences run (when the backend has no
/// [`Stream::attention_parts`]).
fn attend<D: Device>(
    st: &mut D::Stream,
    m: &Model<D>,
    l: usize,
    lw: &LayerWeights<D>,
    kv: &mut KvLayer<D>,
    mut r: Rows<'_, D::Buf>,
) -> Result<(), EngineError> {
    rope_and_write(st, m, l, kv, &mut r)?;
    let params = attention_params(m, l, kv, r.n, r.pos);
    // Latent attention reads its one cached row as keys and values.
    let v = if m.spec.mla.is_some() { &kv.k } else { &kv.v };
    st.attention(r.q, &kv.k, v, &params, lw.attn_sinks.as_ref(), r.out)?;
    Ok(())
}

/// One forward pass's view of a session: the model and the session's
/// parts the pass reads and writes (its stream, own KV cache, scratch,
/// expert slots, timings and hooks), borrowed for the pass.
pub(crate) struct Pass<'s, D: Device> {
    pub(crate) model: &'s Model<D>,
    pub(crate) stream: &'s mut D::Stream,
    pub(crate) kv: &'s mut KvCache<D>,
    pub(crate) bufs: &'s mut Buffers<D>,
    pub(crate) experts: &'s mut SessionExperts<D>,
    pub(crate) times: &'s mut PhaseTimes,
    pub(crate) hooks: &'s mut Hooks<D>,
}

impl<D: Device> Pass<'_, D> {
    /// Runs one batch of at most `max_batch` tokens at `pos` (inputs already
    /// checked) and, if asked, writes the logits of `rows` rows starting at
    /// batch row `first` into `out`.
    pub(crate) fn run_chunk(
        &mut self,
        pos: usize,
        tokens: &[u32],
        head: Option<(usize, usize, &mut [f32])>,
    ) -> Result<(), EngineError> {
        // A step at position 0 starts the recurrent layers' state afresh
        // (their ops take that as a parameter, which a recording would keep
        // for every replay), so recording starts at position 1.
        let recordable = tokens.len() == 1
            && pos > 0
            && matches!(head, Some((0, 1, _)))
            && !self.hooks.active()
            && (self.model.spec.moe.is_none() || self.experts.device_only())
            && self.stream.records_steps();
        if recordable {
            let start = Instant::now();
            let token = tokens[0];
            if !self.stream.replay_step(token, pos)? {
                self.stream.begin_step(token, pos)?;
                let recorded = self.step_ops(pos, tokens);
                // A failed recording must not leave the stream recording,
                // nor a partial step to replay.
                let ended = self.stream.end_step();
                if recorded.is_err() || ended.is_err() {
                    self.stream.forget_step();
                }
                recorded?;
                ended?;
            }
            if let Some((_, _, out)) = head {
                let vocab = self.model.spec.vocab_size;
                self.stream.read(&self.bufs.logits, &mut out[..vocab])?;
            }
            self.times.lap(Phase::Step, start);
            return Ok(());
        }
        self.layers_and_head(&mut At::Own(pos), tokens, head)
    }

    /// One decode step of several sequences (inputs already checked): row
    /// `i` is `tokens[i]` at the next position of `rows[i].kv`; the logits
    /// of every row go to `out` (`[rows, vocab]`). Never a recorded step:
    /// which caches a step reads changes from step to step.
    pub(crate) fn run_rows(
        &mut self,
        rows: &mut [BatchRow<'_, D>],
        tokens: &[u32],
        out: &mut [f32],
    ) -> Result<(), EngineError> {
        let n = tokens.len();
        self.layers_and_head(&mut At::Rows(rows), tokens, Some((0, n, out)))
    }

    /// One pass over chunks of several sequences (inputs already checked):
    /// `tokens` is every chunk's tokens in order; the logits of the last
    /// row of each chunk that asks for them go to `out`, in chunk order
    /// (`[asking chunks, vocab]`).
    pub(crate) fn run_chunks(
        &mut self,
        chunks: &mut [BatchChunk<'_, D>],
        tokens: &[u32],
        out: &mut [f32],
    ) -> Result<(), EngineError> {
        let t = self.embed_and_layers(&mut At::Chunks(chunks), tokens)?;
        // The rows that give logits, gathered to the front of the head's input.
        let hidden = self.model.spec.hidden_size;
        let (mut end, mut rows) = (0, 0);
        for c in chunks.iter() {
            end += c.tokens.len();
            if c.logits {
                let b = &mut self.bufs;
                self.stream
                    .copy(&b.h, (end - 1) * hidden, &mut b.a, rows * hidden, hidden)?;
                rows += 1;
            }
        }
        if rows > 0 {
            self.head_on_a(rows)?;
            let vocab = self.model.spec.vocab_size;
            self.stream
                .read(&self.bufs.logits, &mut out[..rows * vocab])?;
        }
        self.times.lap(Phase::Head, t);
        Ok(())
    }

    /// A recorded decode step: every op of one token's forward pass up to
    /// its logits on the device (the read-back stays outside the step).
    fn step_ops(&mut self, pos: usize, tokens: &[u32]) -> Result<(), EngineError> {
        self.embed_and_layers(&mut At::Own(pos), tokens)?;
        self.head_logits(0, 1)
    }

    /// The forward pass of a batch, op by op, with its phases timed.
    fn layers_and_head(
        &mut self,
        at: &mut At<'_, '_, D>,
        tokens: &[u32],
        head: Option<(usize, usize, &mut [f32])>,
    ) -> Result<(), EngineError> {
        let t = self.embed_and_layers(at, tokens)?;
        if let Some((first, rows, out)) = head {
            self.head(first, rows, out)?;
            self.times.lap(Phase::Head, t);
        }
        Ok(())
    }

    /// Embedding, every layer and the hooks; returns when the last phase
    /// ended. Hooks run only for a sequence's own tokens ([`At::Own`]);
    /// `Session::decode_batch` refuses to run while they are set.
    fn embed_and_layers(
        &mut self,
        at: &mut At<'_, '_, D>,
        tokens: &[u32],
    ) -> Result<Instant, EngineError> {
        let m = self.model;
        let spec = &m.spec;
        let n = tokens.len();
        let hidden = spec.hidden_size;
        let (st, b) = (&mut *self.stream, &mut *self.bufs);

        let start = Instant::now();
        st.embed(&m.weights.token_embd, tokens, &mut b.h)?;
        if spec.embedding.scale != 1.0 {
            st.scale(&mut b.h, n * hidden, spec.embedding.scale)?;
        }
        if let Some(norm) = spec.embedding.norm {
            st.rms_norm(&mut b.h, n, hidden, norm, None)?;
        }
        let mut t = self.times.lap(Phase::Embed, start);
        // Capture and census follow one sequence's positions; steering acts
        // on every row of a batch of sequences alike.
        let hooks = match at {
            At::Own(pos) if self.hooks.active() => Some(*pos),
            _ => None,
        };
        let steer_rows = hooks.is_none() && self.hooks.steers();
        for (l, lw) in m.weights.layers.iter().enumerate() {
            self.attention_block(l, lw, at, n)?;
            t = self.times.lap(Phase::Attention, t);
            t = self.ffn_block(l, lw, n, t)?;
            if let Some(s) = lw.layer_output_scale {
                self.stream.scale(&mut self.bufs.h, n * hidden, s)?;
            }
            if hooks.is_some() {
                let h = &mut self.bufs.h;
                self.hooks.after_layer(&mut *self.stream, l, h, n, hidden)?;
            } else if steer_rows {
                self.hooks
                    .steer(&mut *self.stream, l, &mut self.bufs.h, n)?;
            }
            if let At::Chunks(chunks) = at {
                self.steer_chunks(l, chunks)?;
            }
        }
        if let Some(pos) = hooks {
            self.hooks
                .end_chunk(&mut *self.stream, pos, tokens, hidden)?;
        }
        Ok(t)
    }

    fn attention_block(
        &mut self,
        l: usize,
        lw: &LayerWeights<D>,
        at: &mut At<'_, '_, D>,
        n: usize,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (spec, st) = (&m.spec, &mut *self.stream);
        let ls = &spec.layers[l];
        let (hidden, nh, hd) = (spec.hidden_size, spec.num_heads, ls.head_dim);
        let norms = &spec.norms;
        let b = &mut *self.bufs;

        st.copy(&b.h, 0, &mut b.a, 0, n * hidden)?;
        st.rms_norm(&mut b.a, n, hidden, norms.attn_input, lw.attn_norm.as_ref())?;
        let mismatch = EngineError::NotImplemented {
            feature: "attention weights that do not match the spec",
        };
        if let Some(dw) = &lw.delta {
            self.delta_mix(l, dw, at, n)?;
        } else {
            let (Some(attn_q), Some(attn_output)) = (&lw.attn_q, &lw.attn_output) else {
                return Err(mismatch);
            };
            match (&spec.mla, &lw.mla, &lw.attn_k) {
                (Some(a), Some(w), _) => latent_qk::<D>(st, b, a, nh, attn_q, w, n)?,
                (None, None, Some(wk)) => Self::project_qkv(st, b, lw, attn_q, spec, ls, n, wk)?,
                _ => return Err(mismatch),
            }
            match at {
                At::Own(pos) => self.attend_own(l, lw, *pos, n)?,
                // One attention call over every sequence's rows, when the
                // backend has it (the work splits between threads at once).
                At::Rows(rows) if self.stream.attends_parts() => {
                    for (i, row) in rows.iter_mut().enumerate() {
                        self.write_part(l, row.kv, i, 1)?;
                    }
                    self.attend_parts(l, lw, rows.iter().map(|r| (&*r.kv, 1)))?;
                }
                At::Chunks(chunks) if self.stream.attends_parts() => {
                    let mut first = 0;
                    for c in chunks.iter_mut() {
                        self.write_part(l, c.kv, first, c.tokens.len())?;
                        first += c.tokens.len();
                    }
                    let parts = chunks.iter().map(|c| (&*c.kv, c.tokens.len()));
                    self.attend_parts(l, lw, parts)?;
                }
                At::Rows(rows) => {
                    for (i, row) in rows.iter_mut().enumerate() {
                        self.attend_part(l, lw, row.kv, i, 1)?;
                    }
                }
                At::Chunks(chunks) => {
                    let mut first = 0;
                    for c in chunks.iter_mut() {
                        self.attend_part(l, lw, c.kv, first, c.tokens.len())?;
                        first += c.tokens.len();
                    }
                }
            }
            let (st, b) = (&mut *self.stream, &mut *self.bufs);
            if let (Some(wg), Some(g)) = (&lw.attn_gate, b.gate.as_mut()) {
                st.matmul(wg, &b.a, n, g)?;
                st.mul_sigmoid(&mut b.att, g, n * nh * hd)?;
            }
            match (&spec.mla, &lw.mla, b.mla.as_mut()) {
                (Some(a), Some(w), Some(s)) => {
                    latent_values::<D>(st, a, nh, &w.kv_b, &b.att, n, &mut s.v)?;
                    st.matmul(attn_output, &s.v, n, &mut b.o)?;
                }
                _ => st.matmul(attn_output, &b.att, n, &mut b.o)?,
            }
            add_bias::<D>(st, &mut b.o, lw.attn_output_bias.as_ref(), n)?;
        }
        let (st, b) = (&mut *self.stream, &mut *self.bufs);
        if let Some(ns) = norms.attn_post {
            st.rms_norm(&mut b.o, n, hidden, ns, lw.post_attention_norm.as_ref())?;
        }
        st.add(&mut b.h, &b.o, n * hidden)?;
        Ok(())
    }

    /// q, k, v of plain attention for `n` tokens, with their biases and
    /// per-head norms.
    #[allow(clippy::too_many_arguments)]
    fn project_qkv(
        st: &mut D::Stream,
        b: &mut Buffers<D>,
        lw: &LayerWeights<D>,
        attn_q: &D::Matrix,
        spec: &ArchSpec,
        ls: &LayerSpec,
        n: usize,
        attn_k: &D::Matrix,
    ) -> Result<(), EngineError> {
        let (nh, nkv, hd) = (spec.num_heads, ls.num_kv_heads, ls.head_dim);
        let norms = &spec.norms;
        st.matmul(attn_q, &b.a, n, &mut b.q)?;
        add_bias::<D>(st, &mut b.q, lw.attn_q_bias.as_ref(), n)?;
        st.matmul(attn_k, &b.a, n, &mut b.k)?;
        add_bias::<D>(st, &mut b.k, lw.attn_k_bias.as_ref(), n)?;
        match &lw.attn_v {
            Some(wv) => {
                st.matmul(wv, &b.a, n, &mut b.v)?;
                add_bias::<D>(st, &mut b.v, lw.attn_v_bias.as_ref(), n)?;
            }
            // Values are the key projection as it is before the k norm and rope.
            None => st.copy(&b.k, 0, &mut b.v, 0, n * nkv * hd)?,
        }
        if let Some(ns) = norms.q {
            st.rms_norm(&mut b.q, n * nh, hd, ns, lw.attn_q_norm.as_ref())?;
        }
        if let Some(ns) = norms.k {
            st.rms_norm(&mut b.k, n * nkv, hd, ns, lw.attn_k_norm.as_ref())?;
        }
        if let Some(ns) = norms.v {
            st.rms_norm(&mut b.v, n * nkv, hd, ns, lw.attn_v_norm.as_ref())?;
        }
        Ok(())
    }

    /// A gated DeltaNet layer's token mixing for `n` rows of `bufs.a` into
    /// `bufs.o` (see [`DeltaNetSpec`]): the projections are batched; the
    /// convolution and the recurrence run over the session's own state
    /// ([`At::Own`]) or each sequence's ([`At::Rows`], [`At::Chunks`]).
    fn delta_mix(
        &mut self,
        l: usize,
        w: &DeltaNetWeights<D>,
        at: &mut At<'_, '_, D>,
        n: usize,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (spec, st, b) = (&m.spec, &mut *self.stream, &mut *self.bufs);
        let (Some(d), Some(s)) = (&spec.delta_net, b.delta.as_mut()) else {
            return Err(EngineError::NotImplemented {
                feature: "a DeltaNet layer without its spec or scratch",
            });
        };
        let no_state = || EngineError::NotImplemented {
            feature: "a DeltaNet layer whose cache holds no recurrent state",
        };
        st.matmul(&w.qkv, &b.a, n, &mut s.batch.mixed)?;
        st.matmul(&w.alpha, &b.a, n, &mut s.batch.alpha)?;
        st.matmul(&w.beta, &b.a, n, &mut s.batch.beta)?;
        st.matmul(&w.z, &b.a, n, &mut s.z)?;
        match at {
            At::Own(pos) => {
                let state = self.kv.layers[l].state.as_mut().ok_or_else(no_state)?;
                delta_recurrence(st, d, w, &mut s.batch, state, n, *pos == 0)?;
            }
            At::Rows(rows) => {
                for (i, row) in rows.iter_mut().enumerate() {
                    delta_part(st, d, w, s, row.kv, l, i, 1)?;
                }
            }
            At::Chunks(chunks) => {
                let mut first = 0;
                for c in chunks.iter_mut() {
                    delta_part(st, d, w, s, c.kv, l, first, c.tokens.len())?;
                    first += c.tokens.len();
                }
            }
        }
        // Gated RMSNorm per value head (plain weight, the model's eps), then
        // `z ← silu(z) · norm(o)`, then the output projection.
        let eps = spec.norms.attn_input.eps;
        st.rms_norm(
            &mut s.batch.core,
            n * d.v_heads,
            d.v_head_dim,
            NormSpec::plain(eps),
            Some(&w.norm),
        )?;
        st.glu(
            &mut s.z,
            &s.batch.core,
            n * d.value_dim(),
            Activation::Swiglu,
        )?;
        st.matmul(&w.out, &s.z, n, &mut b.o)?;
        Ok(())
    }

    /// Rope, cache write and attention of layer `l` for `n` tokens at
    /// consecutive positions from `pos` in the session's own cache.
    fn attend_own(
        &mut self,
        l: usize,
        lw: &LayerWeights<D>,
        pos: usize,
        n: usize,
    ) -> Result<(), EngineError> {
        let b = &mut *self.bufs;
        let rows = Rows {
            q: &mut b.q,
            k: &mut b.k,
            v: &b.v,
            out: &mut b.att,
            n,
            pos,
        };
        attend(self.stream, self.model, l, lw, &mut self.kv.layers[l], rows)
    }

    /// Steers each chunk's rows of the residual stream after layer `l` with
    /// the chunk's own control vectors: rows that are not at the front of
    /// the batch are steered in `bufs.a` (free between layers) and copied
    /// back, so each row changes exactly as it would alone.
    fn steer_chunks(&mut self, l: usize, chunks: &[BatchChunk<'_, D>]) -> Result<(), EngineError> {
        let hidden = self.model.spec.hidden_size;
        let (st, b) = (&mut self.stream, &mut self.bufs);
        let mut first = 0;
        for c in chunks {
            let n = c.tokens.len();
            if let Some(s) = c.steering.filter(|s| s.steers_layer(l)) {
                if first == 0 {
                    s.apply(st, l, &mut b.h, n)?;
                } else {
                    st.copy(&b.h, first * hidden, &mut b.a, 0, n * hidden)?;
                    s.apply(st, l, &mut b.a, n)?;
                    st.copy(&b.a, 0, &mut b.h, first * hidden, n * hidden)?;
                }
            }
            first += n;
        }
        Ok(())
    }

    /// Rope and cache write of layer `l` for batch rows `first .. first +
    /// n`, a sequence of their own at the next positions of `kv`: the roped
    /// queries go back to their rows of `bufs.q` for [`Self::attend_parts`].
    fn write_part(
        &mut self,
        l: usize,
        kv: &mut KvCache<D>,
        first: usize,
        n: usize,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (spec, st, b) = (&m.spec, &mut *self.stream, &mut *self.bufs);
        let ls = &spec.layers[l];
        let (qd, kvd) = (spec.num_heads * ls.head_dim, ls.num_kv_heads * ls.head_dim);
        let (latent, roped) = (spec.mla.is_some(), m.ropes[l].is_some());
        let r = &mut b.row;
        let pos = kv.position();
        if roped {
            st.copy(&b.q, first * qd, &mut r.q, 0, n * qd)?;
        }
        st.copy(&b.k, first * kvd, &mut r.k, 0, n * kvd)?;
        if !latent {
            st.copy(&b.v, first * kvd, &mut r.v, 0, n * kvd)?;
        }
        let mut rows = Rows {
            q: &mut r.q,
            k: &mut r.k,
            v: &r.v,
            out: &mut r.att,
            n,
            pos,
        };
        rope_and_write(st, m, l, &mut kv.layers[l], &mut rows)?;
        if roped {
            st.copy(&r.q, 0, &mut b.q, first * qd, n * qd)?;
        }
        Ok(())
    }

    /// Attention of layer `l` for consecutive groups of batch rows, each
    /// `(cache, n)`: the `n` rows after the previous groups', whose keys
    /// and values [`Self::write_part`] has just written, at the cache's
    /// next positions. One backend call for all
    /// ([`Stream::attention_parts`]); every row is computed as a pass of its
    /// sequence alone would compute it.
    fn attend_parts<'c>(
        &mut self,
        l: usize,
        lw: &LayerWeights<D>,
        parts: impl Iterator<Item = (&'c KvCache<D>, usize)>,
    ) -> Result<(), EngineError>
    where
        D: 'c,
    {
        let m = self.model;
        let (spec, st, b) = (&m.spec, &mut *self.stream, &mut *self.bufs);
        let latent = spec.mla.is_some();
        // A few dozen bytes per sequence and layer; the per-sequence caches
        // it borrows change every layer.
        let parts: Vec<AttentionPart<'_, D::Buf>> = parts
            .map(|(kv, n)| {
                let kl = &kv.layers[l];
                AttentionPart {
                    k_cache: &kl.k,
                    v_cache: if latent { &kl.k } else { &kl.v },
                    params: attention_params(m, l, kl, n, kv.position()),
                }
            })
            .collect();
        st.attention_parts(&b.q, &parts, lw.attn_sinks.as_ref(), &mut b.att)?;
        Ok(())
    }

    /// Rope, cache write and attention of layer `l` for batch rows
    /// `first .. first + n`, a sequence of their own at the next positions
    /// of `kv`, which they alone attend to. The rows are computed exactly as
    /// a pass of the sequence alone over those tokens would compute them.
    fn attend_part(
        &mut self,
        l: usize,
        lw: &LayerWeights<D>,
        kv: &mut KvCache<D>,
        first: usize,
        n: usize,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (spec, st, b) = (&m.spec, &mut *self.stream, &mut *self.bufs);
        let ls = &spec.layers[l];
        let (qd, kvd) = (spec.num_heads * ls.head_dim, ls.num_kv_heads * ls.head_dim);
        let latent = spec.mla.is_some();
        let r = &mut b.row;
        let pos = kv.position();
        st.copy(&b.q, first * qd, &mut r.q, 0, n * qd)?;
        st.copy(&b.k, first * kvd, &mut r.k, 0, n * kvd)?;
        if !latent {
            st.copy(&b.v, first * kvd, &mut r.v, 0, n * kvd)?;
        }
        let rows = Rows {
            q: &mut r.q,
            k: &mut r.k,
            v: &r.v,
            out: &mut r.att,
            n,
            pos,
        };
        attend(st, m, l, lw, &mut kv.layers[l], rows)?;
        st.copy(&r.att, 0, &mut b.att, first * qd, n * qd)?;
        Ok(())
    }

    /// The FFN block of layer `l`; times its phases from `t` and returns
    /// the end of the last.
    fn ffn_block(
        &mut self,
        l: usize,
        lw: &LayerWeights<D>,
        n: usize,
        t: Instant,
    ) -> Result<Instant, EngineError> {
        let m = self.model;
        let spec = &m.spec;
        let hidden = spec.hidden_size;
        let (st, b) = (&mut *self.stream, &mut *self.bufs);

        st.copy(&b.h, 0, &mut b.a, 0, n * hidden)?;
        st.rms_norm(
            &mut b.a,
            n,
            hidden,
            spec.norms.ffn_input,
            lw.ffn_norm.as_ref(),
        )?;
        let (t, phase) = match &lw.ffn {
            FfnWeights::Dense(d) => {
                let tmp = MlpScratch {
                    gate: &mut b.mlp_gate,
                    up: &mut b.mlp_up,
                };
                dense_mlp(st, m, d, &b.a, n, tmp, &mut b.o)?;
                if let Some(c) = self.hooks.census.as_mut() {
                    c.dense(st, l, FfnSite::Dense, &b.mlp_gate, n, d.intermediate)?;
                }
                (t, Phase::DenseFfn)
            }
            FfnWeights::Moe(mw) => (self.moe_block(l, lw, mw, n, t)?, Phase::Experts),
        };
        let (st, b) = (&mut *self.stream, &mut *self.bufs);
        if let Some(ns) = spec.norms.ffn_post {
            st.rms_norm(&mut b.o, n, hidden, ns, lw.post_ffw_norm.as_ref())?;
        }
        st.add(&mut b.h, &b.o, n * hidden)?;
        Ok(self.times.lap(phase, t))
    }

    /// The MoE part of a MoE layer's FFN: routed experts plus any shared or
    /// parallel dense branch, into `bufs.o`. `bufs.a` holds the FFN-normed
    /// input and `bufs.h` the residual stream entering the block. Times
    /// router, routed experts and dense branches from `t`; returns the end.
    fn moe_block(
        &mut self,
        l: usize,
        lw: &LayerWeights<D>,
        mw: &MoeWeights<D>,
        n: usize,
        t: Instant,
    ) -> Result<Instant, EngineError> {
        let m = self.model;
        let spec = &m.spec;
        let hidden = spec.hidden_size;
        let norms = &spec.norms;
        let (st, b) = (&mut *self.stream, &mut *self.bufs);
        let (Some(router_buf), Some(routes), Some(scratch), Some(moe_in), Some(router)) = (
            b.router.as_mut(),
            b.routes.as_mut(),
            b.moe.as_mut(),
            b.moe_in.as_mut(),
            m.router.as_ref(),
        ) else {
            return Err(EngineError::NotImplemented {
                feature: "a MoE layer in a spec without a MoE block",
            });
        };

        // Router. A router with its own input scale (Gemma 4) reads
        // `rms(h) · scale · hidden^-½` of the residual stream, with the
        // FFN norms' eps (HF: both are `rms_norm_eps`).
        match &mw.router_scale {
            Some(scale) => {
                st.copy(&b.h, 0, moe_in, 0, n * hidden)?;
                let ns = NormSpec::plain(norms.ffn_input.eps);
                st.rms_norm(moe_in, n, hidden, ns, Some(scale))?;
                st.scale(moe_in, n * hidden, (hidden as f64).powf(-0.5) as f32)?;
                st.matmul(&mw.router, moe_in, n, router_buf)?;
            }
            None => st.matmul(&mw.router, &b.a, n, router_buf)?,
        }
        add_bias::<D>(st, router_buf, mw.router_bias.as_ref(), n)?;
        let tables = RouterTables {
            correction: mw.exp_probs_b.as_ref(),
            expert_scale: mw.expert_scale.as_ref(),
        };
        st.route(router_buf, n, router, tables, routes)?;
        let t = self.times.lap(Phase::Router, t);

        // Routed experts, on the FFN-normed input or on their own norm of
        // the residual stream, wherever the store keeps them.
        let x = match norms.moe_input {
            Some(ns) => {
                st.copy(&b.h, 0, moe_in, 0, n * hidden)?;
                st.rms_norm(moe_in, n, hidden, ns, lw.pre_ffw_norm_2.as_ref())?;
                &*moe_in
            }
            None => &b.a,
        };
        self.experts.run(
            st,
            RoutedInput {
                layer: l,
                x,
                n_tokens: n,
                routes,
                resident: mw.experts.as_ref(),
                activation: spec.activation,
                census: self.hooks.census.as_mut(),
            },
            scratch,
            &mut b.o,
        )?;
        if let Some(ns) = norms.moe_post {
            st.rms_norm(&mut b.o, n, hidden, ns, lw.post_ffw_norm_2.as_ref())?;
        }
        let mut t = self.times.lap(Phase::Experts, t);

        // Always-on branches on the FFN-normed input.
        let branches = [
            (&mw.shared, FfnSite::Shared, None),
            (
                &mw.parallel_dense,
                FfnSite::ParallelDense,
                norms
                    .dense_branch_post
                    .map(|ns| (ns, lw.post_ffw_norm_1.as_ref())),
            ),
        ];
        for (w, site, post) in branches {
            let Some(w) = w else { continue };
            let tmp = MlpScratch {
                gate: &mut b.mlp_gate,
                up: &mut b.mlp_up,
            };
            dense_mlp(st, m, w, &b.a, n, tmp, &mut b.branch)?;
            if let Some(c) = self.hooks.census.as_mut() {
                c.dense(st, l, site, &b.mlp_gate, n, w.intermediate)?;
            }
            if let (FfnSite::Shared, Some(gw), Some(g)) =
                (site, &mw.shared_gate, b.shared_gate.as_mut())
            {
                st.matmul(gw, &b.a, n, g)?;
                st.mul_sigmoid_rows(&mut b.branch, g, n, hidden)?;
            }
            if let Some((ns, weight)) = post {
                st.rms_norm(&mut b.branch, n, hidden, ns, weight)?;
            }
            st.add(&mut b.o, &b.branch, n * hidden)?;
            t = self.times.lap(Phase::DenseFfn, t);
        }
        Ok(t)
    }

    /// Final norm, head, multiplier and soft-cap for batch rows
    /// `first .. first + rows`, read back into `out` (`[rows, vocab]`).
    fn head(&mut self, first: usize, rows: usize, out: &mut [f32]) -> Result<(), EngineError> {
        self.head_logits(first, rows)?;
        let vocab = self.model.spec.vocab_size;
        self.stream
            .read(&self.bufs.logits, &mut out[..rows * vocab])?;
        Ok(())
    }

    /// Final norm, head, multiplier and soft-cap of batch rows `first ..
    /// first + rows` into the logits buffer.
    fn head_logits(&mut self, first: usize, rows: usize) -> Result<(), EngineError> {
        let hidden = self.model.spec.hidden_size;
        let b = &mut self.bufs;
        self.stream
            .copy(&b.h, first * hidden, &mut b.a, 0, rows * hidden)?;
        self.head_on_a(rows)
    }

    /// Final norm, head, multiplier and soft-cap of the first `rows` rows
    /// of `bufs.a` (residual rows) into the logits buffer.
    fn head_on_a(&mut self, rows: usize) -> Result<(), EngineError> {
        let m = self.model;
        let (spec, st) = (&m.spec, &mut *self.stream);
        let (hidden, vocab) = (spec.hidden_size, spec.vocab_size);
        let b = &mut *self.bufs;
        st.rms_norm(
            &mut b.a,
            rows,
            hidden,
            spec.norms.output,
            m.weights.output_norm.as_ref(),
        )?;
        let w_out = m.weights.output.as_ref().unwrap_or(&m.weights.token_embd);
        st.matmul(w_out, &b.a, rows, &mut b.logits)?;
        if spec.head.multiplier != 1.0 {
            st.scale(&mut b.logits, rows * vocab, spec.head.multiplier)?;
        }
        if let Some(cap) = spec.head.softcap {
            st.softcap(&mut b.logits, rows * vocab, cap)?;
        }
        Ok(())
    }
}
