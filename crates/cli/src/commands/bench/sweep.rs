//! `turbospark bench --sweep --model DIR`: prefill and decode speed with
//! streamed experts at several slot counts in one run (by default top_k, 2·top_k,
//! 4·top_k and every expert), with the decode phase's cache hit rate, read
//! bandwidth and share of time spent waiting for expert reads, the engine's
//! phases over the decode steps (attention, router, routed experts — reads
//! included — and head), and each configuration's peak resident memory (VmHWM,
//! reset between configurations) against the bound the slot cache promises:
//! resident weights + slots × stride × MoE layers + 300 MiB of scratch,
//! plus the page cache a GPU may lock for its copies (`--pin-page-cache`:
//! locked pages of a mapped file count in the resident set).
//!
//! Tokens are synthetic (a fixed pseudo-random prompt, then greedy
//! decoding), so any MoE install works, including `turbospark synth` ones.
//! Without `--direct-io`, reads after the first configuration may come
//! from the page cache.
//!
//! Routing does not depend on the configuration (experts are applied in
//! router-rank order, bits are equal), so the router histogram of the
//! first configuration describes them all: bench prints how skewed it is
//! (the share of selections taken by each layer's most chosen top_k, 2·top_k
//! and 4·top_k experts) and `--router-hist` writes it.
//!
//! With `--json`, each configuration is one JSON object on stdout (`test`:
//! "sweep", `experts`, `slots` (null when not streamed), `prefill_tok_per_s`,
//! `decode_tok_per_s`, `hit_rate`, `bytes_read`, `read_bytes_per_s`,
//! `io_wait`, `peak_rss_bytes`, `bound_bytes`, ...), what `turbospark plot
//! sweep` draws.

use super::{peak_rss_reset, Args};
use crate::generate::peak_rss_bytes;
use crate::loading::{with_model, ModelTask};
use crate::progress::human_bytes;
use anyhow::{bail, Context, Result};
use std::process::ExitCode;
use std::time::Instant;
use turbospark_backend::Device;
use turbospark_cpu::Numerics;
use turbospark_engine::timing::PhaseTimes;
use turbospark_engine::{
    ExpertMode, ExpertOptions, Logits, Model, Residency, RouterHistogram, SessionOptions, SlotCount,
};
use turbospark_format::install::{ExpertLayer, Install};
use turbospark_text::sampler::argmax;

/// Scratch, KV cache, thread stacks and allocator slack allowed on top of
/// the weights and slots.
const OVERHEAD: u64 = 300 << 20;

/// `k`, `2k`, `all`, or a number, for a model of `top_k` of `num_experts`.
fn parse_slots(s: &str, top_k: usize, num_experts: usize) -> Result<usize> {
    let s = s.trim();
    if s == "all" {
        return Ok(num_experts);
    }
    if let Some(m) = s.strip_suffix('k') {
        let m: usize = if m.is_empty() { 1 } else { m.parse()? };
        return Ok((m * top_k).min(num_experts));
    }
    s.parse()
        .with_context(|| format!("--slots: `{s}` is not a number, `Nk` or `all`"))
}

struct Row {
    label: String,
    slots: Option<usize>,
    prefill_tps: f64,
    decode_tps: f64,
    hit_rate: f64,
    bytes_read: u64,
    /// Misses, and of them those the device copied from the page cache.
    misses: u64,
    page_cache_copies: u64,
    read_bw: f64,
    /// Share of the decode time spent waiting for expert reads.
    io_wait: f64,
    peak: Option<u64>,
    bound: Option<u64>,
    histogram: RouterHistogram,
    /// The engine's phases over the decode steps.
    decode_phases: PhaseTimes,
}

/// The sweep's settings, from [`Args`].
struct Sweep {
    prompt: usize,
    generate: usize,
    threads: Option<usize>,
    numerics: Numerics,
}

fn run_one(a: &Sweep, args: &Args, install: &Install, opts: &ExpertOptions) -> Result<Row> {
    with_model(
        &args.model,
        &args.device,
        a.threads,
        a.numerics,
        opts,
        OneConfig { a, install },
    )
}

/// One expert configuration's prefill and decode, on a loaded model.
struct OneConfig<'a> {
    a: &'a Sweep,
    install: &'a Install,
}

impl ModelTask for OneConfig<'_> {
    type Output = Row;

    fn run<D: Device>(self, model: Model<D>) -> Result<Row> {
        measure_config(self.a, self.install, &model)
    }
}

fn measure_config<D: Device>(a: &Sweep, install: &Install, model: &Model<D>) -> Result<Row> {
    let plan = model.expert_store().plan().clone();
    let vocab = model.vocab_size();
    let prompt: Vec<u32> = (0..a.prompt)
        .map(|i| ((i * 7919 + 13) % vocab) as u32)
        .collect();
    let mut session = model.session(SessionOptions {
        context: a.prompt + a.generate,
        max_batch: a.prompt.clamp(1, 64),
    })?;
    let reset = peak_rss_reset();
    let mut last = vec![0f32; vocab];
    let t = Instant::now();
    session.forward(0, &prompt, Logits::Last(&mut last))?;
    let prefill = t.elapsed().as_secs_f64();
    session.expert_stats_mut().reset();
    session.phase_times_mut().reset();
    let mut next = argmax(&last);
    let t = Instant::now();
    for pos in a.prompt..a.prompt + a.generate {
        next = argmax(session.decode(next, pos)?);
    }
    let decode = t.elapsed().as_secs_f64();
    let stats = session.expert_stats().total();
    let streamed = plan.residency == Residency::Streamed;
    let m = &install.manifest;
    Ok(Row {
        label: plan.residency.to_string(),
        slots: streamed.then_some(plan.slots),
        prefill_tps: a.prompt as f64 / prefill,
        decode_tps: a.generate as f64 / decode,
        hit_rate: stats.hit_rate(),
        bytes_read: stats.bytes_read,
        misses: stats.reads,
        page_cache_copies: stats.page_cache_copies,
        read_bw: stats.bandwidth(),
        io_wait: stats.wait_nanos as f64 * 1e-9 / decode,
        peak: reset.then(peak_rss_bytes).flatten(),
        bound: streamed.then(|| {
            // Host slots: the cache's, or every expert's (--host-experts).
            let held = |e: &ExpertLayer| {
                if plan.host_experts {
                    e.num_experts
                } else {
                    plan.slots
                }
            };
            m.resident_bytes
                + m.experts
                    .iter()
                    .map(|e| held(e) as u64 * e.stride)
                    .sum::<u64>()
                + plan.pin_page_cache
                + OVERHEAD
        }),
        histogram: session.router_histogram().clone(),
        decode_phases: *session.phase_times(),
    })
}

pub fn run(args: &Args) -> Result<ExitCode> {
    let install = Install::open(&args.model)?;
    let m = &install.manifest;
    let Some(moe) = m.arch.moe.as_ref() else {
        bail!(
            "{} has no routed experts: the expert-slot sweep (--sweep, --slots, --prompt, \
             --generate, --mapped, --resident) needs a MoE install; without those options bench measures \
             speed",
            args.model.display()
        );
    };
    let a = Sweep {
        prompt: args.prompt.unwrap_or(16),
        generate: args.generate.unwrap_or(16),
        threads: match args.threads.as_slice() {
            [] => None,
            [t] => Some(*t),
            _ => bail!("the expert-slot sweep runs at one thread count; give one --threads"),
        },
        numerics: match args.numerics.as_slice() {
            [n] => (*n).into(),
            _ => bail!("the expert-slot sweep runs in one arithmetic; give one --numerics"),
        },
    };
    if a.prompt == 0 {
        bail!("--prompt must be at least 1");
    }
    let cache = &args.experts.cache;
    let io_threads = cache.io_threads(args.device.backend);
    let default_slots = ["k", "2k", "4k", "all"].map(String::from).to_vec();
    let (k, ne) = (moe.top_k, moe.num_experts);
    let mut counts = Vec::new();
    for s in args.slots.as_ref().unwrap_or(&default_slots) {
        let n = parse_slots(s, k, ne)?;
        if !counts.contains(&n) {
            counts.push(n);
        }
    }
    let stride = m.experts.first().map_or(0, |e| e.stride);
    let json = args.json;
    if !json {
        println!(
        "bench {}: {} MoE layers × {} experts (top-{k}), stride {}, resident {}; prompt {}, generate {}; {} cache, {} reader threads{}",
        args.model.display(),
        m.experts.len(),
        ne,
        human_bytes(stride),
        human_bytes(m.resident_bytes),
        a.prompt,
        a.generate,
        cache.policy(),
        io_threads,
        match (cache.direct_io, cache.host_experts) {
            (_, true) => ", every expert in host memory",
            (true, false) => ", direct I/O",
            (false, false) => "",
        },
    );
        println!(
            "{:>9} {:>6} {:>13} {:>12} {:>7} {:>10} {:>11} {:>8} {:>10} {:>10} {:>5}",
            "experts",
            "slots",
            "prefill tok/s",
            "decode tok/s",
            "hit%",
            "MiB read",
            "read MiB/s",
            "io wait%",
            "peak RSS",
            "bound",
            "ok"
        );
    }
    let base = ExpertOptions {
        policy: cache.policy(),
        direct_io: cache.direct_io,
        io_threads,
        host_experts: cache.host_experts,
        pin_page_cache: cache.pin_page_cache(args.device.backend)?,
        ..ExpertOptions::default()
    };
    let mut configs = Vec::new();
    if args.resident {
        configs.push(ExpertOptions {
            mode: ExpertMode::Resident,
            ..base
        });
    }
    if args.mapped {
        configs.push(ExpertOptions {
            mode: ExpertMode::Mapped,
            ..base
        });
    }
    for &n in &counts {
        configs.push(ExpertOptions {
            mode: ExpertMode::Streamed,
            slots: SlotCount::Fixed(n),
            ..base
        });
    }
    let mut all_ok = true;
    let mut histogram = None;
    for opts in &configs {
        let r = run_one(&a, args, &install, opts)?;
        let ok = match (r.peak, r.bound) {
            (Some(p), Some(b)) => {
                all_ok &= p <= b;
                if p <= b {
                    "yes"
                } else {
                    "NO"
                }
            }
            _ => "-",
        };
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        if json {
            let line = serde_json::json!({
                "test": "sweep",
                "model": args.model.display().to_string(),
                "experts": r.label,
                "slots": r.slots,
                "n_prompt": a.prompt,
                "n_gen": a.generate,
                "prefill_tok_per_s": r.prefill_tps,
                "decode_tok_per_s": r.decode_tps,
                "hit_rate": r.hit_rate,
                "bytes_read": r.bytes_read,
                "page_cache_copies": r.page_cache_copies,
                "read_bytes_per_s": r.read_bw,
                "io_wait": r.io_wait,
                "peak_rss_bytes": r.peak,
                "bound_bytes": r.bound,
            });
            println!("{line}");
            histogram.get_or_insert(r.histogram);
            continue;
        }
        println!(
            "{:>9} {:>6} {:>13.2} {:>12.2} {:>7.2} {:>10.1} {:>11.1} {:>8.1} {:>10} {:>10} {:>5}",
            r.label,
            r.slots.map_or("-".into(), |s| s.to_string()),
            r.prefill_tps,
            r.decode_tps,
            100.0 * r.hit_rate,
            mib(r.bytes_read),
            mib(r.read_bw as u64),
            100.0 * r.io_wait,
            r.peak.map_or("-".into(), human_bytes),
            r.bound.map_or("-".into(), human_bytes),
            ok
        );
        println!("{:>16} {}", "decode phases:", r.decode_phases);
        if r.page_cache_copies > 0 {
            println!(
                "{:>16} {} of {} misses copied by the device from locked page cache (no read)",
                "page cache:", r.page_cache_copies, r.misses
            );
        }
        histogram.get_or_insert(r.histogram);
    }
    if let Some(h) = &histogram {
        let share = |n: usize| 100.0 * h.hot_share(n);
        // With --json, stdout holds only the JSON lines.
        let say = |s: String| {
            if json {
                eprintln!("{s}")
            } else {
                println!("{s}")
            }
        };
        say(format!(
            "routing: each layer's most chosen {k} / {} / {} experts took {:.1} % / {:.1} % / {:.1} % of {} selections (uniform: {:.1} % / {:.1} % / {:.1} %)",
            2 * k,
            4 * k,
            share(k),
            share(2 * k),
            share(4 * k),
            h.total(),
            100.0 * (k as f64 / ne as f64).min(1.0),
            100.0 * (2.0 * k as f64 / ne as f64).min(1.0),
            100.0 * (4.0 * k as f64 / ne as f64).min(1.0),
        ));
        if let Some(path) = &args.experts.router_hist {
            crate::experts::write_histogram(path, h)?;
        }
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        eprintln!("peak resident memory exceeded the slot cache's bound");
        ExitCode::from(1)
    })
}
