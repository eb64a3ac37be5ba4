//! x86-64 AVX2 + FMA + F16C fast-numerics kernels: one weight row against
//! `C ≤ TOKENS` activation rows, each weight block unpacked into registers
//! once and dotted with every activation row (`vpmaddubsw` of unsigned
//! weight codes and signed 8-bit activations, `vpmaddwd` to 32 bits, one
//! f32 multiply-add per block and row). The integer sums equal the scalar
//! kernels' (`super::scalar`); the f32 accumulation runs in 8 lanes, so
//! results agree with them to rounding. Block math: `super::blocks`.
//!
//! Every function here requires a CPU with AVX2, FMA and F16C; the caller
//! checks once ([`super::Isa::detect`]).

// The tiles index several parallel arrays (accumulators, rows, scales) by
// the same register index; iterator chains would obscure that.
#![allow(clippy::needless_range_loop)]
use super::act::{ActRows, Block256, Block32, QK256, QK32};
use super::avx2_ops::hsum;
use super::blocks::MXFP4_U;
use super::TOKENS;
use std::arch::x86_64::*;
use turbospark_core::QuantFormat;

// Formats as const-generic parameters of the kernels (shared with
// `avx2_packed`).
pub(super) const Q4_0: u8 = 0;
pub(super) const Q4_1: u8 = 1;
pub(super) const Q5_0: u8 = 2;
pub(super) const Q5_1: u8 = 3;
pub(super) const MXFP4: u8 = 4;
pub(super) const Q8_0: u8 = 5;
const Q4K: u8 = 6;
const Q5K: u8 = 7;
const Q6K: u8 = 8;
const F32: u8 = 9;
const F16: u8 = 10;
const BF16: u8 = 11;

/// `out[r · c_n + c] = Σ_i W_r[i] · x_{t0+c}[i]` for the `R = w.len()`
/// weight rows and `c_n = out.len() / R` activation rows; the tile shapes
/// are those of [`super::tile_rows`].
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; each of `w` holds one row of `cols`
/// elements of `format`, and `acts` holds rows `t0 .. t0 + c_n` of `cols`
/// activations in the shape `format` takes.
pub(crate) unsafe fn dot_tile(
    format: QuantFormat,
    w: &[&[u8]],
    cols: usize,
    acts: ActRows<'_>,
    t0: usize,
    out: &mut [f32],
) {
    macro_rules! by_shape {
        ($f:ident, $fmt:expr, $a:expr) => {
            match (w.len(), out.len()) {
                (1, 1) => $f::<{ $fmt }, 1, 1>(w, cols, $a, t0, out),
                (1, 2) => $f::<{ $fmt }, 1, 2>(w, cols, $a, t0, out),
                (1, 3) => $f::<{ $fmt }, 1, 3>(w, cols, $a, t0, out),
                (1, 4) => $f::<{ $fmt }, 1, TOKENS>(w, cols, $a, t0, out),
                (8, 8) => $f::<{ $fmt }, 8, 1>(w, cols, $a, t0, out),
                _ => unreachable!("tile of {} rows × {} outputs", w.len(), out.len()),
            }
        };
    }
    // SAFETY (all arms): forwarded from this function's contract; the
    // activation shape matches the format (`ActKind::of`).
    unsafe {
        match (format, acts) {
            (QuantFormat::Q4_0, ActRows::Q32(a)) => by_shape!(legacy, Q4_0, a),
            (QuantFormat::Q4_1, ActRows::Q32(a)) => by_shape!(legacy, Q4_1, a),
            (QuantFormat::Q5_0, ActRows::Q32(a)) => by_shape!(legacy, Q5_0, a),
            (QuantFormat::Q5_1, ActRows::Q32(a)) => by_shape!(legacy, Q5_1, a),
            (QuantFormat::Mxfp4, ActRows::Q32(a)) => by_shape!(legacy, MXFP4, a),
            (QuantFormat::Q8_0, ActRows::Q32(a)) => by_shape!(legacy, Q8_0, a),
            (QuantFormat::Q4K, ActRows::Q256(a)) => by_shape!(kquant, Q4K, a),
            (QuantFormat::Q5K, ActRows::Q256(a)) => by_shape!(kquant, Q5K, a),
            (QuantFormat::Q6K, ActRows::Q256(a)) => by_shape!(kquant, Q6K, a),
            (QuantFormat::F32, ActRows::F32(x)) => by_shape!(float, F32, x),
            (QuantFormat::F16, ActRows::F32(x)) => by_shape!(float, F16, x),
            (QuantFormat::Bf16, ActRows::F32(x)) => by_shape!(float, BF16, x),
            _ => super::scalar::dot_tile(format, w, cols, acts, t0, out),
        }
    }
}

/// The f16 at `p` (unaligned), widened.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller's pointer holds two readable bytes.
    let h = unsafe { (p as *const u16).read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// 16 bytes of nibbles as 32 byte codes: low nibbles then high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    // SAFETY: the caller's pointer holds 16 readable bytes.
    let t = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let both = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Byte `j` is 0x10 where bit `j` of the little-endian u32 at `p` is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn high_bits32(p: *const u8) -> __m256i {
    // SAFETY: the caller's pointer holds 4 readable bytes.
    let x = unsafe { (p as *const u32).read_unaligned() };
    let shuf = _mm256_set_epi64x(
        0x0303030303030303,
        0x0202020202020202,
        0x0101010101010101,
        0x0000000000000000,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let bit = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit), _mm256_set1_epi64x(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The 32 codes of one block of format `F` and its `(dw, mw)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy_block<const F: u8>(b: *const u8) -> (__m256i, f32, f32) {
    // SAFETY: `b` points at one whole block of format `F` (caller).
    unsafe {
        match F {
            Q4_0 => {
                let d = f16_at(b);
                (nibbles32(b.add(2)), d, -8.0 * d)
            }
            Q4_1 => (nibbles32(b.add(4)), f16_at(b), f16_at(b.add(2))),
            Q5_0 => {
                let d = f16_at(b);
                let u = _mm256_or_si256(nibbles32(b.add(6)), high_bits32(b.add(2)));
                (u, d, -16.0 * d)
            }
            Q5_1 => {
                let u = _mm256_or_si256(nibbles32(b.add(8)), high_bits32(b.add(4)));
                (u, f16_at(b), f16_at(b.add(2)))
            }
            MXFP4 => {
                let table = _mm_loadu_si128(MXFP4_U.as_ptr() as *const __m128i);
                let u = _mm256_shuffle_epi8(_mm256_set_m128i(table, table), nibbles32(b.add(1)));
                let d = super::blocks::e8m0_half(*b);
                (u, d, -12.0 * d)
            }
            _ => (
                _mm256_loadu_si256(b.add(2) as *const __m256i),
                f16_at(b),
                0.0,
            ),
        }
    }
}

/// Σ of the eight i32 lanes of `u · q` pairs: `vpmaddubsw` then `vpmaddwd`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_u8_i8(u: __m256i, q: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn legacy<const F: u8, const R: usize, const C: usize>(
    w: &[&[u8]],
    cols: usize,
    a: &[Block32],
    t0: usize,
    out: &mut [f32],
) {
    let nb = cols / QK32;
    let bb = match F {
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        MXFP4 => 17,
        _ => 34,
    };
    debug_assert!(w.iter().all(|w| w.len() >= nb * bb) && a.len() >= (t0 + C) * nb);
    let wp: [*const u8; R] = std::array::from_fn(|r| w[r].as_ptr());
    let ap = a[t0 * nb..].as_ptr();
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut macc = [[0f32; C]; R];
    for b in 0..nb {
        // The tokens' activation blocks, loaded once for the R rows.
        let mut q = [_mm256_setzero_si256(); C];
        let mut da = [0f32; C];
        let mut sa = [0f32; C];
        for c in 0..C {
            // SAFETY: activation row `t0 + c` has `nb` blocks; `qs` is 32
            // readable bytes.
            unsafe {
                let ab = &*ap.add(c * nb + b);
                q[c] = _mm256_loadu_si256(ab.qs.as_ptr() as *const __m256i);
                da[c] = ab.d;
                sa[c] = ab.s;
            }
        }
        for r in 0..R {
            // SAFETY: block `b < nb` lies inside row `r` (checked length).
            let (u, dw, mw) = unsafe { legacy_block::<F>(wp[r].add(b * bb)) };
            let (u, sign) = if F == Q8_0 {
                (_mm256_sign_epi8(u, u), u)
            } else {
                (u, _mm256_setzero_si256())
            };
            for c in 0..C {
                let qc = if F == Q8_0 {
                    _mm256_sign_epi8(q[c], sign)
                } else {
                    q[c]
                };
                let s = _mm256_cvtepi32_ps(dot_u8_i8(u, qc));
                acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * da[c]), s, acc[r][c]);
                if F != Q8_0 {
                    macc[r][c] += mw * sa[c];
                }
            }
        }
    }
    for r in 0..R {
        for c in 0..C {
            out[r * C + c] = hsum(acc[r][c]) + macc[r][c];
        }
    }
}

/// i16 lanes `[lo ×8 | hi ×8]`: per-16-element scales for a maddubs result.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair_scale(lo: i32, hi: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kquant<const F: u8, const R: usize, const C: usize>(
    w: &[&[u8]],
    cols: usize,
    a: &[Block256],
    t0: usize,
    out: &mut [f32],
) {
    let nb = cols / QK256;
    let bb = match F {
        Q4K => 144,
        Q5K => 176,
        _ => 210,
    };
    debug_assert!(w.iter().all(|w| w.len() >= nb * bb) && a.len() >= (t0 + C) * nb);
    let rows: [&[Block256]; C] = std::array::from_fn(|c| &a[(t0 + c) * nb..(t0 + c + 1) * nb]);
    let mut accs = [[_mm256_setzero_ps(); C]; R];
    let m4 = _mm256_set1_epi8(0x0F);
    for (b, r) in (0..nb).flat_map(|b| (0..R).map(move |r| (b, r))) {
        let acc = &mut accs[r];
        let blk = &w[r][b * bb..(b + 1) * bb];
        let p = blk.as_ptr();
        let mut isum = [_mm256_setzero_si256(); C];
        // SAFETY (loads below): every offset stays inside the block `blk`,
        // and every activation block has 256 codes and 16 sums.
        unsafe {
            if F == Q6K {
                let d = f16_at(p.add(208));
                let sc8 = _mm_loadu_si128(p.add(192) as *const __m128i);
                let sc16 = _mm256_cvtepi8_epi16(sc8);
                let scs: [i8; 16] = std::mem::transmute(sc8);
                for half in 0..2 {
                    let ql = p.add(64 * half);
                    let qh = _mm256_loadu_si256(p.add(128 + 32 * half) as *const __m256i);
                    let l0 = _mm256_loadu_si256(ql as *const __m256i);
                    let l1 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
                    let m3 = _mm256_set1_epi8(3);
                    let h = |shift: i32| {
                        let v = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift));
                        _mm256_slli_epi16(_mm256_and_si256(v, m3), 4)
                    };
                    let u = [
                        _mm256_or_si256(_mm256_and_si256(l0, m4), h(0)),
                        _mm256_or_si256(_mm256_and_si256(l1, m4), h(2)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), h(4)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), h(6)),
                    ];
                    let s = |j: usize| {
                        let k = 8 * half + 2 * j;
                        pair_scale(scs[k] as i32, scs[k + 1] as i32)
                    };
                    let sc = [s(0), s(1), s(2), s(3)];
                    for c in 0..C {
                        let q = rows[c][b].qs.as_ptr().add(128 * half);
                        for j in 0..4 {
                            let qa = _mm256_loadu_si256(q.add(32 * j) as *const __m256i);
                            let p16 = _mm256_maddubs_epi16(u[j], qa);
                            isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(p16, sc[j]));
                        }
                    }
                }
                for c in 0..C {
                    let ab = &rows[c][b];
                    let bs = _mm256_loadu_si256(ab.bsums.as_ptr() as *const __m256i);
                    let off = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
                    let total = _mm256_sub_epi32(isum[c], off);
                    acc[c] = _mm256_fmadd_ps(
                        _mm256_set1_ps(d * ab.d),
                        _mm256_cvtepi32_ps(total),
                        acc[c],
                    );
                }
            } else {
                let d = f16_at(p);
                let dmin = f16_at(p.add(2));
                let mut sc = [0i32; 8];
                let mut mins = [0i16; 16];
                for s in 0..8 {
                    let (scale, min) = super::blocks::scale_min_k4(&blk[4..16], s);
                    sc[s] = scale as i32;
                    mins[2 * s] = min as i16;
                    mins[2 * s + 1] = min as i16;
                }
                let mins = _mm256_loadu_si256(mins.as_ptr() as *const __m256i);
                let (qs, qh) = if F == Q5K {
                    (p.add(48), _mm256_loadu_si256(p.add(16) as *const __m256i))
                } else {
                    (p.add(16), _mm256_setzero_si256())
                };
                let one = _mm256_set1_epi8(1);
                for j in 0..4 {
                    let bytes = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
                    let mut lo = _mm256_and_si256(bytes, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), m4);
                    if F == Q5K {
                        let bit = |s: usize| {
                            let v = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s as i32));
                            _mm256_slli_epi16(_mm256_and_si256(v, one), 4)
                        };
                        lo = _mm256_or_si256(lo, bit(2 * j));
                        hi = _mm256_or_si256(hi, bit(2 * j + 1));
                    }
                    let slo = _mm256_set1_epi16(sc[2 * j] as i16);
                    let shi = _mm256_set1_epi16(sc[2 * j + 1] as i16);
                    for c in 0..C {
                        let q = rows[c][b].qs.as_ptr().add(64 * j);
                        let a0 = _mm256_loadu_si256(q as *const __m256i);
                        let a1 = _mm256_loadu_si256(q.add(32) as *const __m256i);
                        let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a0), slo);
                        let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a1), shi);
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_add_epi32(p0, p1));
                    }
                }
                for c in 0..C {
                    let ab = &rows[c][b];
                    let bs = _mm256_loadu_si256(ab.bsums.as_ptr() as *const __m256i);
                    let msum = _mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mins));
                    let main = _mm256_cvtepi32_ps(isum[c]);
                    acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d * ab.d), main, acc[c]);
                    acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(-dmin * ab.d), msum, acc[c]);
                }
            }
        }
    }
    for r in 0..R {
        for c in 0..C {
            out[r * C + c] = hsum(accs[r][c]);
        }
    }
}

/// Eight weights of a float row starting at element `i`, widened to f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float8<const F: u8>(w: *const u8, i: usize) -> __m256 {
    // SAFETY: the caller keeps `i + 8` within the row.
    unsafe {
        match F {
            F32 => _mm256_loadu_ps(w.add(4 * i) as *const f32),
            F16 => _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * i) as *const __m128i)),
            _ => {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(w.add(2 * i) as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float<const F: u8, const R: usize, const C: usize>(
    w: &[&[u8]],
    cols: usize,
    x: &[f32],
    t0: usize,
    out: &mut [f32],
) {
    let width = if F == F32 { 4 } else { 2 };
    debug_assert!(w.iter().all(|w| w.len() >= cols * width) && x.len() >= (t0 + C) * cols);
    let format = match F {
        F32 => QuantFormat::F32,
        F16 => QuantFormat::F16,
        _ => QuantFormat::Bf16,
    };
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let body = cols - cols % 8;
    let mut i = 0;
    while i < body {
        for r in 0..R {
            // SAFETY: `i + 8 ≤ cols`; every activation row has `cols` values.
            unsafe {
                let wv = float8::<F>(w[r].as_ptr(), i);
                for c in 0..C {
                    let xv = _mm256_loadu_ps(x.as_ptr().add((t0 + c) * cols + i));
                    acc[r][c] = _mm256_fmadd_ps(wv, xv, acc[r][c]);
                }
            }
        }
        i += 8;
    }
    for r in 0..R {
        for c in 0..C {
            let xt = &x[(t0 + c) * cols..(t0 + c + 1) * cols];
            let tail: f32 = (body..cols)
                .map(|i| super::blocks::float_at(format, w[r], i) * xt[i])
                .sum();
            out[r * C + c] = hsum(acc[r][c]) + tail;
        }
    }
}
