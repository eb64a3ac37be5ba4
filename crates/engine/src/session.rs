//! A session: one sequence's KV cache, its own stream on the model's device
//! (which owns the ops' scratch, so sessions on one model share nothing
//! mutable), and every buffer the decoder needs, allocated once.
//! [`Session::forward`] runs tokens at the cache's next position (a prompt
//! at once: prefill; one token: decode) and returns raw logits; nothing on
//! that path allocates.

use crate::decoder::Buffers;
use crate::experts::routed::SessionExperts;
use crate::experts::{ExpertStats, RouterHistogram};
use crate::hooks::{Hooks, ResidualSink, Steering};
use crate::kv::{layer_capacity, KvCache};
use crate::model::Model;
use crate::timing::PhaseTimes;
use crate::EngineError;
use turbospark_backend::{Device, Limits};

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
    /// The last token's logits for [`Session::decode`].
    last_logits: Vec<f32>,
    max_batch: usize,
}

impl<'m, D: Device> Session<'m, D> {
    pub(crate) fn new(model: &'m Model<D>, opts: SessionOptions) -> Result<Self, EngineError> {
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
        let max_keys = spec
            .layers
            .iter()
            .map(|l| layer_capacity(l.window, opts.context, max_batch))
            .max()
            .unwrap_or(0);
        let max_head_dim = spec.layers.iter().map(|l| l.head_dim).max().unwrap_or(0);
        // Streamed expert slots are uploaded first: the stream's scratch
        // fits every matrix on the device when it is created.
        let experts = SessionExperts::new(&model.spec, &model.device, &model.experts, max_batch)?;
        let stream = device.stream(&Limits {
            max_tokens: max_batch,
            max_keys,
            max_head_dim,
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
            last_logits: vec![0.0; spec.vocab_size],
            max_batch,
        })
    }

    /// The next position the cache expects.
    pub fn position(&self) -> usize {
        self.kv.position()
    }

    pub fn context(&self) -> usize {
        self.kv.context()
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
            self.run_chunk(pos, chunk, head)?;
            self.kv.advance(chunk.len());
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
        let mut out = std::mem::take(&mut self.last_logits);
        let result = self.forward(position, &[token], Logits::Last(&mut out));
        self.last_logits = out;
        result.map(|()| self.last_logits.as_slice())
    }
}
