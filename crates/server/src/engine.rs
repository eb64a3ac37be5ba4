//! The scheduler: one thread that owns the model and runs continuous
//! batching over up to `parallel` sequences, each with a KV cache of its
//! own (allocated once, at start, and reused).
//!
//! Every step of the loop:
//! 1. admits queued jobs into free places (blocking only when nothing runs),
//!    each into the place whose cache already holds the longest prefix of
//!    its prompt (a place keeps the keys and values of the sequence that
//!    last held it, and the tokens they belong to: requests that share a
//!    system prompt, or a conversation's next turn, compute only what is
//!    new; a prefix is shared only between sequences steered alike, since
//!    steering changes the keys and values of the layers after it); when
//!    another place, a running sequence's included, holds a longer prefix,
//!    its keys and values are copied in ([`Session::copy_prefix`]: a copy
//!    costs far less than computing the tokens again);
//! 2. ends sequences whose client went away (the receiving half of their
//!    event channel is closed) or whose deadline passed, freeing their place;
//! 3. runs one forward pass ([`Session::forward_chunks`]) over one token of
//!    every sequence past its prompt (a decode step) and prompt chunks of
//!    at most [`PREFILL_CHUNK`] tokens of the sequences still reading their
//!    prompts, oldest first, up to [`PREFILL_BUDGET`] prompt tokens (so a
//!    long prompt delays the others by a few chunks per step, not by its
//!    whole length). The rows share each weight read, while rope, cache
//!    write and attention are per sequence over its own cache;
//! 4. samples each sequence's next token, then sends every sequence's new
//!    text (and ends) to its request at once.
//!
//! A sequence is generated exactly as `turbospark run` generates an answer
//! (the CLI's `generate.rs`): every prompt token is shown to the sampler,
//! the prompt is prefilled, then sample, stop on an end-of-generation
//! token, a stop string, `max_tokens` or a full context, else feed the
//! token back. Each op computes a row the same way whatever the batch, and
//! a row depends only on its token and the keys and values before it
//! (however they were computed), so with batch-invariant numerics (the
//! CPU's `exact` and `fast`) a sequence's tokens depend neither on what
//! else is being decoded nor on where its prefix came from.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use std::rc::Rc;
use tokio::sync::mpsc::UnboundedSender;
use turbospark_backend::Device;
use turbospark_engine::{
    BatchChunk, KvCache, Model, PreparedSteering, Session, SessionOptions, Steering,
};
use turbospark_text::{Sampler, SamplerConfig, StreamDecoder, Tokenizer};

use crate::metrics::Metrics;
use crate::ServerError;

/// Most prompt tokens of one sequence in one step; also the chunk
/// `turbospark run` prefills in (the session's default batch).
pub const PREFILL_CHUNK: usize = 64;

/// Prompt tokens prefilled per step at most, over all sequences: several
/// short prompts that arrive together start within one step, while a long
/// prompt still yields to the decoding sequences every few chunks.
pub const PREFILL_BUDGET: usize = 2 * PREFILL_CHUNK;

/// What a request asks the engine to generate.
#[derive(Debug, Clone)]
pub struct GenParams {
    pub sampler: SamplerConfig,
    pub max_tokens: usize,
    pub stops: Vec<String>,
}

/// One request, from the HTTP side to the scheduler.
pub struct Job {
    pub prompt: Vec<u32>,
    pub params: GenParams,
    /// Control vectors of this request alone, replacing the server's
    /// default steering (checked against the model); `None`: the default.
    pub steering: Option<Steering>,
    /// Text and the end of the generation go here; a closed receiver means
    /// the client went away.
    pub events: UnboundedSender<Event>,
    /// When the request gives up.
    pub deadline: Instant,
}

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token.
    Eos,
    /// A stop string was generated (it is not part of the text).
    Stop(String),
    /// `max_tokens` generated.
    MaxTokens,
    /// The KV cache is full.
    ContextFull,
}

/// What the scheduler tells a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The sequence got its place and its prompt is being read.
    Started,
    /// Text that is final (stop strings held back until they cannot match).
    Text(String),
    Done {
        finish: Finish,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    /// The request's deadline passed first.
    TimedOut,
    /// The engine failed on this sequence.
    Failed(String),
}

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Sequences decoded together.
    pub parallel: usize,
    /// KV positions of each sequence.
    pub context: usize,
    /// Control vectors steering every sequence whose request does not
    /// bring its own (`--control-vector`).
    pub steering: Option<Steering>,
}

/// The steering that computed a place's keys and values: steering changes
/// the residual stream, so a cached prefix serves only a sequence steered
/// the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Steered {
    /// Not steered.
    No,
    /// By the server's default control vectors.
    Default,
    /// By a request's own (never shared).
    Own,
}

/// A place of the batch: a KV cache, the tokens whose keys and values it
/// holds (`tokens[p]` at position `p`, up to the cache's position), and
/// how they were steered.
struct Place<D: Device> {
    kv: KvCache<D>,
    tokens: Vec<u32>,
    steered: Steered,
}

impl<D: Device> Place<D> {
    /// Positions of `prompt` this place already holds for a sequence
    /// steered as `steered`, leaving at least one token to compute (its
    /// logits start the answer).
    fn shared_prefix(&self, prompt: &[u32], steered: Steered) -> usize {
        if steered == Steered::Own || steered != self.steered {
            return 0;
        }
        let same = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        same.min(prompt.len().saturating_sub(1))
    }
}

/// Takes the free place holding the longest prefix of `prompt` computed
/// with the same steering and keeps that prefix in it; returns the place
/// and the prefix's length.
fn take_place<D: Device>(
    free: &mut Vec<Place<D>>,
    prompt: &[u32],
    steered: Steered,
) -> Option<(Place<D>, usize)> {
    let best = (0..free.len()).max_by_key(|&i| free[i].shared_prefix(prompt, steered))?;
    let mut place = free.swap_remove(best);
    let mut keep = place.shared_prefix(prompt, steered);
    place.steered = steered;
    if place.kv.rewind(keep).is_err() {
        keep = 0;
        place.kv.reset();
    }
    place.tokens.truncate(keep);
    Some((place, keep))
}

/// The place among `places` holding the longest prefix of `prompt`
/// computed with the same steering, and that prefix's length.
fn longest_prefix<'p, D: Device + 'p>(
    places: impl Iterator<Item = &'p Place<D>>,
    prompt: &[u32],
    steered: Steered,
) -> Option<(&'p Place<D>, usize)> {
    places
        .map(|p| (p, p.shared_prefix(prompt, steered)))
        .max_by_key(|&(_, n)| n)
}

/// A sequence in a place of the batch.
struct Seq<'t, D: Device> {
    job: Job,
    place: Place<D>,
    /// The control vectors steering it (none: unsteered).
    steering: Option<Rc<PreparedSteering<D>>>,
    /// Prompt tokens already in the cache.
    prefilled: usize,
    sampler: Sampler,
    detok: StreamDecoder<'t>,
    generated: usize,
    /// The token to feed at the next decode step.
    next: Option<u32>,
    started: Instant,
    first_token: Option<Instant>,
    /// This step's events, sent when every sequence of the step has
    /// sampled (see [`flush_events`]).
    outbox: Vec<Event>,
}

/// Runs the scheduler until `stop` is set and no sequence is left, or the
/// job channel closes. `cancel_all` ends every sequence at the next step.
pub fn run<D: Device>(
    model: &Model<D>,
    tok: &Tokenizer,
    cfg: EngineConfig,
    jobs: Receiver<Job>,
    metrics: &Metrics,
    cancel_all: &AtomicBool,
) -> Result<(), ServerError> {
    let parallel = cfg.parallel.max(1);
    let mut worker = model.session(SessionOptions {
        context: cfg.context,
        max_batch: parallel + PREFILL_BUDGET,
    })?;
    // Steering is per sequence (a request may bring its own), so the
    // server's default is prepared once and handed to each sequence.
    let default_steering = match &cfg.steering {
        Some(s) => Some(Rc::new(worker.prepare_steering(s)?)),
        None => None,
    }
    .filter(|s| !s.is_empty());
    let mut caches = (0..parallel)
        .map(|_| {
            Ok::<_, ServerError>(Place {
                kv: worker.new_cache()?,
                tokens: Vec::with_capacity(cfg.context),
                steered: Steered::No,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let vocab = model.vocab_size();
    let mut logits = vec![0f32; parallel * vocab];
    let mut seqs: Vec<Seq<'_, D>> = Vec::with_capacity(parallel);
    let mut open = true;
    let mut step: u64 = 0;

    loop {
        // 1. Admit.
        while open && !caches.is_empty() {
            let job = if seqs.is_empty() {
                match jobs.recv_timeout(Duration::from_millis(100)) {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => break,
                    Err(RecvTimeoutError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            } else {
                match jobs.try_recv() {
                    Ok(job) => job,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            };
            metrics.dequeued();
            if job.events.is_closed() {
                metrics.cancelled();
                continue;
            }
            if Instant::now() >= job.deadline {
                let _ = job.events.send(Event::TimedOut);
                metrics.timed_out();
                continue;
            }
            let sampler = match Sampler::new(job.params.sampler.clone(), vocab) {
                Ok(s) => s,
                Err(e) => {
                    let _ = job.events.send(Event::Failed(e.to_string()));
                    continue;
                }
            };
            let (steering, steered) = match &job.steering {
                None if default_steering.is_some() => (default_steering.clone(), Steered::Default),
                None => (None, Steered::No),
                Some(s) => match worker.prepare_steering(s) {
                    Ok(p) if p.is_empty() => (None, Steered::No),
                    Ok(p) => (Some(Rc::new(p)), Steered::Own),
                    Err(e) => {
                        let _ = job.events.send(Event::Failed(e.to_string()));
                        continue;
                    }
                },
            };
            let Some((mut place, mut reused)) = take_place(&mut caches, &job.prompt, steered)
            else {
                break;
            };
            // A longer prefix in another place, busy or free, is copied.
            let sources = seqs.iter().map(|s| &s.place).chain(caches.iter());
            if let Some((src, n)) = longest_prefix(sources, &job.prompt, steered) {
                if n > reused && worker.copy_prefix(&src.kv, &mut place.kv, n).is_ok() {
                    place.tokens.clear();
                    place.tokens.extend_from_slice(&job.prompt[..n]);
                    reused = n;
                }
            }
            metrics.reused(reused);
            let detok = StreamDecoder::new(tok).with_stop_strings(job.params.stops.iter().cloned());
            let _ = job.events.send(Event::Started);
            let mut seq = Seq {
                job,
                place,
                steering,
                prefilled: reused,
                sampler,
                detok,
                generated: 0,
                next: None,
                started: Instant::now(),
                first_token: None,
                outbox: Vec::with_capacity(4),
            };
            for &t in &seq.job.prompt {
                seq.sampler.accept(t);
            }
            seqs.push(seq);
        }
        metrics.set_active(seqs.len());
        if seqs.is_empty() {
            metrics.idle();
            if !open || cancel_all.load(Ordering::Relaxed) {
                return Ok(());
            }
            continue;
        }

        // 2. Cancelled, timed out.
        let now = Instant::now();
        let cancel = cancel_all.load(Ordering::Relaxed);
        let mut i = 0;
        while i < seqs.len() {
            let s = &seqs[i];
            let gone = s.job.events.is_closed() || cancel;
            let late = now >= s.job.deadline;
            if gone || late {
                let s = seqs.remove(i);
                if late && !gone {
                    let _ = s.job.events.send(Event::TimedOut);
                    metrics.timed_out();
                } else {
                    metrics.cancelled();
                }
                caches.push(s.place);
            } else {
                i += 1;
            }
        }

        // 3. One pass: a decode token of every sequence past its prompt,
        //    prompt chunks of the others, oldest first, within the budget.
        let mut chunks: Vec<BatchChunk<'_, D>> = Vec::with_capacity(seqs.len());
        // (sequence, end of its prompt chunk, or None for a decode token)
        let mut members: Vec<(usize, Option<usize>)> = Vec::with_capacity(seqs.len());
        let mut budget = PREFILL_BUDGET;
        let mut decoding = 0;
        for (i, s) in seqs.iter_mut().enumerate() {
            let prompt = &s.job.prompt;
            if let Some(token) = &s.next {
                chunks.push(BatchChunk {
                    kv: &mut s.place.kv,
                    tokens: std::slice::from_ref(token),
                    logits: true,
                    steering: s.steering.as_deref(),
                });
                members.push((i, None));
                decoding += 1;
            } else if s.prefilled < prompt.len() && budget > 0 {
                let end = (s.prefilled + PREFILL_CHUNK.min(budget)).min(prompt.len());
                budget -= end - s.prefilled;
                chunks.push(BatchChunk {
                    kv: &mut s.place.kv,
                    tokens: &prompt[s.prefilled..end],
                    logits: end == prompt.len(),
                    steering: s.steering.as_deref(),
                });
                members.push((i, Some(end)));
            }
        }
        if !chunks.is_empty() {
            let rows = chunks.iter().filter(|c| c.logits).count();
            let t0 = Instant::now();
            let result = worker.forward_chunks(&mut chunks, &mut logits[..rows * vocab]);
            drop(chunks);
            if decoding > 0 {
                metrics.decode_step(decoding, t0.elapsed());
            }
            let mut row = 0;
            for &(i, prompt_end) in &members {
                let s = &mut seqs[i];
                if let Err(e) = &result {
                    let _ = s.job.events.send(Event::Failed(e.to_string()));
                    s.next = None;
                    s.prefilled = usize::MAX;
                    continue;
                }
                let sample = match prompt_end {
                    Some(end) => {
                        let chunk = &s.job.prompt[s.prefilled..end];
                        s.place.tokens.extend_from_slice(chunk);
                        s.prefilled = end;
                        end == s.job.prompt.len()
                    }
                    None => {
                        s.place.tokens.extend(s.next);
                        true
                    }
                };
                if sample {
                    let out = &mut logits[row * vocab..(row + 1) * vocab];
                    step_sampled(s, out, tok, metrics);
                    row += 1;
                }
            }
            flush_events(&mut seqs);
            retire(&mut seqs, &mut caches);
        }
        metrics.set_experts(&worker_stats(&worker));
        step += 1;
        if step % 16 == 0 {
            metrics.set_expert_use(worker.router_histogram().layers());
        }
    }
}

fn worker_stats<D: Device>(worker: &Session<'_, D>) -> turbospark_engine::experts::LayerStats {
    worker.expert_stats().total()
}

/// Sends each sequence's events of this step. Sampling every sequence
/// first and sending afterwards wakes the HTTP tasks once per step, after
/// the scheduler's own work, rather than sixteen times in the middle of it
/// (each wake-up could preempt the scheduler for the HTTP side's work on
/// that token, while the engine's other threads wait for the next pass).
fn flush_events<D: Device>(seqs: &mut [Seq<'_, D>]) {
    for s in seqs.iter_mut() {
        for e in s.outbox.drain(..) {
            let _ = s.job.events.send(e);
        }
    }
}

/// Frees the places of sequences that ended (no token to feed and the
/// prompt read, or failed).
fn retire<D: Device>(seqs: &mut Vec<Seq<'_, D>>, caches: &mut Vec<Place<D>>) {
    let mut i = 0;
    while i < seqs.len() {
        let s = &seqs[i];
        let reading = s.prefilled < s.job.prompt.len();
        if s.next.is_none() && !reading {
            caches.push(seqs.remove(i).place);
        } else {
            i += 1;
        }
    }
}

/// One token: sampled from `logits`, its text queued; `Some` when the
/// sequence ends with it (or before it, at `max_tokens`), else the token
/// is `s.next`, to be fed back.
fn sample_one<D: Device>(
    s: &mut Seq<'_, D>,
    logits: &mut [f32],
    tok: &Tokenizer,
    metrics: &Metrics,
) -> Result<Option<Finish>, String> {
    if s.generated >= s.job.params.max_tokens {
        return Ok(Some(Finish::MaxTokens));
    }
    let token = s.sampler.sample(logits).map_err(|e| e.to_string())?;
    s.sampler.accept(token);
    s.generated += 1;
    metrics.generated(1);
    if s.first_token.is_none() {
        let now = Instant::now();
        s.first_token = Some(now);
        metrics.time_to_first_token(now - s.started);
    }
    if tok.is_eog(token) {
        return Ok(Some(Finish::Eos));
    }
    let mut piece = String::new();
    s.detok
        .push_to(token, &mut piece)
        .map_err(|e| e.to_string())?;
    if !piece.is_empty() {
        s.outbox.push(Event::Text(piece));
    }
    if s.detok.is_stopped() {
        let stop = s.detok.stop_string().unwrap_or_default().to_string();
        return Ok(Some(Finish::Stop(stop)));
    }
    if s.generated >= s.job.params.max_tokens {
        return Ok(Some(Finish::MaxTokens));
    }
    if s.place.kv.position() >= s.place.kv.context() {
        return Ok(Some(Finish::ContextFull));
    }
    s.next = Some(token);
    Ok(None)
}

/// Samples from `logits` (the sequence's newest), queues the text and
/// decides whether the sequence goes on: `s.next` is the token to feed, or
/// `None` when it ended (the end is queued). The queue goes out at the
/// end of the step ([`flush_events`]).
fn step_sampled<D: Device>(
    s: &mut Seq<'_, D>,
    logits: &mut [f32],
    tok: &Tokenizer,
    metrics: &Metrics,
) {
    s.next = None;
    let finish = match sample_one(s, logits, tok, metrics) {
        Ok(Some(finish)) => finish,
        Ok(None) => return,
        Err(e) => {
            s.outbox.push(Event::Failed(e));
            return;
        }
    };
    let rest = s.detok.finish();
    if !rest.is_empty() {
        s.outbox.push(Event::Text(rest));
    }
    if let Some(first) = s.first_token {
        let decoded = s.generated.saturating_sub(1);
        let secs = first.elapsed().as_secs_f64();
        if decoded > 0 && secs > 0.0 {
            metrics.decode_rate(decoded as f64 / secs);
        }
    }
    s.outbox.push(Event::Done {
        finish,
        prompt_tokens: s.job.prompt.len(),
        completion_tokens: s.generated,
    });
}
