//! The gated DeltaNet ops (an optional part of the seam, for the families
//! with linear-attention layers): the causal convolution, the gated delta
//! rule and the per-row sigmoid gate, against the f64 references. A
//! sequence is fed in calls of 5, 1 and 3 tokens: the state each call
//! leaves must carry the sequence exactly as one reference pass over all
//! nine tokens does, and a fresh call must ignore whatever the state
//! buffers hold.
//!
//! Backends may run long calls of the gated delta rule in chunks (HF's
//! prefill computes it in chunks of 64 tokens), so it is also checked on
//! calls around and across chunk boundaries (1, 63, 64, 65 and 130
//! tokens), each fresh and continuing a state, against the token-by-token
//! f64 reference: every output and the state after every call within
//! `1e-5 · max|reference|` (f32 rounding of sums over a few hundred
//! tokens; the op computes in f32 whatever the numerics).

use super::data::{f32_tensor, Rng};
use super::{compare_rel, reference, ConformanceError, Context, Harness, Tolerances};
use crate::{ConvParams, DeltaNetInput, DeltaNetParams, Device, Limits, Stream};

/// Token counts of the calls one sequence is fed in.
const CALLS: [usize; 3] = [5, 1, 3];

/// Runs every gated DeltaNet check.
pub fn check_delta_net<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    check_mul_sigmoid_rows(dev, tol)?;
    check_causal_conv1d(dev, tol)?;
    check_gated_delta_rule(dev, tol)?;
    check_gated_delta_rule_chunks(dev)
}

pub fn check_mul_sigmoid_rows<D: Device>(
    dev: &D,
    tol: &Tolerances,
) -> Result<(), ConformanceError> {
    const OP: &str = "mul_sigmoid_rows";
    let (rows, dim) = (7, 37);
    let mut h = Harness::new(dev, Limits::default())?;
    let mut rng = Rng(31);
    let (x, g) = (rng.vec(rows * dim), rng.scaled(rows, 4.0));
    let mut xb = h.buf(&x)?;
    let gb = h.buf(&g)?;
    h.st.mul_sigmoid_rows(&mut xb, &gb, rows, dim)
        .at(OP, "7 rows")?;
    let got = h.get(&xb, rows * dim)?;
    let want: Vec<f64> = (0..rows * dim)
        .map(|i| f64::from(x[i]) * reference::sigmoid(f64::from(g[i / dim])))
        .collect();
    compare_rel(OP, "7 rows", &got, &want, tol.elementwise)?;
    if h.st.mul_sigmoid_rows(&mut xb, &gb, rows + 1, dim).is_ok() {
        return Err(super::property(OP, "8 rows", "read past the gates".into()));
    }
    Ok(())
}

pub fn check_causal_conv1d<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    const OP: &str = "causal_conv1d_silu";
    let (channels, kernel) = (37, 4);
    let n: usize = CALLS.iter().sum();
    let mut rng = Rng(32);
    let x = rng.scaled(n * channels, 2.0);
    let w = rng.vec(channels * kernel);
    let weight = dev
        .upload_vector(&f32_tensor("conv1d", vec![channels * kernel], &w))
        .at(OP, "upload")?;
    let mut h = Harness::new(dev, Limits::default())?;
    let want = reference::causal_conv1d_silu(
        &x,
        &vec![0.0; (kernel - 1) * channels],
        &w,
        channels,
        kernel,
    );
    // A stale state, which the fresh first call must not read.
    let mut state = h.buf(&rng.vec((kernel - 1) * channels))?;
    let mut got = Vec::new();
    let mut start = 0;
    for (i, &len) in CALLS.iter().enumerate() {
        let case = format!("call {i} of {len} tokens");
        let xb = h.buf(&x[start * channels..(start + len) * channels])?;
        let mut out = h.zeros(len * channels)?;
        let p = ConvParams {
            n_tokens: len,
            channels,
            kernel,
            fresh: i == 0,
        };
        h.st.causal_conv1d_silu(&xb, &mut state, &weight, &p, &mut out)
            .at(OP, &case)?;
        got.extend(h.get(&out, len * channels)?);
        start += len;
    }
    compare_rel(OP, "5 + 1 + 3 tokens", &got, &want, tol.activation)?;
    let state_now = h.get(&state, (kernel - 1) * channels)?;
    let last: Vec<f64> = x[(n - kernel + 1) * channels..]
        .iter()
        .map(|&v| f64::from(v))
        .collect();
    compare_rel(OP, "state: the last 3 inputs", &state_now, &last, 0.0)?;
    let p = ConvParams {
        n_tokens: 2,
        channels,
        kernel: 1,
        fresh: false,
    };
    let xb = h.buf(&x[..2 * channels])?;
    let mut out = h.zeros(2 * channels)?;
    if h.st
        .causal_conv1d_silu(&xb, &mut state, &weight, &p, &mut out)
        .is_ok()
    {
        return Err(super::property(OP, "kernel 1", "accepted".into()));
    }
    Ok(())
}

pub fn check_gated_delta_rule<D: Device>(
    dev: &D,
    tol: &Tolerances,
) -> Result<(), ConformanceError> {
    const OP: &str = "gated_delta_rule";
    // Two key heads, each serving two consecutive value heads.
    let shape @ (hk, hv, dk, dv) = (2, 4, 12, 16);
    let row = 2 * hk * dk + hv * dv;
    let n: usize = CALLS.iter().sum();
    let mut rng = Rng(33);
    let qkv = rng.scaled(n * row, 1.5);
    let alpha = rng.scaled(n * hv, 2.0);
    let beta = rng.scaled(n * hv, 3.0);
    // Decay rates exp(a_log) from 0.05 to 1: per-token decays 0.5..0.99.
    let a_log: Vec<f32> = (0..hv).map(|i| (0.05 + 0.3 * i as f32).ln()).collect();
    let dt_bias = rng.vec(hv);
    let up = |name: &str, v: &[f32]| {
        dev.upload_vector(&f32_tensor(name, vec![v.len()], v))
            .at(OP, "upload")
    };
    let (a_log_v, dt_v) = (up("a_log", &a_log)?, up("dt_bias", &dt_bias)?);
    let mut ref_state = vec![0.0; hv * dk * dv];
    let want =
        reference::gated_delta_rule(&qkv, &alpha, &beta, &a_log, &dt_bias, shape, &mut ref_state);
    let limits = Limits {
        max_delta_head_dim: dk.max(dv),
        ..Limits::default()
    };
    let mut h = Harness::new(dev, limits)?;
    let mut state = h.buf(&rng.vec(hv * dk * dv))?;
    let mut got = Vec::new();
    let mut start = 0;
    for (i, &len) in CALLS.iter().enumerate() {
        let case = format!("call {i} of {len} tokens");
        let inputs = (&qkv[..], &alpha[..], &beta[..]);
        let decay = (&a_log_v, &dt_v);
        let t = (start, start + len);
        got.extend(delta_call(
            &mut h,
            shape,
            inputs,
            decay,
            t,
            i == 0,
            &mut state,
            &case,
        )?);
        start += len;
    }
    let t = tol.attention.max(1e-5);
    compare_rel(OP, "5 + 1 + 3 tokens", &got, &want, t)?;
    let state_now = h.get(&state, hv * dk * dv)?;
    compare_rel(OP, "final state", &state_now, &ref_state, t)?;
    // Value heads that are not a multiple of the key heads.
    let q = h.buf(&qkv[..row])?;
    let a = h.buf(&alpha[..hv])?;
    let b = h.buf(&beta[..hv])?;
    let mut out = h.zeros(hv * dv)?;
    let bad = DeltaNetParams {
        n_tokens: 1,
        k_heads: 3,
        v_heads: hv,
        k_head_dim: dk,
        v_head_dim: dv,
        fresh: true,
    };
    let input = DeltaNetInput {
        qkv: &q,
        alpha: &a,
        beta: &b,
        a_log: &a_log_v,
        dt_bias: &dt_v,
    };
    if h.st
        .gated_delta_rule(input, &bad, &mut state, &mut out)
        .is_ok()
    {
        return Err(super::property(OP, "3 key heads", "accepted".into()));
    }
    Ok(())
}

/// Token counts of the chunk checks: one token, a chunk of 64 but one, a
/// chunk, a chunk and one, two chunks and a partial one.
const CHUNK_CALLS: [usize; 5] = [1, 63, 64, 65, 130];

/// Allowed error of the chunk checks, relative to the largest reference
/// value of the compared array.
const CHUNK_TOLERANCE: f64 = 1e-5;

/// The gated delta rule on calls around and across chunk boundaries (see
/// the module docs): for each token count, a fresh call (over a stale
/// state buffer) and a call that continues its state, on small odd heads;
/// then 130 tokens and 65 more on heads of 128, the width of the released
/// models'.
pub fn check_gated_delta_rule_chunks<D: Device>(dev: &D) -> Result<(), ConformanceError> {
    for n in CHUNK_CALLS {
        delta_rule_calls(dev, (2, 4, 12, 20), &[n, n], 34 + n as u64)?;
    }
    delta_rule_calls(dev, (1, 2, 128, 128), &[130, 65], 35)
}

/// Feeds one sequence to the gated delta rule in calls of `calls` tokens
/// (the first fresh, over a random state buffer) and compares each call's
/// outputs and the state it leaves with the f64 reference.
fn delta_rule_calls<D: Device>(
    dev: &D,
    shape @ (hk, hv, dk, dv): reference::DeltaShape,
    calls: &[usize],
    seed: u64,
) -> Result<(), ConformanceError> {
    const OP: &str = "gated_delta_rule";
    let row = 2 * hk * dk + hv * dv;
    let n: usize = calls.iter().sum();
    let mut rng = Rng(seed);
    let qkv = rng.scaled(n * row, 1.5);
    let alpha = rng.scaled(n * hv, 2.0);
    let beta = rng.scaled(n * hv, 3.0);
    // Decay rates exp(a_log) from 0.01 to 6: per-token decays from about
    // 0.999 (the state grows over the whole sequence) to 1e-8 (a chunk's
    // cumulative decay underflows f32).
    let a_log: Vec<f32> = (0..hv)
        .map(|i| (0.01f32 * 600f32.powf(i as f32 / (hv - 1).max(1) as f32)).ln())
        .collect();
    let dt_bias = rng.vec(hv);
    let up = |name: &str, v: &[f32]| {
        dev.upload_vector(&f32_tensor(name, vec![v.len()], v))
            .at(OP, "upload")
    };
    let (a_log_v, dt_v) = (up("a_log", &a_log)?, up("dt_bias", &dt_bias)?);
    let limits = Limits {
        max_tokens: calls.iter().copied().max().unwrap_or(1),
        max_delta_head_dim: dk.max(dv),
        ..Limits::default()
    };
    let mut h = Harness::new(dev, limits)?;
    let mut state = h.buf(&rng.vec(hv * dk * dv))?;
    let mut ref_state = vec![0.0; hv * dk * dv];
    let mut start = 0;
    for (i, &len) in calls.iter().enumerate() {
        let case = format!(
            "{hv} value heads of {dv} over {hk} key heads of {dk}: {} call of {len} tokens \
             after {start}",
            if i == 0 { "a fresh" } else { "a" }
        );
        let (t0, t1) = (start, start + len);
        let want = reference::gated_delta_rule(
            &qkv[t0 * row..t1 * row],
            &alpha[t0 * hv..t1 * hv],
            &beta[t0 * hv..t1 * hv],
            &a_log,
            &dt_bias,
            shape,
            &mut ref_state,
        );
        let inputs = (&qkv[..], &alpha[..], &beta[..]);
        let decay = (&a_log_v, &dt_v);
        let got = delta_call(
            &mut h,
            shape,
            inputs,
            decay,
            (t0, t1),
            i == 0,
            &mut state,
            &case,
        )?;
        compare_max(OP, &format!("{case}: outputs"), &got, &want)?;
        let state_now = h.get(&state, hv * dk * dv)?;
        compare_max(OP, &format!("{case}: state"), &state_now, &ref_state)?;
        start = t1;
    }
    Ok(())
}

/// One call of the gated delta rule over tokens `t.0 .. t.1` of a
/// sequence's inputs (`qkv`, `alpha`, `beta` of every token, rows of
/// `shape`) with the decay vectors (`a_log`, `dt_bias`) on `state`; its
/// outputs.
#[allow(clippy::too_many_arguments)]
fn delta_call<D: Device>(
    h: &mut Harness<'_, D>,
    (hk, hv, dk, dv): reference::DeltaShape,
    (qkv, alpha, beta): (&[f32], &[f32], &[f32]),
    (a_log, dt_bias): (&D::Vector, &D::Vector),
    (t0, t1): (usize, usize),
    fresh: bool,
    state: &mut D::Buf,
    case: &str,
) -> Result<Vec<f32>, ConformanceError> {
    const OP: &str = "gated_delta_rule";
    let row = 2 * hk * dk + hv * dv;
    let len = t1 - t0;
    let q = h.buf(&qkv[t0 * row..t1 * row])?;
    let a = h.buf(&alpha[t0 * hv..t1 * hv])?;
    let b = h.buf(&beta[t0 * hv..t1 * hv])?;
    let mut out = h.zeros(len * hv * dv)?;
    let p = DeltaNetParams {
        n_tokens: len,
        k_heads: hk,
        v_heads: hv,
        k_head_dim: dk,
        v_head_dim: dv,
        fresh,
    };
    let input = DeltaNetInput {
        qkv: &q,
        alpha: &a,
        beta: &b,
        a_log,
        dt_bias,
    };
    h.st.gated_delta_rule(input, &p, state, &mut out)
        .at(OP, case)?;
    h.get(&out, len * hv * dv)
}

/// `compare` within [`CHUNK_TOLERANCE`] of the largest `|want|`.
fn compare_max(
    op: &'static str,
    case: &str,
    got: &[f32],
    want: &[f64],
) -> Result<(), ConformanceError> {
    let max = want.iter().fold(0f64, |m, w| m.max(w.abs()));
    super::compare(op, case, got, want, CHUNK_TOLERANCE, |_| max)
}
