//! The generic decoder: one pass over a batch of tokens, for every family,
//! driven by the [`ArchSpec`](turbospark_core::ArchSpec) alone (the math
//! is in `turbospark_core::arch`; the normative references are the HF
//! `modeling_<type>.py` files of transformers 5.24.0: llama, qwen2, gemma3,
//! muse_glimmer, mixtral, qwen3_moe, gpt_oss, glm4_moe, gemma4). What a
//! layer does between its input norm and its residual add is its token
//! mixer's ([`crate::mixers`]), which this file names by no kind.
//!
//! ```text
//! h = embed(tokens) · embedding.scale ; h = embedding.norm(h)
//! per layer (head_dim and n_kv_heads are the layer's own):
//!   a = attn_norm(h)
//!   h += attn_post_norm(mix(a))                    the layer's token mixer: attention,
//!                                                  latent attention, or a DeltaNet recurrence
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

use crate::batch::{At, BatchChunk, BatchRow};
use crate::census::FfnSite;
use crate::experts::routed::{RoutedInput, SessionExperts};
use crate::hooks::Hooks;
use crate::kv::KvCache;
use crate::mixers::MixIo;
use crate::model::Model;
use crate::scratch::Buffers;
use crate::timing::{Phase, PhaseTimes};
use crate::weights::{DenseWeights, FfnWeights, LayerWeights, MoeWeights};
use crate::EngineError;
use std::time::Instant;
use turbospark_backend::{Device, RouterTables, Stream};
use turbospark_core::arch::NormSpec;

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
            self.mixer_block(l, lw, at, n)?;
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

    /// The input norm, token mixer, post norm and residual add of layer `l`.
    fn mixer_block(
        &mut self,
        l: usize,
        lw: &LayerWeights<D>,
        at: &mut At<'_, '_, D>,
        n: usize,
    ) -> Result<(), EngineError> {
        let m = self.model;
        let (spec, st) = (&m.spec, &mut *self.stream);
        let hidden = spec.hidden_size;
        let norms = &spec.norms;
        let b = &mut *self.bufs;

        st.copy(&b.h, 0, &mut b.a, 0, n * hidden)?;
        st.rms_norm(&mut b.a, n, hidden, norms.attn_input, lw.attn_norm.as_ref())?;
        let io = MixIo {
            st,
            spec,
            l,
            rope: m.ropes[l].as_ref(),
            a: &b.a,
            o: &mut b.o,
            n,
        };
        let mut view = None;
        let seqs = at.seqs(l, self.kv, &mut view);
        lw.mixer.forward(io, &mut b.mixer, seqs)?;
        let (st, b) = (&mut *self.stream, &mut *self.bufs);
        if let Some(ns) = norms.attn_post {
            st.rms_norm(&mut b.o, n, hidden, ns, lw.post_attention_norm.as_ref())?;
        }
        st.add(&mut b.h, &b.o, n * hidden)?;
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
        if let Some(bias) = &mw.router_bias {
            st.add_bias(router_buf, bias, n)?;
        }
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
                device: &self.model.device,
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
