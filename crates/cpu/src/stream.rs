//! [`CpuStream`]: one session's queue of ops on the CPU, with its scratch.
//!
//! Every op runs to completion before it returns (the queue is always
//! empty), so every call is a synchronisation point and copies are plain
//! copies. Work is split over the device's thread pool by output rows
//! (matmul) and by (token, head) (attention); each pool thread works in
//! its own element of the stream's per-thread scratch, so no op takes a
//! lock besides the pool's dispatch (shared by the device's streams: see
//! [`crate::CpuDevice`]).

use crate::disjoint::{DisjointMut, PerThread};
use crate::ggml::float_dot::{FloatDot, FloatType};
use crate::ggml::{self, vec_dot_type, VecDotType};
use crate::kernels::{self, Isa};
use crate::matmul::{self, matmul_rows, matmul_rows_quantized, QuantizedRows};
use crate::pool::{split, Pool};
use crate::scratch::{StreamScratch, ThreadScratch};
use crate::types::{CpuMatrix, CpuVector};
use crate::{check_len, elementwise};
use std::sync::Arc;
use turbospark_backend::{BackendError, Numerics};
use turbospark_core::arch::Activation;

/// Below this many multiply-adds an op runs on the calling thread alone:
/// waking the pool costs more than the work.
const PARALLEL_MIN_WORK: usize = 1 << 15;

/// Activations (f32 values) from which a fast matmul quantizes them on
/// every thread: a batch of several tokens.
const PARALLEL_QUANTIZE: usize = 1 << 12;

/// Elements from which a fast GLU runs on every thread (a batch of
/// several tokens' FFN intermediates).
const PARALLEL_GLU: usize = 1 << 14;

/// A CPU stream (see the module docs).
pub struct CpuStream {
    pub(crate) pool: Arc<Pool>,
    pub(crate) numerics: Numerics,
    /// The instruction set of the fast kernels.
    pub(crate) isa: Isa,
    pub(crate) scratch: StreamScratch,
}

/// Parts per pool thread an op is cut into: threads claim parts as they
/// come free, so a descheduled thread costs at most a part's latency.
const PARTS_PER_THREAD: usize = 4;

/// Runs `f(part, parts, scratch)` for every part over the pool when `work`
/// is large enough (each call with the scratch of the thread running it),
/// else `f(0, 1, ..)` on the caller; then returns the first error a part
/// recorded in its scratch.
pub(crate) fn parallel(
    pool: &Pool,
    threads: &mut [ThreadScratch],
    work: usize,
    f: &(dyn Fn(usize, usize, &mut ThreadScratch) + Sync),
) -> Result<(), BackendError> {
    let n_threads = pool.threads();
    if n_threads > 1 && threads.len() >= n_threads && work >= PARALLEL_MIN_WORK {
        let parts = n_threads * PARTS_PER_THREAD;
        let per = PerThread::new(&mut threads[..n_threads]);
        pool.run(parts, &|thread, part| {
            // SAFETY: a pool thread runs one call at a time and only ever
            // gets its own index `thread < n_threads`, so each element is
            // borrowed by one call at a time.
            f(part, parts, unsafe { per.get(thread) });
        });
    } else if let Some(s) = threads.first_mut() {
        f(0, 1, s);
    }
    for s in threads.iter_mut() {
        if let Some(e) = s.error.take() {
            return Err(e);
        }
    }
    Ok(())
}

impl CpuStream {
    pub(crate) fn new(
        pool: Arc<Pool>,
        numerics: Numerics,
        isa: Isa,
        scratch: StreamScratch,
    ) -> CpuStream {
        CpuStream {
            pool,
            numerics,
            isa,
            scratch,
        }
    }

    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    pub(crate) fn llama_cpp(&self) -> bool {
        self.numerics == Numerics::LlamaCpp
    }

    /// `out[t, o] = Σ_i W[o, i] · x[t, i]` on slices, in this stream's
    /// numerics.
    pub(crate) fn matmul_slices(
        &mut self,
        w: &CpuMatrix,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        check_len("matmul", "x", x.len(), n * w.cols)?;
        check_len("matmul", "out", out.len(), n * w.rows)?;
        match self.numerics {
            Numerics::Exact => return self.matmul_dequantized(w, x, n, out, matmul::dot),
            Numerics::Fast => return self.matmul_fast(w, &x[..n * w.cols], n, out),
            Numerics::LlamaCpp => {}
        }
        let len = n * w.cols;
        let scratch_err = |have| BackendError::ScratchTooSmall {
            op: "matmul",
            need: len,
            have,
        };
        let StreamScratch { threads, act, .. } = &mut self.scratch;
        let kind = vec_dot_type(w.format);
        let rows = match kind {
            VecDotType::F32 => {
                let dot = FloatDot::for_matmul(FloatType::F32, w.rows, w.cols, n);
                return matmul_dequantized(&self.pool, threads, w, x, n, out, move |a, b| {
                    dot.dot(a, b)
                });
            }
            VecDotType::F16 | VecDotType::Bf16 => {
                let (ty, round): (_, fn(f32) -> f32) = if kind == VecDotType::F16 {
                    (FloatType::F16, ggml::quantize::round_f16)
                } else {
                    (FloatType::Bf16, ggml::quantize::round_bf16)
                };
                let have = act.float.len();
                let xr = act.float.get_mut(..len).ok_or(scratch_err(have))?;
                for (r, &v) in xr.iter_mut().zip(&x[..len]) {
                    *r = round(v);
                }
                let dot = FloatDot::for_matmul(ty, w.rows, w.cols, n);
                return matmul_dequantized(&self.pool, threads, w, xr, n, out, move |a, b| {
                    dot.dot(a, b)
                });
            }
            VecDotType::Q8_0 | VecDotType::Q8_1 => {
                let have = act.q8.len() * ggml::quantize::QK8;
                let q = act
                    .q8
                    .get_mut(..len / ggml::quantize::QK8)
                    .ok_or(scratch_err(have))?;
                if kind == VecDotType::Q8_0 {
                    ggml::quantize::quantize_row_q8_0(&x[..len], q);
                } else {
                    ggml::quantize::quantize_row_q8_1(&x[..len], q);
                }
                QuantizedRows::Q8(q)
            }
            VecDotType::Q8K => {
                let have = act.q8k.len() * ggml::quantize::QK_K;
                let q = act
                    .q8k
                    .get_mut(..len / ggml::quantize::QK_K)
                    .ok_or(scratch_err(have))?;
                // Rows the repacked gemm takes are quantized by its own
                // 4-row quantizer.
                let gemm_rows = if ggml::dot::repacked(w.format, w.rows) {
                    n - n % 4
                } else {
                    0
                };
                let split_at = gemm_rows * w.cols;
                let (gemm, rest) = q.split_at_mut(split_at / ggml::quantize::QK_K);
                ggml::quantize::quantize_row_q8_k_gemm(&x[..split_at], gemm);
                ggml::quantize::quantize_row_q8_k(&x[split_at..len], rest);
                QuantizedRows::Q8K(q)
            }
        };
        let out = DisjointMut::new(&mut out[..n * w.rows]);
        parallel(&self.pool, threads, n * w.rows * w.cols, &|i, parts, s| {
            let range = split(w.rows, parts, i);
            if range.is_empty() {
                return;
            }
            // SAFETY: `split` gives every part a disjoint row range.
            if let Err(e) = unsafe { matmul_rows_quantized(w, rows, n, &out, range, &mut s.codes) }
            {
                s.error = Some(e);
            }
        })
    }

    /// The fast-numerics matmul (lengths already checked): activations
    /// quantized once, then [`kernels::matmul_rows`] over the pool.
    fn matmul_fast(
        &mut self,
        w: &CpuMatrix,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let StreamScratch {
            threads, fast_act, ..
        } = &mut self.scratch;
        let have = fast_act.capacity();
        // A batch's activations are quantized by every thread (else one
        // thread would quantize while the others wait for the matmul).
        let pool = &self.pool;
        let acts = if x.len() >= PARALLEL_QUANTIZE {
            fast_act.quantize_split(self.isa, w.format, x, |f| {
                let _ = parallel(pool, threads, PARALLEL_MIN_WORK, &|i, parts, _| f(i, parts));
            })
        } else {
            fast_act.quantize(self.isa, w.format, x)
        };
        let acts = acts.ok_or(BackendError::ScratchTooSmall {
            op: "matmul",
            need: x.len(),
            have,
        })?;
        let out = DisjointMut::new(&mut out[..n * w.rows]);
        let isa = self.isa;
        let unit = kernels::row_unit(isa, w);
        parallel(&self.pool, threads, n * w.rows * w.cols, &|i, parts, _| {
            let units = split(w.rows.div_ceil(unit), parts, i);
            let range = (units.start * unit).min(w.rows)..(units.end * unit).min(w.rows);
            // SAFETY: `split` gives every part a disjoint row range.
            unsafe { kernels::matmul_rows(isa, w, acts, n, &out, range) };
        })
    }

    /// Exactly dequantized weight rows dotted with f32 activations.
    fn matmul_dequantized<D: Fn(&[f32], &[f32]) -> f32 + Sync>(
        &mut self,
        w: &CpuMatrix,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        dot: D,
    ) -> Result<(), BackendError> {
        matmul_dequantized(&self.pool, &mut self.scratch.threads, w, x, n, out, dot)
    }

    pub(crate) fn glu_slices(
        &self,
        gate: &mut [f32],
        up: &[f32],
        len: usize,
        act: Activation,
    ) -> Result<(), BackendError> {
        check_len("glu", "gate", gate.len(), len)?;
        check_len("glu", "up", up.len(), len)?;
        if self.llama_cpp() {
            ggml::ops::glu(&mut gate[..len], &up[..len], act);
        } else if self.numerics == Numerics::Fast {
            let isa = self.isa;
            if len >= PARALLEL_GLU && self.pool.threads() > 1 {
                // Blocks of whole 8-lane vectors: every element takes the
                // path (vector body or scalar tail) it takes in one call.
                let parts = self.pool.threads() * PARTS_PER_THREAD;
                let blocks = len.div_ceil(8);
                let g = DisjointMut::new(&mut gate[..len]);
                self.pool.run(parts, &|_, part| {
                    let r = split(blocks, parts, part);
                    let (lo, hi) = (r.start * 8, (r.end * 8).min(len));
                    if lo < hi {
                        // SAFETY: `split` gives every part a disjoint range.
                        let g = unsafe { g.range(lo, hi - lo) };
                        kernels::glu(isa, g, &up[lo..hi], act);
                    }
                });
            } else {
                kernels::glu(isa, &mut gate[..len], &up[..len], act);
            }
        } else {
            elementwise::glu(&mut gate[..len], &up[..len], act);
        }
        Ok(())
    }
}

/// `out[t, o] = dot(W[o], x[t])` on exactly dequantized weight rows
/// (lengths already checked).
fn matmul_dequantized<D: Fn(&[f32], &[f32]) -> f32 + Sync>(
    pool: &Pool,
    threads: &mut [ThreadScratch],
    w: &CpuMatrix,
    x: &[f32],
    n: usize,
    out: &mut [f32],
    dot: D,
) -> Result<(), BackendError> {
    let out = DisjointMut::new(&mut out[..n * w.rows]);
    parallel(pool, threads, n * w.rows * w.cols, &|i, parts, s| {
        let rows = split(w.rows, parts, i);
        if rows.is_empty() {
            return;
        }
        // SAFETY: `split` gives every part a disjoint row range.
        if let Err(e) = unsafe { matmul_rows(w, x, n, &out, rows, &mut s.tile, &dot) } {
            s.error = Some(e);
        }
    })
}

/// `x[t, i] += bias[i]` for `t < n`.
pub(crate) fn add_bias_slice(
    x: &mut [f32],
    bias: &CpuVector,
    n: usize,
) -> Result<(), BackendError> {
    let d = bias.data.len();
    check_len("add_bias", "x", x.len(), n * d)?;
    if d == 0 {
        return Ok(());
    }
    for row in x[..n * d].chunks_exact_mut(d) {
        for (v, b) in row.iter_mut().zip(&bias.data) {
            *v += b;
        }
    }
    Ok(())
}
