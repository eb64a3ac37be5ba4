//! ggml's quantized dot products as llama.cpp runs them on x86-64 with
//! AVX2 / AVX-512 (normative: `ggml_vec_dot_*` in llama.cpp's
//! `ggml/src/ggml-cpu/arch/x86/quants.c`, `ggml_gemv_q4_K_8x8_q8_K` and
//! `ggml_gemm_q4_K_8x8_q8_K` in `arch/x86/repack.cpp`, and
//! `tinyBLAS_Q0_AVX` in `llamafile/sgemm.cpp`, whose per-element arithmetic
//! equals the `vec_dot` one).
//!
//! Integer sums are exact, so only the float steps need to follow ggml,
//! and they must follow it exactly: a last-bit difference in one dot can
//! flip a later rounding to f16 or to 8 bits, and attention over large
//! scores amplifies such flips. Each kernel is therefore transcribed lane
//! by lane. With `lane_l(c)` the sum of the four products of elements
//! `4l … 4l + 3` of a 32-element chunk `c` (what `_mm256_dpbusd_epi32` or
//! `maddubs` + `madd` leave in 32-bit lane `l`), `fma` a fused
//! multiply-add and `hsum8(v) = ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))`:
//!
//! ```text
//! Q8_0, Q5_0, Q4_0   acc_l = fma(d_w · d_a, lane_l, acc_l) per block;  hsum8(acc)
//! Q4_1, Q5_1         the same, plus summs = fma(m_w, s_a, summs);  hsum8(acc) + summs
//! MXFP4              blocks alternate between two accumulators, scale d_a · e8m0_half(e);
//!                    hsum8(acc1 + acc2), an odd last block added as sumf = fma(d, sumi, sumf)
//! Q4_K (vec_dot)     lane_l = Σ_s sc_s · lane_l(s) (i32);  acc_l = fma(d_a · d_w, lane_l, acc_l)
//!                    four min lanes k: fma(−d_a · dmin_w, m_2k·S_2k + m_2k+1·S_2k+1, ·)
//!                    (S_s the sum of sub-block s's codes); hsum8(acc) + ((m0 + m2) + (m1 + m3))
//! Q4_K (repacked 8×8, every matrix with a multiple of 8 rows):
//!   gemv, one accumulator:  acc = fma(Σ_s sc_s · dot_s, d_w · d_a, acc) per super-block,
//!                           mins alike with dmin_w · d_a;  acc − acc_min
//!   gemm, groups of 4 rows: the same per pair of sub-blocks instead of per super-block
//! Q5_K               as Q4_K (vec_dot), the mins summed as summs = fma(−d_a · dmin_w, Σ, summs)
//! Q6_K               codes 0…63; lane_l = Σ_c sc · lane_l(c) − 32 · (bs_2l · sc_2l + bs_2l+1 · sc_2l+1);
//!                    acc_l = fma(d_a · d_w, lane_l, acc_l); hsum8(acc)
//! ```
//!
//! llama.cpp sends the first `n − n mod 4` rows of a batch of `n` through
//! the repacked Q4_K gemm and the rest through the gemv; [`Path`] says which.

use super::quantize::{BlockQ8, BlockQ8K, QK8, QK_K};
use crate::dequant::{e8m0_half, scale_min_k4, KVALUES};
use turbospark_core::QuantFormat;

/// f32 scales [`unpack_codes`] extracts per block.
pub(crate) const SCALES_PER_BLOCK: usize = 2;
/// Integer sub-block scales [`unpack_codes`] extracts per K-quant block.
pub(crate) const SUBS_PER_K_BLOCK: usize = 16;

#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `hsum_float_8` of ggml's x86 kernels (and tinyBLAS's `hsum(__m256)`).
#[inline(always)]
pub(crate) fn hsum8(v: &[f32; 8]) -> f32 {
    ((v[4] + v[0]) + (v[6] + v[2])) + ((v[5] + v[1]) + (v[7] + v[3]))
}

/// How the eight 32-bit lanes of a 32-element integer dot are computed:
/// lane `l` sums the products of elements `4l … 4l + 3` (exact in i32).
///
/// # Safety
/// [`Lanes::lanes4`] may use instructions of a CPU feature; callers
/// guarantee that the CPU has it (see the implementations).
pub(crate) unsafe trait Lanes {
    /// The lanes of `w[..32] · a[..32]`.
    ///
    /// # Safety
    /// The CPU has the implementation's features.
    unsafe fn lanes4(w: &[i8], a: &[i8]) -> [i32; 8];

    /// The lanes of `w[..32] · a[..32]` times `lo` (lanes 0-3, the first
    /// 16 elements) or `hi` (lanes 4-7).
    ///
    /// # Safety
    /// The CPU has the implementation's features.
    #[inline(always)]
    unsafe fn lanes4_scaled(w: &[i8], a: &[i8], lo: i16, hi: i16) -> [i32; 8] {
        // SAFETY: forwarded.
        let lanes = unsafe { Self::lanes4(w, a) };
        std::array::from_fn(|l| lanes[l] * i32::from(if l < 4 { lo } else { hi }))
    }
}

/// Portable lanes.
pub(crate) struct ScalarLanes;

// SAFETY: uses no CPU feature.
unsafe impl Lanes for ScalarLanes {
    #[inline(always)]
    unsafe fn lanes4(w: &[i8], a: &[i8]) -> [i32; 8] {
        let mut out = [0i32; 8];
        for (o, (w, a)) in out
            .iter_mut()
            .zip(w[..32].chunks_exact(4).zip(a[..32].chunks_exact(4)))
        {
            *o = (0..4)
                .map(|k| i32::from(i16::from(w[k]) * i16::from(a[k])))
                .sum();
        }
        out
    }
}

/// Lanes from AVX2's `maddubs` + `madd`, as ggml computes them. The
/// 16-bit pair sums cannot saturate: codes are at most 128 in magnitude
/// and activations at most 127, so a pair is at most 32512.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Avx2Lanes;

// SAFETY: `lanes4` needs AVX2, which its contract makes the caller check.
#[cfg(target_arch = "x86_64")]
unsafe impl Lanes for Avx2Lanes {
    #[inline(always)]
    unsafe fn lanes4(w: &[i8], a: &[i8]) -> [i32; 8] {
        use std::arch::x86_64::*;
        let (w, a) = (&w[..32], &a[..32]);
        let mut out = [0i32; 8];
        // SAFETY: the caller guarantees AVX2; the unaligned loads read the
        // 32 bytes of `w` and `a`, the store writes the 32 bytes of `out`.
        unsafe {
            let wv = _mm256_loadu_si256(w.as_ptr().cast());
            let av = _mm256_loadu_si256(a.as_ptr().cast());
            let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv));
            let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
            _mm256_storeu_si256(out.as_mut_ptr().cast(), quads);
        }
        out
    }

    #[inline(always)]
    unsafe fn lanes4_scaled(w: &[i8], a: &[i8], lo: i16, hi: i16) -> [i32; 8] {
        use std::arch::x86_64::*;
        let (w, a) = (&w[..32], &a[..32]);
        let mut out = [0i32; 8];
        // SAFETY: as in `lanes4`. The scale multiplies the 16-bit pair sums
        // inside `madd`, as ggml's K-quant kernels do; the products of a
        // pair sum (at most 32512) and an 8-bit scale are exact in i32.
        unsafe {
            let wv = _mm256_loadu_si256(w.as_ptr().cast());
            let av = _mm256_loadu_si256(a.as_ptr().cast());
            let pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv));
            let scale = _mm256_setr_m128i(_mm_set1_epi16(lo), _mm_set1_epi16(hi));
            _mm256_storeu_si256(out.as_mut_ptr().cast(), _mm256_madd_epi16(pairs, scale));
        }
        out
    }
}

/// `Σ w_i · a_i` over a 32-element chunk, exact in i32.
///
/// # Safety
/// The CPU has `L`'s features.
#[inline(always)]
unsafe fn dot_i8<L: Lanes>(w: &[i8], a: &[i8]) -> i32 {
    // SAFETY: forwarded.
    unsafe { L::lanes4(w, a) }.iter().sum()
}

/// Codes of a 32-element block whose 16 bytes `qs` hold element `j` in the
/// low nibble of byte `j` and element `j + 16` in the high nibble, plus the
/// fifth bits `qh` (bit `j` for element `j`) when given, minus `offset`.
#[inline(always)]
fn nibble_codes(qs: &[u8], qh: Option<u32>, offset: i8, out: &mut [i8]) {
    // Eight codes at a time in a u64: nibbles masked out of the packed
    // bytes, fifth bits spread from a byte of `qh` by a table.
    const LOW: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    let word = |at: usize| u64::from_le_bytes(qs[at..at + 8].try_into().unwrap_or([0; 8]));
    let (w0, w1) = (word(0), word(8));
    let mut words = [w0 & LOW, w1 & LOW, (w0 >> 4) & LOW, (w1 >> 4) & LOW];
    if let Some(h) = qh {
        for (k, w) in words.iter_mut().enumerate() {
            *w |= FIFTH_BITS[((h >> (8 * k)) & 0xFF) as usize];
        }
    }
    for (o, w) in out.chunks_exact_mut(8).zip(words) {
        for (o, b) in o.iter_mut().zip(w.to_le_bytes()) {
            *o = b as i8 - offset;
        }
    }
}

/// `FIFTH_BITS[b]` has byte `k` equal to `16 · bit k of b`.
const FIFTH_BITS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut k = 0;
        while k < 8 {
            if (b >> k) & 1 == 1 {
                t[b] |= 0x10 << (8 * k);
            }
            k += 1;
        }
        b += 1;
    }
    t
};

/// Unpacks one row of `fmt` (`bytes` exactly `codes.len()` elements of it)
/// to the 8-bit codes ggml's x86 kernels multiply: signed for Q8_0, Q4_0
/// (nibble − 8), Q5_0 (− 16) and MXFP4 (`kvalues`), unsigned for the
/// formats with a min (Q4_1, Q5_1, Q4_K, Q5_K) and for Q6_K (0 … 63, the
/// −32 is applied through the activation sums); to two f32 scales per
/// block in `scales` ([`SCALES_PER_BLOCK`]): `d` and the min scale (`m`,
/// `dmin`; 0 where the format has none), `e8m0_half(e)` for MXFP4; and,
/// for the K-quants, to [`SUBS_PER_K_BLOCK`] integer sub-block values per
/// block in `subs`: the eight 6-bit scales then the eight mins (Q4_K,
/// Q5_K), or the sixteen signed scales (Q6_K). `fmt` must be
/// block-quantized.
#[inline(always)]
pub(crate) fn unpack_codes(
    fmt: QuantFormat,
    bytes: &[u8],
    codes: &mut [i8],
    scales: &mut [f32],
    subs: &mut [i32],
) {
    let (bb, be) = (fmt.block_bytes(), fmt.block_elems());
    let (d_at, m_at) = match fmt {
        QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q4K | QuantFormat::Q5K => (0, Some(2)),
        QuantFormat::Q6K => (208, None),
        _ => (0, None),
    };
    for (b, s) in bytes
        .chunks_exact(bb)
        .zip(scales.chunks_exact_mut(SCALES_PER_BLOCK))
    {
        s[0] = if fmt == QuantFormat::Mxfp4 {
            e8m0_half(b[0])
        } else {
            f16_at(b, d_at)
        };
        s[1] = m_at.map_or(0.0, |at| f16_at(b, at));
    }
    match fmt {
        QuantFormat::Q4K | QuantFormat::Q5K => {
            for (b, sub) in bytes
                .chunks_exact(bb)
                .zip(subs.chunks_exact_mut(SUBS_PER_K_BLOCK))
            {
                for s in 0..8 {
                    let (sc, m) = scale_min_k4(&b[4..16], s);
                    (sub[s], sub[8 + s]) = (i32::from(sc), i32::from(m));
                }
            }
        }
        QuantFormat::Q6K => {
            for (b, sub) in bytes
                .chunks_exact(bb)
                .zip(subs.chunks_exact_mut(SUBS_PER_K_BLOCK))
            {
                for (o, &v) in sub.iter_mut().zip(&b[192..208]) {
                    *o = i32::from(v as i8);
                }
            }
        }
        _ => {}
    }
    let blocks = bytes.chunks_exact(bb).zip(codes.chunks_exact_mut(be));
    match fmt {
        QuantFormat::Q8_0 => {
            for (b, c) in blocks {
                for (c, &q) in c.iter_mut().zip(&b[2..34]) {
                    *c = q as i8;
                }
            }
        }
        QuantFormat::Q4_0 => blocks.for_each(|(b, c)| nibble_codes(&b[2..18], None, 8, c)),
        QuantFormat::Q4_1 => blocks.for_each(|(b, c)| nibble_codes(&b[4..20], None, 0, c)),
        QuantFormat::Q5_0 => blocks.for_each(|(b, c)| {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            nibble_codes(&b[6..22], Some(qh), 16, c)
        }),
        QuantFormat::Q5_1 => blocks.for_each(|(b, c)| {
            let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            nibble_codes(&b[8..24], Some(qh), 0, c)
        }),
        QuantFormat::Mxfp4 => {
            for (b, c) in blocks {
                let (lo, hi) = c.split_at_mut(16);
                for j in 0..16 {
                    lo[j] = KVALUES[usize::from(b[1 + j] & 0x0F)];
                    hi[j] = KVALUES[usize::from(b[1 + j] >> 4)];
                }
            }
        }
        QuantFormat::Q4K => {
            for (b, c) in blocks {
                // Sub-blocks 2j and 2j + 1 share 32 bytes: low and high nibbles.
                for (qs, c) in b[16..144].chunks_exact(32).zip(c.chunks_exact_mut(64)) {
                    let (lo, hi) = c.split_at_mut(32);
                    for l in 0..32 {
                        lo[l] = (qs[l] & 0x0F) as i8;
                        hi[l] = (qs[l] >> 4) as i8;
                    }
                }
            }
        }
        QuantFormat::Q5K => {
            for (b, c) in blocks {
                let qh = &b[16..48];
                for (j, (qs, c)) in b[48..176]
                    .chunks_exact(32)
                    .zip(c.chunks_exact_mut(64))
                    .enumerate()
                {
                    let (lo, hi) = c.split_at_mut(32);
                    for l in 0..32 {
                        lo[l] = ((qs[l] & 0x0F) | (((qh[l] >> (2 * j)) & 1) << 4)) as i8;
                        hi[l] = ((qs[l] >> 4) | (((qh[l] >> (2 * j + 1)) & 1) << 4)) as i8;
                    }
                }
            }
        }
        QuantFormat::Q6K => {
            for (b, c) in blocks {
                for h in 0..2 {
                    let ql = &b[64 * h..64 * h + 64];
                    let qh = &b[128 + 32 * h..128 + 32 * h + 32];
                    let c = &mut c[128 * h..128 * h + 128];
                    for l in 0..32 {
                        let high = |k: usize| ((qh[l] >> (2 * k)) & 3) << 4;
                        c[l] = ((ql[l] & 0x0F) | high(0)) as i8;
                        c[l + 32] = ((ql[l + 32] & 0x0F) | high(1)) as i8;
                        c[l + 64] = ((ql[l] >> 4) | high(2)) as i8;
                        c[l + 96] = ((ql[l + 32] >> 4) | high(3)) as i8;
                    }
                }
            }
        }
        QuantFormat::F32 | QuantFormat::F16 | QuantFormat::Bf16 => {
            unreachable!("float weights are not dotted in integers")
        }
    }
}

/// A quantized activation row, in the weight format's `vec_dot_type`.
#[derive(Clone, Copy)]
pub(crate) enum ActRow<'a> {
    /// Q8_0 (or Q8_1) blocks of 32.
    Q8(&'a [BlockQ8]),
    /// Q8_K blocks of 256.
    Q8K(&'a [BlockQ8K]),
}

/// Which of llama.cpp's kernels handles a row of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// `ggml_vec_dot_*`, tinyBLAS, or the repacked Q4_K gemv.
    VecDot,
    /// The repacked Q4_K gemm (rows in groups of four).
    Gemm,
}

/// Whether llama.cpp on x86 repacks a matrix of `fmt` with `rows` rows
/// into interleaved 8-row blocks (and so uses its gemv/gemm kernels).
pub(crate) fn repacked(fmt: QuantFormat, rows: usize) -> bool {
    fmt == QuantFormat::Q4K && rows.is_multiple_of(8)
}

/// The dot of a weight row of `fmt` (`codes`, `scales` and `subs` from
/// [`unpack_codes`]) with an activation row, as llama.cpp's x86 kernel for
/// `path` computes it; `repacked` as [`repacked`] says for the matrix.
///
/// # Safety
/// The CPU has `L`'s features.
#[inline(always)]
pub(crate) unsafe fn dot_codes<L: Lanes>(
    fmt: QuantFormat,
    codes: &[i8],
    scales: &[f32],
    subs: &[i32],
    act: ActRow<'_>,
    repacked: bool,
    path: Path,
) -> f32 {
    match (fmt, act) {
        (QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0, ActRow::Q8(a)) => {
            let mut acc = [0f32; 8];
            for ((s, c), y) in scales.chunks_exact(2).zip(codes.chunks_exact(QK8)).zip(a) {
                let d = s[0] * y.d;
                // SAFETY: forwarded contract.
                let lanes = unsafe { L::lanes4(c, &y.qs) };
                for l in 0..8 {
                    acc[l] = d.mul_add(lanes[l] as f32, acc[l]);
                }
            }
            hsum8(&acc)
        }
        (QuantFormat::Q4_1 | QuantFormat::Q5_1, ActRow::Q8(a)) => {
            let mut acc = [0f32; 8];
            let mut summs = 0f32;
            for ((s, c), y) in scales.chunks_exact(2).zip(codes.chunks_exact(QK8)).zip(a) {
                summs = s[1].mul_add(y.s, summs);
                let d = s[0] * y.d;
                // SAFETY: forwarded contract.
                let lanes = unsafe { L::lanes4(c, &y.qs) };
                for l in 0..8 {
                    acc[l] = d.mul_add(lanes[l] as f32, acc[l]);
                }
            }
            hsum8(&acc) + summs
        }
        (QuantFormat::Mxfp4, ActRow::Q8(a)) => {
            let mut acc = [[0f32; 8]; 2];
            let pairs = a.len() / 2;
            for (i, ((s, c), y)) in scales
                .chunks_exact(2)
                .zip(codes.chunks_exact(QK8))
                .zip(a)
                .take(2 * pairs)
                .enumerate()
            {
                let d = y.d * s[0];
                // SAFETY: forwarded contract.
                let lanes = unsafe { L::lanes4(c, &y.qs) };
                for l in 0..8 {
                    acc[i % 2][l] = d.mul_add(lanes[l] as f32, acc[i % 2][l]);
                }
            }
            let sum: [f32; 8] = std::array::from_fn(|l| acc[0][l] + acc[1][l]);
            let mut sumf = hsum8(&sum);
            if a.len() % 2 == 1 {
                let last = a.len() - 1;
                let y = &a[last];
                let d = y.d * scales[2 * last];
                // SAFETY: forwarded contract.
                let sumi = unsafe { dot_i8::<L>(&codes[last * QK8..], &y.qs) };
                sumf = d.mul_add(sumi as f32, sumf);
            }
            sumf
        }
        (QuantFormat::Q4K, ActRow::Q8K(a)) if repacked => {
            // SAFETY: forwarded contract.
            unsafe { q4_k_repacked::<L>(codes, scales, subs, a, path) }
        }
        (QuantFormat::Q4K | QuantFormat::Q5K, ActRow::Q8K(a)) => {
            let mut acc = [0f32; 8];
            let mut acc_m = [0f32; 4];
            let mut summs = 0f32;
            for (((sub, s), c), y) in subs
                .chunks_exact(SUBS_PER_K_BLOCK)
                .zip(scales.chunks_exact(2))
                .zip(codes.chunks_exact(QK_K))
                .zip(a)
            {
                let (d, dmin) = (y.d * s[0], -y.d * s[1]);
                let mut sumi = [0i32; 8];
                let mut mins = [0i32; 8];
                for (s, (c, q)) in c.chunks_exact(32).zip(y.qs.chunks_exact(32)).enumerate() {
                    let sc = sub[s] as i16;
                    // SAFETY: forwarded contract.
                    let lanes = unsafe { L::lanes4_scaled(c, q, sc, sc) };
                    for l in 0..8 {
                        sumi[l] += lanes[l];
                    }
                    mins[s] =
                        sub[8 + s] * (i32::from(y.bsums[2 * s]) + i32::from(y.bsums[2 * s + 1]));
                }
                for l in 0..8 {
                    acc[l] = d.mul_add(sumi[l] as f32, acc[l]);
                }
                if fmt == QuantFormat::Q4K {
                    for k in 0..4 {
                        acc_m[k] = dmin.mul_add((mins[2 * k] + mins[2 * k + 1]) as f32, acc_m[k]);
                    }
                } else {
                    summs = dmin.mul_add(mins.iter().sum::<i32>() as f32, summs);
                }
            }
            let m = if fmt == QuantFormat::Q4K {
                (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3])
            } else {
                summs
            };
            hsum8(&acc) + m
        }
        (QuantFormat::Q6K, ActRow::Q8K(a)) => {
            let mut acc = [0f32; 8];
            for (((sub, s), c), y) in subs
                .chunks_exact(SUBS_PER_K_BLOCK)
                .zip(scales.chunks_exact(2))
                .zip(codes.chunks_exact(QK_K))
                .zip(a)
            {
                let mut sumi = [0i32; 8];
                for (ch, (c, q)) in c.chunks_exact(32).zip(y.qs.chunks_exact(32)).enumerate() {
                    let (lo, hi) = (sub[2 * ch] as i16, sub[2 * ch + 1] as i16);
                    // SAFETY: forwarded contract.
                    let lanes = unsafe { L::lanes4_scaled(c, q, lo, hi) };
                    for l in 0..8 {
                        sumi[l] += lanes[l];
                    }
                }
                for l in 0..8 {
                    let offset = i32::from(y.bsums[2 * l]) * sub[2 * l]
                        + i32::from(y.bsums[2 * l + 1]) * sub[2 * l + 1];
                    sumi[l] -= offset << 5;
                }
                let d = y.d * s[0];
                for l in 0..8 {
                    acc[l] = d.mul_add(sumi[l] as f32, acc[l]);
                }
            }
            hsum8(&acc)
        }
        _ => unreachable!("{fmt} dotted against activations of another vec_dot_type"),
    }
}

/// The repacked Q4_K kernels (gemv and gemm of `repack.cpp`) for one
/// weight row and one activation row.
///
/// # Safety
/// The CPU has `L`'s features.
#[inline(always)]
unsafe fn q4_k_repacked<L: Lanes>(
    codes: &[i8],
    scales: &[f32],
    subs: &[i32],
    a: &[BlockQ8K],
    path: Path,
) -> f32 {
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (((sub, s), c), y) in subs
        .chunks_exact(SUBS_PER_K_BLOCK)
        .zip(scales.chunks_exact(2))
        .zip(codes.chunks_exact(QK_K))
        .zip(a)
    {
        let (d, dmin) = (s[0] * y.d, s[1] * y.d);
        // Integer sums are exact in any order: scaled lanes are summed per
        // pair of sub-blocks and reduced once per pair.
        let mut pair = [0i32; 4];
        let mut min = [0i32; 4];
        for (p, (c, q)) in c.chunks_exact(64).zip(y.qs.chunks_exact(64)).enumerate() {
            let mut lanes = [0i32; 8];
            for h in 0..2 {
                let s = 2 * p + h;
                let sc = sub[s] as i16;
                // SAFETY: forwarded contract.
                let l = unsafe { L::lanes4_scaled(&c[32 * h..], &q[32 * h..], sc, sc) };
                for k in 0..8 {
                    lanes[k] += l[k];
                }
                min[p] += sub[8 + s] * (i32::from(y.bsums[2 * s]) + i32::from(y.bsums[2 * s + 1]));
            }
            pair[p] = lanes.iter().sum();
        }
        match path {
            Path::VecDot => {
                acc = (pair.iter().sum::<i32>() as f32).mul_add(d, acc);
                acc_min = (min.iter().sum::<i32>() as f32).mul_add(dmin, acc_min);
            }
            Path::Gemm => {
                for p in 0..4 {
                    acc = (pair[p] as f32).mul_add(d, acc);
                    acc_min = (min[p] as f32).mul_add(dmin, acc_min);
                }
            }
        }
    }
    acc - acc_min
}
