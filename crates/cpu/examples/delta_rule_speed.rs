//! Speed of the CPU backend's gated delta rule (the recurrence of the gated
//! DeltaNet layers) alone:
//! `cargo run --release -p turbospark-cpu --example delta_rule_speed -- [TOKENS] [CALL_TOKENS] [THREADS] [REPS]`
//! runs `TOKENS` tokens (default 512) in calls of `CALL_TOKENS` (default
//! all of them: one prefill call; 1 runs them as decode does) with the
//! head shapes of Qwen3.6-35B-A3B's linear-attention layers (32 value
//! heads over 16 key heads, key and value heads of 128), and prints the
//! best time of `REPS` repetitions (default 5). Inputs are random with
//! decays in the range of the real model's; the point is the speed.

use turbospark_backend::{
    DType, DeltaNetInput, DeltaNetParams, Device, HostTensor, Limits, SharedBytes, Stream,
};
use turbospark_core::QuantFormat;
use turbospark_cpu::CpuDevice;

const K_HEADS: usize = 16;
const V_HEADS: usize = 32;
const HEAD_DIM: usize = 128;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: usize| args.get(i).map_or(Ok(d), |s| s.parse::<usize>());
    let n = num(0, 512)?;
    let per_call = num(1, n)?.clamp(1, n.max(1));
    let (threads, reps) = (num(2, 2)?, num(3, 5)?.max(1));
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = |len: usize, scale: f32| -> Vec<f32> {
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    };
    let p = DeltaNetParams {
        n_tokens: per_call,
        k_heads: K_HEADS,
        v_heads: V_HEADS,
        k_head_dim: HEAD_DIM,
        v_head_dim: HEAD_DIM,
        fresh: true,
    };
    let row = p.row();
    let (qkv, alpha, beta) = (
        rand(n * row, 1.0),
        rand(n * V_HEADS, 2.0),
        rand(n * V_HEADS, 2.0),
    );
    // exp(A_log) from 1 to 16 and dt_bias near 1: per-token decays
    // between about 0.99 and 1e-7, as in the released checkpoints.
    let a_log: Vec<f32> = (0..V_HEADS)
        .map(|h| (1.0 + 15.0 * h as f32 / V_HEADS as f32).ln() - 3.0)
        .collect();
    let dt_bias = vec![1.0f32; V_HEADS];
    let be = CpuDevice::new(threads)?;
    let vector = |name: &str, v: &[f32]| {
        be.upload_vector(&HostTensor {
            name: name.into(),
            format: QuantFormat::F32,
            shape: vec![v.len()],
            bytes: SharedBytes::from_f32(v),
        })
    };
    let (a_log, dt_bias) = (vector("A_log", &a_log)?, vector("dt_bias", &dt_bias)?);
    let mut st = be.stream(&Limits {
        max_tokens: per_call,
        max_delta_head_dim: HEAD_DIM,
        ..Limits::default()
    })?;
    let calls = n.div_ceil(per_call);
    let mut bufs = Vec::with_capacity(calls);
    for c in 0..calls {
        let (t0, t1) = (c * per_call, ((c + 1) * per_call).min(n));
        let mut b = [
            be.alloc(DType::F32, (t1 - t0) * row)?,
            be.alloc(DType::F32, (t1 - t0) * V_HEADS)?,
            be.alloc(DType::F32, (t1 - t0) * V_HEADS)?,
        ];
        st.write(&mut b[0], &qkv[t0 * row..t1 * row])?;
        st.write(&mut b[1], &alpha[t0 * V_HEADS..t1 * V_HEADS])?;
        st.write(&mut b[2], &beta[t0 * V_HEADS..t1 * V_HEADS])?;
        bufs.push((t1 - t0, b));
    }
    let mut state = be.alloc(DType::F32, p.state_len())?;
    let mut out = be.alloc(DType::F32, per_call * V_HEADS * HEAD_DIM)?;
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = std::time::Instant::now();
        for (c, (len, b)) in bufs.iter().enumerate() {
            let input = DeltaNetInput {
                qkv: &b[0],
                alpha: &b[1],
                beta: &b[2],
                a_log: &a_log,
                dt_bias: &dt_bias,
            };
            let params = DeltaNetParams {
                n_tokens: *len,
                fresh: c == 0,
                ..p
            };
            st.gated_delta_rule(input, &params, &mut state, &mut out)?;
        }
        st.synchronize()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "gated_delta_rule: {n} tokens in calls of {per_call}, {V_HEADS} value heads over \
         {K_HEADS} key heads of {HEAD_DIM}, {threads} threads, {}: best of {reps} {:.2} ms \
         ({:.0} tokens/s)",
        be.isa().name(),
        best * 1e3,
        n as f64 / best
    );
    Ok(())
}
