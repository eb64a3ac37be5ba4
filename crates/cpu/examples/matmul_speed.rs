//! Throughput of the CPU backend's matmul for one weight format and shape:
//! `cargo run --release -p turbospark-cpu --example matmul_speed -- FORMAT ROWS COLS TOKENS [THREADS] [NUMERICS] [ISA]`
//! prints GB/s of weights streamed and GMAC/s (ISA: scalar, avx2 or
//! avx512-vnni; default the best this CPU has). Weights and activations are
//! random; the point is the kernel's speed, not its result.

use turbospark_backend::{DType, Device, HostTensor, Limits, Numerics, SharedBytes, Stream};
use turbospark_core::quant::row_bytes;
use turbospark_core::QuantFormat;
use turbospark_cpu::{CpuDevice, Isa};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "FORMAT ROWS COLS TOKENS [THREADS] [NUMERICS] [ISA]";
    let format: QuantFormat = serde_json::from_str(&format!("\"{}\"", args.first().ok_or(usage)?))?;
    let num = |i: usize, d: usize| args.get(i).map_or(Ok(d), |s| s.parse::<usize>());
    let (rows, cols, n, threads) = (num(1, 1536)?, num(2, 576)?, num(3, 1)?, num(4, 1)?);
    let numerics: Numerics = args.get(5).map_or("fast", |s| s.as_str()).parse()?;
    let isa = match args.get(6).map(|s| s.as_str()) {
        None => Isa::detect(),
        Some("scalar") => Isa::Scalar,
        Some("avx2") => Isa::Avx2,
        Some("avx512-vnni") => Isa::Avx512Vnni,
        Some(other) => return Err(format!("unknown ISA {other}; {usage}").into()),
    };
    let rb = row_bytes(format, cols)?;
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut bytes: Vec<u8> = (0..rows * rb)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    // Small finite scales (random ones would be subnormal or huge, and
    // subnormal arithmetic is far slower).
    if format.block_elems() > 1 {
        for b in bytes.chunks_exact_mut(format.block_bytes()) {
            match format {
                QuantFormat::Mxfp4 => b[0] = 120,
                QuantFormat::Q6K => {
                    let n = b.len();
                    b[n - 2..].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                }
                _ => b[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes()),
            }
        }
    }
    let be = CpuDevice::new(threads)?
        .with_numerics(numerics)
        .with_isa(isa);
    let w = be.upload_matrix(&HostTensor {
        name: "w".into(),
        format,
        shape: vec![rows, cols],
        bytes: SharedBytes::from_vec(bytes),
    })?;
    let mut st = be.stream(&Limits {
        max_tokens: n,
        ..Limits::default()
    })?;
    let mut x = be.alloc(DType::F32, n * cols)?;
    let xs: Vec<f32> = (0..n * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    st.write(&mut x, &xs)?;
    let mut out = be.alloc(DType::F32, n * rows)?;
    let reps = (2e9 / (rows * cols * n) as f64).clamp(3.0, 20000.0) as usize;
    st.matmul(&w, &x, n, &mut out)?;
    let t = std::time::Instant::now();
    // The fastest single call too: on a shared machine the mean carries
    // every time the thread was descheduled, the minimum hardly any.
    let mut fastest = f64::INFINITY;
    for _ in 0..reps {
        let c = std::time::Instant::now();
        st.matmul(&w, &x, n, &mut out)?;
        st.synchronize()?;
        fastest = fastest.min(c.elapsed().as_secs_f64());
    }
    let dt = t.elapsed().as_secs_f64() / reps as f64;
    println!(
        "{format} [{rows}, {cols}] x {n} tokens, {threads} threads, {numerics}, {}: {:.1} µs/call, {:.2} GB/s weights, {:.1} GMAC/s (fastest call {:.1} µs)",
        be.isa().name(),
        dt * 1e6,
        (rows * rb) as f64 / dt / 1e9,
        (rows * cols * n) as f64 / dt / 1e9,
        fastest * 1e6
    );
    Ok(())
}
