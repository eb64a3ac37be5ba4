//! x86-64 AVX2 + FMA + F16C kernel for weights repacked eight rows at a
//! time ([`super::packed`]): per 32-element block, eight code registers
//! (lane `r` ↔ row `r`) are multiplied with broadcasts of four activation
//! codes (`vpmaddubsw`), summed in 16 bits where that cannot overflow, then
//! widened (`vpmaddwd`); the eight lanes are the eight rows' integer sums.
//! One `cvt` and one multiply-add per block and token turn them into f32
//! with the rows' scales, and a second multiply-add adds the block offset
//! (`mw · s`, see [`super::blocks`]).
//!
//! The integer sums equal the scalar kernels'; the f32 accumulation order
//! (block by block, per row) matches the scalar kernels' too, up to the
//! fused multiply-adds.
//!
//! Every function here requires a CPU with AVX2, FMA and F16C.

// The tiles index parallel arrays (accumulators, code registers) by the
// same register index; iterator chains would obscure that.
#![allow(clippy::needless_range_loop)]

use super::act::{Block256, Block32};
use super::avx2::{MXFP4, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use super::blocks::MXFP4_U;
use super::packed::{group_block_bytes, k_layout, scale_bytes, GROUP};
use std::arch::x86_64::*;
use turbospark_core::QuantFormat;

pub(super) const fn format_of(f: u8) -> QuantFormat {
    match f {
        Q4_0 => QuantFormat::Q4_0,
        Q4_1 => QuantFormat::Q4_1,
        Q5_0 => QuantFormat::Q5_0,
        Q5_1 => QuantFormat::Q5_1,
        MXFP4 => QuantFormat::Mxfp4,
        _ => QuantFormat::Q8_0,
    }
}

/// `out[c][r] = Σ_i W[8g + r, i] · x_{t0+c}[i]` for the packed group `grp`
/// of `nb` blocks and `c < out.len() ≤ 4` activation rows of `a` (each
/// `nb` blocks).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `grp` is one whole packed group of
/// `format` with `nb` blocks; `a` holds rows `t0 .. t0 + out.len()`.
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
                _ => group::<{ $fmt }, 4>(grp, nb, a, t0, out),
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
            _ => unreachable!("{format} is not repacked"),
        }
    }
}

/// Four activation codes `q[4k .. 4k + 4]` in every 32-bit lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn broadcast4(q: *const i8, k: usize) -> __m256i {
    // SAFETY: the caller's `q` holds 32 codes and `k < 8`.
    _mm256_set1_epi32(unsafe { (q.add(4 * k) as *const i32).read_unaligned() })
}

/// The eight rows' scales of block `p` of a packed group of format `F`:
/// `(d, m)` with `m` the factor of the activation block's scaled code sum
/// (`blocks::legacy_block`: the min for Q4_1/Q5_1, `d` times the code
/// offset otherwise; unused for Q8_0).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `p` points at a whole group block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn block_scales<const F: u8>(p: *const u8) -> (__m256, __m256) {
    // SAFETY: the scales lie at the start of the block (contract).
    unsafe {
        match F {
            Q4_1 | Q5_1 => (
                _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i)),
            ),
            MXFP4 => {
                // 2^(e − 128) (`blocks::e8m0_half`): exponent bits e − 1
                // for e ≥ 2, the subnormals 2^-128 and 2^-127 below.
                let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
                let one = _mm256_set1_epi32(1);
                let normal = _mm256_slli_epi32(_mm256_sub_epi32(e, one), 23);
                let sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
                let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
                let d = _mm256_castsi256_ps(_mm256_blendv_epi8(normal, sub, small));
                (d, _mm256_mul_ps(d, _mm256_set1_ps(-12.0)))
            }
            _ => {
                let d = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
                let off = match F {
                    Q4_0 => -8.0,
                    Q5_0 => -16.0,
                    _ => 0.0,
                };
                (d, _mm256_mul_ps(d, _mm256_set1_ps(off)))
            }
        }
    }
}

/// The eight code registers of one block of a packed group of format `F`
/// (register `k`, byte `4r + i` = code `4k + i` of row `r`) whose codes
/// start at `c`: unsigned for every format but Q8_0 (signed bytes).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `c` points at the block's codes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn block_codes<const F: u8>(c: *const u8) -> [__m256i; 8] {
    let mut codes = [_mm256_setzero_si256(); 8];
    // SAFETY: 128 (nibbles) or 256 (bytes) bytes of codes (contract).
    unsafe {
        if F == Q4_0 || F == Q4_1 || F == MXFP4 {
            let m4 = _mm256_set1_epi8(0x0F);
            let table = _mm_loadu_si128(MXFP4_U.as_ptr() as *const __m128i);
            let table = _mm256_set_m128i(table, table);
            for i in 0..4 {
                let v = _mm256_loadu_si256(c.add(32 * i) as *const __m256i);
                let lo = _mm256_and_si256(v, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if F == MXFP4 {
                    codes[i] = _mm256_shuffle_epi8(table, lo);
                    codes[i + 4] = _mm256_shuffle_epi8(table, hi);
                } else {
                    codes[i] = lo;
                    codes[i + 4] = hi;
                }
            }
        } else {
            for k in 0..8 {
                codes[k] = _mm256_loadu_si256(c.add(32 * k) as *const __m256i);
            }
        }
    }
    codes
}

/// `acc += (d · a.d) · isum`, then `acc += m · a.s` (all formats but
/// Q8_0): one block's contribution to eight rows' f32 sums, in the order
/// every kernel on the packed layout adds it.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn accumulate<const F: u8>(
    acc: __m256,
    d8: __m256,
    m8: __m256,
    isum: __m256i,
    ab: &Block32,
) -> __m256 {
    let scale = _mm256_mul_ps(d8, _mm256_set1_ps(ab.d));
    let acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), acc);
    if F != Q8_0 {
        _mm256_fmadd_ps(m8, _mm256_set1_ps(ab.s), acc)
    } else {
        acc
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
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
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); C];
    for b in 0..nb {
        // SAFETY (loads below): block `b < nb` of the group spans
        // `gbb` bytes inside `grp` (checked length); scales first, then
        // 128 (nibbles) or 256 (bytes) bytes of codes.
        unsafe {
            let p = grp.as_ptr().add(b * gbb);
            let (d8, m8) = block_scales::<F>(p);
            let mut codes = block_codes::<F>(p.add(sb));
            // Q8_0's codes are signed: |w| · (a with w's sign).
            let signs = codes;
            if F == Q8_0 {
                for k in 0..8 {
                    codes[k] = _mm256_sign_epi8(codes[k], codes[k]);
                }
            }
            for t in 0..C {
                let ab = &*ap.add(t * nb + b);
                let q = ab.qs.as_ptr();
                let isum = if F == Q8_0 {
                    let mut s = _mm256_setzero_si256();
                    for k in 0..8 {
                        let qa = _mm256_sign_epi8(broadcast4(q, k), signs[k]);
                        let p16 = _mm256_maddubs_epi16(codes[k], qa);
                        s = _mm256_add_epi32(s, _mm256_madd_epi16(p16, ones));
                    }
                    s
                } else {
                    // Codes ≤ 31: four pair sums ≤ 4 · 2 · 31 · 127 fit in i16.
                    let mut halves = [_mm256_setzero_si256(); 2];
                    for h in 0..2 {
                        let mut s16 = _mm256_maddubs_epi16(codes[4 * h], broadcast4(q, 4 * h));
                        for k in 4 * h + 1..4 * h + 4 {
                            s16 = _mm256_add_epi16(
                                s16,
                                _mm256_maddubs_epi16(codes[k], broadcast4(q, k)),
                            );
                        }
                        halves[h] = _mm256_madd_epi16(s16, ones);
                    }
                    _mm256_add_epi32(halves[0], halves[1])
                };
                acc[t] = accumulate::<F>(acc[t], d8, m8, isum, ab);
            }
        }
    }
    for t in 0..C {
        // SAFETY: `out[t]` is 8 floats.
        unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
}

/// `out[c][r] = Σ_i W[8g + r, i] · x_{t0+c}[i]` for the packed K-quant
/// group `grp` (Q4_K or Q6_K) of `nb` super-blocks and `c < out.len() ≤ 4`
/// activation rows of `a`.
///
/// # Safety
/// As [`group_tile`], with [`Block256`] activations.
pub(crate) unsafe fn kgroup_tile(
    format: QuantFormat,
    grp: &[u8],
    nb: usize,
    a: &[Block256],
    t0: usize,
    out: &mut [[f32; GROUP]],
) {
    macro_rules! by_tokens {
        ($f:ident) => {
            match out.len() {
                1 => $f::<1>(grp, nb, a, t0, out),
                2 => $f::<2>(grp, nb, a, t0, out),
                3 => $f::<3>(grp, nb, a, t0, out),
                _ => $f::<4>(grp, nb, a, t0, out),
            }
        };
    }
    // SAFETY (both arms): forwarded from this function's contract.
    unsafe {
        match format {
            QuantFormat::Q4K => by_tokens!(q4k_group),
            QuantFormat::Q6K => by_tokens!(q6k_group),
            _ => unreachable!("{format} is not a repacked K-quant"),
        }
    }
}

/// i16 lanes `(v, v)` from lane half `odd` of each 32-bit lane of `pairs`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dup_half(pairs: __m256i, odd: bool) -> __m256i {
    if odd {
        _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(pairs, 0b11_11_01_01), 0b11_11_01_01)
    } else {
        _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(pairs, 0b10_10_00_00), 0b10_10_00_00)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_group<const C: usize>(
    grp: &[u8],
    nb: usize,
    a: &[Block256],
    t0: usize,
    out: &mut [[f32; GROUP]],
) {
    use k_layout::*;
    debug_assert!(grp.len() >= nb * Q4K_BYTES && a.len() >= (t0 + C) * nb && out.len() >= C);
    let ap = a[t0 * nb..].as_ptr();
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); C];
    for b in 0..nb {
        // SAFETY (loads below): super-block `b < nb` spans `Q4K_BYTES`
        // inside `grp`; activation blocks hold 256 codes and 16 sums.
        unsafe {
            let p = grp.as_ptr().add(b * Q4K_BYTES);
            let d8 = _mm256_cvtph_ps(_mm_loadu_si128(p.add(Q4K_D) as *const __m128i));
            let dmin8 = _mm256_cvtph_ps(_mm_loadu_si128(p.add(Q4K_DMIN) as *const __m128i));
            let mut isum = [_mm256_setzero_si256(); C];
            for sub in 0..8 {
                let pairs = _mm256_loadu_si256(p.add(Q4K_SC + 32 * (sub / 2)) as *const __m256i);
                let sc16 = dup_half(pairs, sub % 2 == 1);
                let c = p.add(Q4K_CODES + 128 * sub);
                let mut codes = [_mm256_setzero_si256(); 8];
                for i in 0..4 {
                    let v = _mm256_loadu_si256(c.add(32 * i) as *const __m256i);
                    codes[i] = _mm256_and_si256(v, m4);
                    codes[i + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                }
                for t in 0..C {
                    let q = (*ap.add(t * nb + b)).qs.as_ptr().add(32 * sub);
                    for h in 0..2 {
                        // 4-bit codes: four pair sums ≤ 4 · 2 · 15 · 127 fit in i16.
                        let mut s16 = _mm256_maddubs_epi16(codes[4 * h], broadcast4(q, 4 * h));
                        for k in 4 * h + 1..4 * h + 4 {
                            s16 = _mm256_add_epi16(
                                s16,
                                _mm256_maddubs_epi16(codes[k], broadcast4(q, k)),
                            );
                        }
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16, sc16));
                    }
                }
            }
            for t in 0..C {
                let ab = &*ap.add(t * nb + b);
                // Sums of the eight 32-code sub-blocks, as i16 pairs per 32-bit lane.
                let bs = _mm256_loadu_si256(ab.bsums.as_ptr() as *const __m256i);
                let sub_sums =
                    _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
                let mut msum = _mm256_setzero_si256();
                for pair in 0..4 {
                    let mp = _mm256_loadu_si256(p.add(Q4K_M + 32 * pair) as *const __m256i);
                    let bcast = _mm256_set1_epi32(_mm_extract_epi32_var(sub_sums, pair));
                    msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mp, bcast));
                }
                let da = _mm256_set1_ps(ab.d);
                acc[t] =
                    _mm256_fmadd_ps(_mm256_mul_ps(d8, da), _mm256_cvtepi32_ps(isum[t]), acc[t]);
                acc[t] =
                    _mm256_fnmadd_ps(_mm256_mul_ps(dmin8, da), _mm256_cvtepi32_ps(msum), acc[t]);
            }
        }
    }
    for t in 0..C {
        // SAFETY: `out[t]` is 8 floats.
        unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
}

/// Lane `i` (< 4) of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn _mm_extract_epi32_var(v: __m128i, i: usize) -> i32 {
    let mut lanes = [0i32; 4];
    // SAFETY: 16 writable bytes.
    unsafe { _mm_storeu_si128(lanes.as_mut_ptr() as *mut __m128i, v) };
    lanes[i]
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_group<const C: usize>(
    grp: &[u8],
    nb: usize,
    a: &[Block256],
    t0: usize,
    out: &mut [[f32; GROUP]],
) {
    use k_layout::*;
    debug_assert!(grp.len() >= nb * Q6K_BYTES && a.len() >= (t0 + C) * nb && out.len() >= C);
    let ap = a[t0 * nb..].as_ptr();
    let mut acc = [_mm256_setzero_ps(); C];
    for b in 0..nb {
        // SAFETY (loads below): super-block `b < nb` spans `Q6K_BYTES`
        // inside `grp`; activation blocks hold 256 codes and 16 sums.
        unsafe {
            let p = grp.as_ptr().add(b * Q6K_BYTES);
            let d8 = _mm256_cvtph_ps(_mm_loadu_si128(p.add(Q6K_D) as *const __m128i));
            let mut isum = [_mm256_setzero_si256(); C];
            for sub in 0..16 {
                let pairs = _mm256_loadu_si256(p.add(Q6K_SC + 32 * (sub / 2)) as *const __m256i);
                let sc16 = dup_half(pairs, sub % 2 == 1);
                let c = p.add(Q6K_CODES + 128 * sub);
                let codes: [__m256i; 4] =
                    std::array::from_fn(|k| _mm256_loadu_si256(c.add(32 * k) as *const __m256i));
                for t in 0..C {
                    let q = (*ap.add(t * nb + b)).qs.as_ptr().add(16 * sub);
                    for h in 0..2 {
                        // 6-bit codes: two pair sums ≤ 2 · 2 · 63 · 127 fit in i16.
                        let s16 = _mm256_add_epi16(
                            _mm256_maddubs_epi16(codes[2 * h], broadcast4(q, 2 * h)),
                            _mm256_maddubs_epi16(codes[2 * h + 1], broadcast4(q, 2 * h + 1)),
                        );
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(s16, sc16));
                    }
                }
            }
            for t in 0..C {
                let ab = &*ap.add(t * nb + b);
                let bs = ab.bsums.as_ptr() as *const i32;
                let mut osum = _mm256_setzero_si256();
                for pair in 0..8 {
                    let sp = _mm256_loadu_si256(p.add(Q6K_SC + 32 * pair) as *const __m256i);
                    let bcast = _mm256_set1_epi32(bs.add(pair).read_unaligned());
                    osum = _mm256_add_epi32(osum, _mm256_madd_epi16(sp, bcast));
                }
                let total = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(osum, 5));
                let scale = _mm256_mul_ps(d8, _mm256_set1_ps(ab.d));
                acc[t] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(total), acc[t]);
            }
        }
    }
    for t in 0..C {
        // SAFETY: `out[t]` is 8 floats.
        unsafe { _mm256_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
}
