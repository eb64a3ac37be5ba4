//! ggml's activation quantizers: the `vec_dot_type` rows that
//! `ggml_compute_forward_mul_mat` builds from f32 activations before an
//! integer dot product. Normative: `quantize_row_q8_0_ref`,
//! `quantize_row_q8_1_ref` and `quantize_row_q8_K_ref` in llama.cpp's
//! `ggml/src/ggml-quants.c`, and the x86 versions llama.cpp actually runs
//! on x86-64 (`quantize_row_q8_0`, `quantize_row_q8_1` in
//! `ggml-cpu/arch/x86/quants.c`, `ggml_quantize_mat_q8_K_4x8` in
//! `ggml-cpu/arch/x86/repack.cpp`).
//!
//! Per block of 32 (Q8_0, Q8_1) or 256 (Q8_K) values `x`:
//!
//! ```text
//! Q8_0  reference: amax = max |x|, d = amax / 127, id = d ? 1/d : 0
//!                  q_j = roundf(x_j · id)      (half away from zero)
//!       x86:       id = amax ? 127/amax : 0,  q_j = round-half-even(x_j · id)
//!       d stored as f16
//! Q8_1  as Q8_0, plus s = f16(d · Σ q_j)   (d the f32 value, not the f16)
//! Q8_K  max = the first x_j of largest |x_j|, iscale = −127 / max
//!       q_j = min(127, nearest_int(iscale · x_j))   (half to even)
//!       d = 1 / iscale (f32), bsums[k] = Σ of the 16 codes of group k
//!       (an all-zero block gets d = 0 and zero codes); the x86 4-row
//!       variant takes iscale = −127/amax when +amax occurs, else 127/amax
//! ```
//!
//! The matmul of [`Numerics::LlamaCpp`](turbospark_backend::Numerics)
//! uses the x86 versions; the reference ones differ only where `x · id`
//! lands within an ulp of a rounding tie.
//!
//! Scales are kept widened to f32 (`d`, `s` of [`BlockQ8`] hold f16 values
//! exactly); [`BlockQ8::q8_0_bytes`] and friends give ggml's byte layout.
//! NaN inputs give unspecified codes.

use half::f16;

/// Elements per Q8_0 / Q8_1 block.
pub const QK8: usize = 32;
/// Elements per Q8_K block.
pub const QK_K: usize = 256;

/// 32 activations quantized to 8 bits: ggml's `block_q8_0`, or
/// `block_q8_1` when [`BlockQ8::s`] is used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8 {
    /// The scale, an f16 value widened to f32.
    pub d: f32,
    /// Q8_1: `d · Σ qs` rounded to f16, widened (0 in a Q8_0 block).
    pub s: f32,
    pub qs: [i8; QK8],
}

impl BlockQ8 {
    pub const ZERO: BlockQ8 = BlockQ8 {
        d: 0.0,
        s: 0.0,
        qs: [0; QK8],
    };

    /// ggml's 34-byte `block_q8_0`: `d` (f16), `qs`.
    pub fn q8_0_bytes(&self) -> [u8; 34] {
        let mut b = [0u8; 34];
        b[..2].copy_from_slice(&f16::from_f32(self.d).to_le_bytes());
        for (o, &q) in b[2..].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
        b
    }

    /// ggml's 36-byte `block_q8_1`: `d`, `s` (f16), `qs`.
    pub fn q8_1_bytes(&self) -> [u8; 36] {
        let mut b = [0u8; 36];
        b[..2].copy_from_slice(&f16::from_f32(self.d).to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(self.s).to_le_bytes());
        for (o, &q) in b[4..].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
        b
    }
}

/// 256 activations quantized to 8 bits with an f32 scale and the sums of
/// each 16 codes: ggml's `block_q8_K`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

impl BlockQ8K {
    pub const ZERO: BlockQ8K = BlockQ8K {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; QK_K / 16],
    };

    /// ggml's 292-byte `block_q8_K`: `d` (f32), `qs`, `bsums` (i16).
    pub fn bytes(&self) -> [u8; 292] {
        let mut b = [0u8; 292];
        b[..4].copy_from_slice(&self.d.to_le_bytes());
        for (o, &q) in b[4..260].iter_mut().zip(&self.qs) {
            *o = q as u8;
        }
        for (o, s) in b[260..].chunks_exact_mut(2).zip(&self.bsums) {
            o.copy_from_slice(&s.to_le_bytes());
        }
        b
    }
}

/// `MAX(a, b)` of ggml (`a > b ? a : b`).
fn ggml_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// `max |x|` of a block.
fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| ggml_max(m, v.abs()))
}

/// `quantize_row_q8_0` of ggml's x86 build (AVX2 / AVX-512), which differs
/// from the reference formula in two roundings: the reciprocal scale is
/// `127 / amax` rather than `1 / (amax / 127)`, and codes round half to
/// even. `x.len()` must be `QK8 · y.len()`.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8]) {
    debug_assert_eq!(x.len(), y.len() * QK8);
    for (x, b) in x.chunks_exact(QK8).zip(y) {
        let amax = amax(x);
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        b.d = f16::from_f32(amax / 127.0).to_f32();
        b.s = 0.0;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = (v * id).round_ties_even() as i8;
        }
    }
}

/// `quantize_row_q8_1` of ggml's x86 build: as [`quantize_row_q8_0`], plus
/// `s = f16(d · Σ q)` with the f32 `d`.
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8]) {
    debug_assert_eq!(x.len(), y.len() * QK8);
    for (x, b) in x.chunks_exact(QK8).zip(y) {
        let amax = amax(x);
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        b.d = f16::from_f32(d).to_f32();
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = (v * id).round_ties_even() as i8;
            sum += i32::from(*q);
        }
        b.s = f16::from_f32(d * sum as f32).to_f32();
    }
}

/// The reference `quantize_row_q8_0_ref` (what ggml builds without SIMD
/// run): `id = 1 / d`, codes rounded half away from zero.
pub fn quantize_row_q8_0_ref(x: &[f32], y: &mut [BlockQ8]) {
    debug_assert_eq!(x.len(), y.len() * QK8);
    for (x, b) in x.chunks_exact(QK8).zip(y) {
        let d = amax(x) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d).to_f32();
        b.s = 0.0;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            // |v · id| ≤ 127 up to rounding, so the saturating cast is exact.
            *q = (v * id).round() as i8;
        }
    }
}

/// The reference `quantize_row_q8_1_ref`.
pub fn quantize_row_q8_1_ref(x: &[f32], y: &mut [BlockQ8]) {
    debug_assert_eq!(x.len(), y.len() * QK8);
    for (x, b) in x.chunks_exact(QK8).zip(y) {
        let d = amax(x) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d).to_f32();
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
            sum += i32::from(*q);
        }
        b.s = f16::from_f32(sum as f32 * d).to_f32();
    }
}

/// Codes and group sums of a Q8_K block for the reciprocal scale `iscale`.
fn q8_k_codes(x: &[f32], iscale: f32, b: &mut BlockQ8K) {
    for (q, &v) in b.qs.iter_mut().zip(x) {
        // ggml's nearest_int: round half to even (|iscale · v| ≤ 127.5).
        *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
    }
    for (s, group) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
        *s = group.iter().map(|&q| i16::from(q)).sum();
    }
    b.d = 1.0 / iscale;
}

/// `quantize_row_q8_K_ref`, which the x86 build also runs for `vec_dot`
/// and gemv rows: `x.len()` must be `QK_K · y.len()`.
pub fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    debug_assert_eq!(x.len(), y.len() * QK_K);
    for (x, b) in x.chunks_exact(QK_K).zip(y) {
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *b = BlockQ8K::ZERO;
            continue;
        }
        q8_k_codes(x, -127.0 / max, b);
    }
}

/// `ggml_quantize_mat_q8_K_4x8` (x86) for one row, what llama.cpp feeds the
/// repacked Q4_K gemm: as [`quantize_row_q8_k`] except that the sign of
/// the scale follows whether `+amax` occurs in the block (the reference
/// takes the first element of largest magnitude).
pub fn quantize_row_q8_k_gemm(x: &[f32], y: &mut [BlockQ8K]) {
    debug_assert_eq!(x.len(), y.len() * QK_K);
    for (x, b) in x.chunks_exact(QK_K).zip(y) {
        let amax = amax(x);
        if amax == 0.0 {
            *b = BlockQ8K::ZERO;
            continue;
        }
        let iscale = if x.contains(&amax) {
            -127.0 / amax
        } else {
            127.0 / amax
        };
        q8_k_codes(x, iscale, b);
    }
}

/// `x` rounded to f16 (nearest, ties to even) and widened back, as ggml's
/// `GGML_CPU_FP32_TO_FP16` then `GGML_CPU_FP16_TO_FP32`.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// `x` rounded to bf16 (nearest, ties to even) and widened back, as ggml's
/// `GGML_FP32_TO_BF16` then `GGML_BF16_TO_FP32`.
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_blocks_quantize_to_zero() {
        let mut q8 = [BlockQ8::ZERO; 1];
        quantize_row_q8_1(&[0.0; 32], &mut q8);
        assert_eq!(q8[0], BlockQ8::ZERO);
        let mut k = [BlockQ8K::ZERO; 1];
        quantize_row_q8_k(&[0.0; 256], &mut k);
        assert_eq!(k[0], BlockQ8K::ZERO);
    }

    #[test]
    fn the_largest_magnitude_maps_to_127() {
        let mut x = [0.25f32; 256];
        x[3] = -2.0;
        let mut k = [BlockQ8K::ZERO; 1];
        quantize_row_q8_k(&x, &mut k);
        // iscale = −127 / max = 63.5 keeps the sign: −2 ↦ −127.
        assert_eq!(k[0].qs[3], -127);
        assert_eq!(k[0].d, 2.0 / 127.0);
        let mut q8 = [BlockQ8::ZERO; 1];
        quantize_row_q8_0(&x[..32], &mut q8);
        assert_eq!(q8[0].qs[3], -127);
    }
}
