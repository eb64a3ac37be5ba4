//! Fast row dequantization, bit-identical to the scalar reference
//! `turbospark_core::quant::dequantize_row` (which follows ggml's
//! `dequantize_row_*`): the same f32 products in the same order, without
//! fused multiply-add, but decoded a block at a time with straight-line
//! nibble unpacking the compiler can vectorise, instead of a per-element
//! code lookup. The unit tests compare every format bit for bit against the
//! reference on random bytes.
//!
//! Block layouts and formulas: see the `turbospark_core::quant` module docs.

use turbospark_core::quant::{row_bytes, QuantError};
use turbospark_core::QuantFormat;

fn f16(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// ggml's `GGML_E8M0_TO_FP32_HALF`: `2^(e − 128)`, subnormal for `e < 2`.
pub(crate) fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits((u32::from(e) - 1) << 23)
    }
}

/// MXFP4 E2M1 values doubled, by 4-bit code.
pub(crate) const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// K-quant sub-block scale and min (ggml `get_scale_min_k4`).
pub(crate) fn scale_min_k4(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// Dequantizes one row: `bytes` holds exactly `out.len()` elements of `fmt`.
pub(crate) fn dequantize(
    fmt: QuantFormat,
    bytes: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let expected_bytes = row_bytes(fmt, out.len())?;
    if expected_bytes != bytes.len() {
        return Err(QuantError::LengthMismatch {
            format: fmt,
            elements: out.len(),
            expected_bytes,
            got_bytes: bytes.len(),
        });
    }
    let bb = fmt.block_bytes();
    let be = fmt.block_elems();
    let blocks = bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be));
    match fmt {
        QuantFormat::F32 => {
            for (b, o) in blocks {
                o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        QuantFormat::F16 => {
            for (b, o) in blocks {
                o[0] = f16(b, 0);
            }
        }
        QuantFormat::Bf16 => {
            for (b, o) in blocks {
                o[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
        QuantFormat::Q8_0 => {
            for (b, o) in blocks {
                let d = f16(b, 0);
                for (o, &q) in o.iter_mut().zip(&b[2..34]) {
                    *o = f32::from(q as i8) * d;
                }
            }
        }
        QuantFormat::Q4_0 => {
            for (b, o) in blocks {
                let d = f16(b, 0);
                let (lo, hi) = o.split_at_mut(16);
                for j in 0..16 {
                    let q = b[2 + j];
                    lo[j] = (i32::from(q & 0x0F) - 8) as f32 * d;
                    hi[j] = (i32::from(q >> 4) - 8) as f32 * d;
                }
            }
        }
        QuantFormat::Q4_1 => {
            for (b, o) in blocks {
                let (d, m) = (f16(b, 0), f16(b, 2));
                let (lo, hi) = o.split_at_mut(16);
                for j in 0..16 {
                    let q = b[4 + j];
                    lo[j] = f32::from(q & 0x0F) * d + m;
                    hi[j] = f32::from(q >> 4) * d + m;
                }
            }
        }
        QuantFormat::Q5_0 => {
            for (b, o) in blocks {
                let d = f16(b, 0);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let (lo, hi) = o.split_at_mut(16);
                for j in 0..16 {
                    let q = b[6 + j];
                    let h0 = (((qh >> j) & 1) << 4) as u8;
                    let h1 = (((qh >> (j + 16)) & 1) << 4) as u8;
                    lo[j] = (i32::from((q & 0x0F) | h0) - 16) as f32 * d;
                    hi[j] = (i32::from((q >> 4) | h1) - 16) as f32 * d;
                }
            }
        }
        QuantFormat::Q5_1 => {
            for (b, o) in blocks {
                let (d, m) = (f16(b, 0), f16(b, 2));
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                let (lo, hi) = o.split_at_mut(16);
                for j in 0..16 {
                    let q = b[8 + j];
                    let h0 = (((qh >> j) & 1) << 4) as u8;
                    let h1 = (((qh >> (j + 16)) & 1) << 4) as u8;
                    lo[j] = f32::from((q & 0x0F) | h0) * d + m;
                    hi[j] = f32::from((q >> 4) | h1) * d + m;
                }
            }
        }
        QuantFormat::Q4K | QuantFormat::Q5K => {
            let five = fmt == QuantFormat::Q5K;
            let qs_at = if five { 48 } else { 16 };
            for (b, o) in blocks {
                let (d, dmin) = (f16(b, 0), f16(b, 2));
                let scales = &b[4..16];
                for (s, o) in o.chunks_exact_mut(32).enumerate() {
                    let (sc, m) = scale_min_k4(scales, s);
                    let (d1, m1) = (d * f32::from(sc), dmin * f32::from(m));
                    let qs = &b[qs_at + 32 * (s / 2)..qs_at + 32 * (s / 2) + 32];
                    let shift = 4 * (s % 2);
                    if five {
                        let qh = &b[16..48];
                        for l in 0..32 {
                            let q = ((qs[l] >> shift) & 0x0F) | (((qh[l] >> s) & 1) << 4);
                            o[l] = d1 * f32::from(q) - m1;
                        }
                    } else {
                        for l in 0..32 {
                            o[l] = d1 * f32::from((qs[l] >> shift) & 0x0F) - m1;
                        }
                    }
                }
            }
        }
        QuantFormat::Q6K => {
            for (b, o) in blocks {
                let d = f16(b, 208);
                let mut scales = [0f32; 16];
                for (sc, &raw) in scales.iter_mut().zip(&b[192..208]) {
                    *sc = d * f32::from(raw as i8);
                }
                for h in 0..2 {
                    let ql = &b[64 * h..64 * h + 64];
                    let qh = &b[128 + 32 * h..128 + 32 * h + 32];
                    for k in 0..4 {
                        let base = 128 * h + 32 * k;
                        let low_src = &ql[32 * (k % 2)..32 * (k % 2) + 32];
                        for l in 0..32 {
                            let low = if k < 2 {
                                low_src[l] & 0x0F
                            } else {
                                low_src[l] >> 4
                            };
                            let high = (qh[l] >> (2 * k)) & 3;
                            let code = i32::from(low | (high << 4)) - 32;
                            o[base + l] = scales[(base + l) / 16] * code as f32;
                        }
                    }
                }
            }
        }
        QuantFormat::Mxfp4 => {
            for (b, o) in blocks {
                let d = e8m0_half(b[0]);
                let (lo, hi) = o.split_at_mut(16);
                for j in 0..16 {
                    let q = b[1 + j];
                    lo[j] = f32::from(KVALUES[usize::from(q & 0x0F)]) * d;
                    hi[j] = f32::from(KVALUES[usize::from(q >> 4)]) * d;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use turbospark_core::quant::dequantize_row;

    #[test]
    fn bit_identical_to_the_reference_on_random_bytes() {
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut byte = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        };
        for fmt in QuantFormat::ALL {
            let n = 512;
            let bytes: Vec<u8> = (0..row_bytes(fmt, n).unwrap()).map(|_| byte()).collect();
            let mut want = vec![0f32; n];
            let mut got = vec![0f32; n];
            dequantize_row(fmt, &bytes, &mut want).unwrap();
            dequantize(fmt, &bytes, &mut got).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{fmt} element {i}: {g} vs reference {w}"
                );
            }
        }
    }

    #[test]
    fn length_errors_match_the_reference() {
        let mut out = vec![0f32; 32];
        assert!(dequantize(QuantFormat::Q8_0, &[0; 33], &mut out).is_err());
        let mut odd = vec![0f32; 31];
        assert!(dequantize(QuantFormat::Q8_0, &[0; 34], &mut odd).is_err());
    }
}
