//! x86-64 AVX-512 VNNI kernel (256-bit registers, AVX-512VL encoding) for
//! weights repacked eight rows at a time ([`super::packed`]), 32-element
//! formats: the layout, the code unpacking and the f32 arithmetic of
//! [`super::avx2_packed`], with each block's integer dot done by `vpdpbusd`
//! (four u8 × i8 products added into each 32-bit lane) instead of
//! `vpmaddubsw`, 16-bit adds and `vpmaddwd`.
//!
//! That integer dot is what every further token of a batch costs (the
//! codes are unpacked once per block for all the tile's tokens), and here
//! it takes eight instructions per block and token instead of
//! seventeen. Q8_0's signed codes are offset to `w + 128` once per block
//! (`vpdpbusd` wants one unsigned side), and the token's `128 · Σ a`
//! ([`Block32::sum128`]) subtracted from its sum, instead of moving each
//! weight's sign onto the activations per token as AVX2 does. The 32 vector registers of AVX-512 also hold a tile of
//! [`TILE_TOKENS`] tokens (eight code registers, one accumulator per
//! token), so a batch unpacks each block half as often.
//!
//! Both kernels' integer sums are exact (AVX2's 16-bit partial sums cannot
//! saturate: see `avx2_packed`), and the f32 steps per block and token are
//! the same instructions in the same order ([`super::avx2_packed::accumulate`]),
//! so the two give the same bits for every row, whatever the tile.
//!
//! Every function here requires a CPU with AVX2, FMA, F16C, AVX-512F,
//! AVX-512VL and AVX-512 VNNI.

// The tiles index parallel arrays (accumulators, code registers) by the
// same register index; iterator chains would obscure that.
#![allow(clippy::needless_range_loop)]

use super::act::Block32;
use super::avx2::{MXFP4, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use super::avx2_packed::{accumulate, block_codes, block_scales, broadcast4, format_of};
use super::packed::{group_block_bytes, scale_bytes, GROUP};
use std::arch::x86_64::*;
use turbospark_core::QuantFormat;

/// Tokens per tile of this kernel.
pub(crate) const TILE_TOKENS: usize = 8;

/// `out[c][r] = Σ_i W[8g + r, i] · x_{t0+c}[i]` for the packed group `grp`
/// of `nb` blocks and `c < out.len() ≤` [`TILE_TOKENS`] activation rows of
/// `a` (each `nb` blocks).
///
/// # Safety
/// The CPU has AVX2, FMA, F16C, AVX-512F, AVX-512VL and AVX-512 VNNI;
/// `grp` is one whole packed group of `format` with `nb` blocks; `a` holds
/// rows `t0 .. t0 + out.len()`.
pub(crate) unsafe fn group_tile(
    format: QuantFormat,
    grp: &[u8],
    nb: usize,
    a: &[Block32],
    t0: usize,
    out: &mut [[f32; GROUP]],
) {
    macro_rules! by_tokens {
        ($fmt:expr) => {
            match out.len() {
                1 => group::<{ $fmt }, 1>(grp, nb, a, t0, out),
                2 => group::<{ $fmt }, 2>(grp, nb, a, t0, out),
                3 => group::<{ $fmt }, 3>(grp, nb, a, t0, out),
                4 => group::<{ $fmt }, 4>(grp, nb, a, t0, out),
                5 => group::<{ $fmt }, 5>(grp, nb, a, t0, out),
                6 => group::<{ $fmt }, 6>(grp, nb, a, t0, out),
                7 => group::<{ $fmt }, 7>(grp, nb, a, t0, out),
                _ => group::<{ $fmt }, TILE_TOKENS>(grp, nb, a, t0, out),
            }
        };
    }
    // SAFETY (all arms): forwarded from this function's contract.
    unsafe {
        match format {
            QuantFormat::Q4_0 => by_tokens!(Q4_0),
            QuantFormat::Q4_1 => by_tokens!(Q4_1),
            QuantFormat::Q5_0 => by_tokens!(Q5_0),
            QuantFormat::Q5_1 => by_tokens!(Q5_1),
            QuantFormat::Mxfp4 => by_tokens!(MXFP4),
            QuantFormat::Q8_0 => by_tokens!(Q8_0),
            _ => unreachable!("{format} has no VNNI group kernel"),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn group<const F: u8, const C: usize>(
    grp: &[u8],
    nb: usize,
    a: &[Block32],
    t0: usize,
    out: &mut [[f32; GROUP]],
) {
    let format = format_of(F);
    let (gbb, sb) = (group_block_bytes(format), scale_bytes(format));
    debug_assert!(grp.len() >= nb * gbb && a.len() >= (t0 + C) * nb && out.len() >= C);
    let ap = a[t0 * nb..].as_ptr();
    let mut acc = [_mm256_setzero_ps(); C];
    for b in 0..nb {
        // SAFETY (loads below): block `b < nb` of the group spans `gbb`
        // bytes inside `grp` (checked length), scales first; activation
        // block `b` of each token holds 32 codes.
        unsafe {
            let p = grp.as_ptr().add(b * gbb);
            let (d8, m8) = block_scales::<F>(p);
            let mut codes = block_codes::<F>(p.add(sb));
            // Q8_0's codes are signed: w + 128 (flipping the sign bit)
            // is unsigned, and Σ (w + 128) · a − 128 · Σ a = Σ w · a.
            if F == Q8_0 {
                let bias = _mm256_set1_epi8(i8::MIN);
                for k in 0..8 {
                    codes[k] = _mm256_xor_si256(codes[k], bias);
                }
            }
            for t in 0..C {
                let ab = &*ap.add(t * nb + b);
                let q = ab.qs.as_ptr();
                // Two chains of four, so that the adds of one token do not
                // wait on each other's latency.
                let mut s = [_mm256_setzero_si256(); 2];
                for k in 0..8 {
                    s[k % 2] = _mm256_dpbusd_epi32(s[k % 2], codes[k], broadcast4(q, k));
                }
                let mut isum = _mm256_add_epi32(s[0], s[1]);
                if F == Q8_0 {
                    isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(ab.sum128));
                }
                acc[t] = accumulate::<F>(acc[t], d8, m8, isum, ab);
            }
        }
    }
    for t in 0..C {
        // SAFETY: `out[t]` is 8 floats.
        unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
}
