//! The gated DeltaNet ops (an optional part of the seam, for the families
//! with linear-attention layers): the causal convolution, the gated delta
//! rule and the per-row sigmoid gate, against the f64 references. A
//! sequence is fed in calls of 5, 1 and 3 tokens: the state each call
//! leaves must carry the sequence exactly as one reference pass over all
//! nine tokens does, and a fresh call must ignore whatever the state
//! buffers hold.

use super::data::{f32_tensor, Rng};
use super::{compare_rel, reference, ConformanceError, Context, Harness, Tolerances};
use crate::{ConvParams, DeltaNetInput, DeltaNetParams, Device, Limits, Stream};

/// Token counts of the calls one sequence is fed in.
const CALLS: [usize; 3] = [5, 1, 3];

/// Runs every gated DeltaNet check.
pub fn check_delta_net<D: Device>(dev: &D, tol: &Tolerances) -> Result<(), ConformanceError> {
    check_mul_sigmoid_rows(dev, tol)?;
    check_causal_conv1d(dev, tol)?;
    check_gated_delta_rule(dev, tol)
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
        max_head_dim: dk,
        ..Limits::default()
    };
    let mut h = Harness::new(dev, limits)?;
    let mut state = h.buf(&rng.vec(hv * dk * dv))?;
    let mut got = Vec::new();
    let mut start = 0;
    for (i, &len) in CALLS.iter().enumerate() {
        let case = format!("call {i} of {len} tokens");
        let q = h.buf(&qkv[start * row..(start + len) * row])?;
        let a = h.buf(&alpha[start * hv..(start + len) * hv])?;
        let b = h.buf(&beta[start * hv..(start + len) * hv])?;
        let mut out = h.zeros(len * hv * dv)?;
        let p = DeltaNetParams {
            n_tokens: len,
            k_heads: hk,
            v_heads: hv,
            k_head_dim: dk,
            v_head_dim: dv,
            fresh: i == 0,
        };
        let input = DeltaNetInput {
            qkv: &q,
            alpha: &a,
            beta: &b,
            a_log: &a_log_v,
            dt_bias: &dt_v,
        };
        h.st.gated_delta_rule(input, &p, &mut state, &mut out)
            .at(OP, &case)?;
        got.extend(h.get(&out, len * hv * dv)?);
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
