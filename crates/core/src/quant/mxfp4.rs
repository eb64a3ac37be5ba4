//! MXFP4 in ggml's `block_mxfp4` layout (`ggml-common.h`): one E8M0 byte
//! `e`, then 16 bytes holding 32 E2M1 codes (element `j` in the low nibble of
//! byte `j`, element `j + 16` in the high nibble). Reference:
//! `dequantize_row_mxfp4` / `quantize_row_mxfp4_ref` in `ggml-quants.c`,
//! `GGML_E8M0_TO_FP32_HALF` in `ggml-impl.h`.
//!
//! The OCP value of code `c` is `e2m1(c) · 2^(e − 127)`. ggml stores the
//! E2M1 magnitudes doubled (`KVALUES`, integers) and halves the scale,
//! `w = KVALUES[c] · 2^(e − 128)`: the same number, computed exactly in f32.

use super::split_nibble;

/// Elements per block.
const QK: usize = 32;
/// Block bytes: the exponent byte, then the 16 bytes of codes.
const BLOCK_BYTES: usize = 1 + QK / 2;

/// E2M1 values times two, indexed by the 4-bit code (sign in bit 3).
const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^(e − 128)` as f32, built from bits as `GGML_E8M0_TO_FP32_HALF` does:
/// subnormal for `e < 2`, normal otherwise. `e = 255` gives `2^127` (ggml
/// does not treat it as NaN).
fn e8m0_to_f32_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits((u32::from(e) - 1) << 23)
    }
}

pub(super) fn dequantize(bytes: &[u8], out: &mut [f32]) {
    for (block, out) in bytes
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = e8m0_to_f32_half(block[0]);
        for (j, o) in out.iter_mut().enumerate() {
            *o = f32::from(KVALUES[usize::from(split_nibble(&block[1..], j))]) * d;
        }
    }
}

/// `Σ_blocks 2^(e − 128) · Σ_j KVALUES[c_j] · x_j`.
pub(super) fn dot(bytes: &[u8], x: &[f32]) -> f64 {
    let mut acc = 0.0f64;
    for (block, x) in bytes.chunks_exact(BLOCK_BYTES).zip(x.chunks_exact(QK)) {
        let d = e8m0_to_f32_half(block[0]);
        let mut sum_kx = 0.0f32;
        for (j, &xj) in x.iter().enumerate() {
            sum_kx += f32::from(KVALUES[usize::from(split_nibble(&block[1..], j))]) * xj;
        }
        acc += f64::from(d * sum_kx);
    }
    acc
}

/// The exponent byte ggml picks for a block whose largest magnitude is
/// `amax`: `floorf(log2f(amax)) − 2 + 127`, or 0 for an all-zero block.
///
/// `log2f` matters here: for `amax` a few ulps below a power of two `2^k`
/// (k ≥ 3 or k ≤ −3) the correctly rounded f32 logarithm is exactly `k`, so
/// ggml (and numpy, which gguf-py uses) picks the exponent of `2^k`, not the
/// exact `floor(log2(amax)) = k − 1`. The f32 rounding of an f64 `log2` is
/// the correctly rounded f32 `log2` (the f64 error is far below half an f32
/// ulp), so this reproduces them without depending on the platform's
/// `log2f`. Blocks with `amax < 2^-125` would need a negative exponent; ggml
/// casts that to `uint8_t` (undefined in C), here it saturates to 0, the
/// smallest scale.
fn shared_exponent(amax: f32) -> u8 {
    if amax > 0.0 {
        let log2 = (f64::from(amax).log2() as f32).floor();
        // Saturating cast: negative (tiny amax) -> 0, infinite amax -> 255.
        (log2 - 2.0 + 127.0) as u8
    } else {
        0
    }
}

/// MXFP4 quantization, as `quantize_row_mxfp4_ref`: the scale comes from
/// [`shared_exponent`], and each element takes the code whose
/// `|d · KVALUES[c] − x|` is smallest, the lowest code on ties (so a
/// midpoint goes toward zero and `±0` to code 0). NaN inputs give
/// unspecified codes.
pub(super) fn quantize(x: &[f32], out: &mut [u8]) {
    for (x, block) in x.chunks_exact(QK).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let e = shared_exponent(amax);
        let d = e8m0_to_f32_half(e);
        let (exponent, qs) = block.split_at_mut(1);
        exponent[0] = e;
        qs.fill(0);
        for (j, &xj) in x.iter().enumerate() {
            let best = nearest_code(xj, d);
            if j < QK / 2 {
                qs[j] |= best;
            } else {
                qs[j - QK / 2] |= best << 4;
            }
        }
    }
}

/// The code `c` whose `|d · KVALUES[c] − x|` is smallest, the lowest on
/// ties: `best_index_mxfp4`'s scan of all 16 codes in order, over code 0
/// and the 7 nonzero codes of `x`'s sign only. A code of the other sign
/// (or code 8, zero) is never strictly nearer than code 0: with `d > 0`,
/// `d · k − x` then adds two values of one sign, whose rounded sum is at
/// least `|x|` in magnitude, code 0's distance. A NaN `x` gives code 0 (no
/// comparison holds), as the full scan does.
fn nearest_code(x: f32, d: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (d * f32::from(KVALUES[0]) - x).abs();
    let first = if x < 0.0 { 9 } else { 1 };
    for (c, &k) in KVALUES.iter().enumerate().skip(first).take(7) {
        let err = (d * f32::from(k) - x).abs();
        if err < best_err {
            best_err = err;
            best = c as u8;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `best_index_mxfp4` as ggml writes it: all 16 codes in order.
    fn nearest_code_scan(x: f32, d: f32) -> u8 {
        let mut best = 0u8;
        let mut best_err = (d * f32::from(KVALUES[0]) - x).abs();
        for (c, &k) in KVALUES.iter().enumerate().skip(1) {
            let err = (d * f32::from(k) - x).abs();
            if err < best_err {
                best_err = err;
                best = c as u8;
            }
        }
        best
    }

    #[test]
    fn the_half_scan_picks_the_full_scans_code() {
        // Every scale; inputs on a grid of sixteenths of the scale (every
        // code value and midpoint), a few ulps either side of each, and
        // their negatives; plus ±0, infinities and NaN.
        let mut checked = 0usize;
        for e in 0..=255u8 {
            let d = e8m0_to_f32_half(e);
            for m in -260i32..=260 {
                let x = d * m as f32 / 16.0;
                let mut near = vec![x, -x];
                let (mut up, mut down) = (x, x);
                for _ in 0..3 {
                    up = f32::from_bits(up.to_bits().wrapping_add(1));
                    down = f32::from_bits(down.to_bits().wrapping_sub(1));
                    near.extend([up, down]);
                }
                near.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
                for x in near {
                    assert_eq!(
                        nearest_code(x, d),
                        nearest_code_scan(x, d),
                        "x {x:e}, e {e}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 1_000_000);
    }

    #[test]
    fn half_scale_is_two_to_the_e_minus_128() {
        for e in 0..=255u8 {
            let expected = 2.0f64.powi(i32::from(e) - 128) as f32;
            assert_eq!(e8m0_to_f32_half(e), expected, "e = {e}");
        }
    }

    #[test]
    fn shared_exponent_follows_rounded_log2() {
        assert_eq!(shared_exponent(0.0), 0);
        assert_eq!(shared_exponent(4.0), 127);
        assert_eq!(shared_exponent(7.5), 127);
        // One ulp below 8: log2f rounds to 3.0, so the exponent of 8.
        assert_eq!(shared_exponent(8.0f32.next_down_compat()), 128);
        // One ulp below 2: log2f stays below 1.0.
        assert_eq!(shared_exponent(2.0f32.next_down_compat()), 125);
        assert_eq!(shared_exponent(1e-40), 0);
    }

    trait NextDown {
        fn next_down_compat(self) -> Self;
    }

    impl NextDown for f32 {
        /// The next smaller positive f32 (the workspace's minimum Rust
        /// predates `f32::next_down`).
        fn next_down_compat(self) -> f32 {
            f32::from_bits(self.to_bits() - 1)
        }
    }
}
