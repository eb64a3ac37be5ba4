//! Scalar reference kernels for every [`QuantFormat`]: dequantize a row, dot
//! a row with an f32 vector, and quantize f32 to Q8_0 and MXFP4.
//!
//! Normative reference: ggml's block structs (llama.cpp `ggml/src/ggml-common.h`)
//! and its `dequantize_row_*` / `quantize_row_*_ref` (`ggml/src/ggml-quants.c`).
//! The tests compare bit for bit against an independent implementation,
//! `gguf.quants` of the `gguf` Python package 0.19.0 (fixtures written by
//! `scripts/fixtures/make_quant_fixtures.py`).
//!
//! A row of `n` elements is `n / block_elems` blocks stored back to back.
//! Per block (`d`, `dmin`, `m` are little-endian f16 unless noted; `q` is the
//! integer code of an element):
//!
//! ```text
//! f32 / f16 / bf16   w = x  (bf16: the f32 whose high 16 bits are the value)
//! Q8_0  [d, qs: i8 x32]                w_j = qs_j · d
//! Q4_0  [d, qs: 16 B]                  w_j = (q_j − 8) · d
//! Q4_1  [d, m, qs: 16 B]               w_j = q_j · d + m
//! Q5_0  [d, qh: u32, qs: 16 B]         w_j = (q_j − 16) · d,  q_j = nibble_j | (bit j of qh) << 4
//! Q5_1  [d, m, qh: u32, qs: 16 B]      w_j = q_j · d + m
//!   nibble_j: low nibble of qs[j] for j < 16, high nibble of qs[j − 16] otherwise
//! Q4_K  [d, dmin, scales: 12 B, qs: 128 B]            256 = 8 sub-blocks s of 32
//! Q5_K  [d, dmin, scales: 12 B, qh: 32 B, qs: 128 B]  w = (d · sc_s) · q − (dmin · m_s)
//!   sc_s, m_s: 6-bit values packed as in ggml's get_scale_min_k4
//!   q (element l of sub-block s): nibble of qs[32·(s/2) + l], low for even s
//!   (Q5_K adds (bit s of qh[l]) << 4)
//! Q6_K  [ql: 128 B, qh: 64 B, scales: i8 x16, d]      256 = 16 sub-blocks of 16
//!                                      w_i = (d · scales[i/16]) · (q_i − 32)
//! MXFP4 [e: u8, qs: 16 B]              w_j = kvalues[nibble_j] · 2^(e − 128)
//!   kvalues = {0, 1, 2, 3, 4, 6, 8, 12, 0, −1, −2, −3, −4, −6, −8, −12}: the
//!   E2M1 values doubled, so the scale is the E8M0 value 2^(e − 127) halved.
//! ```
//!
//! Every product is evaluated in f32 in the order written, without fused
//! multiply-add, which is what makes [`dequantize_row`] equal to ggml's and
//! gguf-py's output bit for bit.
//!
//! [`dot_row`] computes `Σ w_i · x_i` from the packed bytes, the way an
//! optimised kernel does: per (sub-)block it sums `q · x` (and `x` for the
//! formats with a min) in f32, applies the block's scales in f32, and
//! accumulates the blocks in f64. It therefore agrees with the dot of the
//! dequantized row to rounding, not bit for bit.

mod float;
mod kquants;
mod legacy;
mod mxfp4;

use crate::QuantFormat;

/// Why a quantized row could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The element count is not a whole number of blocks.
    #[error("{format}: a row of {elements} elements is not a whole number of {block_elems}-element blocks")]
    PartialBlock {
        format: QuantFormat,
        elements: usize,
        block_elems: usize,
    },
    /// The byte buffer does not hold exactly the row's blocks.
    #[error(
        "{format}: {elements} elements take {expected_bytes} bytes, but the buffer has {got_bytes}"
    )]
    LengthMismatch {
        format: QuantFormat,
        elements: usize,
        expected_bytes: usize,
        got_bytes: usize,
    },
    /// The row's byte length does not fit in `usize`.
    #[error("{format}: a row of {elements} elements is too large to address")]
    RowTooLarge {
        format: QuantFormat,
        elements: usize,
    },
}

/// Byte length of a row of `elements` elements of `format`.
pub fn row_bytes(format: QuantFormat, elements: usize) -> Result<usize, QuantError> {
    let block_elems = format.block_elems();
    let partial_elems = elements % block_elems;
    if partial_elems != 0 {
        return Err(QuantError::PartialBlock {
            format,
            elements,
            block_elems,
        });
    }
    (elements / block_elems)
        .checked_mul(format.block_bytes())
        .ok_or(QuantError::RowTooLarge { format, elements })
}

/// Checks that `got_bytes` is exactly the length of `elements` elements.
fn check_row(format: QuantFormat, elements: usize, got_bytes: usize) -> Result<(), QuantError> {
    let expected_bytes = row_bytes(format, elements)?;
    if expected_bytes != got_bytes {
        return Err(QuantError::LengthMismatch {
            format,
            elements,
            expected_bytes,
            got_bytes,
        });
    }
    Ok(())
}

/// Dequantize one row: `bytes` holds exactly `out.len()` elements of `fmt`.
pub fn dequantize_row(fmt: QuantFormat, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    check_row(fmt, out.len(), bytes.len())?;
    match fmt {
        QuantFormat::F32 => float::dequantize_f32(bytes, out),
        QuantFormat::F16 => float::dequantize_f16(bytes, out),
        QuantFormat::Bf16 => float::dequantize_bf16(bytes, out),
        QuantFormat::Q8_0 => legacy::dequantize_q8_0(bytes, out),
        QuantFormat::Q4_0 => legacy::dequantize_q4_0(bytes, out),
        QuantFormat::Q4_1 => legacy::dequantize_q4_1(bytes, out),
        QuantFormat::Q5_0 => legacy::dequantize_q5_0(bytes, out),
        QuantFormat::Q5_1 => legacy::dequantize_q5_1(bytes, out),
        QuantFormat::Q4K => kquants::dequantize_q4_k(bytes, out),
        QuantFormat::Q5K => kquants::dequantize_q5_k(bytes, out),
        QuantFormat::Q6K => kquants::dequantize_q6_k(bytes, out),
        QuantFormat::Mxfp4 => mxfp4::dequantize(bytes, out),
    }
    Ok(())
}

/// Reference dot product of one quantized row with an f32 vector: `bytes`
/// holds exactly `x.len()` elements of `fmt`.
pub fn dot_row(fmt: QuantFormat, bytes: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    check_row(fmt, x.len(), bytes.len())?;
    let dot = match fmt {
        QuantFormat::F32 => float::dot_f32(bytes, x),
        QuantFormat::F16 => float::dot_f16(bytes, x),
        QuantFormat::Bf16 => float::dot_bf16(bytes, x),
        QuantFormat::Q8_0 => legacy::dot_q8_0(bytes, x),
        QuantFormat::Q4_0 => legacy::dot_q4_0(bytes, x),
        QuantFormat::Q4_1 => legacy::dot_q4_1(bytes, x),
        QuantFormat::Q5_0 => legacy::dot_q5_0(bytes, x),
        QuantFormat::Q5_1 => legacy::dot_q5_1(bytes, x),
        QuantFormat::Q4K => kquants::dot_q4_k(bytes, x),
        QuantFormat::Q5K => kquants::dot_q5_k(bytes, x),
        QuantFormat::Q6K => kquants::dot_q6_k(bytes, x),
        QuantFormat::Mxfp4 => mxfp4::dot(bytes, x),
    };
    Ok(dot as f32)
}

/// Quantize one row to Q8_0, as ggml's `quantize_row_q8_0_ref` (and gguf-py)
/// do: `out` must be exactly the Q8_0 length of `x`.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    check_row(QuantFormat::Q8_0, x.len(), out.len())?;
    legacy::quantize_q8_0(x, out);
    Ok(())
}

/// Quantize one row to MXFP4, as ggml's `quantize_row_mxfp4_ref` (and
/// gguf-py) do: `out` must be exactly the MXFP4 length of `x`.
pub fn quantize_row_mxfp4(x: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    check_row(QuantFormat::Mxfp4, x.len(), out.len())?;
    mxfp4::quantize(x, out);
    Ok(())
}

/// The little-endian f16 at `at`, widened to f32 (exact).
fn read_f16(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Code `j` of a 32-element block whose 16 bytes `qs` hold element `j` in
/// the low nibble of byte `j` and element `j + 16` in the high nibble
/// (Q4_0, Q4_1, Q5_0, Q5_1, MXFP4).
fn split_nibble(qs: &[u8], j: usize) -> u8 {
    if j < 16 {
        qs[j] & 0x0F
    } else {
        qs[j - 16] >> 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_rows_are_valid() {
        for f in QuantFormat::ALL {
            let mut out: [f32; 0] = [];
            assert_eq!(dequantize_row(f, &[], &mut out), Ok(()));
            assert_eq!(dot_row(f, &[], &[]), Ok(0.0));
        }
    }

    #[test]
    fn row_bytes_matches_dtype_bytes_for() {
        for f in QuantFormat::ALL {
            for n in [0usize, 1, 31, 32, 256, 512, 1000] {
                assert_eq!(
                    row_bytes(f, n).ok(),
                    f.bytes_for(n as u64).map(|b| b as usize),
                    "{f} n={n}"
                );
            }
        }
    }

    #[test]
    fn oversized_row_is_an_error() {
        let n = usize::MAX / 32 * 32;
        assert_eq!(
            row_bytes(QuantFormat::Q8_0, n),
            Err(QuantError::RowTooLarge {
                format: QuantFormat::Q8_0,
                elements: n
            })
        );
    }
}
