//! A session: one sequence's KV cache, its own stream on the model's device
//! (which owns the ops' scratch, so sessions on one model share nothing
//! mutable), and every buffer the decoder needs, allocated once.
//! [`Session::forward`] runs tokens at the cache's next position (a prompt
//! at once: prefill; one token: decode) and returns raw logits; nothing on
//! that path allocates.
//!
//! A session can also compute other sequences whose KV caches it does not
//! own ([`Session::new_cache`]): [`Session::forward_in`] runs a prompt (or
//! a chunk of one) into such a cache, and [`Session::decode_batch`] decodes
//! one token for each of several sequences in one pass, every matmul over
//! all rows at once (the rows share each weight read) while rope, cache
//! write and attention stay per sequence, over its own cache.
//! [`Session::forward_chunks`] is the general form: one pass over chunks of
//! several sequences (decode tokens and prompt chunks together). Every op
//! computes a row the same way whatever the batch, so a sequence computed
//! in a batch gets the logits it would get alone (bit for bit where the
//! device's numerics are batch-invariant, as the CPU's exact and fast
//! numerics are).

use crate::batch::{BatchChunk, BatchRow};
use crate::census::{CensusState, FfnCensus};
use crate::decoder::Pass;
use crate::experts::routed::SessionExperts;
use crate::experts::{ExpertStats, RouterHistogram};
use crate::hooks::{Hooks, PreparedSteering, ResidualSink, Steering};
use crate::kv::KvCache;
use crate::mixers;
use crate::model::Model;
use crate::scratch::Buffers;
use crate::timing::PhaseTimes;
use crate::EngineError;
use turbospark_backend::{Device, Limits, Stream};

/// Sizes of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionOptions {
    /// Positions the KV cache holds.
    pub context: usize,
    /// Most tokens one batched pass processes; longer inputs run in chunks
    /// of this size. Scratch (including `max_batch × vocab` logits) scales
    /// with it.
    pub max_batch: usize,
}

impl SessionOptions {
    /// A session of `context` positions with the default batch of 64.
    pub fn new(context: usize) -> Self {
        SessionOptions {
            context,
            max_batch: 64,
        }
    }
}

/// Which logits a forward call returns.
pub enum Logits<'a> {
    /// None (the tokens only fill the cache).
    None,
    /// The last token's `[vocab]` logits.
    Last(&'a mut [f32]),
    /// Every token's logits, `[n_tokens, vocab]` row-major.
    All(&'a mut [f32]),
}

pub struct Session<'m, D: Device> {
    pub(crate) model: &'m Model<D>,
    /// This session's queue of ops and their scratch.
    pub(crate) stream: D::Stream,
    pub(crate) kv: KvCache<D>,
    pub(crate) bufs: Buffers<D>,
    /// Routed-expert slots (streamed), routes, statistics and router
    /// histogram.
    pub(crate) experts: SessionExperts<D>,
    /// Wall time per phase of the forward passes so far.
    pub(crate) times: PhaseTimes,
    /// Residual capture and steering (none by default).
    pub(crate) hooks: Hooks<D>,
    /// The last token's logits for [`Session::decode`], in the device's
    /// host memory (page-locked on a GPU, so the copy of a decode step's
    /// logits is one DMA instead of a staged copy through the driver; none
    /// only while a decode step holds it).
    last_logits: Option<D::HostBuf>,
    /// The tokens of a [`Session::decode_batch`] step `[max_batch]`.
    batch_tokens: Vec<u32>,
    max_batch: usize,
}

impl<D: Device> Model<D> {
    /// A session of `context` positions with the device's default batch
    /// ([`Device::default_batch`]).
    pub fn session_options(&self, context: usize) -> SessionOptions {
        SessionOptions {
            context,
            max_batch: self.device.default_batch(),
        }
    }

    /// A new session (KV cache and scratch) over this model.
    pub fn session(&self, options: SessionOptions) -> Result<Session<'_, D>, EngineError> {
        Session::new(self, options)
    }
}

impl<'m, D: Device> Session<'m, D> {
    fn new(model: &'m Model<D>, opts: SessionOptions) -> Result<Self, EngineError> {
        if opts.context == 0 || opts.max_batch == 0 {
            return Err(EngineError::BadOptions {
                detail: format!(
                    "context ({}) and max_batch ({}) must be positive",
                    opts.context, opts.max_batch
                ),
            });
        }
        let spec = &model.spec;
        let max_batch = opts.max_batch.min(opts.context);
        let device = &model.device;
        let kv = KvCache::new(device, spec, opts.context, max_batch)?;
        let (max_keys, max_head_dim) = mixers::stream_needs(spec, opts.context, max_batch);
        // Streamed expert slots are uploaded first: the stream's scratch
        // fits every matrix on the device when it is created.
        let experts = SessionExperts::new(&model.spec, &model.device, &model.experts, max_batch)?;
        let stream = device.stream(&Limits {
            max_tokens: max_batch,
            max_keys,
            max_head_dim,
            max_delta_head_dim: mixers::delta_head_dim(spec),
            max_experts: spec.moe.as_ref().map_or(0, |m| m.num_experts),
            max_routes: spec.moe.as_ref().map_or(0, |m| m.top_k * max_batch),
            max_expert_intermediate: spec.moe.as_ref().map_or(0, |m| m.expert_intermediate),
        })?;
        Ok(Session {
            model,
            stream,
            kv,
            bufs: Buffers::new(device, spec, max_batch)?,
            experts,
            times: PhaseTimes::default(),
            hooks: Hooks::default(),
            last_logits: Some(device.alloc_host(spec.vocab_size)?),
            batch_tokens: Vec::with_capacity(max_batch),
            max_batch,
        })
    }

    /// The decoder's view of this session for one forward pass over its
    /// own cache.
    fn pass(&mut self) -> Pass<'_, D> {
        Pass {
            model: self.model,
            stream: &mut self.stream,
            kv: &mut self.kv,
            bufs: &mut self.bufs,
            experts: &mut self.experts,
            times: &mut self.times,
            hooks: &mut self.hooks,
        }
    }

    /// The next position the cache expects.
    pub fn position(&self) -> usize {
        self.kv.position()
    }

    pub fn context(&self) -> usize {
        self.kv.context()
    }

    /// Most tokens one pass processes (and most rows of a
    /// [`Session::decode_batch`] step).
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    pub fn kv(&self) -> &KvCache<D> {
        &self.kv
    }

    /// Forgets the sequence (keeps the buffers, the expert slots' contents
    /// and the statistics).
    pub fn reset(&mut self) {
        self.kv.reset();
    }

    /// Expert cache traffic per MoE layer since the session began (or
    /// since the caller last reset it).
    pub fn expert_stats(&self) -> &ExpertStats {
        &self.experts.stats
    }

    pub fn expert_stats_mut(&mut self) -> &mut ExpertStats {
        &mut self.experts.stats
    }

    /// Wall time per phase of every forward pass since the session began
    /// (or since the caller last reset it).
    pub fn phase_times(&self) -> &PhaseTimes {
        &self.times
    }

    pub fn phase_times_mut(&mut self) -> &mut PhaseTimes {
        &mut self.times
    }

    /// Whether the session counts routes (router histogram, and requests
    /// and hits of resident experts); on by default. Counting reads each
    /// MoE layer's routes back to the host, which a resident layer
    /// otherwise never does (streamed layers always read them to fetch
    /// their experts).
    pub fn set_route_statistics(&mut self, on: bool) {
        self.experts.observe = on;
    }

    /// How often the router chose each expert of each MoE layer.
    pub fn router_histogram(&self) -> &RouterHistogram {
        &self.experts.histogram
    }

    pub fn router_histogram_mut(&mut self) -> &mut RouterHistogram {
        &mut self.experts.histogram
    }

    /// Steers every later forward pass with control vectors (`None`:
    /// stops steering); see [`crate::hooks`]. Checks the layer range and
    /// the vectors against the model; on error the steering is unchanged.
    pub fn set_steering(&mut self, steering: Option<&Steering>) -> Result<(), EngineError> {
        let spec = &self.model.spec;
        self.hooks.set_steering(
            &self.model.device,
            spec.layers.len(),
            spec.hidden_size,
            steering,
        )
    }

    /// Control vectors uploaded for this session's model, to steer one
    /// sequence of a batch ([`BatchChunk::steering`]); checked as
    /// [`Session::set_steering`] checks them.
    pub fn prepare_steering(
        &self,
        steering: &Steering,
    ) -> Result<PreparedSteering<D>, EngineError> {
        let spec = &self.model.spec;
        PreparedSteering::new(
            &self.model.device,
            spec.layers.len(),
            spec.hidden_size,
            steering,
        )
    }

    /// Captures the residual stream after each of `layers` (decoder layer
    /// indices from 0, HF `hidden_states[L + 1]`) in every later forward
    /// pass, handing the rows of each pass to `sink` (see
    /// [`crate::hooks`]). A capture already running is finished first.
    pub fn set_capture(
        &mut self,
        layers: &[usize],
        sink: Box<dyn ResidualSink>,
    ) -> Result<(), EngineError> {
        let spec = &self.model.spec;
        self.hooks.set_capture(
            &self.model.device,
            spec.layers.len(),
            spec.hidden_size,
            self.max_batch,
            layers,
            sink,
        )
    }

    /// Pauses (`false`) or resumes (`true`) the capture, e.g. to keep only
    /// the prompt's or only the generated tokens' rows.
    pub fn set_capture_enabled(&mut self, on: bool) {
        self.hooks.set_capture_enabled(on);
    }

    /// Starts an FFN census with `thresholds` (see [`crate::census`]),
    /// replacing any, or stops it (`None`).
    pub fn set_ffn_census(&mut self, thresholds: Option<&[f32]>) -> Result<(), EngineError> {
        let Some(thresholds) = thresholds else {
            self.hooks.set_census(None);
            return Ok(());
        };
        let c = CensusState::new(
            &self.model.device,
            &self.model.spec,
            self.max_batch,
            thresholds,
        )?;
        self.hooks.set_census(Some(c));
        Ok(())
    }

    /// The FFN census so far, when one runs.
    pub fn ffn_census(&self) -> Option<&FfnCensus> {
        self.hooks.census.as_ref().map(|c| &c.data)
    }

    /// The FFN census, to reset it.
    pub fn ffn_census_mut(&mut self) -> Option<&mut FfnCensus> {
        self.hooks.census.as_mut().map(|c| &mut c.data)
    }

    /// Ends the capture and finishes its sink (which may write a header or
    /// a sidecar); does nothing without a capture.
    pub fn finish_capture(&mut self) -> Result<(), EngineError> {
        self.hooks.finish_capture()
    }

    /// Runs `tokens` at positions `position ..`, which must be the cache's
    /// next position, and writes the logits asked for. Inputs are checked
    /// before any work: on error the session is unchanged.
    pub fn forward(
        &mut self,
        position: usize,
        tokens: &[u32],
        logits: Logits<'_>,
    ) -> Result<(), EngineError> {
        let vocab = self.model.spec.vocab_size;
        if tokens.is_empty() {
            return Err(EngineError::EmptyInput);
        }
        if let Some((index, &token)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= vocab)
        {
            return Err(EngineError::TokenOutOfVocab {
                token,
                index,
                vocab,
            });
        }
        self.kv.check_append(position, tokens.len())?;
        let rows = match &logits {
            Logits::None => 0,
            Logits::Last(_) => 1,
            Logits::All(_) => tokens.len(),
        };
        let have = match &logits {
            Logits::None => 0,
            Logits::Last(o) | Logits::All(o) => o.len(),
        };
        if have != rows * vocab {
            return Err(EngineError::LogitsBuffer {
                need: rows * vocab,
                have,
                rows,
                vocab,
            });
        }
        let n_chunks = tokens.len().div_ceil(self.max_batch);
        let mut logits = logits;
        for (c, chunk) in tokens.chunks(self.max_batch).enumerate() {
            let pos = position + c * self.max_batch;
            let head = match &mut logits {
                Logits::None => None,
                Logits::Last(out) => {
                    (c + 1 == n_chunks).then_some((chunk.len() - 1, 1, &mut **out))
                }
                Logits::All(out) => {
                    let at = c * self.max_batch * vocab;
                    Some((0, chunk.len(), &mut out[at..at + chunk.len() * vocab]))
                }
            };
            if let Err(e) = self.pass().run_chunk(pos, chunk, head) {
                // A recurrent state may have moved past the position: the
                // sequence must be recomputed, never continued.
                if self.kv.has_recurrent_state() {
                    self.kv.reset();
                }
                return Err(e);
            }
            self.kv.advance(chunk.len());
        }
        Ok(())
    }

    /// A KV cache for a sequence this session computes through
    /// [`Session::forward_in`] and [`Session::decode_batch`]: the same
    /// context and ring sizes as the session's own.
    pub fn new_cache(&self) -> Result<KvCache<D>, EngineError> {
        KvCache::new(
            &self.model.device,
            &self.model.spec,
            self.kv.context(),
            self.max_batch,
        )
    }

    /// Makes `dst` hold the first `positions` positions of `src` (both made
    /// by [`Session::new_cache`]): their keys and values copied, `dst`'s
    /// position set to `positions`, whatever `dst` held forgotten. A row
    /// depends only on its token and the positions before it, so `dst` then
    /// continues exactly as a sequence that computed those tokens itself
    /// would (the server's reuse of a prompt prefix another sequence
    /// computed). Refused, with `dst` unchanged, where [`KvCache::rewind`]
    /// would refuse to take `src` back to `positions`: past its position,
    /// after a sliding layer's ring wrapped, or, but for 0, with a
    /// recurrent state.
    pub fn copy_prefix(
        &mut self,
        src: &KvCache<D>,
        dst: &mut KvCache<D>,
        positions: usize,
    ) -> Result<(), EngineError> {
        self.check_cache(src)?;
        self.check_cache(dst)?;
        src.check_rewind(positions)?;
        dst.reset();
        for (s, d) in src.layers.iter().zip(dst.layers.iter_mut()) {
            mixers::LayerCache::copy_prefix(&mut self.stream, s, d, positions)?;
        }
        dst.advance(positions);
        Ok(())
    }

    /// Checks that `kv` is shaped like this session's own cache.
    fn check_cache(&self, kv: &KvCache<D>) -> Result<(), EngineError> {
        if kv.same_shape(&self.kv) {
            Ok(())
        } else {
            Err(EngineError::BadOptions {
                detail: "a KV cache not made by this session's new_cache".into(),
            })
        }
    }

    /// [`Session::forward`] for the sequence whose cache is `kv` (made by
    /// [`Session::new_cache`]), at its next position; this session's own
    /// cache is left as it was.
    pub fn forward_in(
        &mut self,
        kv: &mut KvCache<D>,
        tokens: &[u32],
        logits: Logits<'_>,
    ) -> Result<(), EngineError> {
        self.check_cache(kv)?;
        // A recorded decode step names the cache it was recorded with: none
        // may be replayed over another sequence's cache, nor kept after it.
        self.stream.forget_step();
        std::mem::swap(&mut self.kv, kv);
        let result = self.forward(self.kv.position(), tokens, logits);
        std::mem::swap(&mut self.kv, kv);
        self.stream.forget_step();
        result
    }

    /// One decode step of several sequences in one pass: row `i` feeds
    /// `rows[i].token` at the next position of `rows[i].kv` (a cache made by
    /// [`Session::new_cache`]) and gets its logits in `logits[i · vocab ..]`
    /// (`[rows.len(), vocab]`). At most `max_batch` rows. Inputs are checked
    /// before any work: on error every cache is unchanged.
    pub fn decode_batch(
        &mut self,
        rows: &mut [BatchRow<'_, D>],
        logits: &mut [f32],
    ) -> Result<(), EngineError> {
        let vocab = self.model.spec.vocab_size;
        let n = rows.len();
        if n == 0 {
            return Err(EngineError::EmptyInput);
        }
        if self.hooks.observes() {
            return Err(EngineError::BadOptions {
                detail: "residual capture and the FFN census follow one sequence; \
                         decode_batch does not run while they are set"
                    .into(),
            });
        }
        if n > self.max_batch {
            return Err(EngineError::BadOptions {
                detail: format!(
                    "{n} sequences in one decode step, the session's max_batch is {}",
                    self.max_batch
                ),
            });
        }
        if logits.len() != n * vocab {
            return Err(EngineError::LogitsBuffer {
                need: n * vocab,
                have: logits.len(),
                rows: n,
                vocab,
            });
        }
        for (index, row) in rows.iter().enumerate() {
            if row.token as usize >= vocab {
                return Err(EngineError::TokenOutOfVocab {
                    token: row.token,
                    index,
                    vocab,
                });
            }
            self.check_cache(row.kv)?;
            row.kv.check_append(row.kv.position(), 1)?;
        }
        let mut tokens = std::mem::take(&mut self.batch_tokens);
        tokens.clear();
        tokens.extend(rows.iter().map(|r| r.token));
        let result = self.pass().run_rows(rows, &tokens, logits);
        self.batch_tokens = tokens;
        if let Err(e) = result {
            // As in forward_chunks: a moved recurrent state is not continued.
            for row in rows.iter_mut().filter(|r| r.kv.has_recurrent_state()) {
                row.kv.reset();
            }
            return Err(e);
        }
        for row in rows.iter_mut() {
            row.kv.advance(1);
        }
        Ok(())
    }

    /// One pass over chunks of several sequences: chunk `c` feeds
    /// `chunks[c].tokens` at the next positions of `chunks[c].kv` (a cache
    /// made by [`Session::new_cache`]); the chunks that ask for logits get
    /// their last token's in `logits`, in chunk order (`[asking chunks,
    /// vocab]`). A decode step is a chunk of one token; a prompt chunk
    /// rides along with the decode steps of other sequences. At most
    /// `max_batch` tokens in all. Inputs are checked before any work: on
    /// error every cache is unchanged.
    pub fn forward_chunks(
        &mut self,
        chunks: &mut [BatchChunk<'_, D>],
        logits: &mut [f32],
    ) -> Result<(), EngineError> {
        let vocab = self.model.spec.vocab_size;
        if chunks.is_empty() || chunks.iter().any(|c| c.tokens.is_empty()) {
            return Err(EngineError::EmptyInput);
        }
        if self.hooks.observes() {
            return Err(EngineError::BadOptions {
                detail: "residual capture and the FFN census follow one sequence; \
                         forward_chunks does not run while they are set"
                    .into(),
            });
        }
        let n: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        if n > self.max_batch {
            return Err(EngineError::BadOptions {
                detail: format!(
                    "{n} tokens in one pass, the session's max_batch is {}",
                    self.max_batch
                ),
            });
        }
        let rows = chunks.iter().filter(|c| c.logits).count();
        if logits.len() != rows * vocab {
            return Err(EngineError::LogitsBuffer {
                need: rows * vocab,
                have: logits.len(),
                rows,
                vocab,
            });
        }
        let mut index = 0;
        for c in chunks.iter() {
            if let Some(&token) = c.tokens.iter().find(|&&t| t as usize >= vocab) {
                let at = c.tokens.iter().position(|&t| t == token).unwrap_or(0);
                return Err(EngineError::TokenOutOfVocab {
                    token,
                    index: index + at,
                    vocab,
                });
            }
            index += c.tokens.len();
            self.check_cache(c.kv)?;
            c.kv.check_append(c.kv.position(), c.tokens.len())?;
        }
        let mut tokens = std::mem::take(&mut self.batch_tokens);
        tokens.clear();
        for c in chunks.iter() {
            tokens.extend_from_slice(c.tokens);
        }
        let result = self.pass().run_chunks(chunks, &tokens, logits);
        self.batch_tokens = tokens;
        if let Err(e) = result {
            // A recurrent state may have moved past its cache's position:
            // those sequences must be recomputed, never continued.
            for c in chunks.iter_mut().filter(|c| c.kv.has_recurrent_state()) {
                c.kv.reset();
            }
            return Err(e);
        }
        for c in chunks.iter_mut() {
            c.kv.advance(c.tokens.len());
        }
        Ok(())
    }

    /// Prefill: every token's logits, `[tokens.len(), vocab]`, into `out`.
    pub fn prefill(&mut self, tokens: &[u32], out: &mut [f32]) -> Result<(), EngineError> {
        self.forward(self.position(), tokens, Logits::All(out))
    }

    /// Decode one token at `position` (the cache's next position); returns
    /// its logits.
    pub fn decode(&mut self, token: u32, position: usize) -> Result<&[f32], EngineError> {
        let mut out = match self.last_logits.take() {
            Some(out) => out,
            None => self.model.device.alloc_host(self.model.spec.vocab_size)?,
        };
        let result = self.forward(position, &[token], Logits::Last(out.as_mut()));
        let out: &D::HostBuf = self.last_logits.insert(out);
        result?;
        Ok(out.as_ref())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sessions_stay_sendable() {
        fn send<T: Send>() {}
        send::<super::Session<'static, turbospark_cpu::CpuDevice>>();
    }
}
