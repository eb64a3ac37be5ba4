//! Gated DeltaNet on the CPU: the depthwise causal convolution and the
//! gated delta rule (math and reference in `turbospark_backend::delta_net`;
//! HF `causal_conv1d_fn` and `torch_recurrent_gated_delta_rule` of
//! transformers 5.24.0).
//!
//! Prefill and decode run the same token-by-token recurrence (HF's decode
//! form); HF's prefill uses the chunked form, the same function in another
//! summation order (the tiny fixture's HF prefill and decode logits differ
//! by 5e-5). A chunked kernel would trade this loop's `O(n · dk · dv)` state
//! updates per head for matrix products over chunks; not done yet. Each
//! value head's state is updated in f32, heads one after another.

use crate::elementwise::sigmoid;
use turbospark_backend::{ConvParams, DeltaNetParams};

/// `out[t, c] = silu(Σ_j w[c, j] · in[t − (k − 1) + j, c])` over the state
/// (the `k − 1` inputs before `x`, oldest first), which then becomes the
/// last `k − 1` inputs. Lengths are checked by the caller.
pub(crate) fn causal_conv1d_silu(
    x: &[f32],
    state: &mut [f32],
    w: &[f32],
    p: &ConvParams,
    out: &mut [f32],
) {
    let (n, ch, k) = (p.n_tokens, p.channels, p.kernel);
    let past = k - 1;
    let state = &mut state[..past * ch];
    if p.fresh {
        state.fill(0.0);
    }
    for t in 0..n {
        for c in 0..ch {
            let mut s = 0f32;
            for j in 0..k {
                // Input row `t + j − past` of `x`, or of the state before it.
                let v = match (t + j).checked_sub(past) {
                    Some(r) => x[r * ch + c],
                    None => state[(t + j) * ch + c],
                };
                s += w[c * k + j] * v;
            }
            out[t * ch + c] = s * sigmoid(s);
        }
    }
    // The new state: the last `past` rows of [state, x].
    if n >= past {
        state.copy_from_slice(&x[(n - past) * ch..n * ch]);
    } else {
        state.copy_within(n * ch.., 0);
        state[(past - n) * ch..].copy_from_slice(&x[..n * ch]);
    }
}

/// `x / sqrt(Σx² + 1e-6)` in place (HF `l2norm`, FLA's epsilon).
fn l2norm(x: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    let r = 1.0 / (ss + 1e-6).sqrt();
    x.iter_mut().for_each(|v| *v *= r);
}

/// `log(1 + e^x)`, linear past 20 as torch's `softplus` (threshold 20).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The per-token inputs of [`gated_delta_rule`].
pub(crate) struct Inputs<'a> {
    pub qkv: &'a [f32],
    pub alpha: &'a [f32],
    pub beta: &'a [f32],
    pub a_log: &'a [f32],
    pub dt_bias: &'a [f32],
}

/// The gated delta rule, token after token (lengths checked by the
/// caller); `qk` is scratch of `2 · k_head_dim`.
pub(crate) fn gated_delta_rule(
    i: &Inputs<'_>,
    p: &DeltaNetParams,
    state: &mut [f32],
    qk: &mut [f32],
    out: &mut [f32],
) {
    let (hk, hv, dk, dv) = (p.k_heads, p.v_heads, p.k_head_dim, p.v_head_dim);
    let row = p.row();
    let state = &mut state[..p.state_len()];
    if p.fresh {
        state.fill(0.0);
    }
    let q_scale = (dk as f32).powf(-0.5);
    let (q, k) = qk[..2 * dk].split_at_mut(dk);
    for t in 0..p.n_tokens {
        let r = &i.qkv[t * row..(t + 1) * row];
        for h in 0..hv {
            let kh = h / (hv / hk);
            q.copy_from_slice(&r[kh * dk..(kh + 1) * dk]);
            l2norm(q);
            q.iter_mut().for_each(|v| *v *= q_scale);
            k.copy_from_slice(&r[(hk + kh) * dk..(hk + kh + 1) * dk]);
            l2norm(k);
            let v = &r[2 * hk * dk + h * dv..2 * hk * dk + (h + 1) * dv];
            let beta = sigmoid(i.beta[t * hv + h]);
            let g = -i.a_log[h].exp() * softplus(i.alpha[t * hv + h] + i.dt_bias[h]);
            let decay = g.exp();
            let s = &mut state[h * dk * dv..(h + 1) * dk * dv];
            s.iter_mut().for_each(|x| *x *= decay);
            let o = &mut out[(t * hv + h) * dv..(t * hv + h + 1) * dv];
            // o holds Sᵀk first, then the output.
            o.fill(0.0);
            for (ki, srow) in k.iter().zip(s.chunks_exact(dv)) {
                for (acc, sv) in o.iter_mut().zip(srow) {
                    *acc += sv * ki;
                }
            }
            for (acc, &vj) in o.iter_mut().zip(v) {
                *acc = (vj - *acc) * beta;
            }
            for (ki, srow) in k.iter().zip(s.chunks_exact_mut(dv)) {
                for (sv, d) in srow.iter_mut().zip(o.iter()) {
                    *sv += ki * d;
                }
            }
            o.fill(0.0);
            for (qi, srow) in q.iter().zip(s.chunks_exact(dv)) {
                for (acc, sv) in o.iter_mut().zip(srow) {
                    *acc += sv * qi;
                }
            }
        }
    }
}
