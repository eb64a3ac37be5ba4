//! Plain f64 references of every op, written from the formulas (HF
//! `modeling_*.py`, `eager_attention_forward`), sharing no code with any
//! backend.

use crate::{AttentionParams, RopeTable};
use turbospark_core::arch::{Activation, NormScale, NormSpec, RopeKind, RouterKind};

pub fn dot(a: &[f32], b: &[f32]) -> (f64, f64) {
    a.iter().zip(b).fold((0.0, 0.0), |(s, m), (&x, &y)| {
        let p = f64::from(x) * f64::from(y);
        (s + p, m + p.abs())
    })
}

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// One row of RMS norm.
pub fn rms_norm(x: &[f32], spec: NormSpec, w: Option<&[f32]>) -> Vec<f64> {
    let ms = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + f64::from(spec.eps)).sqrt();
    x.iter()
        .enumerate()
        .map(|(i, &v)| {
            let s = match (spec.scale, w) {
                (NormScale::Plain, Some(w)) => f64::from(w[i]),
                (NormScale::Centered, Some(w)) => 1.0 + f64::from(w[i]),
                _ => 1.0,
            };
            f64::from(v) * r * s
        })
        .collect()
}

/// One head rotated at `pos`.
pub fn rope(head: &[f32], pos: usize, table: &RopeTable) -> Vec<f64> {
    let mut out: Vec<f64> = head.iter().map(|&v| f64::from(v)).collect();
    let pairs = table.rotary_dim / 2;
    for i in 0..pairs {
        let angle = pos as f64 * f64::from(table.inv_freq[i]);
        let f = f64::from(table.attention_factor);
        let (c, s) = (angle.cos() * f, angle.sin() * f);
        let (a, b) = match table.kind {
            RopeKind::Neox => (i, i + pairs),
            RopeKind::Interleaved => (2 * i, 2 * i + 1),
        };
        let (xa, xb) = (f64::from(head[a]), f64::from(head[b]));
        out[a] = xa * c - xb * s;
        out[b] = xb * c + xa * s;
    }
    out
}

pub fn glu(act: Activation, g: f64, u: f64) -> f64 {
    match act {
        Activation::Swiglu => g * sigmoid(g) * u,
        Activation::GeluTanh => {
            0.5 * g
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g.powi(3))).tanh())
                * u
        }
        Activation::ClampedSwiglu { alpha, limit } => {
            let (a, l) = (f64::from(alpha), f64::from(limit));
            let g = g.min(l);
            let u = u.clamp(-l, l);
            (u + 1.0) * g * sigmoid(a * g)
        }
    }
}

pub fn softcap(x: f64, cap: f64) -> f64 {
    (x / cap).tanh() * cap
}

/// Attention of query head `h` of token `t` over the full history `ks`,
/// `vs` (rows by position), as [`AttentionParams`] describes.
pub fn attention(
    p: &AttentionParams,
    q: &[f32],
    ks: &[Vec<f32>],
    vs: &[Vec<f32>],
    t: usize,
    h: usize,
    sink: Option<f32>,
) -> Vec<f64> {
    let hd = p.head_dim;
    let pos = p.first_pos + t;
    let kvh = h / (p.n_heads / p.n_kv_heads);
    let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let q = &q[(t * p.n_heads + h) * hd..][..hd];
    let mut s: Vec<f64> = (lo..=pos)
        .map(|j| {
            let mut v = dot(q, &ks[j][kvh * hd..(kvh + 1) * hd]).0 * f64::from(p.scale);
            if let Some(cap) = p.softcap {
                v = softcap(v, f64::from(cap));
            }
            v
        })
        .collect();
    let m = s
        .iter()
        .cloned()
        .chain(sink.map(f64::from))
        .fold(f64::NEG_INFINITY, f64::max);
    s.iter_mut().for_each(|v| *v = (*v - m).exp());
    let denom: f64 = s.iter().sum::<f64>() + sink.map_or(0.0, |x| (f64::from(x) - m).exp());
    let mut out = vec![0f64; hd];
    for (w, j) in s.iter().zip(lo..=pos) {
        for (o, &v) in out.iter_mut().zip(&vs[j][kvh * hd..(kvh + 1) * hd]) {
            *o += w / denom * f64::from(v);
        }
    }
    out
}

/// Indices of the `k` largest `values` among `eligible`, best first, ties
/// to the lower index.
fn top_k(values: &[f64], k: usize, eligible: impl Fn(usize) -> bool) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).filter(|&i| eligible(i)).collect();
    idx.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// One token's routes `(expert, weight)`, best rank first (the module
/// docs of [`crate::routing`] give the formulas).
pub fn route(
    kind: RouterKind,
    k: usize,
    z: &[f32],
    correction: Option<&[f32]>,
    expert_scale: Option<&[f32]>,
) -> Vec<(u32, f64)> {
    let z: Vec<f64> = z.iter().map(|&v| f64::from(v)).collect();
    let softmax = |z: &[f64]| {
        let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = z.iter().map(|v| (v - m).exp()).collect();
        let s: f64 = e.iter().sum();
        e.into_iter().map(|v| v / s).collect::<Vec<f64>>()
    };
    match kind {
        RouterKind::SoftmaxTopK { renormalize } => {
            let p = softmax(&z);
            let chosen = top_k(&p, k, |_| true);
            let total: f64 = chosen.iter().map(|&i| p[i]).sum();
            chosen
                .iter()
                .map(|&i| (i as u32, if renormalize { p[i] / total } else { p[i] }))
                .collect()
        }
        RouterKind::Gemma4 => {
            let p = softmax(&z);
            let chosen = top_k(&p, k, |_| true);
            let total: f64 = chosen.iter().map(|&i| p[i]).sum();
            chosen
                .iter()
                .map(|&i| {
                    let s = expert_scale.map_or(1.0, |s| f64::from(s[i]));
                    (i as u32, p[i] / total * s)
                })
                .collect()
        }
        RouterKind::TopKSoftmax => {
            let chosen = top_k(&z, k, |_| true);
            let picked: Vec<f64> = chosen.iter().map(|&i| z[i]).collect();
            let w = softmax(&picked);
            chosen.iter().zip(w).map(|(&i, w)| (i as u32, w)).collect()
        }
        RouterKind::SigmoidGrouped {
            n_group,
            topk_group,
            renormalize,
            scaling,
        } => {
            let n = z.len();
            let per = n / n_group;
            let s: Vec<f64> = z.iter().map(|&v| sigmoid(v)).collect();
            let c: Vec<f64> = (0..n)
                .map(|i| s[i] + correction.map_or(0.0, |c| f64::from(c[i])))
                .collect();
            let groups: Vec<f64> = (0..n_group)
                .map(|g| {
                    let mut m: Vec<f64> = c[g * per..(g + 1) * per].to_vec();
                    m.sort_by(|a, b| b.total_cmp(a));
                    m.iter().take(2).sum()
                })
                .collect();
            let kept = top_k(&groups, topk_group, |_| true);
            let chosen = top_k(&c, k, |i| kept.contains(&(i / per)));
            let total: f64 = chosen.iter().map(|&i| s[i]).sum::<f64>() + 1e-20;
            chosen
                .iter()
                .map(|&i| {
                    let w = if renormalize { s[i] / total } else { s[i] };
                    (i as u32, w * f64::from(scaling))
                })
                .collect()
        }
    }
}

/// Depthwise causal convolution with SiLU over `x` `[n, channels]` after
/// `history` (`[kernel − 1, channels]`, oldest first): `out[t, c] =
/// silu(Σ_j w[c, j] · in[t − (kernel − 1) + j, c])` (HF `causal_conv1d_fn`).
pub fn causal_conv1d_silu(
    x: &[f32],
    history: &[f32],
    w: &[f32],
    channels: usize,
    kernel: usize,
) -> Vec<f64> {
    let n = x.len() / channels;
    let past = kernel - 1;
    let input = |t: usize, c: usize| -> f64 {
        // `t` counts from the oldest history row.
        if t < past {
            f64::from(history[t * channels + c])
        } else {
            f64::from(x[(t - past) * channels + c])
        }
    };
    let mut out = vec![0.0; n * channels];
    for t in 0..n {
        for c in 0..channels {
            let s: f64 = (0..kernel)
                .map(|j| f64::from(w[c * kernel + j]) * input(t + j, c))
                .sum();
            out[t * channels + c] = s * sigmoid(s);
        }
    }
    out
}

/// Shapes of [`gated_delta_rule`]: `(k_heads, v_heads, k_head_dim,
/// v_head_dim)`.
pub type DeltaShape = (usize, usize, usize, usize);

/// The gated delta rule token by token (HF
/// `torch_recurrent_gated_delta_rule` with `use_qk_l2norm_in_kernel`, and
/// the `beta`/`g` of `Qwen3_5MoeGatedDeltaNet.forward`), from `state`
/// `[v_heads, k_head_dim, v_head_dim]`, which it updates; returns `out`
/// `[n, v_heads · v_head_dim]`.
pub fn gated_delta_rule(
    qkv: &[f32],
    alpha: &[f32],
    beta: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    (hk, hv, dk, dv): DeltaShape,
    state: &mut [f64],
) -> Vec<f64> {
    let row = 2 * hk * dk + hv * dv;
    let n = qkv.len() / row;
    let l2 = |v: &[f32]| -> Vec<f64> {
        let ss: f64 = v.iter().map(|&x| f64::from(x).powi(2)).sum();
        let r = 1.0 / (ss + 1e-6).sqrt();
        v.iter().map(|&x| f64::from(x) * r).collect()
    };
    let mut out = vec![0.0; n * hv * dv];
    for t in 0..n {
        let r = &qkv[t * row..(t + 1) * row];
        for h in 0..hv {
            let kh = h / (hv / hk);
            let q: Vec<f64> = l2(&r[kh * dk..(kh + 1) * dk])
                .iter()
                .map(|x| x / (dk as f64).sqrt())
                .collect();
            let k = l2(&r[hk * dk + kh * dk..hk * dk + (kh + 1) * dk]);
            let v = &r[2 * hk * dk + h * dv..2 * hk * dk + (h + 1) * dv];
            let b = sigmoid(f64::from(beta[t * hv + h]));
            let a = f64::from(alpha[t * hv + h]) + f64::from(dt_bias[h]);
            let softplus = if a > 20.0 { a } else { a.exp().ln_1p() };
            let g = -f64::from(a_log[h]).exp() * softplus;
            let s = &mut state[h * dk * dv..(h + 1) * dk * dv];
            s.iter_mut().for_each(|x| *x *= g.exp());
            for j in 0..dv {
                let kv: f64 = (0..dk).map(|i| s[i * dv + j] * k[i]).sum();
                let delta = (f64::from(v[j]) - kv) * b;
                for i in 0..dk {
                    s[i * dv + j] += k[i] * delta;
                }
            }
            for j in 0..dv {
                out[t * hv * dv + h * dv + j] = (0..dk).map(|i| s[i * dv + j] * q[i]).sum();
            }
        }
    }
    out
}
