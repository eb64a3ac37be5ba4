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

use crate::dequant::dequantize;
use crate::disjoint::DisjointMut;
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
/// (`[n, w.rows]`), using `tile` (at least `TILE · w.cols`) as scratch.
///
/// # Safety
/// Concurrent callers sharing `out` must pass disjoint `rows`.
pub(crate) unsafe fn matmul_rows(
    w: &CpuMatrix,
    x: &[f32],
    n: usize,
    out: &DisjointMut<'_>,
    rows: std::ops::Range<usize>,
    tile: &mut [f32],
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
