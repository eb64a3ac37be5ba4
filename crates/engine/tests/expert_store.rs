//! The expert store on every MoE fixture, converted to a real install:
//!
//! - logits of a chunked prefill followed by 16 greedy decode steps are bit
//!   for bit those of resident experts when the experts are mapped, or
//!   streamed through top_k slots (prefill chunks then need more experts
//!   than there are slots and run in token groups), a middle count, or every
//!   expert, under LFU and LRU, with direct I/O where the filesystem has
//!   it, and with every expert held in host memory (`host_experts`, whose
//!   one copy two live sessions share). Resident logits themselves are checked against HF transformers
//!   by `crates/cli/tests/tiny_logits.rs`;
//! - the statistics add up and the router histogram does not depend on the
//!   mode;
//! - bad input (an expert file shorter than its manifest entry, a file that
//!   shrinks under a running session, fewer slots than top_k) is a typed
//!   error, never a panic.

mod common;

use common::{tokens, TempInstall, MOE_FAMILIES};
use std::fs::OpenOptions;
use turbospark_cpu::{CpuDevice, Numerics};
use turbospark_engine::experts::ExpertError;
use turbospark_engine::{
    CachePolicy, EngineError, ExpertMode, ExpertOptions, ExpertStats, Model, Residency,
    RouterHistogram, SessionOptions,
};
use turbospark_format::install::Install;

const PROMPT: usize = 24;
const DECODE: usize = 16;

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

struct Run {
    bits: Vec<u32>,
    stats: ExpertStats,
    histogram: RouterHistogram,
}

/// Prefill of `PROMPT` tokens in chunks of 8, then `DECODE` greedy steps.
fn run(install: &Install, opts: &ExpertOptions) -> Result<Run, EngineError> {
    run_in(install, opts, Numerics::Exact)
}

/// As [`run`], in `numerics`.
fn run_in(install: &Install, opts: &ExpertOptions, numerics: Numerics) -> Result<Run, EngineError> {
    let device = CpuDevice::new(1).unwrap().with_numerics(numerics);
    let model = Model::open(install, device, opts)?;
    let vocab = model.vocab_size();
    let prompt = tokens(PROMPT, vocab);
    let mut s = model.session(SessionOptions {
        context: PROMPT + DECODE,
        max_batch: 8,
    })?;
    let mut logits = vec![0f32; PROMPT * vocab];
    s.prefill(&prompt, &mut logits)?;
    let mut next = argmax(&logits[(PROMPT - 1) * vocab..]);
    for pos in PROMPT..PROMPT + DECODE {
        let row = s.decode(next, pos)?;
        next = argmax(row);
        logits.extend_from_slice(row);
    }
    Ok(Run {
        bits: logits.iter().map(|v| v.to_bits()).collect(),
        stats: s.expert_stats().clone(),
        histogram: s.router_histogram().clone(),
    })
}

fn mode(mode: ExpertMode) -> ExpertOptions {
    ExpertOptions {
        mode,
        ..ExpertOptions::default()
    }
}

#[test]
fn logits_are_bit_identical_across_modes_slots_and_policies() {
    for &family in MOE_FAMILIES {
        let Some(tmp) = TempInstall::convert(family, "bits") else {
            println!("skipped {family}: fixture absent");
            continue;
        };
        let install = tmp.open();
        let moe = install.manifest.arch.moe.unwrap();
        let (k, ne) = (moe.top_k, moe.num_experts);
        let reference = run(&install, &mode(ExpertMode::Resident)).unwrap();
        let moe_layers = install.manifest.experts.len();
        assert_eq!(reference.stats.layers().len(), moe_layers);
        for (_, s) in reference.stats.layers() {
            assert_eq!(s.hits, s.requests, "{family}: resident experts always hit");
            assert_eq!((s.reads, s.bytes_read), (0, 0));
        }
        for (_, counts) in reference.histogram.layers() {
            let total: u64 = counts.iter().sum();
            assert_eq!(total, ((PROMPT + DECODE) * k) as u64, "{family}");
        }

        let middle = (k + ne) / 2;
        let lru = |slots| ExpertOptions {
            policy: CachePolicy::Lru,
            ..ExpertOptions::streamed(slots)
        };
        let direct = ExpertOptions {
            direct_io: true,
            ..ExpertOptions::streamed(k)
        };
        let cases = [
            ("mapped".to_string(), mode(ExpertMode::Mapped)),
            (format!("streamed {k} lfu"), ExpertOptions::streamed(k)),
            (format!("streamed {k} lru"), lru(k)),
            (
                format!("streamed {middle} lfu"),
                ExpertOptions::streamed(middle),
            ),
            (format!("streamed {middle} lru"), lru(middle)),
            (format!("streamed {ne} (all)"), ExpertOptions::streamed(ne)),
            (format!("streamed {k} direct I/O"), direct),
            (
                format!("streamed {k}, every expert in host memory"),
                ExpertOptions {
                    host_experts: true,
                    ..ExpertOptions::streamed(k)
                },
            ),
            (
                format!("streamed {k} direct I/O, every expert in host memory"),
                ExpertOptions {
                    host_experts: true,
                    ..direct
                },
            ),
        ];
        for (name, opts) in &cases {
            let got = match run(&install, opts) {
                Err(EngineError::Experts(ExpertError::Open { direct: true, .. })) => {
                    println!("{family}: {name} skipped: no O_DIRECT on this filesystem");
                    continue;
                }
                r => r.unwrap(),
            };
            let first_diff = got
                .bits
                .iter()
                .zip(&reference.bits)
                .position(|(a, b)| a != b);
            assert_eq!(
                first_diff, None,
                "{family}: {name}: logits differ from resident"
            );
            assert_eq!(got.histogram, reference.histogram, "{family}: {name}");
            let total = got.stats.total();
            if opts.mode == ExpertMode::Mapped || name.ends_with("(all)") {
                // One group per batch, as with resident experts.
                assert_eq!(
                    total.requests,
                    reference.stats.total().requests,
                    "{family}: {name}"
                );
            }
            for (l, s) in got.stats.layers() {
                let layout = install.manifest.expert_layer(*l).unwrap();
                if opts.mode == ExpertMode::Mapped {
                    assert_eq!((s.hits, s.bytes_read), (s.requests, 0));
                    continue;
                }
                assert_eq!(s.hits + s.reads, s.requests, "{family}: {name}: layer {l}");
                let per_read = if opts.direct_io {
                    layout.record_len().next_multiple_of(4096)
                } else {
                    layout.record_len()
                };
                assert_eq!(s.bytes_read, s.reads * per_read, "{family}: {name}");
                if name.ends_with("(all)") {
                    assert!(
                        s.reads <= ne as u64,
                        "{family}: with a slot per expert nothing is read twice"
                    );
                }
            }
            println!(
                "{family}: {name}: identical; hit rate {:.1}%, {} reads",
                100.0 * total.hit_rate(),
                total.reads
            );
        }
    }
}

/// With every expert in host memory, the model's sessions share one copy:
/// two sessions alive at once, decoding in turn, each give the resident
/// logits bit for bit.
#[test]
fn sessions_share_the_host_copy_of_the_experts() {
    let Some(tmp) = TempInstall::convert("mixtral", "host") else {
        println!("skipped: mixtral fixture absent");
        return;
    };
    let install = tmp.open();
    let reference = run(&install, &mode(ExpertMode::Resident)).unwrap();
    let k = install.manifest.arch.moe.as_ref().unwrap().top_k;
    let opts = ExpertOptions {
        host_experts: true,
        ..ExpertOptions::streamed(k)
    };
    let model = Model::open(&install, CpuDevice::new(1).unwrap(), &opts).unwrap();
    assert!(model.expert_store().plan().host_experts);
    let vocab = model.vocab_size();
    let prompt = tokens(PROMPT, vocab);
    let session = || {
        model.session(SessionOptions {
            context: PROMPT + DECODE,
            max_batch: 8,
        })
    };
    let (mut a, mut b) = (session().unwrap(), session().unwrap());
    let mut out = [Vec::new(), Vec::new()];
    let mut next = [0u32; 2];
    for (i, s) in [&mut a, &mut b].into_iter().enumerate() {
        let mut logits = vec![0f32; PROMPT * vocab];
        s.prefill(&prompt, &mut logits).unwrap();
        next[i] = argmax(&logits[(PROMPT - 1) * vocab..]);
        out[i] = logits;
    }
    for pos in PROMPT..PROMPT + DECODE {
        for (i, s) in [&mut a, &mut b].into_iter().enumerate() {
            let row = s.decode(next[i], pos).unwrap();
            next[i] = argmax(row);
            out[i].extend_from_slice(row);
        }
    }
    for (i, logits) in out.iter().enumerate() {
        let bits: Vec<u32> = logits.iter().map(|v| v.to_bits()).collect();
        assert!(
            bits == reference.bits,
            "session {i}: logits differ from resident"
        );
    }
}

#[test]
fn the_plan_says_what_was_chosen() {
    let Some(tmp) = TempInstall::convert("mixtral", "plan") else {
        return;
    };
    let install = tmp.open();
    let opts = ExpertOptions {
        memory_budget: Some(1 << 40),
        ..ExpertOptions::default()
    };
    let m = Model::open(&install, CpuDevice::new(1).unwrap(), &opts).unwrap();
    assert_eq!(m.expert_store().residency(), Residency::Resident);
    assert!(m.expert_store().plan().to_string().contains("fits"));
    // A budget with room for the resident weights and 3 slots per layer.
    let fp = turbospark_engine::experts::Footprint::of_install(&install);
    let opts = ExpertOptions {
        memory_budget: Some(fp.with_slots(3) + 100),
        ..ExpertOptions::default()
    };
    let m = Model::open(&install, CpuDevice::new(1).unwrap(), &opts).unwrap();
    let plan = m.expert_store().plan();
    assert_eq!((plan.residency, plan.slots), (Residency::Streamed, 3));
    assert!(plan.to_string().contains("exceeds"), "{plan}");
}

#[test]
fn fewer_slots_than_top_k_is_an_error() {
    let Some(tmp) = TempInstall::convert("glm4_moe", "slots") else {
        return;
    };
    let install = tmp.open();
    let k = install.manifest.arch.moe.as_ref().unwrap().top_k;
    let e = Model::open(
        &install,
        CpuDevice::new(1).unwrap(),
        &ExpertOptions::streamed(k - 1),
    )
    .err()
    .unwrap();
    assert!(
        matches!(e, EngineError::Experts(ExpertError::TooFewSlots { slots, top_k }) if slots == k - 1 && top_k == k),
        "{e}"
    );
    assert!(e.to_string().contains(&format!("at least {k}")), "{e}");
}

#[test]
fn a_short_expert_file_is_an_error_at_open() {
    let Some(tmp) = TempInstall::convert("qwen3moe", "short") else {
        return;
    };
    let layout = tmp.open().manifest.experts[0].clone();
    let path = tmp.dir.join(&layout.file);
    let shrink = || {
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(layout.file_len() - 4096)
            .unwrap()
    };
    // Shrunk after the install was validated: each mode's open catches it.
    let install = tmp.open();
    shrink();
    for opts in [
        ExpertOptions::streamed(4),
        mode(ExpertMode::Mapped),
        mode(ExpertMode::Resident),
    ] {
        let e = Model::open(&install, CpuDevice::new(1).unwrap(), &opts)
            .err()
            .unwrap();
        assert!(
            matches!(e, EngineError::Experts(ExpertError::FileShort { .. })),
            "{:?}: {e}",
            opts.mode
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&layout.file) && msg.contains("stride"),
            "{msg}"
        );
    }
    // Shrunk before: the install itself does not open.
    let e = Install::open(&tmp.dir).err().unwrap().to_string();
    assert!(e.contains(&layout.file), "{e}");
}

#[test]
fn a_read_error_mid_generation_is_a_typed_error() {
    let Some(tmp) = TempInstall::convert("mixtral", "readerr") else {
        return;
    };
    let install = tmp.open();
    let k = install.manifest.arch.moe.as_ref().unwrap().top_k;
    let model = Model::open(
        &install,
        CpuDevice::new(1).unwrap(),
        &ExpertOptions::streamed(k),
    )
    .unwrap();
    let vocab = model.vocab_size();
    let toks = tokens(PROMPT, vocab);
    let mut s = model.session(SessionOptions::new(PROMPT)).unwrap();
    let mut out = vec![0f32; 4 * vocab];
    s.prefill(&toks[..4], &mut out).unwrap();
    // Every expert file loses its data under the running session.
    for layer in &install.manifest.experts {
        OpenOptions::new()
            .write(true)
            .open(tmp.dir.join(&layer.file))
            .unwrap()
            .set_len(0)
            .unwrap();
    }
    let mut error = None;
    for (pos, &t) in toks.iter().enumerate().skip(4) {
        if let Err(e) = s.decode(t, pos) {
            error = Some((pos, e));
            break;
        }
    }
    let (pos, e) = error.expect("a decode step misses the cache and fails to read");
    assert!(
        matches!(
            e,
            EngineError::Experts(ExpertError::Read { ref source, .. })
                if source.kind() == std::io::ErrorKind::UnexpectedEof
        ),
        "{e}"
    );
    assert!(e.to_string().contains("experts/"), "{e}");
    // The failed step did not advance the session.
    assert_eq!(s.position(), pos);
}

/// Options of a gpt-oss-like synthetic install (Q8_0 resident, MXFP4
/// experts) written over any earlier one.
fn synth_options(
    seed: u64,
    threads: usize,
    router_skew: Option<f64>,
) -> turbospark_engine::synthetic_install::SynthOptions {
    turbospark_engine::synthetic_install::SynthOptions {
        seed,
        resident_format: turbospark_core::QuantFormat::Q8_0,
        expert_format: turbospark_core::QuantFormat::Mxfp4,
        threads,
        force: true,
        router_skew,
    }
}

#[test]
fn a_synthetic_install_opens_and_streams_bit_identically() {
    use turbospark_engine::synthetic_install::{write_synthetic_install, SynthOptions};
    let Some(spec) = common::spec("gpt_oss", &[("hidden_size", serde_json::json!(128))]) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("turbospark-engine-synth-{}", std::process::id()));
    let opts = synth_options(7, 2, None);
    let manifest = write_synthetic_install(&spec, &dir, &opts, &mut |_| {}).unwrap();
    assert_eq!(manifest.experts.len(), spec.moe_layers().count());
    assert!(manifest.experts[0]
        .parts
        .iter()
        .any(|p| p.dtype == turbospark_core::QuantFormat::Mxfp4));
    let install = Install::open(&dir).unwrap();
    let k = spec.moe.unwrap().top_k;
    // Q8_0 resident weights and MXFP4 experts: the fast kernels (repacked
    // resident weights, experts on their own layout) too.
    for numerics in [Numerics::Exact, Numerics::Fast] {
        let resident = run_in(&install, &mode(ExpertMode::Resident), numerics).unwrap();
        for opts in [mode(ExpertMode::Mapped), ExpertOptions::streamed(k)] {
            let other = run_in(&install, &opts, numerics).unwrap();
            assert!(
                resident.bits == other.bits,
                "synthetic, {numerics}: {:?} differs from resident",
                opts.mode
            );
        }
        let streamed = run_in(&install, &ExpertOptions::streamed(k), numerics).unwrap();
        assert!(streamed.stats.total().reads > 0);
    }
    // The generator does not depend on its thread count.
    let dir1 = dir.with_extension("one-thread");
    let one = SynthOptions { threads: 1, ..opts };
    write_synthetic_install(&spec, &dir1, &one, &mut |_| {}).unwrap();
    for layout in &manifest.experts {
        let a = std::fs::read(dir.join(&layout.file)).unwrap();
        let b = std::fs::read(dir1.join(&layout.file)).unwrap();
        assert!(a == b, "{}", layout.file);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir1);
}

/// Share of `histogram`'s selections that went to each layer's `quarter`
/// most popular experts by [`ranking`](turbospark_engine::router_skew::ranking).
fn top_quarter_share(histogram: &RouterHistogram, seed: u64) -> f64 {
    let (mut top, mut all) = (0u64, 0u64);
    for (layer, counts) in histogram.layers() {
        let rank = turbospark_engine::router_skew::ranking(counts.len(), seed, *layer);
        for (e, &c) in counts.iter().enumerate() {
            all += c;
            if rank[e] < counts.len() / 4 {
                top += c;
            }
        }
    }
    top as f64 / all as f64
}

#[test]
fn a_skewed_synthetic_router_prefers_its_popular_experts() {
    use turbospark_engine::synthetic_install::{write_synthetic_install, SynthOptions};
    let Some(spec) = common::spec(
        "gpt_oss",
        &[
            ("hidden_size", serde_json::json!(128)),
            ("num_local_experts", serde_json::json!(16)),
        ],
    ) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("turbospark-engine-skew-{}", std::process::id()));
    let mut opts = synth_options(11, 2, Some(1.5));
    let share = |opts: &SynthOptions| {
        write_synthetic_install(&spec, &dir, opts, &mut |_| {}).unwrap();
        let install = Install::open(&dir).unwrap();
        let r = run(&install, &mode(ExpertMode::Resident)).unwrap();
        top_quarter_share(&r.histogram, opts.seed)
    };
    // Zipf(1.5) over 16 experts, top-2: the 4 most popular take 74 % of
    // selections under Plackett–Luce (Gumbel noise) and 81 % with the
    // Gaussian noise a random matrix gives (Monte Carlo, 200k draws);
    // uniform routing gives 25 %.
    let skewed = share(&opts);
    opts.router_skew = None;
    let uniform = share(&opts);
    let _ = std::fs::remove_dir_all(&dir);
    println!("top-quarter share: skewed {skewed:.3}, unskewed {uniform:.3}");
    assert!(skewed > 0.5, "skewed routing: top quarter took {skewed:.3}");
    assert!(
        uniform < 0.4,
        "unskewed routing: top quarter took {uniform:.3}"
    );
}

#[test]
fn a_router_skew_without_a_router_bias_is_refused() {
    use turbospark_engine::synthetic_install::write_synthetic_install;
    let Some(spec) = common::spec("mixtral", &[]) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("turbospark-engine-noskew-{}", std::process::id()));
    let opts = synth_options(1, 1, Some(1.0));
    let e = write_synthetic_install(&spec, &dir, &opts, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("router bias"), "{e}");
    assert!(!dir.exists(), "a refused synth left {}", dir.display());
}
