//! ggml's floating-point dot products (f32, f16, bf16 operands) as
//! llama.cpp runs them on x86-64 with AVX-512: the dots of float-weight
//! matmuls and of attention's `q·k` and `p·V` (normative:
//! `ggml_vec_dot_f32`, `ggml_vec_dot_f16`, `ggml_vec_dot_bf16` in
//! `ggml/src/ggml-cpu/vec.cpp` with the AVX-512 macros of `simd-mappings.h`,
//! and `tinyBLAS` in `llamafile/sgemm.cpp`).
//!
//! Which kernel runs depends on the batch: with one activation row
//! `ggml_compute_forward_mul_mat` calls `vec_dot`; with more, tinyBLAS
//! takes the matmul when the inner size is a multiple of 16 and the
//! weight's rows a multiple of 4. Element `i` of a dot goes to a lane:
//!
//! ```text
//! tinyBLAS (batch)      one 16-lane accumulator, lane i mod 16, fused multiply-add;
//!                       reduce16 (`_mm512_reduce_add_ps`) at the end
//! vec_dot f32 / f16     four 16-lane accumulators a = (i / 16) mod 4 over steps of 64;
//!                       (a0 + a2) + (a1 + a3), reduce16; elements past the last full
//!                       step added one by one (f16: in f64; f32: fused in f32)
//! vec_dot bf16          two 16-lane accumulators over steps of 32, each reduced
//!                       and added in f64; the rest added in f64
//! ```
//!
//! f16 and bf16 products are exact in f32, so their fused multiply-adds
//! are plain sums of products here.

use super::ops::reduce_add_16;

/// The operand type of a float dot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FloatType {
    F32,
    F16,
    Bf16,
}

/// Which of ggml's kernels computes a float dot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FloatDot {
    pub ty: FloatType,
    /// tinyBLAS (a batch) rather than `vec_dot`.
    pub tiny: bool,
}

impl FloatDot {
    /// The kernel for a matmul of `rows` weight rows, `k` inputs and `n`
    /// activation rows.
    pub(crate) fn for_matmul(ty: FloatType, rows: usize, k: usize, n: usize) -> FloatDot {
        FloatDot {
            ty,
            tiny: n >= 2 && k.is_multiple_of(16) && rows.is_multiple_of(4),
        }
    }

    pub(crate) fn dot(self, x: &[f32], y: &[f32]) -> f32 {
        let mut acc = FloatAcc::new(self, x.len().min(y.len()));
        for (i, (&a, &b)) in x.iter().zip(y).enumerate() {
            acc.add(i, a, b);
        }
        acc.finish()
    }
}

/// The accumulators of one float dot of `n` elements, fed element by
/// element in increasing index order.
pub(crate) struct FloatAcc {
    kind: FloatDot,
    /// Elements before this index go to the lanes, the rest to the tail.
    full: usize,
    lanes: [f32; 64],
    /// Products (or operand pairs, for f32) past the last full step, in
    /// order; at most 63.
    tail: [(f32, f32); 64],
    tail_len: usize,
}

impl FloatAcc {
    pub(crate) fn new(kind: FloatDot, n: usize) -> FloatAcc {
        let step = match (kind.tiny, kind.ty) {
            (true, _) => 16,
            (false, FloatType::Bf16) => 32,
            (false, _) => 64,
        };
        FloatAcc {
            kind,
            full: n - n % step,
            lanes: [0.0; 64],
            tail: [(0.0, 0.0); 64],
            tail_len: 0,
        }
    }

    #[inline]
    pub(crate) fn add(&mut self, i: usize, x: f32, y: f32) {
        if i < self.full {
            let lane = match (self.kind.tiny, self.kind.ty) {
                (true, _) => i % 16,
                (false, FloatType::Bf16) => i % 32,
                (false, _) => i % 64,
            };
            let l = &mut self.lanes[lane];
            *l = if self.kind.ty == FloatType::F32 {
                x.mul_add(y, *l)
            } else {
                *l + x * y
            };
        } else {
            self.tail[self.tail_len] = (x, y);
            self.tail_len += 1;
        }
    }

    pub(crate) fn finish(&self) -> f32 {
        let a = &self.lanes;
        let lane16 = |off: usize| -> [f32; 16] { std::array::from_fn(|l| a[off + l]) };
        let tail = &self.tail[..self.tail_len];
        if self.kind.tiny {
            return reduce_add_16(&lane16(0));
        }
        match self.kind.ty {
            FloatType::F32 => {
                let folded: [f32; 16] =
                    std::array::from_fn(|l| (a[l] + a[32 + l]) + (a[16 + l] + a[48 + l]));
                tail.iter()
                    .fold(reduce_add_16(&folded), |s, &(x, y)| x.mul_add(y, s))
            }
            FloatType::F16 => {
                let folded: [f32; 16] =
                    std::array::from_fn(|l| (a[l] + a[32 + l]) + (a[16 + l] + a[48 + l]));
                let sum = f64::from(reduce_add_16(&folded));
                tail.iter().fold(sum, |s, &(x, y)| s + f64::from(x * y)) as f32
            }
            FloatType::Bf16 => {
                let sum =
                    f64::from(reduce_add_16(&lane16(0))) + f64::from(reduce_add_16(&lane16(16)));
                tail.iter().fold(sum, |s, &(x, y)| s + f64::from(x * y)) as f32
            }
        }
    }
}
