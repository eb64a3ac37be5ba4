//! Quantized matrix × activations: `out[t, o] = Σ_i W[o, i] · x[t, i]`.
//!
//! Each thread owns a contiguous range of weight rows. It dequantizes
//! [`TILE`] rows at a time into its scratch (`crate::dequant`, bit-identical
//! to the reference `turbospark_core::quant::dequantize_row` and to ggml), then dots
//! every token's activations against them. The dot keeps eight f32 partial
//! sums (vectorisable) combined in a fixed order, and each output element is
//! computed the same way whatever the batch size, thread count or row split,
//! so one token through `matmul` gives the same bits as that token inside a
//! batch: decode and prefill agree exactly.
//!
//! Under [`Numerics::LlamaCpp`](turbospark_backend::Numerics::LlamaCpp)
//! quantized weights go through [`matmul_rows_quantized`] instead: the
//! activations arrive already quantized (`crate::ggml`), weight rows are
//! unpacked to 8-bit codes a tile at a time and dotted in integers.

use crate::dequant::dequantize;
use crate::disjoint::DisjointMut;
use crate::ggml::dot::{
    dot_codes, repacked, unpack_codes, ActRow, Lanes, Path, ScalarLanes, SCALES_PER_BLOCK,
    SUBS_PER_K_BLOCK,
};
use crate::ggml::quantize::{BlockQ8, BlockQ8K, QK8, QK_K};
use crate::types::CpuMatrix;
use turbospark_backend::BackendError;

/// Weight rows dequantized together (their f32 copy stays in L1/L2 while
/// every token of the batch is dotted against it).
pub(crate) const TILE: usize = 8;

/// `Σ a[i] · b[i]` over the common length, eight lanes then a fixed tree.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Computes output rows `rows` of `w` for `n` tokens into `out`
/// (`[n, w.rows]`), using `tile` (at least `TILE · w.cols`) as scratch and
/// `dot` for each dequantized row and activation row ([`dot`] itself,
/// except under llama.cpp numerics).
///
/// # Safety
/// Concurrent callers sharing `out` must pass disjoint `rows`.
pub(crate) unsafe fn matmul_rows<D: Fn(&[f32], &[f32]) -> f32>(
    w: &CpuMatrix,
    x: &[f32],
    n: usize,
    out: &DisjointMut<'_>,
    rows: std::ops::Range<usize>,
    tile: &mut [f32],
    dot: D,
) -> Result<(), BackendError> {
    let cols = w.cols;
    if tile.len() < TILE * cols {
        return Err(BackendError::ScratchTooSmall {
            op: "matmul",
            need: TILE * cols,
            have: tile.len(),
        });
    }
    let mut r = rows.start;
    while r < rows.end {
        let m = TILE.min(rows.end - r);
        for i in 0..m {
            dequantize(w.format, w.row(r + i), &mut tile[i * cols..(i + 1) * cols]).map_err(
                |source| BackendError::Quant {
                    name: w.name.clone(),
                    source,
                },
            )?;
        }
        for t in 0..n {
            let xt = &x[t * cols..(t + 1) * cols];
            // SAFETY: row range `r .. r + m` of token `t` lies inside this
            // caller's `rows`, which the contract keeps disjoint.
            let o = unsafe { out.range(t * w.rows + r, m) };
            for (i, o) in o.iter_mut().enumerate() {
                *o = dot(&tile[i * cols..(i + 1) * cols], xt);
            }
        }
        r += m;
    }
    Ok(())
}

/// [`TILE`] weight rows unpacked for the integer matmul: one code per
/// element, [`SCALES_PER_BLOCK`] scales per block and, for K-quants,
/// [`SUBS_PER_K_BLOCK`] sub-block scales per block.
#[derive(Default)]
pub(crate) struct CodeTile {
    codes: Vec<i8>,
    scales: Vec<f32>,
    subs: Vec<i32>,
}

impl CodeTile {
    /// Grows the tile for matrices of `fmt` with `cols` inputs.
    pub(crate) fn fit(&mut self, fmt: turbospark_core::QuantFormat, cols: usize) {
        if self.codes.len() < TILE * cols {
            self.codes.resize(TILE * cols, 0);
        }
        let (scales, subs) = Self::sizes(fmt, cols);
        if self.scales.len() < scales {
            self.scales.resize(scales, 0.0);
        }
        if self.subs.len() < subs {
            self.subs.resize(subs, 0);
        }
    }

    /// Scale and sub-block entries of [`TILE`] rows of `cols` inputs.
    fn sizes(fmt: turbospark_core::QuantFormat, cols: usize) -> (usize, usize) {
        let blocks = TILE * cols / fmt.block_elems();
        let subs = if fmt.block_elems() == QK_K {
            blocks * SUBS_PER_K_BLOCK
        } else {
            0
        };
        (blocks * SCALES_PER_BLOCK, subs)
    }

    fn holds(&self, w: &CpuMatrix) -> bool {
        let (scales, subs) = Self::sizes(w.format, w.cols);
        self.codes.len() >= TILE * w.cols && self.scales.len() >= scales && self.subs.len() >= subs
    }
}

/// The activation rows of an integer matmul, in the weight's `vec_dot_type`.
#[derive(Clone, Copy)]
pub(crate) enum QuantizedRows<'a> {
    /// `n` rows of `cols / 32` Q8_0 or Q8_1 blocks.
    Q8(&'a [BlockQ8]),
    /// `n` rows of `cols / 256` Q8_K blocks.
    Q8K(&'a [BlockQ8K]),
}

impl QuantizedRows<'_> {
    fn row(&self, t: usize, cols: usize) -> ActRow<'_> {
        match *self {
            QuantizedRows::Q8(a) => ActRow::Q8(&a[t * cols / QK8..(t + 1) * cols / QK8]),
            QuantizedRows::Q8K(a) => ActRow::Q8K(&a[t * cols / QK_K..(t + 1) * cols / QK_K]),
        }
    }
}

/// ggml's integer matmul: output rows `rows` of a block-quantized `w` for
/// `n` tokens whose activations `x` are already in `w`'s `vec_dot_type`,
/// into `out` (`[n, w.rows]`), using `tile` (fitted to `w`) to unpack
/// [`TILE`] weight rows at a time.
///
/// The kernels are scalar transcriptions of ggml's lanes; on CPUs with AVX2
/// and FMA they are compiled for those features, which lets the compiler
/// vectorise the integer sums and issue the fused multiply-adds as single
/// instructions (the results are the same bits either way).
///
/// # Safety
/// Concurrent callers sharing `out` must pass disjoint `rows`.
pub(crate) unsafe fn matmul_rows_quantized(
    w: &CpuMatrix,
    x: QuantizedRows<'_>,
    n: usize,
    out: &DisjointMut<'_>,
    rows: std::ops::Range<usize>,
    tile: &mut CodeTile,
) -> Result<(), BackendError> {
    if !tile.holds(w) {
        return Err(BackendError::ScratchTooSmall {
            op: "matmul",
            need: TILE * w.cols,
            have: tile.codes.len(),
        });
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the features `quantized_tiles_avx2` is
        // compiled for; the row contract is the caller's.
        unsafe { quantized_tiles_avx2(w, x, n, out, rows, tile) };
        return Ok(());
    }
    // SAFETY: scalar lanes need no CPU feature; the row contract is the
    // caller's.
    unsafe { quantized_tiles::<ScalarLanes>(w, x, n, out, rows, tile) };
    Ok(())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantized_tiles_avx2(
    w: &CpuMatrix,
    x: QuantizedRows<'_>,
    n: usize,
    out: &DisjointMut<'_>,
    rows: std::ops::Range<usize>,
    tile: &mut CodeTile,
) {
    // SAFETY: this function only runs on CPUs with AVX2 (its own
    // contract); the row contract is forwarded.
    unsafe { quantized_tiles::<crate::ggml::dot::Avx2Lanes>(w, x, n, out, rows, tile) }
}

/// The body of [`matmul_rows_quantized`] (`tile` already checked).
///
/// # Safety
/// The CPU has `L`'s features, and the row contract of
/// [`matmul_rows_quantized`] holds.
#[inline(always)]
unsafe fn quantized_tiles<L: Lanes>(
    w: &CpuMatrix,
    x: QuantizedRows<'_>,
    n: usize,
    out: &DisjointMut<'_>,
    rows: std::ops::Range<usize>,
    tile: &mut CodeTile,
) {
    let cols = w.cols;
    let (scales, subs) = CodeTile::sizes(w.format, cols);
    let (scales, subs) = (scales / TILE, subs / TILE);
    let repacked = repacked(w.format, w.rows);
    // llama.cpp's repacked kernels take a batch's rows in groups of four
    // (gemm) and the remainder one by one (gemv).
    let gemm_rows = if repacked { n - n % 4 } else { 0 };
    let mut r = rows.start;
    while r < rows.end {
        let m = TILE.min(rows.end - r);
        for i in 0..m {
            unpack_codes(
                w.format,
                w.row(r + i),
                &mut tile.codes[i * cols..(i + 1) * cols],
                &mut tile.scales[i * scales..(i + 1) * scales],
                &mut tile.subs[i * subs..(i + 1) * subs],
            );
        }
        for t in 0..n {
            let xt = x.row(t, cols);
            let path = if t < gemm_rows {
                Path::Gemm
            } else {
                Path::VecDot
            };
            // SAFETY: row range `r .. r + m` of token `t` lies inside this
            // caller's `rows`, which the contract keeps disjoint.
            let o = unsafe { out.range(t * w.rows + r, m) };
            for (i, o) in o.iter_mut().enumerate() {
                // SAFETY: the CPU has `L`'s features (this function's contract).
                *o = unsafe {
                    dot_codes::<L>(
                        w.format,
                        &tile.codes[i * cols..(i + 1) * cols],
                        &tile.scales[i * scales..(i + 1) * scales],
                        &tile.subs[i * subs..(i + 1) * subs],
                        xt,
                        repacked,
                        path,
                    )
                };
            }
        }
        r += m;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_f64_on_odd_lengths() {
        for n in [0usize, 1, 7, 8, 9, 31, 100] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - want).abs() < 1e-5, "n={n}");
        }
    }
}
