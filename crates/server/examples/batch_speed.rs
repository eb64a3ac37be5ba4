//! How batched decoding scales with the number of sequences, engine only
//! (no HTTP, no sampling): `steps` decode steps of `n` sequences, each over
//! its own KV cache, for each `n`, with the engine's phases. Besides the
//! wall time per step it prints the CPU time per step (every thread of the
//! process, from `/proc/self/task/*/schedstat`), which a shared machine's
//! load disturbs far less than the wall time (with one thread it is the
//! work itself; with two it also counts the pool's spinning), and the
//! fastest single step.
//!
//! `cargo run --release -p turbospark-server --example batch_speed -- INSTALL [fast|exact] [avx2|avx512-vnni|scalar]`
//! (the last: the fast kernels' instruction set; default the best this CPU
//! has). Environment: `THREADS` (default 2), `STEPS` (default 20), `NS`
//! (the batch sizes, default `1,2,4,8,16`), `ROUNDS` (default 1: every
//! size once per round, the rounds one after another).

use std::time::Instant;
use turbospark_engine::{BatchRow, ExpertOptions, Logits, Model, SessionOptions};

/// Nanoseconds every thread of this process has run (Linux), if readable.
fn cpu_nanos() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let dir = std::env::args().nth(1).unwrap();
    let num = std::env::args().nth(2).unwrap_or("fast".into());
    let numerics = if num == "exact" {
        turbospark_cpu::Numerics::Exact
    } else {
        turbospark_cpu::Numerics::Fast
    };
    let install = turbospark_format::install::Install::open(std::path::Path::new(&dir)).unwrap();
    let isa = match std::env::args().nth(3).as_deref() {
        None => turbospark_cpu::Isa::detect(),
        Some("avx2") => turbospark_cpu::Isa::Avx2,
        Some("avx512-vnni") => turbospark_cpu::Isa::Avx512Vnni,
        Some("scalar") => turbospark_cpu::Isa::Scalar,
        Some(other) => panic!("unknown instruction set {other}"),
    };
    let threads = env_or("THREADS", 2usize);
    let steps = env_or("STEPS", 20usize);
    let rounds = env_or("ROUNDS", 1usize);
    let ns: Vec<usize> = std::env::var("NS")
        .unwrap_or_else(|_| "1,2,4,8,16".into())
        .split(',')
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let dev = turbospark_cpu::CpuDevice::new(threads)
        .unwrap()
        .with_numerics(numerics)
        .with_isa(isa);
    println!(
        "{numerics} numerics, {} kernels, {threads} threads",
        dev.isa().name()
    );
    let m = Model::open(&install, dev, &ExpertOptions::mapped()).unwrap();
    let vocab = m.vocab_size();
    let mut w = m
        .session(SessionOptions {
            context: 512,
            max_batch: 64,
        })
        .unwrap();
    for _ in 0..rounds {
        for &n in &ns {
            let mut caches: Vec<_> = (0..n).map(|_| w.new_cache().unwrap()).collect();
            for c in caches.iter_mut() {
                w.forward_in(c, &[1, 2, 3, 4], Logits::None).unwrap();
            }
            let mut logits = vec![0f32; n * vocab];
            w.phase_times_mut().reset();
            let cpu0 = cpu_nanos();
            let t = Instant::now();
            let mut fastest = f64::INFINITY;
            for s in 0..steps {
                let step = Instant::now();
                let mut rows: Vec<_> = caches
                    .iter_mut()
                    .map(|kv| BatchRow {
                        kv,
                        token: 100 + s as u32,
                    })
                    .collect();
                w.decode_batch(&mut rows, &mut logits).unwrap();
                fastest = fastest.min(step.elapsed().as_secs_f64());
            }
            let dt = t.elapsed().as_secs_f64();
            let cpu = match (cpu0, cpu_nanos()) {
                (Some(a), Some(b)) => format!("{:.2}", (b - a) as f64 / 1e6 / steps as f64),
                _ => "?".into(),
            };
            let pt = *w.phase_times();
            let per_step = |d: std::time::Duration| d.as_secs_f64() * 1e3 / steps as f64;
            use turbospark_engine::timing::Phase;
            println!(
                "n={n:2} step {:.2} ms (cpu {cpu} ms, fastest {:.2} ms)  {:.1} tok/s  per step: attention {:.2}, FFN {:.2}, head {:.2} ms",
                dt / steps as f64 * 1e3,
                fastest * 1e3,
                (n * steps) as f64 / dt,
                per_step(pt.get(Phase::Attention)),
                per_step(pt.get(Phase::DenseFfn)),
                per_step(pt.get(Phase::Head)),
            );
        }
    }
}
