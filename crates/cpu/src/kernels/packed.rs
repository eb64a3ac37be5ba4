//! Weights repacked at upload for the SIMD kernels: eight rows interleaved
//! so that one 32-byte register holds four consecutive codes of each of the
//! eight rows (lane `r` ↔ row `r`). A dot with eight rows then takes one
//! broadcast of four activation codes per register, and the eight row sums
//! come out as the eight lanes of one vector: no horizontal sums, one f32
//! multiply-add per block for all eight rows.
//!
//! Layout, per group of eight rows `g` and per 32-element block `b` (the
//! 32-element formats of [`super::blocks`]; `u_r[j]` is code `j` of row `r`
//! in that block):
//!
//! ```text
//! scales   d_r as f16 ×8 (Q4_0, Q5_0, Q8_0); d_r, m_r as f16 ×8 each (Q4_1,
//!          Q5_1); the E8M0 byte e_r ×8 (MXFP4)
//! codes    register k = 0..7, byte 4r + i = u_r[4k + i]:
//!   nibbles (Q4_0, Q4_1, MXFP4): 4 × 32 bytes, register k in the low
//!           nibbles of chunk k, register k + 4 in the high nibbles
//!   bytes   (Q5_0, Q5_1: unsigned 0..31; Q8_0: signed): 8 × 32 bytes
//! ```
//!
//! Nibble formats keep their size (plus nothing); Q5_0/Q5_1 grow from 22/24
//! to 34/36 bytes per block, trading memory for a kernel without bit
//! gathering. Rows past the last whole group stay in the original layout.
//!
//! K-quants, per group and 256-element super-block (sub-block scales as
//! 16-bit pairs, so that `vpmaddwd` applies them to the 16-bit dot sums):
//!
//! ```text
//! Q4_K  d ×8, dmin ×8 (f16); scale pairs: 4 × 32 bytes, lane r =
//!       (sc_r[2p], sc_r[2p+1]) as i16; min pairs likewise; codes: per
//!       sub-block of 32, 128 bytes of nibbles as above (1312 bytes, +14%)
//! Q6_K  d ×8 (f16); scale pairs: 8 × 32 bytes (i16); codes: per sub-block
//!       of 16, four registers of unsigned bytes 0..63 (2320 bytes, +38%)
//! ```

use super::blocks::{legacy_block, KBlock};
use turbospark_core::QuantFormat;

/// Rows per interleaved group.
pub(crate) const GROUP: usize = 8;

/// How a format's codes are stored in a packed group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codes {
    /// Two registers per 32 bytes (4-bit codes; MXFP4 keeps its nibble
    /// index, looked up at use).
    Nibbles,
    /// One register per 32 bytes (unsigned 5-bit codes, or Q8_0's signed
    /// bytes).
    Bytes,
    /// Q4_K super-blocks.
    Q4K,
    /// Q6_K super-blocks.
    Q6K,
}

/// Whether `format` is repacked, and how.
pub(crate) const fn codes(format: QuantFormat) -> Option<Codes> {
    match format {
        QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Mxfp4 => Some(Codes::Nibbles),
        QuantFormat::Q5_0 | QuantFormat::Q5_1 | QuantFormat::Q8_0 => Some(Codes::Bytes),
        QuantFormat::Q4K => Some(Codes::Q4K),
        QuantFormat::Q6K => Some(Codes::Q6K),
        _ => None,
    }
}

/// Bytes of scales per group and block (32-element formats).
pub(crate) const fn scale_bytes(format: QuantFormat) -> usize {
    match format {
        QuantFormat::Q4_1 | QuantFormat::Q5_1 => 32,
        QuantFormat::Mxfp4 => 8,
        _ => 16,
    }
}

/// Offsets inside a packed K-quant group block.
pub(crate) mod k_layout {
    pub const Q4K_D: usize = 0;
    pub const Q4K_DMIN: usize = 16;
    pub const Q4K_SC: usize = 32;
    pub const Q4K_M: usize = 160;
    pub const Q4K_CODES: usize = 288;
    pub const Q4K_BYTES: usize = 1312;
    pub const Q6K_D: usize = 0;
    pub const Q6K_SC: usize = 16;
    pub const Q6K_CODES: usize = 272;
    pub const Q6K_BYTES: usize = 2320;
}

/// Bytes per group and block.
pub(crate) const fn group_block_bytes(format: QuantFormat) -> usize {
    match codes(format) {
        Some(Codes::Nibbles) => scale_bytes(format) + 128,
        Some(Codes::Q4K) => k_layout::Q4K_BYTES,
        Some(Codes::Q6K) => k_layout::Q6K_BYTES,
        _ => scale_bytes(format) + 256,
    }
}

/// A matrix's whole groups of eight rows in the interleaved layout.
#[derive(Debug, Clone)]
pub(crate) struct Packed {
    /// Whole groups (`rows / 8`).
    pub groups: usize,
    /// 32-element blocks per row.
    pub blocks: usize,
    pub data: Vec<u8>,
}

impl Packed {
    /// An empty packing for a `[rows, cols]` matrix of `format` (`None`
    /// when the format is not repacked or has no whole group).
    pub(crate) fn for_shape(format: QuantFormat, rows: usize, cols: usize) -> Option<Packed> {
        codes(format)?;
        let groups = rows / GROUP;
        let be = format.block_elems();
        if groups == 0 || !cols.is_multiple_of(be) {
            return None;
        }
        let blocks = cols / be;
        Some(Packed {
            groups,
            blocks,
            data: vec![0; groups * blocks * group_block_bytes(format)],
        })
    }

    /// The packed bytes of group `g`.
    pub(crate) fn group(&self, format: QuantFormat, g: usize) -> &[u8] {
        let len = self.blocks * group_block_bytes(format);
        &self.data[g * len..(g + 1) * len]
    }

    /// Fills the packing from the original rows (`row(r)` gives row `r`'s
    /// packed bytes in ggml's layout).
    pub(crate) fn fill<'a>(&mut self, format: QuantFormat, row: impl Fn(usize) -> &'a [u8]) {
        if matches!(codes(format), Some(Codes::Q4K | Codes::Q6K)) {
            return self.fill_k(format, row);
        }
        let gbb = group_block_bytes(format);
        let sb = scale_bytes(format);
        let bb = format.block_bytes();
        let mut u = [0i32; 32];
        for g in 0..self.groups {
            for b in 0..self.blocks {
                let at = (g * self.blocks + b) * gbb;
                let dst = &mut self.data[at..at + gbb];
                let (scales, codes_out) = dst.split_at_mut(sb);
                for r in 0..GROUP {
                    let src = &row(g * GROUP + r)[b * bb..(b + 1) * bb];
                    match format {
                        QuantFormat::Mxfp4 => scales[r] = src[0],
                        QuantFormat::Q4_1 | QuantFormat::Q5_1 => {
                            scales[2 * r..2 * r + 2].copy_from_slice(&src[0..2]);
                            scales[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&src[2..4]);
                        }
                        _ => scales[2 * r..2 * r + 2].copy_from_slice(&src[0..2]),
                    }
                    // Nibble formats and Q8_0 store their codes in the
                    // order the packing wants within each 4-byte word
                    // (nibble `j` low, `j + 16` high): a word copy.
                    let qs_at = match format {
                        QuantFormat::Q4_0 | QuantFormat::Q8_0 => Some(2),
                        QuantFormat::Q4_1 => Some(4),
                        QuantFormat::Mxfp4 => Some(1),
                        _ => None,
                    };
                    if let Some(o) = qs_at {
                        let words = if format == QuantFormat::Q8_0 { 8 } else { 4 };
                        for k in 0..words {
                            codes_out[32 * k + 4 * r..32 * k + 4 * r + 4]
                                .copy_from_slice(&src[o + 4 * k..o + 4 * k + 4]);
                        }
                        continue;
                    }
                    legacy_block(format, src, &mut u);
                    for k in 0..8 {
                        for i in 0..4 {
                            codes_out[32 * k + 4 * r + i] = u[4 * k + i] as u8;
                        }
                    }
                }
            }
        }
    }

    fn fill_k<'a>(&mut self, format: QuantFormat, row: impl Fn(usize) -> &'a [u8]) {
        use k_layout::*;
        let gbb = group_block_bytes(format);
        let bb = format.block_bytes();
        let mut k = KBlock::new();
        let put16 = |dst: &mut [u8], at: usize, v: i32| {
            dst[at..at + 2].copy_from_slice(&(v as i16).to_le_bytes());
        };
        for g in 0..self.groups {
            for b in 0..self.blocks {
                let at = (g * self.blocks + b) * gbb;
                let dst = &mut self.data[at..at + gbb];
                for r in 0..GROUP {
                    let src = &row(g * GROUP + r)[b * bb..(b + 1) * bb];
                    k.decode(format, src);
                    if format == QuantFormat::Q4K {
                        dst[Q4K_D + 2 * r..Q4K_D + 2 * r + 2].copy_from_slice(&src[0..2]);
                        dst[Q4K_DMIN + 2 * r..Q4K_DMIN + 2 * r + 2].copy_from_slice(&src[2..4]);
                        for s in 0..8 {
                            let lane = Q4K_SC + 32 * (s / 2) + 4 * r + 2 * (s % 2);
                            put16(dst, lane, k.sc[s]);
                            put16(dst, lane - Q4K_SC + Q4K_M, k.m[s]);
                            for kk in 0..8 {
                                for i in 0..4 {
                                    let v = k.u[32 * s + 4 * kk + i] as u8;
                                    let byte =
                                        &mut dst[Q4K_CODES + 128 * s + 32 * (kk % 4) + 4 * r + i];
                                    *byte = if kk < 4 {
                                        (*byte & 0xF0) | v
                                    } else {
                                        (*byte & 0x0F) | (v << 4)
                                    };
                                }
                            }
                        }
                    } else {
                        dst[Q6K_D + 2 * r..Q6K_D + 2 * r + 2].copy_from_slice(&src[208..210]);
                        for s in 0..16 {
                            put16(dst, Q6K_SC + 32 * (s / 2) + 4 * r + 2 * (s % 2), k.sc[s]);
                            for kk in 0..4 {
                                for i in 0..4 {
                                    dst[Q6K_CODES + 128 * s + 32 * kk + 4 * r + i] =
                                        k.u[16 * s + 4 * kk + i] as u8;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
