//! ggml's 32-element block formats Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1
//! (`block_q8_0` ... `block_q5_1` in `ggml-common.h`; `dequantize_row_q*`
//! and `quantize_row_q8_0_ref` in `ggml-quants.c`).
//!
//! Symmetric formats (Q8_0, Q4_0, Q5_0): `w = c · d` with a signed code `c`.
//! Affine formats (Q4_1, Q5_1): `w = q · d + m` with an unsigned code `q`.
//! The two are kept apart because `c · d + 0` would turn `-0.0` into `+0.0`.

use super::{read_f16, split_nibble};

/// Elements per block.
const QK: usize = 32;

/// Block bytes: f16 scale (+ f16 min) (+ u32 high bits) + codes.
const Q8_0_BYTES: usize = 2 + QK;
const Q4_0_BYTES: usize = 2 + QK / 2;
const Q4_1_BYTES: usize = 4 + QK / 2;
const Q5_0_BYTES: usize = 6 + QK / 2;
const Q5_1_BYTES: usize = 8 + QK / 2;

/// Fifth bit of element `j` of a Q5 block: bit `j` of the little-endian u32
/// at `block[at..at + 4]`.
fn q5_high_bit(block: &[u8], at: usize, j: usize) -> u8 {
    let qh = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
    (((qh >> j) & 1) as u8) << 4
}

fn q8_0_code(block: &[u8], j: usize) -> i32 {
    i32::from(block[2 + j] as i8)
}

fn q4_0_code(block: &[u8], j: usize) -> i32 {
    i32::from(split_nibble(&block[2..], j)) - 8
}

fn q5_0_code(block: &[u8], j: usize) -> i32 {
    i32::from(split_nibble(&block[6..], j) | q5_high_bit(block, 2, j)) - 16
}

fn q4_1_code(block: &[u8], j: usize) -> u8 {
    split_nibble(&block[4..], j)
}

fn q5_1_code(block: &[u8], j: usize) -> u8 {
    split_nibble(&block[8..], j) | q5_high_bit(block, 4, j)
}

/// `w_j = c_j · d`, `d` the f16 at the start of the block.
fn dequantize_symmetric(
    bytes: &[u8],
    out: &mut [f32],
    block_bytes: usize,
    code: fn(&[u8], usize) -> i32,
) {
    for (block, out) in bytes
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = read_f16(block, 0);
        for (j, o) in out.iter_mut().enumerate() {
            *o = code(block, j) as f32 * d;
        }
    }
}

/// `Σ_blocks d · Σ_j c_j · x_j`.
fn dot_symmetric(
    bytes: &[u8],
    x: &[f32],
    block_bytes: usize,
    code: fn(&[u8], usize) -> i32,
) -> f64 {
    let mut acc = 0.0f64;
    for (block, x) in bytes.chunks_exact(block_bytes).zip(x.chunks_exact(QK)) {
        let d = read_f16(block, 0);
        let mut sum_cx = 0.0f32;
        for (j, &xj) in x.iter().enumerate() {
            sum_cx += code(block, j) as f32 * xj;
        }
        acc += f64::from(d * sum_cx);
    }
    acc
}

/// `w_j = q_j · d + m`, `d` and `m` the f16s at bytes 0 and 2.
fn dequantize_affine(
    bytes: &[u8],
    out: &mut [f32],
    block_bytes: usize,
    code: fn(&[u8], usize) -> u8,
) {
    for (block, out) in bytes
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(QK))
    {
        let d = read_f16(block, 0);
        let m = read_f16(block, 2);
        for (j, o) in out.iter_mut().enumerate() {
            *o = f32::from(code(block, j)) * d + m;
        }
    }
}

/// `Σ_blocks d · Σ_j q_j · x_j + m · Σ_j x_j`.
fn dot_affine(bytes: &[u8], x: &[f32], block_bytes: usize, code: fn(&[u8], usize) -> u8) -> f64 {
    let mut acc = 0.0f64;
    for (block, x) in bytes.chunks_exact(block_bytes).zip(x.chunks_exact(QK)) {
        let d = read_f16(block, 0);
        let m = read_f16(block, 2);
        let (mut sum_qx, mut sum_x) = (0.0f32, 0.0f32);
        for (j, &xj) in x.iter().enumerate() {
            sum_qx += f32::from(code(block, j)) * xj;
            sum_x += xj;
        }
        acc += f64::from(d * sum_qx) + f64::from(m * sum_x);
    }
    acc
}

pub(super) fn dequantize_q8_0(bytes: &[u8], out: &mut [f32]) {
    dequantize_symmetric(bytes, out, Q8_0_BYTES, q8_0_code);
}

pub(super) fn dequantize_q4_0(bytes: &[u8], out: &mut [f32]) {
    dequantize_symmetric(bytes, out, Q4_0_BYTES, q4_0_code);
}

pub(super) fn dequantize_q5_0(bytes: &[u8], out: &mut [f32]) {
    dequantize_symmetric(bytes, out, Q5_0_BYTES, q5_0_code);
}

pub(super) fn dequantize_q4_1(bytes: &[u8], out: &mut [f32]) {
    dequantize_affine(bytes, out, Q4_1_BYTES, q4_1_code);
}

pub(super) fn dequantize_q5_1(bytes: &[u8], out: &mut [f32]) {
    dequantize_affine(bytes, out, Q5_1_BYTES, q5_1_code);
}

pub(super) fn dot_q8_0(bytes: &[u8], x: &[f32]) -> f64 {
    dot_symmetric(bytes, x, Q8_0_BYTES, q8_0_code)
}

pub(super) fn dot_q4_0(bytes: &[u8], x: &[f32]) -> f64 {
    dot_symmetric(bytes, x, Q4_0_BYTES, q4_0_code)
}

pub(super) fn dot_q5_0(bytes: &[u8], x: &[f32]) -> f64 {
    dot_symmetric(bytes, x, Q5_0_BYTES, q5_0_code)
}

pub(super) fn dot_q4_1(bytes: &[u8], x: &[f32]) -> f64 {
    dot_affine(bytes, x, Q4_1_BYTES, q4_1_code)
}

pub(super) fn dot_q5_1(bytes: &[u8], x: &[f32]) -> f64 {
    dot_affine(bytes, x, Q5_1_BYTES, q5_1_code)
}

/// Q8_0 quantization, as `quantize_row_q8_0_ref`:
/// `d = max|x| / 127`, `q_j = round(x_j / d)` (half away from zero, via the
/// f32 reciprocal `1 / d`, 0 when `d = 0`), `d` stored as f16 (round to
/// nearest even). NaN inputs give unspecified codes.
pub(super) fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    for (x, block) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for (q, &xj) in block[2..].iter_mut().zip(x) {
            // |x_j · id| <= 127 up to rounding, so the saturating cast is exact.
            *q = ((xj * id).round() as i8) as u8;
        }
    }
}
