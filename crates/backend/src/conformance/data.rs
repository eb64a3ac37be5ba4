//! Seeded random inputs: f32 values and valid quantized rows of every
//! format, with scales in a sane range.

use crate::{HostTensor, SharedBytes};
use turbospark_core::quant::{quantize_row_mxfp4, quantize_row_q8_0, row_bytes};
use turbospark_core::QuantFormat;

/// SplitMix64.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }
    /// `n` values uniform in [-1, 1).
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
    /// `n` values uniform in [-s, s).
    pub fn scaled(&mut self, n: usize, s: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * s).collect()
    }
}

fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// One random row of `cols` elements in `fmt` (`cols` a multiple of the
/// block size).
pub fn random_row(fmt: QuantFormat, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let n_blocks = cols / fmt.block_elems();
    let len = row_bytes(fmt, cols).unwrap_or(0);
    let mut out = Vec::with_capacity(len);
    match fmt {
        QuantFormat::F32 => (0..cols).for_each(|_| out.extend(rng.f32().to_le_bytes())),
        QuantFormat::F16 => (0..cols).for_each(|_| out.extend(f16_bytes(rng.f32()))),
        QuantFormat::Bf16 => {
            (0..cols).for_each(|_| out.extend(((rng.f32().to_bits() >> 16) as u16).to_le_bytes()))
        }
        QuantFormat::Q8_0 | QuantFormat::Mxfp4 => {
            out.resize(len, 0);
            let quantize = if fmt == QuantFormat::Q8_0 {
                quantize_row_q8_0
            } else {
                quantize_row_mxfp4
            };
            // Valid sizes by construction; a failure leaves zeros, which
            // are still a valid row.
            let _ = quantize(&rng.vec(cols), &mut out);
        }
        _ => {
            for _ in 0..n_blocks {
                let start = out.len();
                out.extend((0..fmt.block_bytes()).map(|_| rng.byte()));
                let block = &mut out[start..];
                let d = f16_bytes(rng.f32() * 0.05);
                let m = f16_bytes(rng.f32() * 0.05);
                match fmt {
                    QuantFormat::Q6K => {
                        let at = block.len() - 2;
                        block[at..].copy_from_slice(&d);
                    }
                    QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q4K | QuantFormat::Q5K => {
                        block[..2].copy_from_slice(&d);
                        block[2..4].copy_from_slice(&m);
                    }
                    // Q4_0, Q5_0: the scale leads the block.
                    _ => block[..2].copy_from_slice(&d),
                }
            }
        }
    }
    out
}

/// A random `[rows, cols]` matrix in `fmt`.
pub fn random_matrix(
    name: &str,
    fmt: QuantFormat,
    rows: usize,
    cols: usize,
    rng: &mut Rng,
) -> HostTensor {
    let bytes: Vec<u8> = (0..rows).flat_map(|_| random_row(fmt, cols, rng)).collect();
    HostTensor {
        name: name.to_string(),
        format: fmt,
        shape: vec![rows, cols],
        bytes: SharedBytes::from_vec(bytes),
    }
}

/// An f32 tensor of the given shape.
/// The bit patterns of `v` (for comparing two runs bit for bit, NaNs and
/// signed zeros included).
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

pub fn f32_tensor(name: &str, shape: Vec<usize>, values: &[f32]) -> HostTensor {
    HostTensor {
        name: name.to_string(),
        format: QuantFormat::F32,
        shape,
        bytes: SharedBytes::from_f32(values),
    }
}

/// The rows of a matrix tensor dequantized by the scalar reference of
/// `turbospark_core::quant` (independent of any backend), row-major.
pub fn dequantized(t: &HostTensor) -> Vec<f32> {
    let (rows, cols) = (t.shape[0], t.shape[1]);
    let rb = t.bytes.len() / rows.max(1);
    let mut out = vec![0f32; rows * cols];
    for (r, row) in out.chunks_exact_mut(cols.max(1)).enumerate().take(rows) {
        let bytes = &t.bytes.as_slice()[r * rb..(r + 1) * rb];
        // Rows come from `random_row`, so they decode; a failure leaves
        // zeros and shows up as a mismatch.
        let _ = turbospark_core::quant::dequantize_row(t.format, bytes, row);
    }
    out
}
