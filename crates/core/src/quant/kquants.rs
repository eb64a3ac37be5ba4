//! ggml's 256-element super-block formats Q4_K, Q5_K and Q6_K (`block_q4_K`,
//! `block_q5_K`, `block_q6_K` in `ggml-common.h`; `dequantize_row_q4_K`,
//! `_q5_K`, `_q6_K` and `get_scale_min_k4` in `ggml-quants.c`).
//!
//! Q4_K / Q5_K: 8 sub-blocks `s` of 32 with 6-bit scale `sc_s` and min `m_s`,
//! `w = (d · sc_s) · q − (dmin · m_s)`. Q6_K: 16 sub-blocks of 16 with int8
//! scales, `w = (d · sc_s) · (q − 32)`.

use super::read_f16;

/// Elements per super-block.
const QK_K: usize = 256;

const Q4_K_BYTES: usize = 4 + 12 + QK_K / 2;
const Q5_K_BYTES: usize = 4 + 12 + QK_K / 8 + QK_K / 2;
const Q6_K_BYTES: usize = QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;

/// Offsets inside a Q4_K / Q5_K block: d, dmin, then the packed scales.
const K_SCALES: usize = 4;
const Q4_K_QS: usize = 16;
const Q5_K_QH: usize = 16;
const Q5_K_QS: usize = 16 + QK_K / 8;

/// Offsets inside a Q6_K block.
const Q6_K_QH: usize = QK_K / 2;
const Q6_K_SCALES: usize = Q6_K_QH + QK_K / 4;
const Q6_K_D: usize = Q6_K_SCALES + QK_K / 16;

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes: the low
/// six bits of bytes 0..4 (scales) and 4..8 (mins) for `j < 4`; for `j >= 4`
/// a nibble of byte `j + 4` plus the top two bits of byte `j − 4` (scale) or
/// byte `j` (min).
fn scale_min_k4(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// Low four bits of element `l` of sub-block `s`: the 32 bytes at
/// `qs[32 · (s / 2)..]` hold sub-block `2k` in their low nibbles and `2k + 1`
/// in their high nibbles.
fn k_nibble(qs: &[u8], s: usize, l: usize) -> u8 {
    (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0F
}

fn q4_k_code(block: &[u8], s: usize, l: usize) -> u8 {
    k_nibble(&block[Q4_K_QS..], s, l)
}

/// Q5_K's fifth bit of element `l` of sub-block `s` is bit `s` of `qh[l]`.
fn q5_k_code(block: &[u8], s: usize, l: usize) -> u8 {
    let high = (block[Q5_K_QH + l] >> s) & 1;
    k_nibble(&block[Q5_K_QS..], s, l) | (high << 4)
}

/// `(d · sc_s, dmin · m_s)` for each of the 8 sub-blocks.
fn affine_k_scales(block: &[u8]) -> [(f32, f32); 8] {
    let d = read_f16(block, 0);
    let dmin = read_f16(block, 2);
    let scales = &block[K_SCALES..K_SCALES + 12];
    let mut out = [(0.0, 0.0); 8];
    for (s, o) in out.iter_mut().enumerate() {
        let (sc, m) = scale_min_k4(scales, s);
        *o = (d * f32::from(sc), dmin * f32::from(m));
    }
    out
}

fn dequantize_affine_k(
    bytes: &[u8],
    out: &mut [f32],
    block_bytes: usize,
    code: fn(&[u8], usize, usize) -> u8,
) {
    for (block, out) in bytes
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let scales = affine_k_scales(block);
        for (s, (out, &(d1, m1))) in out.chunks_exact_mut(32).zip(&scales).enumerate() {
            for (l, o) in out.iter_mut().enumerate() {
                *o = d1 * f32::from(code(block, s, l)) - m1;
            }
        }
    }
}

/// `Σ_s (d · sc_s) · Σ q x − (dmin · m_s) · Σ x`.
fn dot_affine_k(
    bytes: &[u8],
    x: &[f32],
    block_bytes: usize,
    code: fn(&[u8], usize, usize) -> u8,
) -> f64 {
    let mut acc = 0.0f64;
    for (block, x) in bytes.chunks_exact(block_bytes).zip(x.chunks_exact(QK_K)) {
        let scales = affine_k_scales(block);
        for (s, (x, &(d1, m1))) in x.chunks_exact(32).zip(&scales).enumerate() {
            let (mut sum_qx, mut sum_x) = (0.0f32, 0.0f32);
            for (l, &xl) in x.iter().enumerate() {
                sum_qx += f32::from(code(block, s, l)) * xl;
                sum_x += xl;
            }
            acc += f64::from(d1 * sum_qx) - f64::from(m1 * sum_x);
        }
    }
    acc
}

pub(super) fn dequantize_q4_k(bytes: &[u8], out: &mut [f32]) {
    dequantize_affine_k(bytes, out, Q4_K_BYTES, q4_k_code);
}

pub(super) fn dequantize_q5_k(bytes: &[u8], out: &mut [f32]) {
    dequantize_affine_k(bytes, out, Q5_K_BYTES, q5_k_code);
}

pub(super) fn dot_q4_k(bytes: &[u8], x: &[f32]) -> f64 {
    dot_affine_k(bytes, x, Q4_K_BYTES, q4_k_code)
}

pub(super) fn dot_q5_k(bytes: &[u8], x: &[f32]) -> f64 {
    dot_affine_k(bytes, x, Q5_K_BYTES, q5_k_code)
}

/// Signed code of element `i` (0..256) of a Q6_K block. Each half `h` of 128
/// elements is four quarters `k` of 32: the low four bits are the low (`k`
/// = 0, 1) or high (`k` = 2, 3) nibble of `ql[64h + 32·(k % 2) + l]`, the top
/// two bits are bits `2k..2k+2` of `qh[32h + l]`.
fn q6_k_code(block: &[u8], i: usize) -> i32 {
    let (h, k, l) = (i / 128, (i % 128) / 32, i % 32);
    let ql = block[64 * h + 32 * (k % 2) + l];
    let low = if k < 2 { ql & 0x0F } else { ql >> 4 };
    let high = (block[Q6_K_QH + 32 * h + l] >> (2 * k)) & 3;
    i32::from(low | (high << 4)) - 32
}

/// `d · sc_s` for each of the 16 sub-blocks.
fn q6_k_scales(block: &[u8]) -> [f32; 16] {
    let d = read_f16(block, Q6_K_D);
    let mut out = [0.0; 16];
    for (o, &sc) in out.iter_mut().zip(&block[Q6_K_SCALES..Q6_K_D]) {
        *o = d * f32::from(sc as i8);
    }
    out
}

pub(super) fn dequantize_q6_k(bytes: &[u8], out: &mut [f32]) {
    for (block, out) in bytes
        .chunks_exact(Q6_K_BYTES)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let scales = q6_k_scales(block);
        for (i, o) in out.iter_mut().enumerate() {
            *o = scales[i / 16] * q6_k_code(block, i) as f32;
        }
    }
}

pub(super) fn dot_q6_k(bytes: &[u8], x: &[f32]) -> f64 {
    let mut acc = 0.0f64;
    for (block, x) in bytes.chunks_exact(Q6_K_BYTES).zip(x.chunks_exact(QK_K)) {
        let scales = q6_k_scales(block);
        for (s, (x, &ds)) in x.chunks_exact(16).zip(&scales).enumerate() {
            let mut sum_qx = 0.0f32;
            for (l, &xl) in x.iter().enumerate() {
                sum_qx += q6_k_code(block, 16 * s + l) as f32 * xl;
            }
            acc += f64::from(ds * sum_qx);
        }
    }
    acc
}
