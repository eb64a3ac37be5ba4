//! Element-wise kernels: RMS norm, gated activations, sigmoid gate, softcap.
//!
//! RMS norm (HF `LlamaRMSNorm`, `Gemma3RMSNorm`, Muse Glimmer's no-scale
//! norm): `y = x / sqrt(mean(x²) + eps) · s` with `s = w` (plain), `1 + w`
//! (centered) or 1 (no-scale); the mean of squares is accumulated in f64.
//!
//! Gated activations (`gate ← act(gate) · up`):
//! - SwiGLU: `silu(g) · u`, `silu(g) = g / (1 + e^−g)`;
//! - GELU-tanh (`gelu_pytorch_tanh`): `0.5 g (1 + tanh(√(2/π)(g + 0.044715 g³))) · u`;
//! - gpt-oss clamped SwiGLU (`GptOssExperts._apply_gate`): `g = min(g, L)`,
//!   `u = clamp(u, −L, L)`, `(u + 1) · g · sigmoid(α g)`.

use turbospark_core::arch::{Activation, NormScale, NormSpec};

/// RMS-normalises every `dim`-wide row of `x` in place.
pub(crate) fn rms_norm(x: &mut [f32], dim: usize, spec: NormSpec, weight: Option<&[f32]>) {
    if dim == 0 {
        return;
    }
    for row in x.chunks_exact_mut(dim) {
        let ms = row
            .iter()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum::<f64>()
            / dim as f64;
        let inv = (1.0 / (ms + f64::from(spec.eps)).sqrt()) as f32;
        match (spec.scale, weight) {
            (NormScale::Plain, Some(w)) => {
                for (v, &w) in row.iter_mut().zip(w) {
                    *v = (*v * inv) * w;
                }
            }
            (NormScale::Centered, Some(w)) => {
                for (v, &w) in row.iter_mut().zip(w) {
                    *v = (*v * inv) * (1.0 + w);
                }
            }
            _ => {
                for v in row.iter_mut() {
                    *v *= inv;
                }
            }
        }
    }
}

pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `gate[i] = act(gate[i]) · up[i]`.
pub(crate) fn glu(gate: &mut [f32], up: &[f32], act: Activation) {
    match act {
        Activation::Swiglu => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = *g * sigmoid(*g) * u;
            }
        }
        Activation::GeluTanh => {
            const SQRT_2_OVER_PI: f32 = 0.797_884_6;
            for (g, &u) in gate.iter_mut().zip(up) {
                let x = *g;
                let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
                *g = 0.5 * x * (1.0 + inner.tanh()) * u;
            }
        }
        Activation::ClampedSwiglu { alpha, limit } => {
            for (g, &u) in gate.iter_mut().zip(up) {
                // Comparisons (not f32::min/max) so that NaN propagates like torch.clamp.
                let x = if *g > limit { limit } else { *g };
                let u = if u > limit {
                    limit
                } else if u < -limit {
                    -limit
                } else {
                    u
                };
                *g = (u + 1.0) * (x * sigmoid(alpha * x));
            }
        }
    }
}

/// `x[i] *= sigmoid(gate[i])`.
pub(crate) fn mul_sigmoid(x: &mut [f32], gate: &[f32]) {
    for (v, &g) in x.iter_mut().zip(gate) {
        *v *= sigmoid(g);
    }
}

/// `x[i] = cap · tanh(x[i] / cap)`.
pub(crate) fn softcap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = (*v / cap).tanh() * cap;
    }
}

/// `x[t] += (alpha · (u · x[t]) + beta) · u` for each row of `u.len()`,
/// the dot product accumulated in f64.
pub(crate) fn adjust_projection(x: &mut [f32], u: &[f32], alpha: f32, beta: f32) {
    for row in x.chunks_exact_mut(u.len()) {
        let dot: f64 = row
            .iter()
            .zip(u)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum();
        let c = (f64::from(alpha) * dot + f64::from(beta)) as f32;
        for (v, &b) in row.iter_mut().zip(u) {
            *v += c * b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norm_conventions() {
        let mut x = vec![3.0f32, 4.0];
        let w = [2.0f32, 0.5];
        let inv = 1.0 / (12.5f64).sqrt();
        rms_norm(&mut x, 2, NormSpec::plain(0.0), Some(&w));
        assert!((x[0] as f64 - 3.0 * inv * 2.0).abs() < 1e-6);
        let mut y = vec![3.0f32, 4.0];
        rms_norm(&mut y, 2, NormSpec::centered(0.0), Some(&w));
        assert!((y[1] as f64 - 4.0 * inv * 1.5).abs() < 1e-6);
        let mut z = vec![3.0f32, 4.0];
        rms_norm(&mut z, 2, NormSpec::no_scale(0.0), None);
        assert!((z[0] as f64 - 3.0 * inv).abs() < 1e-6);
    }

    #[test]
    fn clamped_swiglu_matches_formula() {
        let mut g = vec![10.0f32, -2.0];
        glu(
            &mut g,
            &[-9.0, 0.5],
            Activation::ClampedSwiglu {
                alpha: 1.702,
                limit: 7.0,
            },
        );
        let s = |x: f32| 1.0 / (1.0 + (-x).exp());
        assert!((g[0] - (-7.0 + 1.0) * 7.0 * s(1.702 * 7.0)).abs() < 1e-5);
        assert!((g[1] - 1.5 * -2.0 * s(1.702 * -2.0)).abs() < 1e-6);
    }
}
