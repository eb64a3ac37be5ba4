//! Portable fast-numerics kernels: one weight row against up to
//! [`TOKENS`](super::TOKENS) activation rows, in the integer form of
//! [`super::blocks`]. They run where no SIMD kernel applies and are the
//! reference the SIMD kernels are tested against.

use super::act::{ActRows, Block256, Block32, QK256, QK32};
use super::blocks::{float_at, legacy_block, KBlock};
use turbospark_core::QuantFormat;

/// `out[r · c_n + c] = Σ_i W_r[i] · x_{t0+c}[i]` for the packed weight rows
/// `w` (each `cols` elements) and `c_n = out.len() / w.len()` activation
/// rows.
pub(crate) fn dot_tile(
    format: QuantFormat,
    w: &[&[u8]],
    cols: usize,
    acts: ActRows<'_>,
    t0: usize,
    out: &mut [f32],
) {
    let c_n = out.len() / w.len();
    for (w, out) in w.iter().zip(out.chunks_exact_mut(c_n)) {
        dot_row(format, w, cols, acts, t0, out);
    }
}

/// `out[c] = Σ_i W[i] · x_{t0+c}[i]` for one weight row.
fn dot_row(
    format: QuantFormat,
    w: &[u8],
    cols: usize,
    acts: ActRows<'_>,
    t0: usize,
    out: &mut [f32],
) {
    match acts {
        ActRows::F32(x) => {
            for (c, o) in out.iter_mut().enumerate() {
                let xt = &x[(t0 + c) * cols..(t0 + c + 1) * cols];
                *o = xt
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| float_at(format, w, i) * v)
                    .sum();
            }
        }
        ActRows::Q32(a) => legacy(format, w, cols / QK32, a, t0, out),
        ActRows::Q256(a) => kquant(format, w, cols / QK256, a, t0, out),
    }
}

fn legacy(format: QuantFormat, w: &[u8], nb: usize, a: &[Block32], t0: usize, out: &mut [f32]) {
    let bb = format.block_bytes();
    let mut u = [0i32; 32];
    let mut acc = [0f32; super::TOKENS];
    for b in 0..nb {
        let (dw, mw) = legacy_block(format, &w[b * bb..(b + 1) * bb], &mut u);
        for (c, acc) in acc.iter_mut().enumerate().take(out.len()) {
            let ab = &a[(t0 + c) * nb + b];
            let isum: i32 = u.iter().zip(&ab.qs).map(|(&u, &q)| u * q as i32).sum();
            *acc += dw * ab.d * isum as f32 + mw * ab.s;
        }
    }
    out.copy_from_slice(&acc[..out.len()]);
}

fn kquant(format: QuantFormat, w: &[u8], nb: usize, a: &[Block256], t0: usize, out: &mut [f32]) {
    let bb = format.block_bytes();
    let mut k = KBlock::new();
    let mut acc = [0f32; super::TOKENS];
    for b in 0..nb {
        k.decode(format, &w[b * bb..(b + 1) * bb]);
        for (c, acc) in acc.iter_mut().enumerate().take(out.len()) {
            let ab = &a[(t0 + c) * nb + b];
            *acc += kblock_dot(format, &k, ab);
        }
    }
    out.copy_from_slice(&acc[..out.len()]);
}

/// `Σ w·a` of one decoded super-block and one activation block.
pub(crate) fn kblock_dot(format: QuantFormat, k: &KBlock, a: &Block256) -> f32 {
    let dot = |range: std::ops::Range<usize>| -> i32 {
        k.u[range.clone()]
            .iter()
            .zip(&a.qs[range])
            .map(|(&u, &q)| u * q as i32)
            .sum()
    };
    if format == QuantFormat::Q6K {
        let mut isum = 0i32;
        let mut osum = 0i32;
        for s in 0..16 {
            isum += k.sc[s] * dot(16 * s..16 * s + 16);
            osum += k.sc[s] * a.bsums[s] as i32;
        }
        a.d * k.d * (isum - 32 * osum) as f32
    } else {
        let mut isum = 0i32;
        let mut msum = 0i32;
        for s in 0..8 {
            isum += k.sc[s] * dot(32 * s..32 * s + 32);
            msum += k.m[s] * (a.bsums[2 * s] as i32 + a.bsums[2 * s + 1] as i32);
        }
        a.d * (k.d * isum as f32 - k.dmin * msum as f32)
    }
}
