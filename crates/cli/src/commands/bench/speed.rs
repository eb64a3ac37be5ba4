//! The speed tests of `turbospark bench`, with llama-bench's semantics
//! (`tools/llama-bench/llama-bench.cpp`: `test_prompt`, `test_gen` and the
//! repetition loop), so the two tools' numbers measure the same work:
//!
//! - `ppN`: one prefill of N random tokens into an empty KV cache, in the
//!   engine's prefill chunks (`--prefill-chunk`), computing only the last
//!   position's logits (llama-bench's batch asks for the last one only).
//! - `tgN`: N single-token decode steps from an empty KV cache, each
//!   computing that token's logits; the next token is random, not sampled.
//! - `-d D` (llama-bench's `--n-depth`): each test runs after an untimed
//!   prefill of D random tokens, so at positions D.. of a cache holding D
//!   (`pp512 @ d512`, `tg128 @ d512`: decode after a 512-token prompt).
//! - A warm-up run first (the whole prefill; one decode step), then `-r`
//!   timed repetitions, each from a cleared cache. Only the forward passes
//!   are timed: the tokens are drawn before the clock starts and nothing is
//!   tokenized or sampled.
//! - Rates are tok/s per repetition; the report gives their mean and
//!   sample standard deviation (llama-bench's `avg_ts` and `stddev_ts`),
//!   and the peak resident set size (VmHWM, reset when the test starts, so
//!   it covers the weights touched, the session and the run).
//!
//! Random tokens are uniform over the vocabulary from a fixed seed, as
//! llama-bench's `std::rand() % n_vocab` (which also starts the prompt with
//! BOS when the vocabulary adds one; a random id costs the same).

use super::model_desc::ModelDesc;
use super::{peak_rss_reset, Args};
use crate::generate::peak_rss_bytes;
use crate::loading::{with_model, BackendArg, ModelTask};
use crate::progress::human_bytes;
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;
use turbospark_backend::Device;
use turbospark_cpu::Numerics;
use turbospark_engine::{Logits, Model, Session, SessionOptions};
use turbospark_format::install::Install;

/// The backend a row names, as llama-bench's `backends` field does.
fn backend_label(name: &str) -> &'static str {
    match name {
        "cuda" => "CUDA",
        _ => "CPU",
    }
}

/// What a test times: one prefill, or single-token decode steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Prompt,
    Gen,
}

/// One test: a prefill of `n` tokens or `n` decode steps, after `depth`
/// tokens already in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Test {
    pub kind: Kind,
    pub n: usize,
    pub depth: usize,
}

impl Test {
    pub fn prompt(n: usize) -> Test {
        Test {
            kind: Kind::Prompt,
            n,
            depth: 0,
        }
    }

    pub fn gen(n: usize) -> Test {
        Test {
            kind: Kind::Gen,
            n,
            depth: 0,
        }
    }

    /// The same test after `depth` tokens.
    pub fn at(self, depth: usize) -> Test {
        Test { depth, ..self }
    }

    /// llama-bench's name: `pp512`, `tg128`, `tg128 @ d512`.
    pub fn name(self) -> String {
        let base = match self.kind {
            Kind::Prompt => format!("pp{}", self.n),
            Kind::Gen => format!("tg{}", self.n),
        };
        if self.depth > 0 {
            format!("{base} @ d{}", self.depth)
        } else {
            base
        }
    }

    fn n_prompt(self) -> usize {
        match self.kind {
            Kind::Prompt => self.n,
            Kind::Gen => 0,
        }
    }

    fn n_gen(self) -> usize {
        match self.kind {
            Kind::Gen => self.n,
            Kind::Prompt => 0,
        }
    }
}

/// The tests `-p`, `-n` and `-d` ask for in llama-bench's order: for each
/// depth, the prefills, then the decodes; zero lengths are skipped.
pub fn tests(n_prompt: &[usize], n_gen: &[usize], depths: &[usize]) -> Vec<Test> {
    let mut all = Vec::new();
    for &d in depths {
        let pp = n_prompt
            .iter()
            .filter(|&&n| n > 0)
            .map(|&n| Test::prompt(n));
        let tg = n_gen.iter().filter(|&&n| n > 0).map(|&n| Test::gen(n));
        all.extend(pp.chain(tg).map(|t| t.at(d)));
    }
    all
}

/// Uniform random token ids from a fixed seed (a 64-bit LCG, high bits).
struct RandomTokens {
    state: u64,
    vocab: u64,
}

impl RandomTokens {
    fn new(vocab: usize) -> Self {
        RandomTokens {
            state: 0x853C_49E6_748F_EA9B,
            vocab: vocab as u64,
        }
    }

    fn next(&mut self) -> u32 {
        self.state = self
            .state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.state >> 32) % self.vocab) as u32
    }
}

/// Runs `test` once from an empty cache (after its untimed depth
/// prefill); returns the seconds its timed forward passes took. `steps`
/// limits a decode test (the warm-up runs one).
fn run_once<D: Device>(
    session: &mut Session<'_, D>,
    test: Test,
    steps: usize,
    random: &mut RandomTokens,
    last: &mut [f32],
) -> Result<f64> {
    session.reset();
    let at = test.depth;
    if at > 0 {
        let depth: Vec<u32> = (0..at).map(|_| random.next()).collect();
        session.forward(0, &depth, Logits::Last(last))?;
    }
    match test.kind {
        Kind::Prompt => {
            let tokens: Vec<u32> = (0..test.n).map(|_| random.next()).collect();
            let t = Instant::now();
            session.forward(at, &tokens, Logits::Last(last))?;
            Ok(t.elapsed().as_secs_f64())
        }
        Kind::Gen => {
            let mut token = random.next();
            let t = Instant::now();
            for pos in at..at + test.n.min(steps) {
                session.decode(token, pos)?;
                token = random.next();
            }
            Ok(t.elapsed().as_secs_f64())
        }
    }
}

/// The result of one test at one thread count and arithmetic.
pub struct Measurement {
    pub test: Test,
    /// llama-bench's backend name (`CPU`, `CUDA`).
    pub backend: &'static str,
    pub threads: usize,
    pub numerics: Numerics,
    /// Tokens a prefill pass took at once.
    pub prefill_chunk: usize,
    /// tok/s of each repetition.
    pub samples: Vec<f64>,
    pub peak_rss: Option<u64>,
}

impl Measurement {
    pub fn mean(&self) -> f64 {
        self.samples.iter().sum::<f64>() / self.samples.len().max(1) as f64
    }

    /// Sample standard deviation (n − 1); 0 for a single sample.
    pub fn sd(&self) -> f64 {
        let n = self.samples.len();
        if n < 2 {
            return 0.0;
        }
        let mean = self.mean();
        let ss: f64 = self.samples.iter().map(|s| (s - mean).powi(2)).sum();
        (ss / (n - 1) as f64).sqrt()
    }
}

/// Measures `test` on `model`: a session sized for it, a warm-up, the
/// repetitions.
fn measure<'m, D: Device>(
    model: &'m Model<D>,
    test: Test,
    threads: usize,
    numerics: Numerics,
    a: &Args,
) -> Result<(Measurement, Session<'m, D>)> {
    let n = test.n;
    let context = n + test.depth;
    let chunk = a
        .prefill_chunk
        .unwrap_or(model.session_options(context).max_batch);
    let mut session = model.session(SessionOptions {
        context,
        max_batch: chunk.min(context),
    })?;
    session.set_route_statistics(a.experts.counts_routes());
    let mut random = RandomTokens::new(model.vocab_size());
    let mut last = vec![0f32; model.vocab_size()];
    let reset = peak_rss_reset();
    if !a.no_warmup {
        run_once(
            &mut session,
            test,
            1.max(test.n_prompt()),
            &mut random,
            &mut last,
        )
        .with_context(|| format!("warm-up of {}", test.name()))?;
    }
    let mut samples = Vec::with_capacity(a.repetitions);
    for _ in 0..a.repetitions {
        let secs = run_once(&mut session, test, n, &mut random, &mut last)
            .with_context(|| format!("running {}", test.name()))?;
        samples.push(n as f64 / secs);
    }
    let m = Measurement {
        test,
        backend: backend_label(model.device().name()),
        threads,
        numerics,
        prefill_chunk: session.max_batch(),
        samples,
        peak_rss: reset.then(peak_rss_bytes).flatten(),
    };
    Ok((m, session))
}

/// One JSON line (the fields llama-bench's `-o jsonl` has under their
/// llama-bench names where they mean the same, plus ours).
pub fn json_line(desc: &ModelDesc, m: &Measurement, experts: Option<&str>) -> String {
    json!({
        "model": desc.name,
        "model_type": desc.kind,
        "model_size": desc.bytes,
        "model_n_params": desc.params,
        "backend": m.backend,
        "threads": m.threads,
        "numerics": m.numerics.name(),
        "experts": experts,
        "test": m.test.name(),
        "n_prompt": m.test.n_prompt(),
        "n_gen": m.test.n_gen(),
        "n_depth": m.test.depth,
        "prefill_chunk": m.prefill_chunk,
        "repetitions": m.samples.len(),
        "tok_per_s": m.mean(),
        "sd": m.sd(),
        "samples": m.samples,
        "peak_rss_bytes": m.peak_rss,
    })
    .to_string()
}

const HEADER: [(&str, usize, bool); 9] = [
    ("model", 30, false),
    ("size", 10, true),
    ("params", 10, true),
    ("backend", 7, false),
    ("threads", 7, true),
    ("numerics", 9, false),
    ("test", 13, true),
    ("t/s", 20, true),
    ("peak RSS", 10, true),
];

/// A markdown table row with the header's widths and alignments.
fn table_row(cells: &[String]) -> String {
    let mut line = String::from("|");
    for (cell, &(_, width, right)) in cells.iter().zip(HEADER.iter()) {
        if right {
            line += &format!(" {cell:>width$} |");
        } else {
            line += &format!(" {cell:<width$} |");
        }
    }
    line
}

/// The table's header and its alignment line.
pub fn table_header() -> String {
    let names: Vec<String> = HEADER.iter().map(|h| h.0.to_string()).collect();
    let mut rule = String::from("|");
    for &(_, width, right) in &HEADER {
        let dashes = "-".repeat(width - usize::from(right));
        rule += &format!(" {dashes}{} |", if right { ":" } else { "" });
    }
    format!("{}\n{rule}", table_row(&names))
}

/// `88.2 MiB`, `12.3 GiB`: llama-bench's size column.
fn size_cell(bytes: u64) -> String {
    let mib = bytes as f64 / (1u64 << 20) as f64;
    if mib >= 1024.0 {
        format!("{:.2} GiB", mib / 1024.0)
    } else {
        format!("{mib:.2} MiB")
    }
}

/// `134.52 M`, `20.91 B`: llama-bench's params column.
fn params_cell(params: u64) -> String {
    let p = params as f64;
    if p >= 1e9 {
        format!("{:.2} B", p / 1e9)
    } else {
        format!("{:.2} M", p / 1e6)
    }
}

pub fn table_line(desc: &ModelDesc, m: &Measurement) -> String {
    table_row(&[
        desc.kind.clone(),
        size_cell(desc.bytes),
        params_cell(desc.params),
        m.backend.to_string(),
        m.threads.to_string(),
        m.numerics.name().to_string(),
        m.test.name(),
        format!("{:.2} ± {:.2}", m.mean(), m.sd()),
        m.peak_rss.map_or("-".into(), human_bytes),
    ])
}

pub fn run(a: &Args) -> Result<ExitCode> {
    let tests = tests(&a.n_prompt, &a.n_gen, &a.n_depth);
    if tests.is_empty() {
        bail!("nothing to run: every -p/--n-prompt and -n/--n-gen is 0");
    }
    if a.repetitions == 0 {
        bail!("-r/--repetitions must be at least 1");
    }
    if a.prefill_chunk == Some(0) {
        bail!("--prefill-chunk must be at least 1");
    }
    if a.threads.contains(&0) {
        bail!("-t/--threads must be at least 1");
    }
    let install = Install::open(&a.model)?;
    let desc = ModelDesc::of(&install);
    let expert_opts = a.experts.options(a.device.backend)?;
    let threads = if a.threads.is_empty() {
        vec![std::thread::available_parallelism().map_or(1, |n| n.get())]
    } else {
        a.threads.clone()
    };
    if !a.json {
        println!("{}", table_header());
    }
    // Thread counts only matter on the CPU.
    let threads = if a.device.backend == BackendArg::Cpu {
        threads
    } else {
        vec![threads[0]]
    };
    for &t in &threads {
        for &numerics in &a.numerics {
            let task = Speed {
                a,
                desc: &desc,
                tests: &tests,
                threads: t,
                numerics: numerics.into(),
            };
            with_model(
                &a.model,
                &a.device,
                Some(t),
                numerics.into(),
                &expert_opts,
                task,
            )?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Every test at one thread count and arithmetic, on a loaded model.
struct Speed<'a> {
    a: &'a Args,
    desc: &'a ModelDesc,
    tests: &'a [Test],
    threads: usize,
    numerics: Numerics,
}

impl ModelTask for Speed<'_> {
    type Output = ();

    fn run<D: Device>(self, model: Model<D>) -> Result<()> {
        let a = self.a;
        let experts = model.spec().moe.is_some().then(|| {
            let plan = model.expert_store().plan();
            eprintln!("{plan}");
            plan.residency.to_string()
        });
        let stdout = std::io::stdout();
        for &test in self.tests {
            let (m, session) = measure(&model, test, self.threads, self.numerics, a)?;
            let line = if a.json {
                json_line(self.desc, &m, experts.as_deref())
            } else {
                table_line(self.desc, &m)
            };
            let mut out = stdout.lock();
            writeln!(out, "{line}")?;
            out.flush()?;
            a.experts
                .report(session.expert_stats(), session.router_histogram())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tests_skip_zeros_and_keep_llama_bench_order() {
        assert_eq!(
            tests(&[512, 0], &[0, 128, 16], &[0]),
            [Test::prompt(512), Test::gen(128), Test::gen(16)]
        );
        assert!(tests(&[0], &[0], &[0, 512]).is_empty());
        assert_eq!(Test::prompt(512).name(), "pp512");
        assert_eq!(Test::gen(128).name(), "tg128");
    }

    /// llama-bench's loops: depth outermost, then prefills, then decodes;
    /// its names (`tg128 @ d512`).
    #[test]
    fn depths_repeat_every_test_in_llama_bench_order() {
        let t = tests(&[512], &[128], &[0, 512]);
        let names: Vec<String> = t.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["pp512", "tg128", "pp512 @ d512", "tg128 @ d512"]);
        assert_eq!(t[3], Test::gen(128).at(512));
        assert_eq!((t[3].n_prompt(), t[3].n_gen(), t[3].depth), (0, 128, 512));
    }

    #[test]
    fn mean_and_sample_sd() {
        let m = Measurement {
            test: Test::gen(1),
            backend: "CPU",
            threads: 1,
            numerics: Numerics::Fast,
            prefill_chunk: 64,
            samples: vec![2.0, 4.0, 6.0],
            peak_rss: None,
        };
        assert_eq!(m.mean(), 4.0);
        assert_eq!(m.sd(), 2.0);
        let one = Measurement {
            samples: vec![5.0],
            ..m
        };
        assert_eq!(one.sd(), 0.0);
    }

    #[test]
    fn random_tokens_stay_in_the_vocabulary() {
        let mut r = RandomTokens::new(7);
        let ids: Vec<u32> = (0..1000).map(|_| r.next()).collect();
        assert!(ids.iter().all(|&t| t < 7));
        assert!((0..7).all(|t| ids.contains(&t)));
    }
}
