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
//! AVX-512VL, AVX-512BW and AVX-512 VNNI.

// The tiles index parallel arrays (accumulators, code registers) by the
// same register index; iterator chains would obscure that.
#![allow(clippy::needless_range_loop)]

use super::act::Block32;
use super::avx2::{MXFP4, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use super::avx2_packed::{accumulate, block_codes, block_scales, broadcast4, format_of};
use super::blocks::MXFP4_U;
use super::packed::{group_block_bytes, scale_bytes, GROUP};
use std::arch::x86_64::*;
use turbospark_core::QuantFormat;

/// Tokens per tile of this kernel.
pub(crate) const TILE_TOKENS: usize = 8;

/// Tokens per tile of the two-group kernel ([`group_pair_tile`]): sixteen
/// accumulators, eight code registers and the scales fit the 32 vector
/// registers, and each weight block is unpacked (and read from memory)
/// once for a batch of sixteen.
pub(crate) const PAIR_TILE_TOKENS: usize = 16;

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

/// `out[c][8j + r] = Σ_i W[8(g + j) + r, i] · x_{t0+c}[i]` for two
/// neighbouring packed groups `g` and `g + 1` (`grp0`, `grp1`) of `nb`
/// blocks and `c < out.len() ≤` [`PAIR_TILE_TOKENS`] activation rows of
/// `a`: [`group_tile`] for sixteen rows at once in 512-bit registers (lanes
/// 0-7 the first group's rows, 8-15 the second's). Every lane runs the
/// same integer dot and the same f32 steps in the same order as
/// [`group_tile`]'s, so each row gets the same bits; per block and token
/// the sixteen rows take the instructions eight took.
///
/// # Safety
/// As [`group_tile`], for both groups.
pub(crate) unsafe fn group_pair_tile(
    format: QuantFormat,
    grp0: &[u8],
    grp1: &[u8],
    nb: usize,
    a: &[Block32],
    t0: usize,
    out: &mut [[f32; 2 * GROUP]],
) {
    macro_rules! by_tokens {
        ($fmt:expr) => {
            match out.len() {
                1 => pair::<{ $fmt }, 1>(grp0, grp1, nb, a, t0, out),
                2 => pair::<{ $fmt }, 2>(grp0, grp1, nb, a, t0, out),
                3 => pair::<{ $fmt }, 3>(grp0, grp1, nb, a, t0, out),
                4 => pair::<{ $fmt }, 4>(grp0, grp1, nb, a, t0, out),
                5 => pair::<{ $fmt }, 5>(grp0, grp1, nb, a, t0, out),
                6 => pair::<{ $fmt }, 6>(grp0, grp1, nb, a, t0, out),
                7 => pair::<{ $fmt }, 7>(grp0, grp1, nb, a, t0, out),
                8 => pair::<{ $fmt }, 8>(grp0, grp1, nb, a, t0, out),
                9 => pair::<{ $fmt }, 9>(grp0, grp1, nb, a, t0, out),
                10 => pair::<{ $fmt }, 10>(grp0, grp1, nb, a, t0, out),
                11 => pair::<{ $fmt }, 11>(grp0, grp1, nb, a, t0, out),
                12 => pair::<{ $fmt }, 12>(grp0, grp1, nb, a, t0, out),
                13 => pair::<{ $fmt }, 13>(grp0, grp1, nb, a, t0, out),
                14 => pair::<{ $fmt }, 14>(grp0, grp1, nb, a, t0, out),
                15 => pair::<{ $fmt }, 15>(grp0, grp1, nb, a, t0, out),
                _ => pair::<{ $fmt }, PAIR_TILE_TOKENS>(grp0, grp1, nb, a, t0, out),
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

/// 32 bytes at `p0` in the low half and 32 at `p1` in the high half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
unsafe fn load_pair(p0: *const u8, p1: *const u8) -> __m512i {
    // SAFETY: the caller's pointers hold 32 bytes each.
    unsafe {
        let lo = _mm512_castsi256_si512(_mm256_loadu_si256(p0 as *const __m256i));
        _mm512_inserti64x4(lo, _mm256_loadu_si256(p1 as *const __m256i), 1)
    }
}

/// 16 bytes at `p0`, then 16 at `p1`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
unsafe fn load_pair128(p0: *const u8, p1: *const u8) -> __m256i {
    // SAFETY: the caller's pointers hold 16 bytes each.
    unsafe {
        _mm256_set_m128i(
            _mm_loadu_si128(p1 as *const __m128i),
            _mm_loadu_si128(p0 as *const __m128i),
        )
    }
}

/// [`super::avx2_packed::block_scales`] of block `p0` of the first group
/// (lanes 0-7) and `p1` of the second (lanes 8-15).
///
/// # Safety
/// The CPU has this module's features; both point at whole group blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
unsafe fn pair_scales<const F: u8>(p0: *const u8, p1: *const u8) -> (__m512, __m512) {
    // SAFETY: the scales lie at the start of each block (contract).
    unsafe {
        match F {
            Q4_1 | Q5_1 => (
                _mm512_cvtph_ps(load_pair128(p0, p1)),
                _mm512_cvtph_ps(load_pair128(p0.add(16), p1.add(16))),
            ),
            MXFP4 => {
                let e = _mm_unpacklo_epi64(
                    _mm_loadl_epi64(p0 as *const __m128i),
                    _mm_loadl_epi64(p1 as *const __m128i),
                );
                let e = _mm512_cvtepu8_epi32(e);
                let one = _mm512_set1_epi32(1);
                let normal = _mm512_slli_epi32(_mm512_sub_epi32(e, one), 23);
                let sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
                let small = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(2), e);
                let d = _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, sub));
                (d, _mm512_mul_ps(d, _mm512_set1_ps(-12.0)))
            }
            _ => {
                let d = _mm512_cvtph_ps(load_pair128(p0, p1));
                let off = match F {
                    Q4_0 => -8.0,
                    Q5_0 => -16.0,
                    _ => 0.0,
                };
                (d, _mm512_mul_ps(d, _mm512_set1_ps(off)))
            }
        }
    }
}

/// [`super::avx2_packed::block_codes`] of the blocks whose codes start at
/// `c0` (first group, low halves) and `c1` (second group, high halves).
///
/// # Safety
/// The CPU has this module's features; both point at a block's codes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
unsafe fn pair_codes<const F: u8>(c0: *const u8, c1: *const u8) -> [__m512i; 8] {
    let mut codes = [_mm512_setzero_si512(); 8];
    // SAFETY: 128 (nibbles) or 256 (bytes) bytes of codes at each (contract).
    unsafe {
        if F == Q4_0 || F == Q4_1 || F == MXFP4 {
            let m4 = _mm512_set1_epi8(0x0F);
            let table = _mm512_broadcast_i32x4(_mm_loadu_si128(MXFP4_U.as_ptr() as *const __m128i));
            for i in 0..4 {
                let v = load_pair(c0.add(32 * i), c1.add(32 * i));
                let lo = _mm512_and_si512(v, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if F == MXFP4 {
                    codes[i] = _mm512_shuffle_epi8(table, lo);
                    codes[i + 4] = _mm512_shuffle_epi8(table, hi);
                } else {
                    codes[i] = lo;
                    codes[i + 4] = hi;
                }
            }
        } else {
            for k in 0..8 {
                codes[k] = load_pair(c0.add(32 * k), c1.add(32 * k));
            }
        }
    }
    codes
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni,avx512bw")]
unsafe fn pair<const F: u8, const C: usize>(
    grp0: &[u8],
    grp1: &[u8],
    nb: usize,
    a: &[Block32],
    t0: usize,
    out: &mut [[f32; 2 * GROUP]],
) {
    let format = format_of(F);
    let (gbb, sb) = (group_block_bytes(format), scale_bytes(format));
    debug_assert!(grp0.len() >= nb * gbb && grp1.len() >= nb * gbb);
    debug_assert!(a.len() >= (t0 + C) * nb && out.len() >= C);
    let ap = a[t0 * nb..].as_ptr();
    let mut acc = [_mm512_setzero_ps(); C];
    for b in 0..nb {
        // SAFETY (loads below): block `b < nb` of each group spans `gbb`
        // bytes inside its slice (checked length), scales first;
        // activation block `b` of each token holds 32 codes.
        unsafe {
            let (p0, p1) = (grp0.as_ptr().add(b * gbb), grp1.as_ptr().add(b * gbb));
            let (d16, m16) = pair_scales::<F>(p0, p1);
            let mut codes = pair_codes::<F>(p0.add(sb), p1.add(sb));
            // As in `group`: Q8_0's codes offset to unsigned.
            if F == Q8_0 {
                let bias = _mm512_set1_epi8(i8::MIN);
                for k in 0..8 {
                    codes[k] = _mm512_xor_si512(codes[k], bias);
                }
            }
            for t in 0..C {
                let ab = &*ap.add(t * nb + b);
                let q = ab.qs.as_ptr();
                let mut s = [_mm512_setzero_si512(); 2];
                for k in 0..8 {
                    let a4 = _mm512_set1_epi32((q.add(4 * k) as *const i32).read_unaligned());
                    s[k % 2] = _mm512_dpbusd_epi32(s[k % 2], codes[k], a4);
                }
                let mut isum = _mm512_add_epi32(s[0], s[1]);
                if F == Q8_0 {
                    isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(ab.sum128));
                }
                // `accumulate`'s steps, lane for lane.
                let scale = _mm512_mul_ps(d16, _mm512_set1_ps(ab.d));
                acc[t] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(isum), acc[t]);
                if F != Q8_0 {
                    acc[t] = _mm512_fmadd_ps(m16, _mm512_set1_ps(ab.s), acc[t]);
                }
            }
        }
    }
    for t in 0..C {
        // SAFETY: `out[t]` is 16 floats.
        unsafe { _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
}
