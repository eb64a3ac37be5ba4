//! ggml's element-wise CPU kernels as llama.cpp runs them on x86-64 with
//! AVX-512 (normative: llama.cpp's `ggml/src/ggml-cpu/vec.h`, `vec.cpp`,
//! `ops.cpp`):
//!
//! - `exp` of the softmax and of SiLU is `ggml_v_expf`, a polynomial with
//!   fused multiply-adds (at most 1.5 ulp from `expf`), transcribed lane by
//!   lane in [`v_expf`];
//! - SwiGLU: `silu(g) · u` with `silu(g) = g / (1 + v_expf(−g))`
//!   (`ggml_vec_swiglu_f32`);
//! - GELU-tanh: a 65536-entry f16 table indexed by `f16(g)`, so
//!   `gelu(g) · u = f16(gelu_f32(f16(g))) · u`, with `gelu(g) = 0` for
//!   `g ≤ −10` and `g` for `g ≥ 10` (`ggml_vec_geglu_f32`, `GGML_GELU_FP16`);
//! - gpt-oss's clamped SwiGLU: `x = min(g, L)`, `y = clamp(u, −L, L)`,
//!   `x / (1 + expf(α · (−x))) · (y + 1)` (`ggml_compute_forward_swiglu_oai`);
//! - RMS norm: `Σ f32(x²)` accumulated in f64, `mean = f32(Σ / n)`,
//!   `scale = 1 / sqrtf(mean + eps)` in f32, `y = x · scale`, then `· w`
//!   (`ggml_compute_forward_rms_norm_f32` and `ggml_mul`);
//! - soft-cap: `tanhf(x · (1/c)) · c` (`ggml_scale`, `ggml_tanh`, `ggml_scale`);
//! - rope: angles `p · s^i` built by repeated f32 multiplication with
//!   `s = powf(base, −2/n_dims)`, times `1/factor` under linear scaling,
//!   then `cosf`, `sinf` (`ggml_rope_cache_init`, `rope_yarn`), and the
//!   rotation `(fma(x0, c, −x1·s), fma(x0, s, x1·c))` (`rotate_pairs` as
//!   GCC compiles it).
//!
//! `cosf`, `sinf`, `tanhf`, `expf` and `powf` are the C library's, as in
//! llama.cpp (Rust's `f32` methods call them).

use half::f16;
use turbospark_backend::RopeTable;
use turbospark_core::arch::{Activation, NormScale, NormSpec, RopeKind, RopeScaling};

/// `ggml_v_expf` (AVX-512 variant), one lane. `mul_add` is a fused
/// multiply-add, as `_mm512_fmadd_ps`; `fnmadd(a, b, c)` is `mul_add(−a, b, c)`.
pub fn v_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // 0x1.715476p+0 (1/ln 2)
    let n = z - r;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),                  // 0x1.7f7d1cp-20
        (-n).mul_add(f32::from_bits(0x3f31_7200), x), // 0x1.62e4p-1
    );
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let u = b * b;
    let c = |bits: u32| f32::from_bits(bits);
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)))
        .mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
    // `_mm512_scalef_ps(j, n)`: j · 2^n rounded once (n is an integer here);
    // the f64 product is exact.
    (f64::from(j) * 2f64.powi(n as i32)) as f32
}

/// `ggml_silu_f32` on the vector path: `x / (1 + v_expf(−x))`.
#[inline]
fn silu(x: f32) -> f32 {
    x / (1.0 + v_expf(0.0 - x))
}

/// `ggml_gelu_f32`, the function ggml tabulates, with the fused
/// multiply-add GCC makes of `1 + A·x·x`.
fn gelu_f32(x: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let inner = (GELU_COEF_A * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh())
}

/// GELU-tanh through ggml's f16 table.
pub fn gelu_table(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        let h = f16::from_f32(x).to_f32();
        f16::from_f32(gelu_f32(h)).to_f32()
    }
}

/// `gate[i] = act(gate[i]) · up[i]` as ggml's GLU ops compute it.
pub(crate) fn glu(gate: &mut [f32], up: &[f32], act: Activation) {
    match act {
        Activation::Swiglu => {
            for (g, &u) in gate.iter_mut().zip(up) {
                *g = silu(*g) * u;
            }
        }
        Activation::GeluTanh => {
            for (g, &u) in gate.iter_mut().zip(up) {
                // Below −10 ggml writes 0 without multiplying by `up`.
                *g = if *g <= -10.0 { 0.0 } else { gelu_table(*g) * u };
            }
        }
        Activation::ClampedSwiglu { alpha, limit } => {
            for (g, &u) in gate.iter_mut().zip(up) {
                let x = g.min(limit);
                let y = u.clamp(-limit, limit);
                let out = x / (1.0 + (alpha * (0.0 - x)).exp());
                *g = out * (y + 1.0);
            }
        }
    }
}

/// RMS norm of every `dim`-wide row of `x` in place.
pub(crate) fn rms_norm(x: &mut [f32], dim: usize, spec: NormSpec, weight: Option<&[f32]>) {
    if dim == 0 {
        return;
    }
    for row in x.chunks_exact_mut(dim) {
        let sum: f64 = row.iter().map(|&v| f64::from(v * v)).sum();
        let mean = (sum / dim as f64) as f32;
        let scale = 1.0 / (mean + spec.eps).sqrt();
        match (spec.scale, weight) {
            (NormScale::Plain, Some(w)) => {
                for (v, &w) in row.iter_mut().zip(w) {
                    *v = (*v * scale) * w;
                }
            }
            (NormScale::Centered, Some(w)) => {
                for (v, &w) in row.iter_mut().zip(w) {
                    *v = (*v * scale) * (1.0 + w);
                }
            }
            _ => row.iter_mut().for_each(|v| *v *= scale),
        }
    }
}

/// `c · tanh(x / c)` as ggml's scale, tanh, scale.
pub(crate) fn softcap(x: &mut [f32], cap: f32) {
    let inv = 1.0 / cap;
    for v in x {
        *v = (*v * inv).tanh() * cap;
    }
}

/// Whether [`rope`] reproduces ggml for `table`'s scaling: plain and
/// linear ropes. Other scalings (YaRN, Llama 3, proportional) keep the
/// exact angles of the table.
pub(crate) fn rope_supported(table: &RopeTable) -> bool {
    matches!(
        table.spec.scaling,
        RopeScaling::None | RopeScaling::Linear { .. }
    ) && table.attention_factor == 1.0
}

/// Rotates `x` (`[tokens, heads, head_dim]`) in place with ggml's angles;
/// `trig` holds at least `2 · table.pairs()` floats. Only for tables that
/// [`rope_supported`] accepts.
pub(crate) fn rope(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    first_pos: usize,
    table: &RopeTable,
    trig: &mut [f32],
) {
    let pairs = table.pairs();
    let theta_scale = table.spec.theta.powf(-2.0 / table.rotary_dim as f32);
    let freq_scale = match table.spec.scaling {
        RopeScaling::Linear { factor } => 1.0 / factor,
        _ => 1.0,
    };
    let (cos, sin) = trig[..2 * pairs].split_at_mut(pairs);
    for (t, token) in x.chunks_exact_mut(n_heads * head_dim).enumerate() {
        let mut theta = (first_pos + t) as f32;
        for i in 0..pairs {
            let angle = freq_scale * theta;
            (cos[i], sin[i]) = (angle.cos(), angle.sin());
            theta *= theta_scale;
        }
        for head in token.chunks_exact_mut(head_dim) {
            for i in 0..pairs {
                let (a, b) = match table.kind {
                    RopeKind::Neox => (i, i + pairs),
                    RopeKind::Interleaved => (2 * i, 2 * i + 1),
                };
                let (x0, x1) = (head[a], head[b]);
                // GCC contracts ggml's `x0·cos − x1·sin` and `x0·sin + x1·cos`
                // into one fused multiply-add each, rounding the product
                // with x1 first.
                head[a] = x0.mul_add(cos[i], -(x1 * sin[i]));
                head[b] = x0.mul_add(sin[i], x1 * cos[i]);
            }
        }
    }
}

/// `_mm512_reduce_add_ps` as GCC's header defines it: halves added
/// pairwise (lanes `i` and `i + 8`, then `i + 4`, then `i + 2`, then `i + 1`).
pub(crate) fn reduce_add_16(v: &[f32; 16]) -> f32 {
    let mut t = [0f32; 8];
    for i in 0..8 {
        t[i] = v[i + 8] + v[i];
    }
    let t6 = [t[4] + t[0], t[5] + t[1], t[6] + t[2], t[7] + t[3]];
    let t8 = [t6[0] + t6[2], t6[1] + t6[3]];
    t8[0] + t8[1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_expf_is_within_two_ulp_of_expf() {
        let mut worst = 0i64;
        let mut x = -100.0f32;
        while x < 88.0 {
            let (got, want) = (v_expf(x), x.exp());
            if want.is_normal() {
                worst = worst.max((got.to_bits() as i64 - want.to_bits() as i64).abs());
            }
            x += 0.0137;
        }
        assert!(worst <= 2, "worst {worst} ulp");
        assert_eq!(v_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(v_expf(0.0), 1.0);
        assert_eq!(v_expf(200.0), f32::INFINITY);
    }

    #[test]
    fn gelu_table_values_are_f16() {
        for x in [-3.0f32, -0.5, 0.1234, 1.0, 7.5] {
            let g = gelu_table(x);
            assert_eq!(f16::from_f32(g).to_f32(), g);
            assert!((g - gelu_f32(x)).abs() <= 2e-3 * gelu_f32(x).abs() + 1e-4);
        }
        assert_eq!(gelu_table(-12.0), 0.0);
        assert_eq!(gelu_table(12.0), 12.0);
    }

    #[test]
    fn reduce_add_16_sums() {
        let v: [f32; 16] = std::array::from_fn(|i| i as f32);
        assert_eq!(reduce_add_16(&v), 120.0);
    }
}
