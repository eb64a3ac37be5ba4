//! How batched decoding scales with the number of sequences, engine only
//! (no HTTP, no sampling): 20 decode steps of `n` sequences, each over its
//! own KV cache, for n = 1, 2, 4, 8, 16, with the engine's phases.
//!
//! `cargo run --release -p turbospark-server --example batch_speed -- INSTALL [fast|exact] [avx2|avx512-vnni|scalar]`
//! (the last: the fast kernels' instruction set; default the best this CPU
//! has).

use std::time::Instant;
use turbospark_engine::{BatchRow, ExpertOptions, Logits, Model, SessionOptions};
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
    let dev = turbospark_cpu::CpuDevice::new(2)
        .unwrap()
        .with_numerics(numerics)
        .with_isa(isa);
    println!("{numerics} numerics, {} kernels", dev.isa().name());
    let m = Model::open(&install, dev, &ExpertOptions::mapped()).unwrap();
    let vocab = m.vocab_size();
    let mut w = m
        .session(SessionOptions {
            context: 512,
            max_batch: 64,
        })
        .unwrap();
    for n in [1usize, 2, 4, 8, 16] {
        let mut caches: Vec<_> = (0..n).map(|_| w.new_cache().unwrap()).collect();
        for c in caches.iter_mut() {
            w.forward_in(c, &[1, 2, 3, 4], Logits::None).unwrap();
        }
        let mut logits = vec![0f32; n * vocab];
        let steps = 20;
        let t = Instant::now();
        for s in 0..steps {
            let mut rows: Vec<_> = caches
                .iter_mut()
                .map(|kv| BatchRow {
                    kv,
                    token: 100 + s as u32,
                })
                .collect();
            w.decode_batch(&mut rows, &mut logits).unwrap();
        }
        let dt = t.elapsed().as_secs_f64();
        let pt = *w.phase_times();
        w.phase_times_mut().reset();
        println!(
            "n={n:2} step {:.1} ms  {:.1} tok/s  {}",
            dt / steps as f64 * 1e3,
            (n * steps) as f64 / dt,
            pt
        );
    }
}
