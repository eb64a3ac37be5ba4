//! The CPU backend: the reference implementation of
//! [`turbospark_backend::Backend`] that every other backend is tested
//! against.
//!
//! Weights stay in their storage format (often inside a memory map) and are
//! dequantized row by row inside the matmul kernel; activations, norm
//! weights, biases and the KV cache are f32. Work is split over a persistent
//! thread pool by output rows (matmul) and by (token, head) (attention); each
//! output element is computed the same way whatever the split, so results do
//! not depend on the thread count or the batch size. Per-thread scratch is
//! sized at upload time and by [`Backend::reserve`]; no op allocates.
//!
//! A backend built with [`Numerics::LlamaCpp`] ([`CpuBackend::with_numerics`])
//! instead reproduces the arithmetic of llama.cpp's CPU backend: quantized
//! activations and integer dot products, an f16 KV cache, f16 attention
//! operands, ggml's element-wise kernels (see [`ggml`]).

mod attention;
mod dequant;
mod disjoint;
mod elementwise;
pub mod ggml;
mod kernels;
mod matmul;
mod moe;
mod pool;
mod rope;
mod types;

pub use kernels::Isa;
pub use turbospark_backend::Numerics;
pub use types::{CpuBuf, CpuMatrix, CpuVector};

use attention::{first_key, AttentionInputs};
use dequant::dequantize;
use disjoint::DisjointMut;
use ggml::float_dot::{FloatDot, FloatType};
use ggml::{vec_dot_type, ActScratch, VecDotType};
use matmul::{matmul_rows, matmul_rows_quantized, CodeTile, QuantizedRows, TILE};
use pool::{split, Pool};
use std::sync::{Mutex, MutexGuard};
use turbospark_backend::{
    AttentionParams, Backend, BackendError, HostTensor, Limits, MoeInput, MoeScratch, RopeTable,
    Route,
};
use turbospark_core::arch::{Activation, NormSpec};
use turbospark_core::quant::row_bytes;

/// Below this many multiply-adds an op runs on the calling thread alone:
/// waking the pool costs more than the work.
const PARALLEL_MIN_WORK: usize = 1 << 15;

/// Scratch owned by one pool thread.
#[derive(Default)]
struct ThreadScratch {
    /// `TILE` dequantized weight rows.
    tile: Vec<f32>,
    /// `TILE` weight rows unpacked to 8-bit codes (llama.cpp numerics).
    codes: CodeTile,
    /// One query head rounded to f16 (llama.cpp numerics).
    q16: Vec<f32>,
    /// Attention scores of one query.
    scores: Vec<f32>,
    /// cos/sin of one token's rope pairs.
    trig: Vec<f32>,
    /// The first error a job met on this thread.
    error: Option<BackendError>,
}

/// The CPU backend.
pub struct CpuBackend {
    pool: Pool,
    scratch: Vec<Mutex<ThreadScratch>>,
    numerics: Numerics,
    /// Quantized activations of the current matmul (llama.cpp numerics).
    act: Mutex<ActScratch>,
    /// The instruction set of the fast kernels.
    isa: Isa,
    /// Quantized activations of the current matmul (fast numerics).
    fast_act: Mutex<kernels::ActScratch>,
}

fn check_len(
    op: &'static str,
    what: &'static str,
    have: usize,
    need: usize,
) -> Result<(), BackendError> {
    if have < need {
        return Err(BackendError::BufferTooSmall {
            op,
            what,
            need,
            have,
        });
    }
    Ok(())
}

fn shape_err(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

impl CpuBackend {
    /// A backend running on `threads` threads (at least 1, the caller's).
    pub fn new(threads: usize) -> Result<CpuBackend, BackendError> {
        let pool = Pool::new(threads).map_err(|e| BackendError::Device(e.to_string()))?;
        let scratch = (0..pool.threads())
            .map(|_| Mutex::new(ThreadScratch::default()))
            .collect();
        Ok(CpuBackend {
            pool,
            scratch,
            numerics: Numerics::Exact,
            act: Mutex::new(ActScratch::default()),
            isa: Isa::detect(),
            fast_act: Mutex::new(kernels::ActScratch::default()),
        })
    }

    /// The same backend running its fast kernels on `isa` (or on the
    /// portable kernels where this CPU lacks it); by default the best the
    /// CPU has.
    pub fn with_isa(mut self, isa: Isa) -> CpuBackend {
        self.isa = isa.supported();
        self
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The same backend computing with `numerics`. Choose before uploading
    /// weights: uploads size the scratch the mode needs.
    pub fn with_numerics(mut self, numerics: Numerics) -> CpuBackend {
        self.numerics = numerics;
        self
    }

    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    fn llama_cpp(&self) -> bool {
        self.numerics == Numerics::LlamaCpp
    }

    fn act(&self) -> MutexGuard<'_, ActScratch> {
        // Poisoning only means an earlier job panicked; the buffers stay usable.
        self.act.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One thread per available core.
    pub fn with_available_threads() -> Result<CpuBackend, BackendError> {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        CpuBackend::new(n)
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    fn scratch(&self, thread: usize) -> MutexGuard<'_, ThreadScratch> {
        // Each thread index locks only its own scratch, so the lock is
        // uncontended; poisoning only means an earlier job panicked.
        self.scratch[thread]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f(part, parts)` over the pool when `work` is large enough,
    /// else `f(0, 1)` on the caller; then returns the first recorded error.
    fn parallel(&self, work: usize, f: &(dyn Fn(usize, usize) + Sync)) -> Result<(), BackendError> {
        let parts = self.pool.threads();
        if parts > 1 && work >= PARALLEL_MIN_WORK {
            self.pool.run(&|i| f(i, parts));
        } else {
            f(0, 1);
        }
        for i in 0..parts {
            if let Some(e) = self.scratch(i).error.take() {
                return Err(e);
            }
        }
        Ok(())
    }

    /// `out[t, o] = Σ_i W[o, i] · x[t, i]` on slices, in this backend's
    /// numerics.
    pub(crate) fn matmul_slices(
        &self,
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
        let mut act = self.act();
        let act = &mut *act;
        let kind = vec_dot_type(w.format);
        let rows = match kind {
            VecDotType::F32 => {
                let dot = FloatDot::for_matmul(FloatType::F32, w.rows, w.cols, n);
                return self.matmul_dequantized(w, x, n, out, move |a, b| dot.dot(a, b));
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
                return self.matmul_dequantized(w, xr, n, out, move |a, b| dot.dot(a, b));
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
        self.parallel(n * w.rows * w.cols, &|i, parts| {
            let range = split(w.rows, parts, i);
            if range.is_empty() {
                return;
            }
            let mut guard = self.scratch(i);
            let s = &mut *guard;
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
        &self,
        w: &CpuMatrix,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let mut guard = self.fast_act.lock().unwrap_or_else(|e| e.into_inner());
        let have = guard.capacity();
        let acts = guard
            .quantize(w.format, x)
            .ok_or(BackendError::ScratchTooSmall {
                op: "matmul",
                need: x.len(),
                have,
            })?;
        let out = DisjointMut::new(&mut out[..n * w.rows]);
        let isa = self.isa;
        let unit = kernels::row_unit(w);
        self.parallel(n * w.rows * w.cols, &|i, parts| {
            let units = split(w.rows.div_ceil(unit), parts, i);
            let range = (units.start * unit).min(w.rows)..(units.end * unit).min(w.rows);
            // SAFETY: `split` gives every part a disjoint row range.
            unsafe { kernels::matmul_rows(isa, w, acts, n, &out, range) };
        })
    }

    /// `out[t, o] = dot(W[o], x[t])` on exactly dequantized weight rows
    /// (lengths already checked).
    fn matmul_dequantized<D: Fn(&[f32], &[f32]) -> f32 + Sync>(
        &self,
        w: &CpuMatrix,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        dot: D,
    ) -> Result<(), BackendError> {
        let out = DisjointMut::new(&mut out[..n * w.rows]);
        self.parallel(n * w.rows * w.cols, &|i, parts| {
            let rows = split(w.rows, parts, i);
            if rows.is_empty() {
                return;
            }
            let mut guard = self.scratch(i);
            let s = &mut *guard;
            // SAFETY: `split` gives every part a disjoint row range.
            if let Err(e) = unsafe { matmul_rows(w, x, n, &out, rows, &mut s.tile, &dot) } {
                s.error = Some(e);
            }
        })
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
            kernels::glu(self.isa, &mut gate[..len], &up[..len], act);
        } else {
            elementwise::glu(&mut gate[..len], &up[..len], act);
        }
        Ok(())
    }

    pub(crate) fn add_bias_slice(
        &self,
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
}

impl Backend for CpuBackend {
    type Buf = CpuBuf;
    type Matrix = CpuMatrix;
    type Vector = CpuVector;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn upload_matrix(&self, t: &HostTensor) -> Result<CpuMatrix, BackendError> {
        let &[rows, cols] = t.shape.as_slice() else {
            return Err(BackendError::Rank {
                name: t.name.clone(),
                expected: 2,
                shape: t.shape.clone(),
            });
        };
        let quant = |source| BackendError::Quant {
            name: t.name.clone(),
            source,
        };
        let rb = row_bytes(t.format, cols).map_err(quant)?;
        let total = rows.checked_mul(rb);
        if total != Some(t.bytes.len()) {
            return Err(quant(turbospark_core::quant::QuantError::LengthMismatch {
                format: t.format,
                elements: rows.saturating_mul(cols),
                expected_bytes: total.unwrap_or(usize::MAX),
                got_bytes: t.bytes.len(),
            }));
        }
        let integer = self.llama_cpp() && t.format.block_elems() > 1;
        for i in 0..self.scratch.len() {
            let mut s = self.scratch(i);
            if s.tile.len() < TILE * cols {
                s.tile.resize(TILE * cols, 0.0);
            }
            if integer {
                s.codes.fit(t.format, cols);
            }
        }
        if self.llama_cpp() {
            self.act().fit_matrix(t.format, cols);
        }
        if self.numerics == Numerics::Fast {
            self.fast_act
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .fit_matrix(cols);
        }
        let mut m = CpuMatrix {
            name: t.name.clone(),
            format: t.format,
            rows,
            cols,
            row_bytes: rb,
            bytes: t.bytes.clone(),
            packed: None,
        };
        if self.numerics == Numerics::Fast {
            m.packed = kernels::pack(self.isa, &m).map(std::sync::Arc::new);
        }
        Ok(m)
    }

    fn upload_vector(&self, t: &HostTensor) -> Result<CpuVector, BackendError> {
        let &[len] = t.shape.as_slice() else {
            return Err(BackendError::Rank {
                name: t.name.clone(),
                expected: 1,
                shape: t.shape.clone(),
            });
        };
        let mut data = vec![0f32; len];
        dequantize(t.format, t.bytes.as_slice(), &mut data).map_err(|source| {
            BackendError::Quant {
                name: t.name.clone(),
                source,
            }
        })?;
        Ok(CpuVector { data })
    }

    fn matrix_shape(&self, m: &CpuMatrix) -> [usize; 2] {
        [m.rows, m.cols]
    }

    fn vector_len(&self, v: &CpuVector) -> usize {
        v.data.len()
    }

    fn reload_matrix(&self, dst: &mut CpuMatrix, t: &HostTensor) -> Result<(), BackendError> {
        // Same format and shape: the scratch the first upload sized still
        // fits, so only the bytes change (an `Arc` clone, no allocation).
        let same = t.format == dst.format
            && t.shape == [dst.rows, dst.cols]
            && t.bytes.len() == dst.rows * dst.row_bytes;
        if same {
            dst.bytes = t.bytes.clone();
            if self.numerics == Numerics::Fast {
                kernels::repack(self.isa, dst);
            }
        } else {
            *dst = self.upload_matrix(t)?;
        }
        Ok(())
    }

    fn reload_vector(&self, dst: &mut CpuVector, t: &HostTensor) -> Result<(), BackendError> {
        if t.shape != [dst.data.len()] {
            *dst = self.upload_vector(t)?;
            return Ok(());
        }
        dequantize(t.format, t.bytes.as_slice(), &mut dst.data).map_err(|source| {
            BackendError::Quant {
                name: t.name.clone(),
                source,
            }
        })
    }

    fn alloc(&self, len: usize) -> Result<CpuBuf, BackendError> {
        Ok(CpuBuf {
            data: vec![0.0; len],
        })
    }

    fn reserve(&self, limits: &Limits) -> Result<(), BackendError> {
        for i in 0..self.scratch.len() {
            let mut s = self.scratch(i);
            if s.scores.len() < limits.max_keys {
                s.scores.resize(limits.max_keys, 0.0);
            }
            if s.trig.len() < limits.max_head_dim {
                s.trig.resize(limits.max_head_dim, 0.0);
            }
            if self.llama_cpp() && s.q16.len() < limits.max_head_dim {
                s.q16.resize(limits.max_head_dim, 0.0);
            }
        }
        if self.llama_cpp() {
            self.act().fit_tokens(limits.max_tokens);
        }
        if self.numerics == Numerics::Fast {
            self.fast_act
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .fit_tokens(limits.max_tokens);
        }
        Ok(())
    }

    fn write(&self, dst: &mut CpuBuf, src: &[f32]) -> Result<(), BackendError> {
        check_len("write", "dst", dst.data.len(), src.len())?;
        dst.data[..src.len()].copy_from_slice(src);
        Ok(())
    }

    fn read(&self, src: &CpuBuf, dst: &mut [f32]) -> Result<(), BackendError> {
        check_len("read", "src", src.data.len(), dst.len())?;
        dst.copy_from_slice(&src.data[..dst.len()]);
        Ok(())
    }

    fn copy(
        &self,
        src: &CpuBuf,
        src_at: usize,
        dst: &mut CpuBuf,
        dst_at: usize,
        len: usize,
    ) -> Result<(), BackendError> {
        check_len("copy", "src", src.data.len(), src_at.saturating_add(len))?;
        check_len("copy", "dst", dst.data.len(), dst_at.saturating_add(len))?;
        dst.data[dst_at..dst_at + len].copy_from_slice(&src.data[src_at..src_at + len]);
        Ok(())
    }

    fn embed(
        &self,
        table: &CpuMatrix,
        tokens: &[u32],
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        let d = table.cols;
        check_len("embed", "out", out.data.len(), tokens.len() * d)?;
        for (t, &tok) in tokens.iter().enumerate() {
            let tok = tok as usize;
            if tok >= table.rows {
                return Err(shape_err(
                    "embed",
                    format!("token {tok} outside the {}-row table", table.rows),
                ));
            }
            dequantize(
                table.format,
                table.row(tok),
                &mut out.data[t * d..(t + 1) * d],
            )
            .map_err(|source| BackendError::Quant {
                name: table.name.clone(),
                source,
            })?;
        }
        Ok(())
    }

    fn matmul(
        &self,
        w: &CpuMatrix,
        x: &CpuBuf,
        n: usize,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        self.matmul_slices(w, &x.data, n, &mut out.data)
    }

    fn add_bias(&self, x: &mut CpuBuf, bias: &CpuVector, n: usize) -> Result<(), BackendError> {
        self.add_bias_slice(&mut x.data, bias, n)
    }

    fn rms_norm(
        &self,
        x: &mut CpuBuf,
        rows: usize,
        dim: usize,
        spec: NormSpec,
        weight: Option<&CpuVector>,
    ) -> Result<(), BackendError> {
        check_len("rms_norm", "x", x.data.len(), rows * dim)?;
        let weight = match (spec.has_weight(), weight) {
            (true, Some(w)) if w.data.len() == dim => Some(w.data.as_slice()),
            (false, None) => None,
            (true, w) => {
                return Err(shape_err(
                    "rms_norm",
                    format!(
                        "a {:?} norm of width {dim} needs a {dim}-element weight, got {:?}",
                        spec.scale,
                        w.map(|w| w.data.len())
                    ),
                ))
            }
            (false, Some(_)) => {
                return Err(shape_err(
                    "rms_norm",
                    "a no-scale norm takes no weight".into(),
                ))
            }
        };
        if self.llama_cpp() {
            ggml::ops::rms_norm(&mut x.data[..rows * dim], dim, spec, weight);
        } else if self.numerics == Numerics::Fast {
            kernels::rms_norm(self.isa, &mut x.data[..rows * dim], dim, spec, weight);
        } else {
            elementwise::rms_norm(&mut x.data[..rows * dim], dim, spec, weight);
        }
        Ok(())
    }

    fn rope(
        &self,
        x: &mut CpuBuf,
        n_tokens: usize,
        n_heads: usize,
        head_dim: usize,
        first_pos: usize,
        table: &RopeTable,
    ) -> Result<(), BackendError> {
        if table.rotary_dim > head_dim || table.rotary_dim != 2 * table.pairs() {
            return Err(shape_err(
                "rope",
                format!(
                    "{} rotary dims ({} pairs) on a {head_dim}-wide head",
                    table.rotary_dim,
                    table.pairs()
                ),
            ));
        }
        let len = n_tokens * n_heads * head_dim;
        check_len("rope", "x", x.data.len(), len)?;
        let mut s = self.scratch(0);
        if s.trig.len() < table.rotary_dim {
            return Err(BackendError::ScratchTooSmall {
                op: "rope",
                need: table.rotary_dim,
                have: s.trig.len(),
            });
        }
        let rope = if self.llama_cpp() && ggml::ops::rope_supported(table) {
            ggml::ops::rope
        } else {
            rope::rope
        };
        rope(
            &mut x.data[..len],
            n_heads,
            head_dim,
            first_pos,
            table,
            &mut s.trig,
        );
        Ok(())
    }

    fn kv_write(
        &self,
        cache: &mut CpuBuf,
        src: &CpuBuf,
        n_tokens: usize,
        row_len: usize,
        first_pos: usize,
        capacity: usize,
    ) -> Result<(), BackendError> {
        if n_tokens > capacity {
            return Err(shape_err(
                "kv_write",
                format!("{n_tokens} rows into a {capacity}-row cache"),
            ));
        }
        check_len("kv_write", "cache", cache.data.len(), capacity * row_len)?;
        check_len("kv_write", "src", src.data.len(), n_tokens * row_len)?;
        for t in 0..n_tokens {
            let slot = (first_pos + t) % capacity;
            let dst = &mut cache.data[slot * row_len..(slot + 1) * row_len];
            let src = &src.data[t * row_len..(t + 1) * row_len];
            if self.llama_cpp() {
                // llama.cpp's cache is f16: store the values it would hold.
                for (d, &v) in dst.iter_mut().zip(src) {
                    *d = ggml::quantize::round_f16(v);
                }
            } else {
                dst.copy_from_slice(src);
            }
        }
        Ok(())
    }

    fn attention(
        &self,
        q: &CpuBuf,
        k_cache: &CpuBuf,
        v_cache: &CpuBuf,
        p: &AttentionParams,
        sinks: Option<&CpuVector>,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        if p.n_tokens == 0 {
            return Ok(());
        }
        if p.n_kv_heads == 0 || p.n_heads % p.n_kv_heads != 0 || p.head_dim == 0 || p.capacity == 0
        {
            return Err(shape_err(
                "attention",
                format!(
                    "{} heads over {} kv heads of {} dims, capacity {}",
                    p.n_heads, p.n_kv_heads, p.head_dim, p.capacity
                ),
            ));
        }
        let q_len = p.n_tokens * p.n_heads * p.head_dim;
        let cache_len = p.capacity * p.n_kv_heads * p.head_dim;
        check_len("attention", "q", q.data.len(), q_len)?;
        check_len("attention", "k_cache", k_cache.data.len(), cache_len)?;
        check_len("attention", "v_cache", v_cache.data.len(), cache_len)?;
        check_len("attention", "out", out.data.len(), q_len)?;
        if let Some(s) = sinks {
            check_len("attention", "sinks", s.data.len(), p.n_heads)?;
        }
        let newest = p.first_pos + p.n_tokens - 1;
        let oldest = first_key(p.first_pos, p.window);
        if newest - oldest + 1 > p.capacity {
            return Err(BackendError::KeysEvicted {
                position: p.first_pos,
                oldest,
                newest,
                capacity: p.capacity,
            });
        }
        let max_keys = newest - first_key(newest, p.window) + 1;
        let have = self.scratch(0).scores.len();
        if have < max_keys {
            return Err(BackendError::ScratchTooSmall {
                op: "attention",
                need: max_keys,
                have,
            });
        }
        let llama_cpp = self.llama_cpp();
        if llama_cpp {
            let have = self.scratch(0).q16.len();
            if have < p.head_dim {
                return Err(BackendError::ScratchTooSmall {
                    op: "attention",
                    need: p.head_dim,
                    have,
                });
            }
        }
        let inputs = AttentionInputs {
            q: &q.data,
            k_cache: &k_cache.data,
            v_cache: &v_cache.data,
            params: p,
            sinks: sinks.map(|s| s.data.as_slice()),
        };
        let hd = p.head_dim;
        let (fast, isa) = (self.numerics == Numerics::Fast, self.isa);
        let items = p.n_tokens * p.n_heads;
        let out = DisjointMut::new(&mut out.data[..q_len]);
        self.parallel(items * max_keys * hd * 2, &|i, parts| {
            let range = split(items, parts, i);
            if range.is_empty() {
                return;
            }
            let mut guard = self.scratch(i);
            let s = &mut *guard;
            for item in range {
                // SAFETY: items are split disjointly among parts and each
                // item owns its own `head_dim` output slice.
                let o = unsafe { out.range(item * hd, hd) };
                let (t, h) = (item / p.n_heads, item % p.n_heads);
                if llama_cpp {
                    inputs.attend_ggml(t, h, &mut s.scores, &mut s.q16, o);
                } else if fast {
                    kernels::attend(isa, &inputs, t, h, &mut s.scores, o);
                } else {
                    inputs.attend(t, h, &mut s.scores, o);
                }
            }
        })
    }

    fn glu(
        &self,
        gate: &mut CpuBuf,
        up: &CpuBuf,
        len: usize,
        act: Activation,
    ) -> Result<(), BackendError> {
        self.glu_slices(&mut gate.data, &up.data, len, act)
    }

    fn add(&self, dst: &mut CpuBuf, src: &CpuBuf, len: usize) -> Result<(), BackendError> {
        check_len("add", "dst", dst.data.len(), len)?;
        check_len("add", "src", src.data.len(), len)?;
        for (d, s) in dst.data[..len].iter_mut().zip(&src.data[..len]) {
            *d += s;
        }
        Ok(())
    }

    fn scale(&self, x: &mut CpuBuf, len: usize, s: f32) -> Result<(), BackendError> {
        check_len("scale", "x", x.data.len(), len)?;
        x.data[..len].iter_mut().for_each(|v| *v *= s);
        Ok(())
    }

    fn mul_sigmoid(&self, x: &mut CpuBuf, gate: &CpuBuf, len: usize) -> Result<(), BackendError> {
        check_len("mul_sigmoid", "x", x.data.len(), len)?;
        check_len("mul_sigmoid", "gate", gate.data.len(), len)?;
        elementwise::mul_sigmoid(&mut x.data[..len], &gate.data[..len]);
        Ok(())
    }

    fn softcap(&self, x: &mut CpuBuf, len: usize, cap: f32) -> Result<(), BackendError> {
        check_len("softcap", "x", x.data.len(), len)?;
        if self.llama_cpp() {
            ggml::ops::softcap(&mut x.data[..len], cap);
        } else {
            elementwise::softcap(&mut x.data[..len], cap);
        }
        Ok(())
    }

    fn moe_experts(
        &self,
        input: MoeInput<'_, CpuBuf, CpuMatrix, CpuVector>,
        scratch: &mut MoeScratch<CpuBuf>,
        only: Option<&[bool]>,
    ) -> Result<(), BackendError> {
        moe::moe_experts(self, input, scratch, only)
    }

    fn moe_combine(
        &self,
        n_tokens: usize,
        hidden: usize,
        routes: &[Route],
        scratch: &MoeScratch<CpuBuf>,
        out: &mut CpuBuf,
    ) -> Result<(), BackendError> {
        moe::moe_combine(n_tokens, hidden, routes, scratch, out)
    }
}
