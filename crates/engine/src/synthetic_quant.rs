//! Encoders of f32 values into every [`QuantFormat`], for synthetic weights
//! that must be stored exactly as a given install stores them
//! ([`crate::synthetic_like`]).
//!
//! Q8_0 and MXFP4 use the reference quantizers of `turbospark_core::quant`
//! (ggml's `quantize_row_*_ref`). The other block formats are written by
//! plain round-to-nearest quantizers of the block layouts decoded by
//! `turbospark_core::quant::dequantize_row` (ggml's `block_*` structs):
//!
//! ```text
//! Q4_0 / Q5_0   d = v / -8 (/ -16), v the element of largest |x|;  q = round(x / d) + 8 (+ 16)
//! Q4_1 / Q5_1   d = (max − min) / 15 (/ 31), m = min;               q = round((x − m) / d)
//! Q4_K / Q5_K   per 32-element sub-block s: lo_s = min(0, min x), step_s = (max x − lo_s) / 15 (/ 31);
//!               d = max step_s / 63, dmin = max(−lo_s) / 63 (f16); sc_s = round(step_s / d),
//!               m_s = round(−lo_s / dmin) (6 bits);  q = round((x + dmin · m_s) / (d · sc_s))
//! Q6_K          per 16-element sub-block s: step_s = max|x| / 31; d = max step_s / 127 (f16);
//!               sc_s = round(step_s / d) (i8);  q = round(x / (d · sc_s)) + 32
//! ```
//!
//! Codes are clamped to their range, so every value decodes to a finite
//! number within the block's range; these are not ggml's error-minimising
//! searches (`make_qkx2_quants`), which random weights do not need. The
//! tests decode every format with `dequantize_row` and compare.

use crate::EngineError;
use half::f16;
use turbospark_core::quant::{quantize_row_mxfp4, quantize_row_q8_0, row_bytes, QuantError};
use turbospark_core::QuantFormat;

/// Elements of a K-quant super-block.
const QK_K: usize = 256;

fn quant_error(name: &str, source: QuantError) -> EngineError {
    EngineError::Backend(turbospark_backend::BackendError::Quant {
        name: name.to_string(),
        source,
    })
}

/// Encodes `values`, rows of `row_len` elements, as `format`. A row must be
/// whole blocks of the format (an error naming `name` otherwise).
pub fn encode_rows(
    name: &str,
    values: &[f32],
    row_len: usize,
    format: QuantFormat,
) -> Result<Vec<u8>, EngineError> {
    if values.is_empty() {
        return Ok(Vec::new());
    }
    let rb = row_bytes(format, row_len).map_err(|e| quant_error(name, e))?;
    if row_len == 0 || values.len() % row_len != 0 {
        return Err(EngineError::BadOptions {
            detail: format!(
                "{name}: {} values are not whole rows of {row_len}",
                values.len()
            ),
        });
    }
    let mut out = vec![0u8; values.len() / row_len * rb];
    for (row, dst) in values.chunks_exact(row_len).zip(out.chunks_exact_mut(rb)) {
        encode_row(row, dst, format).map_err(|e| quant_error(name, e))?;
    }
    Ok(out)
}

/// One row of whole blocks into `out`, exactly its encoded length.
fn encode_row(x: &[f32], out: &mut [u8], format: QuantFormat) -> Result<(), QuantError> {
    let block: fn(&[f32], &mut [u8]) = match format {
        QuantFormat::Q8_0 => return quantize_row_q8_0(x, out),
        QuantFormat::Mxfp4 => return quantize_row_mxfp4(x, out),
        QuantFormat::F32 => |x, o| o.copy_from_slice(&x[0].to_le_bytes()),
        QuantFormat::F16 => |x, o| o.copy_from_slice(&f16::from_f32(x[0]).to_le_bytes()),
        QuantFormat::Bf16 => |x, o| o.copy_from_slice(&half::bf16::from_f32(x[0]).to_le_bytes()),
        QuantFormat::Q4_0 => |x, o| symmetric_block(x, o, 4),
        QuantFormat::Q5_0 => |x, o| symmetric_block(x, o, 5),
        QuantFormat::Q4_1 => |x, o| affine_block(x, o, 4),
        QuantFormat::Q5_1 => |x, o| affine_block(x, o, 5),
        QuantFormat::Q4K => |x, o| affine_k_block(x, o, 4),
        QuantFormat::Q5K => |x, o| affine_k_block(x, o, 5),
        QuantFormat::Q6K => q6_k_block,
    };
    for (x, o) in x
        .chunks_exact(format.block_elems())
        .zip(out.chunks_exact_mut(format.block_bytes()))
    {
        block(x, o);
    }
    Ok(())
}

fn put_f16(out: &mut [u8], at: usize, v: f32) -> f32 {
    let h = f16::from_f32(v);
    out[at..at + 2].copy_from_slice(&h.to_le_bytes());
    h.to_f32()
}

/// `round(v / step)` clamped to `0..=max` (0 for a zero step).
fn code(v: f32, step: f32, max: i32) -> u8 {
    if step == 0.0 {
        return 0;
    }
    ((v / step).round() as i32).clamp(0, max) as u8
}

/// Stores 32 codes of `bits` (4 or 5) bits: element `j` in the low nibble
/// of `qs[j]` and element `j + 16` in the high one; the fifth bits in the
/// little-endian u32 `qh` (bit `j` for element `j`).
fn pack_32(codes: &[u8; 32], bits: u32, qh: Option<&mut [u8]>, qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = (codes[j] & 0x0F) | ((codes[j + 16] & 0x0F) << 4);
    }
    if let (5, Some(qh)) = (bits, qh) {
        let mut h = 0u32;
        for (j, &c) in codes.iter().enumerate() {
            h |= u32::from(c >> 4) << j;
        }
        qh.copy_from_slice(&h.to_le_bytes());
    }
}

/// Q4_0 / Q5_0: `[d, (qh,) qs]`, `w = (q − 2^(bits−1)) · d`.
fn symmetric_block(x: &[f32], out: &mut [u8], bits: u32) {
    let half_range = 1i32 << (bits - 1);
    let extreme = x
        .iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = put_f16(out, 0, extreme / -(half_range as f32));
    let mut codes = [0u8; 32];
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = if d == 0.0 {
            half_range as u8
        } else {
            ((v / d).round() as i32 + half_range).clamp(0, 2 * half_range - 1) as u8
        };
    }
    let (head, qs) = out.split_at_mut(if bits == 5 { 6 } else { 2 });
    pack_32(&codes, bits, Some(&mut head[2..]), qs);
}

/// Q4_1 / Q5_1: `[d, m, (qh,) qs]`, `w = q · d + m`.
fn affine_block(x: &[f32], out: &mut [u8], bits: u32) {
    let max_code = (1i32 << bits) - 1;
    let lo = x.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d = put_f16(out, 0, (hi - lo) / max_code as f32);
    let m = put_f16(out, 2, lo);
    let mut codes = [0u8; 32];
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = code(v - m, d, max_code);
    }
    let (head, qs) = out.split_at_mut(if bits == 5 { 8 } else { 4 });
    pack_32(&codes, bits, Some(&mut head[4..]), qs);
}

/// Q4_K / Q5_K: `[d, dmin, scales: 12, (qh: 32,) qs: 128]`,
/// `w = (d · sc_s) · q − (dmin · m_s)` over 8 sub-blocks of 32.
fn affine_k_block(x: &[f32], out: &mut [u8], bits: u32) {
    let max_code = (1i32 << bits) - 1;
    let mut steps = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    for (s, sub) in x.chunks_exact(32).enumerate() {
        let lo = sub.iter().copied().fold(0.0f32, f32::min);
        let hi = sub.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        steps[s] = (hi - lo).max(0.0) / max_code as f32;
        mins[s] = -lo;
    }
    let d = put_f16(out, 0, steps.iter().copied().fold(0.0, f32::max) / 63.0);
    let dmin = put_f16(out, 2, mins.iter().copied().fold(0.0, f32::max) / 63.0);
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for s in 0..8 {
        sc[s] = code(steps[s], d, 63);
        mn[s] = code(mins[s], dmin, 63);
    }
    // The inverse of ggml's get_scale_min_k4.
    let scales = &mut out[4..16];
    for j in 0..4 {
        scales[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        scales[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        scales[j + 8] = (sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4);
    }
    let qs_at = if bits == 5 { 16 + QK_K / 8 } else { 16 };
    for (s, sub) in x.chunks_exact(32).enumerate() {
        let step = d * f32::from(sc[s]);
        let offset = dmin * f32::from(mn[s]);
        for (l, &v) in sub.iter().enumerate() {
            let q = code(v + offset, step, max_code);
            out[qs_at + 32 * (s / 2) + l] |= (q & 0x0F) << (4 * (s % 2));
            if bits == 5 {
                out[16 + l] |= (q >> 4) << s;
            }
        }
    }
}

/// Q6_K: `[ql: 128, qh: 64, scales: i8 × 16, d]`,
/// `w = (d · sc_s) · (q − 32)` over 16 sub-blocks of 16.
fn q6_k_block(x: &[f32], out: &mut [u8]) {
    const QH: usize = QK_K / 2;
    const SCALES: usize = QH + QK_K / 4;
    const D: usize = SCALES + QK_K / 16;
    let mut steps = [0.0f32; 16];
    for (s, sub) in x.chunks_exact(16).enumerate() {
        steps[s] = sub.iter().fold(0.0f32, |m, &v| m.max(v.abs())) / 31.0;
    }
    let d = put_f16(out, D, steps.iter().copied().fold(0.0, f32::max) / 127.0);
    for s in 0..16 {
        out[SCALES + s] = code(steps[s], d, 127);
    }
    for (i, &v) in x.iter().enumerate() {
        let step = d * f32::from(out[SCALES + i / 16]);
        let q = if step == 0.0 {
            32
        } else {
            ((v / step).round() as i32 + 32).clamp(0, 63) as u8
        };
        let (h, k, l) = (i / 128, (i % 128) / 32, i % 32);
        out[64 * h + 32 * (k % 2) + l] |= (q & 0x0F) << (4 * (k / 2));
        out[QH + 32 * h + l] |= (q >> 4) << (2 * k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::Rng;
    use turbospark_core::quant::dequantize_row;

    /// Random rows of 512 in `±amp` (with an offset block and a zero block),
    /// encoded and decoded by the core's reference dequantizer: every value
    /// within the format's step of its input.
    #[test]
    fn every_format_round_trips_through_the_reference_dequantizer() {
        let mut rng = Rng(7);
        let n = 512;
        for amp in [1.0f32, 0.03] {
            let mut x: Vec<f32> = (0..n)
                .map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp)
                .collect();
            // A block of all positive values (Q4_K's min clamped at 0) and a
            // block of zeros.
            x[256..288].iter_mut().for_each(|v| *v = v.abs() + amp);
            x[288..320].iter_mut().for_each(|v| *v = 0.0);
            for format in QuantFormat::ALL {
                let bytes = encode_rows("t", &x, n, format).unwrap();
                assert_eq!(bytes.len() as u64, format.bytes_for(n as u64).unwrap());
                let mut back = vec![0.0f32; n];
                dequantize_row(format, &bytes, &mut back).unwrap();
                // Largest step any format takes for a block spanning
                // [-2·amp, 2·amp]: Q4_K's 6-bit scales on top of 4-bit codes.
                let tol = match format {
                    QuantFormat::F32 => 0.0,
                    QuantFormat::F16 | QuantFormat::Bf16 => 2.0 * amp / 128.0,
                    QuantFormat::Mxfp4 => amp,
                    QuantFormat::Q8_0 => 2.0 * amp / 127.0,
                    _ => 2.0 * amp / 7.0,
                };
                for (i, (&a, &b)) in x.iter().zip(&back).enumerate() {
                    assert!(
                        b.is_finite() && (a - b).abs() <= tol,
                        "{format} amp {amp} [{i}]: {a} → {b} (tolerance {tol})"
                    );
                }
                assert!(back[288..320].iter().all(|&v| v == 0.0), "{format}: zeros");
            }
        }
    }

    #[test]
    fn a_row_of_partial_blocks_is_an_error() {
        let err = encode_rows("blk.0.x", &[0.0; 48], 48, QuantFormat::Q4K).unwrap_err();
        assert!(err.to_string().contains("blk.0.x"), "{err}");
    }
}
