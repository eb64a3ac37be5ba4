//! Text generation shared by `turbospark run` and `turbospark chat`: loading
//! an install with its tokenizer and chat template, the sampling options,
//! the prefill + decode loop that streams text as it is decoded, and the
//! one-line speed/memory summary.
//!
//! The loop: the prompt's tokens go through one prefill (only the last
//! position's logits are computed), then each sampled token is decoded at the
//! next position until an end-of-generation id (the tokenizer's EOG ids,
//! which include the manifest's `eos_token_ids`), a stop string (held back
//! and never printed, see [`StreamDecoder`]), `--max-tokens`, a full context
//! or an interrupt. The KV cache keeps every token fed to it; a later prompt
//! that extends those tokens (the next chat turn) only prefills what is new.
//!
//! Each phase is timed on its own ([`GenPhases`]): the chat template and
//! tokenizer, the prefill, the decode passes, the sampler and the
//! detokenizer (with the writing of the text), and within the prefill and
//! the decode passes the engine's own phases (attention, FFN, router,
//! routed experts, head); `--timings` prints them.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use turbospark_backend::Device;
use turbospark_engine::experts::LayerStats;
use turbospark_engine::timing::{Phase, PhaseTimes};
use turbospark_engine::{Logits, Model, Session};
use turbospark_format::identity::default_chat_template;
use turbospark_format::install::reader::read_manifest;
use turbospark_text::builtin_templates::{builtin_template, builtin_template_names};
use turbospark_text::{
    chat_prompt_tokens, ChatTemplate, Message, Sampler, SamplerConfig, StreamDecoder, Tokenizer,
};

use crate::experts::ExpertArgs;
use crate::loading::DeviceArgs;
use crate::numerics::{self, NumericsArg};
use crate::probe::{CapturePositions, ProbeArgs};

/// Default cap on the context when `--context` is not given: the model's
/// `max_position` can be far larger than a KV cache one wants by default.
pub const DEFAULT_CONTEXT_CAP: usize = 4096;

/// Model, sampling and output options common to `run` and `chat`.
#[derive(clap::Args, Debug)]
pub struct GenArgs {
    /// The install directory (made by `turbospark convert`).
    #[arg(long)]
    pub model: PathBuf,
    /// A system message put before the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens generated per answer.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy decoding (the argmax, deterministic).
    /// The default, 0.7, with top-k 40, top-p 0.95 and min-p 0.05, follows
    /// common local-inference practice (llama.cpp's defaults, slightly cooler).
    #[arg(long, default_value_t = 0.7)]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0: off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens with mass ≥ P (1: off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than M × the most likely one (0: off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Repetition penalty over the last 64 tokens (1: off): a seen token's
    /// positive logit is divided by it, a negative one multiplied.
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every token seen in the last 64
    /// (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was seen in the last
    /// 64 (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when this text is generated (not printed); repeatable.
    #[arg(long = "stop")]
    pub stops: Vec<String>,
    /// A Jinja chat template file, or the name of a built-in template
    /// (gemma, chatml, mistral, glm4), to use instead of the install's.
    /// Without it, an install that has none uses its family's built-in one.
    #[arg(long, value_name = "FILE|NAME")]
    pub chat_template: Option<String>,
    /// KV cache positions (prompt + answer). Default: the model's maximum
    /// position, capped at 4096.
    #[arg(long)]
    pub context: Option<usize>,
    /// Compute threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Arithmetic: exact, llama-cpp or fast (--help says more); `fast` by
    /// default, `exact` to match HF transformers, `llama-cpp` to reproduce
    /// llama.cpp's tokens.
    #[arg(long, value_enum, default_value = "fast", long_help = numerics::HELP)]
    pub numerics: NumericsArg,
    /// After the summary, print the time spent in each phase (chat
    /// template and tokenizer, prefill, decode passes, sampling,
    /// detokenizing) and the engine's phases within prefill and decode
    /// (attention, dense FFN, router, routed experts, head) to stderr.
    #[arg(long)]
    pub timings: bool,
    #[command(flatten)]
    pub device: DeviceArgs,
    #[command(flatten)]
    pub experts: ExpertArgs,
    #[command(flatten)]
    pub probe: ProbeArgs,
}

impl GenArgs {
    pub fn sampler_config(&self) -> SamplerConfig {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
            ..SamplerConfig::default()
        }
    }
}

/// The text side of an install: tokenizer and (optional) chat template.
pub struct Text {
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
}

impl Text {
    /// Loads the tokenizer of `dir` and the chat template: `template` (a
    /// file, else a built-in name) when given, else the install's, else the
    /// family's built-in one (said on stderr), else none.
    pub fn load(dir: &Path, template: Option<&str>) -> Result<Text> {
        let tokenizer = Tokenizer::from_install_dir(dir)
            .with_context(|| format!("loading the tokenizer of {}", dir.display()))?;
        let template = match template {
            Some(arg) => Some(template_from_arg(arg)?),
            None => match ChatTemplate::from_install_dir(dir)
                .with_context(|| format!("loading the chat template of {}", dir.display()))?
            {
                Some(t) => Some(t),
                None => family_template(dir)?,
            },
        };
        Ok(Text {
            tokenizer,
            template,
        })
    }

    /// The template, or an error that says what to do without one.
    /// (Reached only for families without a built-in template.)
    pub fn require_template(&self, dir: &Path) -> Result<&ChatTemplate> {
        match &self.template {
            Some(t) => Ok(t),
            None => bail!(
                "install {} has no chat template and its family has no built-in one; pass \
                 --chat-template FILE or one of {}, or --raw to feed the prompt text as it is",
                dir.display(),
                builtin_template_names()
            ),
        }
    }

    /// The prompt tokens of `messages` ([`chat_prompt_tokens`], shared
    /// with the server).
    pub fn chat_tokens(&self, template: &ChatTemplate, messages: &[Message]) -> Result<Vec<u32>> {
        chat_prompt_tokens(&self.tokenizer, template, messages).context("building the chat prompt")
    }

    /// Tokenizes raw prompt text (BOS as the vocabulary asks).
    pub fn raw_tokens(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.tokenizer.encode(text, true)?)
    }
}

/// `--chat-template`: an existing file, else a built-in template's name.
fn template_from_arg(arg: &str) -> Result<ChatTemplate> {
    let path = Path::new(arg);
    let src = if path.is_file() {
        std::fs::read_to_string(path).with_context(|| format!("reading chat template {arg}"))?
    } else if let Some(src) = builtin_template(arg) {
        src.to_string()
    } else {
        bail!(
            "--chat-template {arg}: no such file, and not a built-in template ({})",
            builtin_template_names()
        );
    };
    ChatTemplate::new(src).with_context(|| format!("compiling chat template {arg}"))
}

/// The built-in template of the install's family, with a note on stderr.
fn family_template(dir: &Path) -> Result<Option<ChatTemplate>> {
    let manifest = read_manifest(dir)?;
    let family = &manifest.arch.family;
    let Some(name) = default_chat_template(family) else {
        return Ok(None);
    };
    eprintln!(
        "note: {} has no chat template; using the built-in {name} template of the {family} \
         family (--chat-template FILE|NAME to choose another)",
        dir.display(),
        family = turbospark_format::families::name(family),
    );
    let src = builtin_template(name).context("the family's built-in template is missing")?;
    Ok(Some(ChatTemplate::new(src).with_context(|| {
        format!("compiling the built-in {name} template")
    })?))
}

/// Opens the install on the device `--backend` names and runs `task`.
pub fn with_model<T: crate::loading::ModelTask>(a: &GenArgs, task: T) -> Result<T::Output> {
    crate::loading::with_model(
        &a.model,
        &a.device,
        a.threads,
        a.numerics.into(),
        &a.experts.options(a.device.backend)?,
        task,
    )
}

/// The context a session gets: `--context`, else `max_position` capped.
pub fn context_size<D: Device>(a: &GenArgs, model: &Model<D>) -> Result<usize> {
    let max = model.spec().max_position;
    match a.context {
        Some(0) => bail!("--context must be at least 1"),
        Some(c) => Ok(c),
        None if max == 0 => Ok(DEFAULT_CONTEXT_CAP),
        None => Ok(max.min(DEFAULT_CONTEXT_CAP)),
    }
}

/// Checks that a prompt leaves room for at least one generated token.
pub fn check_prompt_fits(prompt_tokens: usize, context: usize) -> Result<()> {
    if prompt_tokens == 0 {
        bail!("the prompt is empty (no tokens)");
    }
    if prompt_tokens >= context {
        bail!(
            "the prompt is {prompt_tokens} tokens but the context holds {context} positions \
             (prompt + answer); shorten the prompt or raise --context"
        );
    }
    Ok(())
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Eos,
    StopString,
    MaxTokens,
    ContextFull,
    Interrupted,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Eos => "eos",
            StopReason::StopString => "stop string",
            StopReason::MaxTokens => "max tokens",
            StopReason::ContextFull => "context full",
            StopReason::Interrupted => "interrupted",
        }
    }
}

/// Wall time of each phase of one generation, in seconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct GenPhases {
    /// Rendering the chat template and tokenizing (set by the caller, which
    /// does both before generating).
    pub prompt: f64,
    /// The decode forward passes (one per token fed back).
    pub forward: f64,
    /// Penalties, filters and the draw, once per generated token.
    pub sample: f64,
    /// Streaming detokenization, stop-string matching and writing the text.
    pub detokenize: f64,
    /// The engine's phases within the prefill and within the decode passes.
    pub engine_prefill: PhaseTimes,
    pub engine_decode: PhaseTimes,
}

/// Counters of one generation.
#[derive(Debug, Clone, Copy)]
pub struct GenStats {
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens found in the KV cache already (not prefilled again).
    pub reused_tokens: usize,
    pub prefill_secs: f64,
    /// Tokens sampled (including the final EOS, if any).
    pub generated: usize,
    /// Decode passes run (generated tokens fed back).
    pub decoded: usize,
    /// From the first sample to the end: forward passes, sampling and
    /// detokenizing.
    pub decode_secs: f64,
    pub stop: StopReason,
    pub phases: GenPhases,
    /// Expert cache traffic of the prefill and of the decode passes (all
    /// zero for a dense model).
    pub cache_prefill: LayerStats,
    pub cache_decode: LayerStats,
}

impl GenStats {
    /// The one-line summary printed to stderr.
    pub fn summary(&self) -> String {
        let rate = |n: usize, s: f64| {
            if n == 0 || s <= 0.0 {
                "-".to_string()
            } else {
                format!("{:.1}", n as f64 / s)
            }
        };
        let prefilled = self.prompt_tokens - self.reused_tokens;
        let reused = if self.reused_tokens > 0 {
            format!(" ({} cached)", self.reused_tokens)
        } else {
            String::new()
        };
        let rss = peak_rss_bytes()
            .map(|b| format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)))
            .unwrap_or_else(|| "?".into());
        format!(
            "prompt {} tokens{reused}, prefill {} tok/s; generated {} tokens, decode {} tok/s; \
             stop: {}; peak RSS {rss}",
            self.prompt_tokens,
            rate(prefilled, self.prefill_secs),
            self.generated,
            rate(self.decoded, self.decode_secs),
            self.stop.as_str(),
        )
    }
}

impl GenStats {
    /// The `--timings` table: the prompt's template and tokenizer, then the
    /// prefill and the decode loop, each split into the engine's phases,
    /// the sampler and the detokenizer, and an `unaccounted` row (the wall
    /// time no phase claimed: calls between phases, logits copies), so that
    /// each section sums to its wall time; then the expert cache's traffic
    /// per token. Per-token figures divide by the prefilled tokens and by
    /// the decode passes.
    pub fn timings(&self) -> String {
        let p = &self.phases;
        let prefilled = self.prompt_tokens - self.reused_tokens;
        let mut t = TimingTable::default();
        t.row("template + tokenize", p.prompt, None, None);
        t.section(
            "prefill",
            self.prefill_secs,
            prefilled,
            &p.engine_prefill,
            &[],
        );
        t.section(
            "decode",
            self.decode_secs,
            self.decoded,
            &p.engine_decode,
            &[("sampling", p.sample), ("detokenize", p.detokenize)],
        );
        t.row(
            "wall",
            p.prompt + self.prefill_secs + self.decode_secs,
            None,
            None,
        );
        let mut out = t.text;
        for (name, c, n) in [
            ("prefill", &self.cache_prefill, prefilled),
            ("decode", &self.cache_decode, self.decoded),
        ] {
            if c.requests > 0 {
                out.push_str(&cache_line(name, c, n));
            }
        }
        out.trim_end().to_string()
    }
}

/// Rows of the `--timings` table: name, total, per token and share of the
/// section's wall time.
#[derive(Default)]
struct TimingTable {
    text: String,
}

impl TimingTable {
    fn row(&mut self, name: &str, secs: f64, per: Option<usize>, share_of: Option<f64>) {
        let per = match per {
            Some(n) if n > 0 => format!("{:.3}", secs * 1e3 / n as f64),
            _ => String::new(),
        };
        let share = match share_of {
            Some(w) if w > 0.0 => format!("{:.1}%", 100.0 * secs / w),
            _ => String::new(),
        };
        if self.text.is_empty() {
            self.text.push_str(&format!(
                "{:<26} {:>11} {:>14} {:>7}\n",
                "timings", "total ms", "per token ms", "share"
            ));
        }
        self.text.push_str(&format!(
            "{name:<26} {:>11.3} {per:>14} {share:>7}\n",
            secs * 1e3
        ));
    }

    /// A section of wall time `wall` over `tokens` tokens: the engine's
    /// phases that took time, the `extra` host phases, and what is left.
    fn section(
        &mut self,
        name: &str,
        wall: f64,
        tokens: usize,
        engine: &PhaseTimes,
        extra: &[(&str, f64)],
    ) {
        self.row(
            &format!("{name} ({tokens} tokens)"),
            wall,
            Some(tokens),
            Some(wall),
        );
        let mut claimed = 0.0;
        for ph in Phase::ALL {
            let s = engine.get(ph).as_secs_f64();
            if s > 0.0 {
                self.row(&format!("  {}", ph.name()), s, Some(tokens), Some(wall));
                claimed += s;
            }
        }
        for &(n, s) in extra {
            self.row(&format!("  {n}"), s, Some(tokens), Some(wall));
            claimed += s;
        }
        // Phases are timed inside the section's wall time, so the rest is
        // never negative but for clock granularity.
        let rest = (wall - claimed).max(0.0);
        self.row("  unaccounted", rest, Some(tokens), Some(wall));
    }
}

/// `expert cache, decode: 3.20 hits, 0.80 misses, 0.52 MiB read per token
/// (hit rate 80.0%)`.
fn cache_line(name: &str, c: &LayerStats, tokens: usize) -> String {
    let n = tokens.max(1) as f64;
    format!(
        "expert cache, {name}: {:.2} hits, {:.2} misses, {:.3} MiB read per token \
         (hit rate {:.1}%, {:.3} ms waiting for reads per token)\n",
        c.hits as f64 / n,
        (c.requests - c.hits) as f64 / n,
        c.bytes_read as f64 / n / (1024.0 * 1024.0),
        100.0 * c.hit_rate(),
        c.wait_nanos as f64 * 1e-6 / n,
    )
}

/// `a − b`, counter by counter (`b` taken earlier from the same session).
fn stats_since(a: &LayerStats, b: &LayerStats) -> LayerStats {
    LayerStats {
        requests: a.requests - b.requests,
        hits: a.hits - b.hits,
        reads: a.reads - b.reads,
        bytes_read: a.bytes_read - b.bytes_read,
        page_cache_copies: a.page_cache_copies - b.page_cache_copies,
        page_cache_bytes: a.page_cache_bytes - b.page_cache_bytes,
        read_nanos: a.read_nanos - b.read_nanos,
        wait_nanos: a.wait_nanos - b.wait_nanos,
    }
}

/// Peak resident set size (`VmHWM` of `/proc/self/status`), where the
/// system has it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// A session with the list of tokens its KV cache holds.
pub struct Generator<'m, D: Device> {
    pub session: Session<'m, D>,
    /// Tokens in the KV cache, in order.
    pub cached: Vec<u32>,
    logits: Vec<f32>,
    /// Which positions a residual capture keeps (`None`: no capture).
    capture: Option<CapturePositions>,
}

/// What one generation produced.
pub struct Generation {
    /// The text printed (stop strings left out).
    pub text: String,
    /// The sampled token ids, in order, including a final end-of-generation
    /// token when that is why it stopped.
    pub ids: Vec<u32>,
    pub stats: GenStats,
}

impl<'m, D: Device> Generator<'m, D> {
    pub fn new(model: &'m Model<D>, context: usize) -> Result<Self> {
        let session = model.session(model.session_options(context))?;
        Ok(Generator {
            session,
            cached: Vec::with_capacity(context),
            logits: vec![0.0; model.vocab_size()],
            capture: None,
        })
    }

    /// A generator whose session has the capture and steering of `a`.
    pub fn with_probes(model: &'m Model<D>, context: usize, a: &GenArgs) -> Result<Self> {
        let mut g = Self::new(model, context)?;
        g.session.set_route_statistics(a.experts.counts_routes());
        let numerics = format!("{:?}", a.numerics).to_lowercase();
        g.capture = a.probe.apply(&mut g.session, model, &a.model, &numerics)?;
        Ok(g)
    }

    /// Ends a residual capture, writing its file and sidecar, and writes
    /// the FFN census, as `a` asks.
    pub fn finish_probes(&mut self, a: &GenArgs) -> Result<()> {
        self.capture = None;
        let numerics = format!("{:?}", a.numerics).to_lowercase();
        a.probe.finish(&mut self.session, &a.model, &numerics)
    }

    /// Forgets the conversation.
    pub fn reset(&mut self) {
        self.session.reset();
        self.cached.clear();
    }

    /// Generates an answer to `prompt` (all tokens of the sequence so far),
    /// writing text to `out` as it becomes final. Tokens already in the KV
    /// cache as a prefix of `prompt` are not prefilled again.
    #[allow(clippy::too_many_arguments)]
    pub fn generate(
        &mut self,
        prompt: &[u32],
        tok: &Tokenizer,
        sampler: &mut Sampler,
        stops: &[String],
        max_tokens: usize,
        interrupt: Option<&AtomicBool>,
        out: &mut dyn Write,
    ) -> Result<Generation> {
        check_prompt_fits(prompt.len(), self.session.context())?;
        let reuse = self.cached.len() < prompt.len() && prompt.starts_with(&self.cached);
        if !reuse {
            self.reset();
        }
        let reused = self.cached.len();
        let fresh = &prompt[reused..];
        for &t in prompt {
            sampler.accept(t);
        }

        if let Some(c) = self.capture {
            self.session.set_capture_enabled(c.prompt());
        }
        self.session.phase_times_mut().reset();
        let cache0 = self.session.expert_stats().total();
        let t0 = Instant::now();
        self.session
            .forward(reused, fresh, Logits::Last(&mut self.logits))
            .context("prefill")?;
        if let Some(c) = self.capture {
            self.session.set_capture_enabled(c.generated());
        }
        let prefill_secs = t0.elapsed().as_secs_f64();
        let engine_prefill = *self.session.phase_times();
        self.session.phase_times_mut().reset();
        self.cached.extend_from_slice(fresh);
        let cache1 = self.session.expert_stats().total();

        let mut detok = StreamDecoder::new(tok).with_stop_strings(stops.iter().cloned());
        let mut text = String::new();
        let mut piece = String::new();
        let mut generated = 0usize;
        let mut ids = Vec::new();
        let mut decoded = 0usize;
        let mut phases = GenPhases {
            engine_prefill,
            ..GenPhases::default()
        };
        let t1 = Instant::now();
        let stop = loop {
            if interrupt.is_some_and(|f| f.load(Ordering::Relaxed)) {
                break StopReason::Interrupted;
            }
            if generated >= max_tokens {
                break StopReason::MaxTokens;
            }
            let ts = Instant::now();
            let token = sampler.sample(&mut self.logits)?;
            sampler.accept(token);
            phases.sample += ts.elapsed().as_secs_f64();
            generated += 1;
            ids.push(token);
            if tok.is_eog(token) {
                break StopReason::Eos;
            }
            let td = Instant::now();
            piece.clear();
            detok.push_to(token, &mut piece)?;
            emit(out, &piece, &mut text)?;
            phases.detokenize += td.elapsed().as_secs_f64();
            if detok.is_stopped() {
                break StopReason::StopString;
            }
            if generated >= max_tokens {
                break StopReason::MaxTokens;
            }
            let pos = self.cached.len();
            if pos >= self.session.context() {
                break StopReason::ContextFull;
            }
            let tf = Instant::now();
            let logits = self.session.decode(token, pos).context("decode")?;
            self.logits.copy_from_slice(logits);
            phases.forward += tf.elapsed().as_secs_f64();
            self.cached.push(token);
            decoded += 1;
        };
        let td = Instant::now();
        let rest = detok.finish();
        emit(out, &rest, &mut text)?;
        phases.detokenize += td.elapsed().as_secs_f64();
        let decode_secs = t1.elapsed().as_secs_f64();
        phases.engine_decode = *self.session.phase_times();
        let cache2 = self.session.expert_stats().total();
        out.flush().ok();
        Ok(Generation {
            text,
            ids,
            stats: GenStats {
                prompt_tokens: prompt.len(),
                reused_tokens: reused,
                prefill_secs,
                generated,
                decoded,
                decode_secs,
                stop,
                phases,
                cache_prefill: stats_since(&cache1, &cache0),
                cache_decode: stats_since(&cache2, &cache1),
            },
        })
    }
}

fn emit(out: &mut dyn Write, piece: &str, text: &mut String) -> Result<()> {
    if piece.is_empty() {
        return Ok(());
    }
    text.push_str(piece);
    out.write_all(piece.as_bytes())
        .and_then(|()| out.flush())
        .context("writing the answer")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> GenStats {
        GenStats {
            prompt_tokens: 10,
            reused_tokens: 2,
            prefill_secs: 0.080,
            generated: 5,
            decoded: 4,
            decode_secs: 0.050,
            stop: StopReason::MaxTokens,
            phases: GenPhases {
                prompt: 0.001,
                forward: 0.040,
                sample: 0.002,
                detokenize: 0.001,
                ..GenPhases::default()
            },
            cache_prefill: LayerStats::default(),
            cache_decode: LayerStats {
                requests: 16,
                hits: 12,
                reads: 4,
                bytes_read: 4 << 20,
                page_cache_copies: 0,
                page_cache_bytes: 0,
                read_nanos: 2_000_000,
                wait_nanos: 1_000_000,
            },
        }
    }

    /// The `total ms` column of a table row.
    fn ms(line: &str) -> f64 {
        line[26..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn sections_sum_to_their_wall_time() {
        let s = stats();
        let text = s.timings();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("timings"), "{text}");
        // No engine phase timed: everything but sampling and detokenizing
        // is unaccounted.
        let decode = lines
            .iter()
            .position(|l| l.starts_with("decode (4 tokens)"))
            .unwrap();
        assert_eq!(ms(lines[decode]), 50.0);
        assert!(lines[decode].contains("12.500"), "{}", lines[decode]);
        let rows: Vec<&str> = lines[decode + 1..]
            .iter()
            .take_while(|l| l.starts_with("  "))
            .copied()
            .collect();
        assert_eq!(rows.len(), 3, "{text}");
        assert!(rows[2].starts_with("  unaccounted"));
        assert!((ms(rows[2]) - 47.0).abs() < 1e-9, "{text}");
        assert!(rows[2].ends_with("94.0%"), "{text}");
        let prefill = lines.iter().find(|l| l.starts_with("prefill (8 tokens)"));
        assert!(prefill.is_some_and(|l| l.contains("10.000")), "{text}");
        // Expert cache per decode pass; no line for a prefill without requests.
        assert!(
            text.contains("expert cache, decode: 3.00 hits, 1.00 misses, 1.000 MiB read per token"),
            "{text}"
        );
        assert!(!text.contains("expert cache, prefill"), "{text}");
        assert!(text
            .lines()
            .any(|l| l.starts_with("wall") && ms(l) == 131.0));
    }

    #[test]
    fn engine_phases_are_rows_of_their_section() {
        let mut s = stats();
        // Time some phases through the public clock-free path: a session
        // fills them; here a copy with known values is enough.
        let mut t = PhaseTimes::default();
        t.add(Phase::Attention, std::time::Duration::from_millis(20));
        t.add(Phase::Head, std::time::Duration::from_millis(15));
        s.phases.engine_decode = t;
        let text = s.timings();
        let rows: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("decode"))
            .skip(1)
            .take_while(|l| l.starts_with("  "))
            .collect();
        let names: Vec<&str> = rows.iter().map(|r| r[..26].trim()).collect();
        assert_eq!(
            names,
            ["attention", "head", "sampling", "detokenize", "unaccounted"]
        );
        let sum: f64 = rows.iter().map(|r| ms(r)).sum();
        assert!((sum - 50.0).abs() < 1e-6, "{text}");
        assert!((ms(rows[4]) - 12.0).abs() < 1e-9, "{text}");
    }
}
