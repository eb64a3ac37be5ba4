//! Weight blocks as the fast kernels see them: integer codes plus the
//! scales that turn an integer dot with 8-bit activations into a float.
//! Layouts as in `turbospark_core::quant` (ggml's `ggml-common.h`).
//!
//! ```text
//! 32-element formats: w_j = dw · u_j + mw
//!   Q4_0   u = nibble            dw = d          mw = −8 d
//!   Q4_1   u = nibble            dw = d          mw = m
//!   Q5_0   u = nibble | hbit<<4  dw = d          mw = −16 d
//!   Q5_1   u = nibble | hbit<<4  dw = d          mw = m
//!   MXFP4  u = kvalues[nibble]+12, dw = 2^(e−128), mw = −12 dw
//!   Q8_0   u = qs (signed)       dw = d          mw = 0
//! so  Σ_j w_j · a_j = dw · da · Σ_j u_j q_j + mw · s      (a = da · q, s = da · Σ q)
//!
//! Q4_K / Q5_K: w = d · sc_s · u − dmin · m_s   (sub-block s of 32, u 4 or 5 bits)
//!   Σ w·a = da · (d · Σ_s sc_s Σ u q − dmin · Σ_s m_s (bsum_2s + bsum_2s+1))
//! Q6_K: w = d · sc_k · (u − 32)   (sub-block k of 16, u 6 bits)
//!   Σ w·a = da · d · (Σ_k sc_k Σ u q − 32 Σ_k sc_k bsum_k)
//! ```
//!
//! These scalar decoders are the portable kernels' building blocks and the
//! reference the SIMD kernels are tested against.

use half::f16;
use turbospark_core::QuantFormat;

/// MXFP4 code values (E2M1 doubled) plus 12, so that every code is unsigned.
pub(crate) const MXFP4_U: [u8; 16] = [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];

#[inline]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `2^(e − 128)`: the MXFP4 block scale for doubled code values.
#[inline]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        // 2^(e−128) is subnormal; build it without shifting past the exponent.
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(((e as u32) - 1) << 23)
    }
}

/// Decodes one 32-element block into its codes `u` and returns `(dw, mw)`.
#[inline]
pub(crate) fn legacy_block(format: QuantFormat, b: &[u8], u: &mut [i32; 32]) -> (f32, f32) {
    let nibbles = |qs: &[u8], u: &mut [i32; 32]| {
        for j in 0..16 {
            u[j] = (qs[j] & 0x0F) as i32;
            u[j + 16] = (qs[j] >> 4) as i32;
        }
    };
    let high_bits = |qh: u32, u: &mut [i32; 32]| {
        for (j, v) in u.iter_mut().enumerate() {
            *v |= (((qh >> j) & 1) << 4) as i32;
        }
    };
    match format {
        QuantFormat::Q4_0 => {
            let d = f16_at(b, 0);
            nibbles(&b[2..18], u);
            (d, -8.0 * d)
        }
        QuantFormat::Q4_1 => {
            nibbles(&b[4..20], u);
            (f16_at(b, 0), f16_at(b, 2))
        }
        QuantFormat::Q5_0 => {
            let d = f16_at(b, 0);
            nibbles(&b[6..22], u);
            high_bits(u32::from_le_bytes([b[2], b[3], b[4], b[5]]), u);
            (d, -16.0 * d)
        }
        QuantFormat::Q5_1 => {
            nibbles(&b[8..24], u);
            high_bits(u32::from_le_bytes([b[4], b[5], b[6], b[7]]), u);
            (f16_at(b, 0), f16_at(b, 2))
        }
        QuantFormat::Mxfp4 => {
            for j in 0..16 {
                u[j] = MXFP4_U[(b[1 + j] & 0x0F) as usize] as i32;
                u[j + 16] = MXFP4_U[(b[1 + j] >> 4) as usize] as i32;
            }
            let d = e8m0_half(b[0]);
            (d, -12.0 * d)
        }
        QuantFormat::Q8_0 => {
            for (v, &q) in u.iter_mut().zip(&b[2..34]) {
                *v = q as i8 as i32;
            }
            (f16_at(b, 0), 0.0)
        }
        QuantFormat::F32
        | QuantFormat::F16
        | QuantFormat::Bf16
        | QuantFormat::Q4K
        | QuantFormat::Q5K
        | QuantFormat::Q6K => unreachable!("{format} is not a 32-element format"),
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j`.
#[inline]
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

/// One decoded K-quant super-block of 256.
pub(crate) struct KBlock {
    /// Unsigned codes (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63).
    pub u: [i32; 256],
    /// Per sub-block scale (8 of 32 for Q4_K/Q5_K; 16 of 16 for Q6_K).
    pub sc: [i32; 16],
    /// Per sub-block min (Q4_K/Q5_K).
    pub m: [i32; 8],
    pub d: f32,
    pub dmin: f32,
}

impl KBlock {
    pub(crate) const fn new() -> KBlock {
        KBlock {
            u: [0; 256],
            sc: [0; 16],
            m: [0; 8],
            d: 0.0,
            dmin: 0.0,
        }
    }

    /// Decodes super-block `b` of `format` (Q4_K, Q5_K or Q6_K).
    pub(crate) fn decode(&mut self, format: QuantFormat, b: &[u8]) {
        match format {
            QuantFormat::Q4K | QuantFormat::Q5K => {
                self.d = f16_at(b, 0);
                self.dmin = f16_at(b, 2);
                let scales = &b[4..16];
                for s in 0..8 {
                    let (sc, m) = scale_min_k4(scales, s);
                    self.sc[s] = sc as i32;
                    self.m[s] = m as i32;
                }
                let (qh, qs) = if format == QuantFormat::Q5K {
                    (Some(&b[16..48]), &b[48..176])
                } else {
                    (None, &b[16..144])
                };
                for s in 0..8 {
                    let bytes = &qs[32 * (s / 2)..32 * (s / 2) + 32];
                    for l in 0..32 {
                        let nib = if s % 2 == 0 {
                            bytes[l] & 0x0F
                        } else {
                            bytes[l] >> 4
                        };
                        let hi = qh.map_or(0, |qh| ((qh[l] >> s) & 1) << 4);
                        self.u[32 * s + l] = (nib | hi) as i32;
                    }
                }
            }
            QuantFormat::Q6K => {
                let (ql, qh) = (&b[0..128], &b[128..192]);
                for (k, sc) in self.sc.iter_mut().enumerate() {
                    *sc = b[192 + k] as i8 as i32;
                }
                self.d = f16_at(b, 208);
                for half in 0..2 {
                    let (ql, qh) = (&ql[64 * half..], &qh[32 * half..]);
                    let u = &mut self.u[128 * half..128 * half + 128];
                    for l in 0..32 {
                        u[l] = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32;
                        u[l + 32] = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32;
                        u[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32;
                        u[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32;
                    }
                }
            }
            _ => unreachable!("{format} is not a K-quant"),
        }
    }
}

/// A float weight element `i` of row bytes `b`.
#[inline]
pub(crate) fn float_at(format: QuantFormat, b: &[u8], i: usize) -> f32 {
    match format {
        QuantFormat::F32 => {
            f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
        }
        QuantFormat::F16 => f16_at(b, 2 * i),
        QuantFormat::Bf16 => {
            f32::from_bits((u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32) << 16)
        }
        _ => unreachable!("{format} is not a float format"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turbospark_core::quant::dequantize_row;

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 33) as u8
            })
            .collect()
    }

    /// Sets every f16 scale field of the blocks to a small finite value.
    fn sane(format: QuantFormat, b: &mut [u8]) {
        let bb = format.block_bytes();
        let half = |v: f32| f16::from_f32(v).to_le_bytes();
        for (i, blk) in b.chunks_exact_mut(bb).enumerate() {
            let v = 0.01 + 0.001 * (i % 7) as f32;
            match format {
                QuantFormat::Q6K => blk[208..210].copy_from_slice(&half(v)),
                QuantFormat::Mxfp4 => blk[0] = 118 + (i % 10) as u8,
                QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q4K | QuantFormat::Q5K => {
                    blk[0..2].copy_from_slice(&half(v));
                    blk[2..4].copy_from_slice(&half(-v * 0.5));
                }
                _ => blk[0..2].copy_from_slice(&half(v)),
            }
        }
    }

    #[test]
    fn decoded_blocks_match_the_reference_dequantizer() {
        for format in [
            QuantFormat::Q4_0,
            QuantFormat::Q4_1,
            QuantFormat::Q5_0,
            QuantFormat::Q5_1,
            QuantFormat::Q8_0,
            QuantFormat::Mxfp4,
            QuantFormat::Q4K,
            QuantFormat::Q5K,
            QuantFormat::Q6K,
        ] {
            let mut b = bytes(format.block_bytes() * 3, 7);
            sane(format, &mut b);
            let n = format.block_elems() * 3;
            let mut want = vec![0f32; n];
            dequantize_row(format, &b, &mut want).unwrap();
            let mut got = vec![0f32; n];
            for (blk, out) in b
                .chunks_exact(format.block_bytes())
                .zip(got.chunks_exact_mut(format.block_elems()))
            {
                if format.block_elems() == 32 {
                    let mut u = [0; 32];
                    let (dw, mw) = legacy_block(format, blk, &mut u);
                    for (o, &u) in out.iter_mut().zip(&u) {
                        *o = dw * u as f32 + mw;
                    }
                } else {
                    let mut k = KBlock::new();
                    k.decode(format, blk);
                    for (i, o) in out.iter_mut().enumerate() {
                        *o = if format == QuantFormat::Q6K {
                            k.d * k.sc[i / 16] as f32 * (k.u[i] - 32) as f32
                        } else {
                            k.d * k.sc[i / 32] as f32 * k.u[i] as f32 - k.dmin * k.m[i / 32] as f32
                        };
                    }
                }
            }
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1e-3),
                    "{format} element {i}: {g} vs {w}"
                );
            }
        }
    }

    #[test]
    fn e8m0_half_is_a_power_of_two() {
        for e in 0..=254u8 {
            assert_eq!(e8m0_half(e) as f64, 2f64.powi(e as i32 - 128), "e={e}");
        }
    }
}
