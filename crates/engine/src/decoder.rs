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
//!   q, k = a·Wq (+b), a·Wk (+b) ; v = a·Wv (+b), or k itself (value_from_key)
//!   q, k, v = per-head q/k/v norms ; q, k = rope(q, k)
//!   cache k, v ; o = attention(q, cache)          (window, sinks, softcap, GQA)
//!   o ⊙= sigmoid(a·Wgate)                          (output gate)
//!   h += attn_post_norm(o·Wo (+b))
//!   a = ffn_norm(h)
//!   dense layer: f = dense(a)
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
use crate::experts::routed::RoutedInput;
use crate::hooks::PreparedSteering;
use crate::kv::KvCache;
use crate::session::Session;
use crate::timing::Phase;
use crate::weights::{DenseWeights, FfnWeights, LayerWeights, MlaWeights, MoeWeights};
use crate::EngineError;
use crate::Model;
use std::time::Instant;
use turbospark_backend::{
    AttentionParams, AttentionPart, DType, Device, MoeInput, MoeScratch, RouterTables, Stream,
};
use turbospark_core::arch::{ArchSpec, FfnKind, LayerSpec, MlaSpec, NormSpec};

/// Scratch activations of a session, `T = max_batch` rows each.
pub(crate) struct Buffers<D: Device> {
    /// Residual stream `[T, hidden]`.
    h: D::Buf,
    /// Normed block input `[T, hidden]`.
    a: D::Buf,
    /// `[T, n_heads · head_dim]`
    q: D::Buf,
    /// `[T, n_kv_heads · head_dim]`
    k: D::Buf,
    v: D::Buf,
    /// Attention output `[T, n_heads · head_dim]`.
    att: D::Buf,
    /// Output-gate logits `[T, n_heads · head_dim]`.
    gate: Option<D::Buf>,
    /// Block output before the residual add `[T, hidden]`.
    o: D::Buf,
    /// Dense / shared MLP `[T, intermediate]`.
    mlp_gate: D::Buf,
    mlp_up: D::Buf,
    /// Second FFN branch (shared expert, parallel dense) `[T, hidden]`.
    branch: D::Buf,
    /// Router logits `[T, num_experts]`.
    router: Option<D::Buf>,
    /// Routes `[T, top_k]`, expert ids.
    routes: Option<D::Routes>,
    /// Router or expert input taken from the residual stream under its own
    /// norm (Gemma 4) `[T, hidden]`.
    moe_in: Option<D::Buf>,
    moe: Option<MoeScratch<D::Buf>>,
    /// `[T, vocab]`
    logits: D::Buf,
    /// q, k, v and attention output of one sequence's rows, for a batch
    /// of sequences that attend to caches of their own ([`At::Rows`],
    /// [`At::Chunks`]).
    row: RowScratch<D>,
    /// Latent attention's projections.
    mla: Option<MlaScratch<D>>,
}

/// Latent attention's intermediate rows, `T` of each.
struct MlaScratch<D: Device> {
    /// `q_a · x` `[T, q_lora]`
    q_a: D::Buf,
    /// The latent `c` `[T, kv_lora]`.
    latent: D::Buf,
    /// The shared rope key `[T, rope]`.
    rope: D::Buf,
}

/// One sequence's q `[T, n_heads · head_dim]`, k and v `[T, n_kv_heads ·
/// head_dim]` and attention output `[T, n_heads · head_dim]`, its rows
/// copied out of the batch so that rope, cache write and attention see
/// them from row 0.
struct RowScratch<D: Device> {
    q: D::Buf,
    k: D::Buf,
    v: D::Buf,
    att: D::Buf,
}

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
/// ([`Session::forward_chunks`]): `tokens` at the next positions of `kv`
/// (one token of a decode step, or a chunk of a prompt), whether the pass
/// returns the logits of its last token, and control vectors that steer
/// this sequence's rows alone (after the session's own steering, if any).
pub struct BatchChunk<'k, D: Device> {
    pub kv: &'k mut KvCache<D>,
    pub tokens: &'k [u32],
    pub logits: bool,
    pub steering: Option<&'k PreparedSteering<D>>,
}

fn max_over<'a>(layers: &'a [LayerSpec], f: impl Fn(&'a LayerSpec) -> usize) -> usize {
    layers.iter().map(f).max().unwrap_or(0)
}

impl<D: Device> Buffers<D> {
    pub(crate) fn new(device: &D, spec: &ArchSpec, t: usize) -> Result<Self, EngineError> {
        let alloc = |len| device.alloc(DType::F32, len);
        let h = spec.hidden_size;
        let qd = max_over(&spec.layers, |l| spec.num_heads * l.head_dim);
        let kvd = max_over(&spec.layers, |l| l.num_kv_heads * l.head_dim);
        let any_dense = spec.layers.iter().any(|l| l.ffn == FfnKind::Dense)
            || spec.moe.as_ref().is_some_and(|m| m.parallel_dense);
        let inter = [
            if any_dense { spec.intermediate_size } else { 0 },
            spec.moe
                .as_ref()
                .and_then(|m| m.shared_intermediate)
                .unwrap_or(0),
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        let moe = spec
            .moe
            .as_ref()
            .map(|m| {
                Ok::<_, EngineError>(MoeScratch {
                    x: alloc(t * h)?,
                    gate: alloc(t * m.expert_intermediate)?,
                    up: alloc(t * m.expert_intermediate)?,
                    y: alloc(t * m.top_k * h)?,
                })
            })
            .transpose()?;
        Ok(Buffers {
            h: alloc(t * h)?,
            a: alloc(t * h)?,
            q: alloc(t * qd)?,
            k: alloc(t * kvd)?,
            v: alloc(t * kvd)?,
            att: alloc(t * qd)?,
            gate: spec
                .attention
                .output_gate
                .then(|| alloc(t * qd))
                .transpose()?,
            o: alloc(t * h)?,
            mlp_gate: alloc(t * inter)?,
            mlp_up: alloc(t * inter)?,
            branch: alloc(t * h)?,
            router: spec
                .moe
                .as_ref()
                .map(|m| alloc(t * m.num_experts))
                .transpose()?,
            routes: spec
                .moe
                .as_ref()
                .map(|m| device.alloc_routes(t, m.top_k))
                .transpose()?,
            moe_in: spec.moe.as_ref().map(|_| alloc(t * h)).transpose()?,
            moe,
            logits: alloc(t * spec.vocab_size)?,
            row: RowScratch {
                q: alloc(t * qd)?,
                k: alloc(t * kvd)?,
                v: alloc(t * kvd)?,
                att: alloc(t * qd)?,
            },
            mla: spec
                .mla
                .as_ref()
                .map(|a| {
                    Ok::<_, EngineError>(MlaScratch {
                        q_a: alloc(t * a.q_lora_rank.unwrap_or(0))?,
                        latent: alloc(t * a.kv_lora_rank)?,
                        rope: alloc(t * a.qk_rope_head_dim)?,
                    })
                })
                .transpose()?,
        })
    }
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
/// query `[q_rope, W_uk[h]ᵀ·q_nope]` of each head, `bufs.k` `[n, rope +
/// kv_lora]` the row `[k_rope, rms(c)]` the cache keeps (rope is applied
/// later, to the first `rope` dims of both).
fn latent_qk<D: Device>(
    st: &mut D::Stream,
    b: &mut Buffers<D>,
    a: &MlaSpec,
    attn_q: &D::Matrix,
    w: &MlaWeights<D>,
    n: usize,
) -> Result<(), EngineError> {
    let Some(s) = b.mla.as_mut() else {
        return Err(EngineError::NotImplemented {
            feature: "latent attention without its scratch",
        });
    };
    let norm = NormSpec::plain(MlaSpec::NORM_EPS);
    match (&w.q_a, a.q_lora_rank) {
        (Some((q_a, q_a_norm)), Some(rank)) => {
            st.matmul(q_a, &b.a, n, &mut s.q_a)?;
            st.rms_norm(&mut s.q_a, n, rank, norm, Some(q_a_norm))?;
            st.matmul(attn_q, &s.q_a, n, &mut b.q)?;
        }
        _ => st.matmul(attn_q, &b.a, n, &mut b.q)?,
    }
    let (r, dr) = (a.kv_lora_rank, a.qk_rope_head_dim);
    st.matmul(&w.kv_a_latent, &b.a, n, &mut s.latent)?;
    st.rms_norm(&mut s.latent, n, r, norm, Some(&w.kv_a_norm))?;
    st.matmul(&w.kv_a_rope, &b.a, n, &mut s.rope)?;
    let row = a.latent_head_dim();
    for t in 0..n {
        st.copy(&s.rope, t * dr, &mut b.k, t * row, dr)?;
        st.copy(&s.latent, t * r, &mut b.k, t * row + dr, r)?;
    }
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

impl<D: Device> Session<'_, D> {
    /// Runs one batch of at most `max_batch` tokens at `pos` (inputs already
    /// checked) and, if asked, writes the logits of `rows` rows starting at
    /// batch row `first` into `out`.
    pub(crate) fn run_chunk(
        &mut self,
        pos: usize,
        tokens: &[u32],
        head: Option<(usize, usize, &mut [f32])>,
    ) -> Result<(), EngineError> {
        let recordable = tokens.len() == 1
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
    /// [`Session::decode_batch`] refuses to run while they are set.
    fn embed_and_layers(
        &mut self,
        at: &mut At<'_, '_, D>,
        tokens: &[u32],
    ) -> Result<Instant, EngineError> {
        let m = self.model;
        let spec = &m.spec;
        let n = tokens.len();
        let hidden = spec.hidden_size;
        let (st, b) = (&mut self.stream, &mut self.bufs);

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
                self.hooks.after_layer(&mut self.stream, l, h, n, hidden)?;
            } else if steer_rows {
                self.hooks.steer(&mut self.stream, l, &mut self.bufs.h, n)?;
            }
            if let At::Chunks(chunks) = at {
                self.steer_chunks(l, chunks)?;
            }
        }
        if let Some(pos) = hooks {
            self.hooks
                .end_chunk(&mut self.stream, pos, tokens, hidden)?;
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
        let (spec, st) = (&m.spec, &mut self.stream);
        let ls = &spec.layers[l];
        let (hidden, nh, hd) = (spec.hidden_size, spec.num_heads, ls.head_dim);
        let norms = &spec.norms;
        let b = &mut self.bufs;

        st.copy(&b.h, 0, &mut b.a, 0, n * hidden)?;
        st.rms_norm(&mut b.a, n, hidden, norms.attn_input, lw.attn_norm.as_ref())?;
        match (&spec.mla, &lw.mla, &lw.attn_k) {
            (Some(a), Some(w), _) => latent_qk::<D>(st, b, a, &lw.attn_q, w, n)?,
            (None, None, Some(wk)) => Self::project_qkv(st, b, lw, spec, ls, n, wk)?,
            _ => {
                return Err(EngineError::NotImplemented {
                    feature: "attention weights that do not match the spec",
                })
            }
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
        let (st, b) = (&mut self.stream, &mut self.bufs);
        if let (Some(wg), Some(g)) = (&lw.attn_gate, b.gate.as_mut()) {
            st.matmul(wg, &b.a, n, g)?;
            st.mul_sigmoid(&mut b.att, g, n * nh * hd)?;
        }
        st.matmul(&lw.attn_output, &b.att, n, &mut b.o)?;
        add_bias::<D>(st, &mut b.o, lw.attn_output_bias.as_ref(), n)?;
        if let Some(ns) = norms.attn_post {
            st.rms_norm(&mut b.o, n, hidden, ns, lw.post_attention_norm.as_ref())?;
        }
        st.add(&mut b.h, &b.o, n * hidden)?;
        Ok(())
    }

    /// q, k, v of plain attention for `n` tokens, with their biases and
    /// per-head norms.
    fn project_qkv(
        st: &mut D::Stream,
        b: &mut Buffers<D>,
        lw: &LayerWeights<D>,
        spec: &ArchSpec,
        ls: &LayerSpec,
        n: usize,
        attn_k: &D::Matrix,
    ) -> Result<(), EngineError> {
        let (nh, nkv, hd) = (spec.num_heads, ls.num_kv_heads, ls.head_dim);
        let norms = &spec.norms;
        st.matmul(&lw.attn_q, &b.a, n, &mut b.q)?;
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

    /// Rope, cache write and attention of layer `l` for `n` tokens at
    /// consecutive positions from `pos` in the session's own cache.
    fn attend_own(
        &mut self,
        l: usize,
        lw: &LayerWeights<D>,
        pos: usize,
        n: usize,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (spec, st, b) = (&m.spec, &mut self.stream, &mut self.bufs);
        let ls = &spec.layers[l];
        let (nh, nkv, hd) = (spec.num_heads, ls.num_kv_heads, ls.head_dim);
        if let Some(rope) = &m.ropes[l] {
            st.rope(&mut b.q, n, nh, hd, pos, rope)?;
            st.rope(&mut b.k, n, nkv, hd, pos, rope)?;
        }
        let kv = &mut self.kv.layers[l];
        // Latent attention reads its one cached row as keys and values.
        let latent = spec.mla.is_some();
        st.kv_write(&mut kv.k, &b.k, n, kv.row, pos, kv.capacity)?;
        if !latent {
            st.kv_write(&mut kv.v, &b.v, n, kv.row, pos, kv.capacity)?;
        }
        let params = AttentionParams {
            n_tokens: n,
            first_pos: pos,
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            capacity: kv.capacity,
            window: ls.window,
            scale: spec.attention.scale,
            softcap: spec.attention.softcap,
        };
        st.attention(
            &b.q,
            &kv.k,
            if latent { &kv.k } else { &kv.v },
            &params,
            lw.attn_sinks.as_ref(),
            &mut b.att,
        )?;
        Ok(())
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
        let (spec, st, b) = (&m.spec, &mut self.stream, &mut self.bufs);
        let ls = &spec.layers[l];
        let (nh, nkv, hd) = (spec.num_heads, ls.num_kv_heads, ls.head_dim);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let latent = spec.mla.is_some();
        let r = &mut b.row;
        let pos = kv.position();
        st.copy(&b.k, first * kvd, &mut r.k, 0, n * kvd)?;
        if !latent {
            st.copy(&b.v, first * kvd, &mut r.v, 0, n * kvd)?;
        }
        if let Some(rope) = &m.ropes[l] {
            st.copy(&b.q, first * qd, &mut r.q, 0, n * qd)?;
            st.rope(&mut r.q, n, nh, hd, pos, rope)?;
            st.copy(&r.q, 0, &mut b.q, first * qd, n * qd)?;
            st.rope(&mut r.k, n, nkv, hd, pos, rope)?;
        }
        let kv = &mut kv.layers[l];
        st.kv_write(&mut kv.k, &r.k, n, kv.row, pos, kv.capacity)?;
        if !latent {
            st.kv_write(&mut kv.v, &r.v, n, kv.row, pos, kv.capacity)?;
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
        let (spec, st, b) = (&m.spec, &mut self.stream, &mut self.bufs);
        let ls = &spec.layers[l];
        let latent = spec.mla.is_some();
        // A few dozen bytes per sequence and layer; the per-sequence caches
        // it borrows change every layer.
        let parts: Vec<AttentionPart<'_, D::Buf>> = parts
            .map(|(kv, n)| {
                let kl = &kv.layers[l];
                AttentionPart {
                    k_cache: &kl.k,
                    v_cache: if latent { &kl.k } else { &kl.v },
                    params: AttentionParams {
                        n_tokens: n,
                        first_pos: kv.position(),
                        n_heads: spec.num_heads,
                        n_kv_heads: ls.num_kv_heads,
                        head_dim: ls.head_dim,
                        capacity: kl.capacity,
                        window: ls.window,
                        scale: spec.attention.scale,
                        softcap: spec.attention.softcap,
                    },
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
        let (spec, st, b) = (&m.spec, &mut self.stream, &mut self.bufs);
        let ls = &spec.layers[l];
        let (nh, nkv, hd) = (spec.num_heads, ls.num_kv_heads, ls.head_dim);
        let (qd, kvd) = (nh * hd, nkv * hd);
        let latent = spec.mla.is_some();
        let r = &mut b.row;
        let pos = kv.position();
        st.copy(&b.q, first * qd, &mut r.q, 0, n * qd)?;
        st.copy(&b.k, first * kvd, &mut r.k, 0, n * kvd)?;
        if !latent {
            st.copy(&b.v, first * kvd, &mut r.v, 0, n * kvd)?;
        }
        if let Some(rope) = &m.ropes[l] {
            st.rope(&mut r.q, n, nh, hd, pos, rope)?;
            st.rope(&mut r.k, n, nkv, hd, pos, rope)?;
        }
        let kv = &mut kv.layers[l];
        st.kv_write(&mut kv.k, &r.k, n, kv.row, pos, kv.capacity)?;
        if !latent {
            st.kv_write(&mut kv.v, &r.v, n, kv.row, pos, kv.capacity)?;
        }
        let params = AttentionParams {
            n_tokens: n,
            first_pos: pos,
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            capacity: kv.capacity,
            window: ls.window,
            scale: spec.attention.scale,
            softcap: spec.attention.softcap,
        };
        st.attention(
            &r.q,
            &kv.k,
            if latent { &kv.k } else { &kv.v },
            &params,
            lw.attn_sinks.as_ref(),
            &mut r.att,
        )?;
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
        let (st, b) = (&mut self.stream, &mut self.bufs);

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
        let (st, b) = (&mut self.stream, &mut self.bufs);
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
        let (st, b) = (&mut self.stream, &mut self.bufs);
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
            },
            scratch,
            &mut b.o,
        )?;
        if let (Some(c), Some(bank)) = (self.hooks.census.as_mut(), mw.experts.as_ref()) {
            let input = MoeInput {
                x,
                n_tokens: n,
                routes,
                bank,
                activation: spec.activation,
            };
            c.experts(st, l, input, scratch)?;
        }
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
        let (spec, st) = (&m.spec, &mut self.stream);
        let (hidden, vocab) = (spec.hidden_size, spec.vocab_size);
        let b = &mut self.bufs;
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
