//! The scheduler: one thread that owns the model and runs continuous
//! batching over up to `parallel` sequences, each with a KV cache of its
//! own (allocated once, at start, and reused).
//!
//! Every step of the loop:
//! 1. admits queued jobs into free places (blocking only when nothing runs);
//! 2. ends sequences whose client went away (the receiving half of their
//!    event channel is closed) or whose deadline passed, freeing their place;
//! 3. runs prefill chunks of at most [`PREFILL_CHUNK`] tokens for the
//!    sequences still reading their prompts, oldest first, up to
//!    [`PREFILL_BUDGET`] tokens (so a long prompt delays the others by a few
//!    chunks per step, not by its whole length);
//! 4. decodes one token for every sequence past its prompt, all in one
//!    forward pass ([`Session::decode_batch`]): the rows share each weight
//!    read, while attention is per sequence over its own cache.
//!
//! A sequence is generated exactly as `turbospark run` generates an answer
//! (the CLI's `generate.rs`): every prompt token is shown to the sampler,
//! the prompt is prefilled in chunks of the same size, then sample, stop
//! on an end-of-generation token, a stop string, `max_tokens` or a full
//! context, else feed the token back. Each op computes a row the same way
//! whatever the batch, so with exact numerics a sequence's tokens do not
//! depend on what else is being decoded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc::UnboundedSender;
use turbospark_backend::Device;
use turbospark_engine::{BatchRow, KvCache, Logits, Model, Session, SessionOptions};
use turbospark_text::{Sampler, SamplerConfig, StreamDecoder, Tokenizer};

use crate::metrics::Metrics;
use crate::ServerError;

/// Prompt tokens one prefill step runs; also the chunk `turbospark run`
/// prefills in (the session's default batch), so the arithmetic is the same.
pub const PREFILL_CHUNK: usize = 64;

/// Prompt tokens prefilled per step at most (whole chunks, so one chunk
/// may take it past): several short prompts that arrive together start
/// within one step, while a long prompt still yields to the decoding
/// sequences every few chunks.
pub const PREFILL_BUDGET: usize = 4 * PREFILL_CHUNK;

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
    /// Control vectors steering every sequence (`--control-vector`).
    pub steering: Option<turbospark_engine::Steering>,
}

/// A sequence in a place of the batch.
struct Seq<'t, D: Device> {
    job: Job,
    kv: KvCache<D>,
    /// Prompt tokens already in the cache.
    prefilled: usize,
    sampler: Sampler,
    detok: StreamDecoder<'t>,
    generated: usize,
    /// The token to feed at the next decode step.
    next: Option<u32>,
    started: Instant,
    first_token: Option<Instant>,
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
        max_batch: parallel.max(PREFILL_CHUNK),
    })?;
    worker.set_steering(cfg.steering.as_ref())?;
    let mut caches = (0..parallel)
        .map(|_| worker.new_cache())
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
            let Some(mut kv) = caches.pop() else { break };
            kv.reset();
            let detok = StreamDecoder::new(tok).with_stop_strings(job.params.stops.iter().cloned());
            let _ = job.events.send(Event::Started);
            let mut seq = Seq {
                job,
                kv,
                prefilled: 0,
                sampler,
                detok,
                generated: 0,
                next: None,
                started: Instant::now(),
                first_token: None,
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
                caches.push(s.kv);
            } else {
                i += 1;
            }
        }

        // 3. Prefill chunks, oldest sequence first, up to the step's budget.
        let mut budget = PREFILL_BUDGET;
        for s in seqs.iter_mut() {
            if budget == 0 {
                break;
            }
            if s.prefilled >= s.job.prompt.len() {
                continue;
            }
            let end = (s.prefilled + PREFILL_CHUNK).min(s.job.prompt.len());
            budget = budget.saturating_sub(end - s.prefilled);
            let chunk = &s.job.prompt[s.prefilled..end];
            let last = end == s.job.prompt.len();
            let out = &mut logits[..vocab];
            let result = if last {
                worker.forward_in(&mut s.kv, chunk, Logits::Last(out))
            } else {
                worker.forward_in(&mut s.kv, chunk, Logits::None)
            };
            match result {
                Err(e) => {
                    let _ = s.job.events.send(Event::Failed(e.to_string()));
                    s.next = None;
                    s.prefilled = usize::MAX;
                }
                Ok(()) => {
                    s.prefilled = end;
                    if last {
                        step_sampled(s, &mut logits[..vocab], tok, metrics);
                    }
                }
            }
        }
        retire(&mut seqs, &mut caches);

        // 4. One batched decode step.
        let mut rows: Vec<BatchRow<'_, D>> = Vec::with_capacity(seqs.len());
        let mut members: Vec<usize> = Vec::with_capacity(seqs.len());
        for (i, s) in seqs.iter_mut().enumerate() {
            if let Some(token) = s.next {
                rows.push(BatchRow {
                    kv: &mut s.kv,
                    token,
                });
                members.push(i);
            }
        }
        if !rows.is_empty() {
            let n = rows.len();
            let t0 = Instant::now();
            let result = worker.decode_batch(&mut rows, &mut logits[..n * vocab]);
            drop(rows);
            metrics.decode_step(n, t0.elapsed());
            for (r, &i) in members.iter().enumerate() {
                let s = &mut seqs[i];
                match &result {
                    Ok(()) => {
                        step_sampled(s, &mut logits[r * vocab..(r + 1) * vocab], tok, metrics);
                    }
                    Err(e) => {
                        let _ = s.job.events.send(Event::Failed(e.to_string()));
                        s.next = None;
                        s.prefilled = usize::MAX;
                    }
                }
            }
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

/// Frees the places of sequences that ended (no token to feed and the
/// prompt read, or failed).
fn retire<D: Device>(seqs: &mut Vec<Seq<'_, D>>, caches: &mut Vec<KvCache<D>>) {
    let mut i = 0;
    while i < seqs.len() {
        let s = &seqs[i];
        let reading = s.prefilled < s.job.prompt.len();
        if s.next.is_none() && !reading {
            caches.push(seqs.remove(i).kv);
        } else {
            i += 1;
        }
    }
}

/// One token: sampled from `logits`, its text sent; `Some` when the
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
        let _ = s.job.events.send(Event::Text(piece));
    }
    if s.detok.is_stopped() {
        let stop = s.detok.stop_string().unwrap_or_default().to_string();
        return Ok(Some(Finish::Stop(stop)));
    }
    if s.generated >= s.job.params.max_tokens {
        return Ok(Some(Finish::MaxTokens));
    }
    if s.kv.position() >= s.kv.context() {
        return Ok(Some(Finish::ContextFull));
    }
    s.next = Some(token);
    Ok(None)
}

/// Samples from `logits` (the sequence's newest), streams the text and
/// decides whether the sequence goes on: `s.next` is the token to feed, or
/// `None` when it ended (the end is sent).
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
            let _ = s.job.events.send(Event::Failed(e));
            return;
        }
    };
    let rest = s.detok.finish();
    if !rest.is_empty() {
        let _ = s.job.events.send(Event::Text(rest));
    }
    if let Some(first) = s.first_token {
        let decoded = s.generated.saturating_sub(1);
        let secs = first.elapsed().as_secs_f64();
        if decoded > 0 && secs > 0.0 {
            metrics.decode_rate(decoded as f64 / secs);
        }
    }
    let _ = s.job.events.send(Event::Done {
        finish,
        prompt_tokens: s.job.prompt.len(),
        completion_tokens: s.generated,
    });
}
