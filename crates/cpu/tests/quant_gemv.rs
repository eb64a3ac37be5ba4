//! The CPU matmul for every quantized format against an independent f64
//! reference: the f64 dot of the rows dequantized by the scalar reference
//! kernel (`turbospark_core::quant::dequantize_row`, bit-exact with ggml).
//!
//! The only permitted difference is f32 accumulation: with eight partial
//! sums and a fixed combining tree, the rounding error of a dot over `n`
//! terms is at most about `(n/8 + 4) · 2⁻²⁴ · Σ|w·x|`, which is the bound
//! asserted. Results must also be identical bit for bit across batch sizes
//! and thread counts.

use turbospark_backend::conformance::data::{random_matrix, Rng};
use turbospark_backend::{DType, Device, Limits, Stream};
use turbospark_core::quant::{dequantize_row, dot_row};
use turbospark_core::QuantFormat;
use turbospark_cpu::{CpuDevice, CpuStream};

const ROWS: usize = 37;
const COLS: usize = 512;
const TOKENS: usize = 3;

/// A stream for matmuls of up to `TOKENS` rows over what `dev` holds.
fn stream(dev: &CpuDevice) -> CpuStream {
    let limits = Limits {
        max_tokens: TOKENS,
        ..Limits::default()
    };
    dev.stream(&limits).unwrap()
}

fn run(
    dev: &CpuDevice,
    st: &mut CpuStream,
    w: &turbospark_cpu::CpuMatrix,
    x: &[f32],
    n: usize,
) -> Vec<f32> {
    let mut xb = dev.alloc(DType::F32, n * COLS).unwrap();
    st.write(&mut xb, &x[..n * COLS]).unwrap();
    let mut out = dev.alloc(DType::F32, n * ROWS).unwrap();
    st.matmul(w, &xb, n, &mut out).unwrap();
    let mut host = vec![0f32; n * ROWS];
    st.read(&out, &mut host).unwrap();
    host
}

#[test]
fn gemv_and_gemm_match_the_f64_reference_for_every_format() {
    let single = CpuDevice::new(1).unwrap();
    let pooled = CpuDevice::new(3).unwrap();
    for fmt in QuantFormat::ALL {
        let mut rng = Rng(0x5eed ^ fmt.ggml_type() as u64);
        let t = random_matrix(fmt.name(), fmt, ROWS, COLS, &mut rng);
        let x = rng.vec(TOKENS * COLS);
        let w1 = single.upload_matrix(&t).unwrap();
        let w3 = pooled.upload_matrix(&t).unwrap();
        let (mut s1, mut s3) = (stream(&single), stream(&pooled));

        let batch = run(&pooled, &mut s3, &w3, &x, TOKENS);
        let batch_single = run(&single, &mut s1, &w1, &x, TOKENS);
        assert_eq!(batch, batch_single, "{fmt}: thread count changed the bits");

        let rb = t.bytes.len() / ROWS;
        let mut deq = vec![0f32; COLS];
        let mut worst = 0f64;
        for tok in 0..TOKENS {
            let xt = &x[tok * COLS..(tok + 1) * COLS];
            let one = run(&pooled, &mut s3, &w3, xt, 1);
            assert_eq!(
                one,
                batch[tok * ROWS..(tok + 1) * ROWS],
                "{fmt}: token {tok} alone differs from the batch"
            );
            for (r, row) in t.bytes.as_slice().chunks_exact(rb).enumerate() {
                dequantize_row(fmt, row, &mut deq).unwrap();
                let exact: f64 = deq.iter().zip(xt).map(|(&w, &v)| w as f64 * v as f64).sum();
                let magnitude: f64 = deq
                    .iter()
                    .zip(xt)
                    .map(|(&w, &v)| (w as f64 * v as f64).abs())
                    .sum();
                let bound = (COLS as f64 / 8.0 + 4.0) * f64::from(f32::EPSILON) / 2.0 * magnitude
                    + f64::from(f32::MIN_POSITIVE);
                let got = f64::from(one[r]);
                let err = (got - exact).abs();
                assert!(
                    err <= bound,
                    "{fmt} row {r} token {tok}: {got} vs f64 {exact} (error {err:e} > bound {bound:e})"
                );
                // The per-block reference dot of the core crate agrees too.
                let reference = dot_row(fmt, row, xt).unwrap() as f64;
                assert!(
                    (got - reference).abs()
                        <= 2.0 * bound + f64::from(f32::EPSILON) * reference.abs(),
                    "{fmt} row {r}: {got} vs reference dot_row {reference}"
                );
                worst = worst.max(err / magnitude.max(f64::MIN_POSITIVE));
            }
        }
        eprintln!("{fmt:>6}: worst |error| / Σ|w·x| = {worst:.2e}");
    }
}

#[test]
fn embedding_rows_are_the_dequantized_table_rows() {
    let be = CpuDevice::new(1).unwrap();
    let mut st = stream(&be);
    for fmt in QuantFormat::ALL {
        let mut rng = Rng(7 + fmt.ggml_type() as u64);
        let t = random_matrix("token_embd.weight", fmt, 5, 256, &mut rng);
        let table = be.upload_matrix(&t).unwrap();
        let mut out = be.alloc(DType::F32, 2 * 256).unwrap();
        st.embed(&table, &[4, 1], &mut out).unwrap();
        let mut got = vec![0f32; 512];
        st.read(&out, &mut got).unwrap();
        let rb = t.bytes.len() / 5;
        let mut want = vec![0f32; 256];
        dequantize_row(fmt, &t.bytes.as_slice()[4 * rb..5 * rb], &mut want).unwrap();
        assert_eq!(got[..256], want[..], "{fmt}");
        assert!(
            st.embed(&table, &[5], &mut out).is_err(),
            "{fmt}: token past the table"
        );
    }
}

#[test]
fn malformed_uploads_are_errors() {
    let be = CpuDevice::new(1).unwrap();
    let mut rng = Rng(1);
    let mut t = random_matrix("w", QuantFormat::Q4K, 2, 256, &mut rng);
    t.shape = vec![3, 256];
    assert!(be.upload_matrix(&t).is_err());
    t.shape = vec![2, 100];
    assert!(be.upload_matrix(&t).is_err());
    t.shape = vec![512];
    assert!(be.upload_matrix(&t).is_err());
}

/// A large fast GLU split between threads gives the bits of one thread's
/// (the vector body and the scalar tail of each element unchanged), for
/// every activation.
#[test]
fn fast_glu_on_two_threads_equals_one() {
    use turbospark_backend::Numerics;
    use turbospark_core::arch::Activation;
    let len = (1 << 15) + 13;
    let mut rng = Rng(7);
    let gate = rng.scaled(len, 4.0);
    let up = rng.vec(len);
    let acts = [
        Activation::Swiglu,
        Activation::GeluTanh,
        Activation::ClampedSwiglu {
            alpha: 1.702,
            limit: 7.0,
        },
    ];
    for act in acts {
        let out: Vec<Vec<u32>> = [1, 2]
            .into_iter()
            .map(|threads| {
                let dev = CpuDevice::new(threads)
                    .unwrap()
                    .with_numerics(Numerics::Fast);
                let mut st = stream(&dev);
                let mut g = dev.alloc(DType::F32, len).unwrap();
                let mut u = dev.alloc(DType::F32, len).unwrap();
                st.write(&mut g, &gate).unwrap();
                st.write(&mut u, &up).unwrap();
                st.glu(&mut g, &u, len, act).unwrap();
                let mut host = vec![0f32; len];
                st.read(&g, &mut host).unwrap();
                host.iter().map(|v| v.to_bits()).collect()
            })
            .collect();
        assert!(out[0] == out[1], "{act:?}");
    }
}
