//! The per-head matmul ([`HeadMatmul`]): one small matrix per head, stored
//! as row blocks of one weight, applied as it is or transposed:
//!
//! ```text
//! plain:      out[t, h, o] = Σ_i W_h[o, i] · x[t, h, i]
//! transposed: out[t, h, j] = Σ_i W_h[i, j] · x[t, h, i]
//! ```
//!
//! Latent attention multiplies by DeepSeek's `attn_kv_b` this way, in its
//! own format, instead of folding it into other matrices at load.
//!
//! Each thread owns a range of heads. It dequantizes [`TILE`] rows of a
//! head at a time into its scratch (`crate::dequant`, bit-identical to the
//! reference dequantization). Plain: every token's input is dotted against
//! each row with [`matmul::dot`], as [`Stream::matmul`] dots a row.
//! Transposed: each token's output starts at zero and adds `x[t, h, i] ·
//! W_h[i]` for `i = 0, 1, …` in f32. Either way an output depends only on
//! its own token's input, computed the same way whatever the batch, thread
//! count or split, in every numerics mode.
//!
//! [`Stream::matmul`]: turbospark_backend::Stream::matmul

use crate::dequant::dequantize;
use crate::disjoint::DisjointMut;
use crate::matmul::{self, TILE};
use crate::pool::split;
use crate::pool::Pool;
use crate::scratch::ThreadScratch;
use crate::stream::parallel;
use crate::types::CpuMatrix;
use turbospark_backend::{BackendError, HeadMatmul};

/// Runs `p` (already checked against `w`, `x` and `out`).
pub(crate) fn head_matmul(
    pool: &Pool,
    threads: &mut [ThreadScratch],
    w: &CpuMatrix,
    x: &[f32],
    p: &HeadMatmul,
    out: &mut [f32],
) -> Result<(), BackendError> {
    let out = DisjointMut::new(out);
    let work = p.n_tokens * p.n_heads * p.rows * w.cols;
    parallel(pool, threads, work, &|i, parts, s| {
        for h in split(p.n_heads, parts, i) {
            // SAFETY: `split` gives every part disjoint heads, and a head's
            // outputs (`out_at .. out_at + width` of its token rows, within
            // the stride by `HeadMatmul::check`) are disjoint from every
            // other head's.
            if let Err(e) = unsafe { head(w, x, p, h, &out, &mut s.tile) } {
                s.error = Some(e);
                return;
            }
        }
    })
}

/// Head `h` of `p` for every token.
///
/// # Safety
/// Concurrent callers sharing `out` must pass different heads.
unsafe fn head(
    w: &CpuMatrix,
    x: &[f32],
    p: &HeadMatmul,
    h: usize,
    out: &DisjointMut<'_>,
    tile: &mut [f32],
) -> Result<(), BackendError> {
    let cols = w.cols;
    if tile.len() < TILE * cols {
        return Err(BackendError::ScratchTooSmall {
            op: "head_matmul",
            need: TILE * cols,
            have: tile.len(),
        });
    }
    let (input, output) = p.widths(cols);
    let row0 = h * p.head_stride + p.first_row;
    if p.transpose {
        for t in 0..p.n_tokens {
            let r = t * p.n_heads + h;
            // SAFETY: this head's output of token `t`; see the caller.
            unsafe { out.range(r * p.out_stride + p.out_at, output) }.fill(0.0);
        }
    }
    let mut i0 = 0;
    while i0 < p.rows {
        let m = TILE.min(p.rows - i0);
        for k in 0..m {
            dequantize(
                w.format,
                w.row(row0 + i0 + k),
                &mut tile[k * cols..(k + 1) * cols],
            )
            .map_err(|source| BackendError::Quant {
                name: w.name.clone(),
                source,
            })?;
        }
        for t in 0..p.n_tokens {
            let r = t * p.n_heads + h;
            let xin = &x[r * p.x_stride + p.x_at..][..input];
            // SAFETY: this head's output of token `t`; see the caller.
            let o = unsafe { out.range(r * p.out_stride + p.out_at, output) };
            for k in 0..m {
                let row = &tile[k * cols..(k + 1) * cols];
                if p.transpose {
                    let xi = xin[i0 + k];
                    for (v, &wv) in o.iter_mut().zip(row) {
                        *v += xi * wv;
                    }
                } else {
                    o[i0 + k] = matmul::dot(row, xin);
                }
            }
        }
        i0 += m;
    }
    Ok(())
}
