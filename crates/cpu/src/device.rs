//! [`CpuDevice`]: uploads, allocation and streams of the CPU backend.
//!
//! The device owns the persistent thread pool, shared by every stream it
//! creates: two sessions decoding at once take turns on the pool (one op
//! at a time; each op uses every thread), while each keeps its own
//! scratch, so they never contend on scratch locks.

use crate::dequant::dequantize;
use crate::kernels::{self, Isa};
use crate::pool::Pool;
use crate::scratch::{StreamScratch, UploadNeeds};
use crate::stream::CpuStream;
use crate::types::{CpuBank, CpuBuf, CpuExpert, CpuHostBuf, CpuMatrix, CpuRoutes, CpuVector};
use std::sync::{Arc, Mutex};
use turbospark_backend::{
    BackendError, DType, Device, ExpertTensors, HostTensor, Limits, MemoryInfo, Numerics, Route,
};

/// The CPU backend's device.
pub struct CpuDevice {
    /// Shared with every stream of this device.
    pool: Arc<Pool>,
    numerics: Numerics,
    /// The instruction set of the fast kernels.
    isa: Isa,
    /// Widest matrix per format uploaded so far (streams fit to it).
    needs: Mutex<UploadNeeds>,
}

impl CpuDevice {
    /// A device running on `threads` threads (at least 1, the caller's).
    pub fn new(threads: usize) -> Result<CpuDevice, BackendError> {
        let pool = Pool::new(threads).map_err(|e| BackendError::Device(e.to_string()))?;
        Ok(CpuDevice {
            pool: Arc::new(pool),
            numerics: Numerics::Exact,
            isa: Isa::detect(),
            needs: Mutex::new(UploadNeeds::default()),
        })
    }

    /// One thread per available core.
    pub fn with_available_threads() -> Result<CpuDevice, BackendError> {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        CpuDevice::new(n)
    }

    /// The same device computing with `numerics` (streams created before
    /// keep theirs).
    pub fn with_numerics(mut self, numerics: Numerics) -> CpuDevice {
        self.numerics = numerics;
        self
    }

    /// The same device running its fast kernels on `isa` (or on the
    /// portable kernels where this CPU lacks it); by default the best the
    /// CPU has.
    pub fn with_isa(mut self, isa: Isa) -> CpuDevice {
        self.isa = isa.supported();
        self
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    fn needs(&self) -> std::sync::MutexGuard<'_, UploadNeeds> {
        // Poisoning only means an upload panicked; the record stays usable.
        self.needs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn vector_data(t: &HostTensor, data: &mut [f32]) -> Result<(), BackendError> {
        dequantize(t.format, t.bytes.as_slice(), data).map_err(|source| BackendError::Quant {
            name: t.name.clone(),
            source,
        })
    }

    /// Checks and wraps a 2-D tensor; with `pack`, also repacks it for the
    /// fast kernels (where the instruction set has packed kernels).
    fn matrix(&self, t: &HostTensor, pack: bool) -> Result<CpuMatrix, BackendError> {
        let (rows, cols, rb) = t.matrix_layout()?;
        self.needs().record(t.format, cols);
        let mut m = CpuMatrix {
            name: t.name.clone(),
            format: t.format,
            rows,
            cols,
            row_bytes: rb,
            bytes: t.bytes.clone(),
            packed: None,
        };
        if pack {
            m.packed = kernels::pack(self.isa, &m).map(Arc::new);
        }
        Ok(m)
    }

    /// A bank's experts are never repacked: a streamed bank's repacked
    /// slots would sit beside the bytes the expert store reads into (twice
    /// the slot cache's memory bound), a mapped bank would be copied out of
    /// its mapping, and resident, mapped and streamed experts must compute
    /// the same bits, so all take the kernels on the original layout.
    fn upload_expert(&self, e: &ExpertTensors) -> Result<CpuExpert, BackendError> {
        let vector = |t: &Option<HostTensor>| t.as_ref().map(|t| self.upload_vector(t)).transpose();
        Ok(CpuExpert {
            gate: self.matrix(&e.gate, false)?,
            up: self.matrix(&e.up, false)?,
            down: self.matrix(&e.down, false)?,
            gate_bias: vector(&e.gate_bias)?,
            up_bias: vector(&e.up_bias)?,
            down_bias: vector(&e.down_bias)?,
        })
    }
}

/// Replaces `dst`'s bytes with `t`'s, which must have its format and shape
/// (an `Arc` clone, no allocation), and repacks them in place for the fast
/// kernels when `dst` is packed.
pub(crate) fn refill_matrix(
    isa: Isa,
    dst: &mut CpuMatrix,
    t: &HostTensor,
) -> Result<(), BackendError> {
    let same = t.format == dst.format
        && t.shape == [dst.rows, dst.cols]
        && t.bytes.len() == dst.rows * dst.row_bytes;
    if !same {
        return Err(crate::shape_err(
            "fill_slot",
            format!(
                "{} is {} {:?}, the slot holds {} [{}, {}]",
                t.name, t.format, t.shape, dst.format, dst.rows, dst.cols
            ),
        ));
    }
    dst.bytes = t.bytes.clone();
    if dst.packed.is_some() {
        kernels::repack(isa, dst);
    }
    Ok(())
}

/// Rewrites `dst` from `t` (same length).
pub(crate) fn refill_vector(dst: &mut CpuVector, t: &HostTensor) -> Result<(), BackendError> {
    if t.shape != [dst.data.len()] {
        return Err(crate::shape_err(
            "fill_slot",
            format!(
                "{} is {:?}, the slot holds [{}]",
                t.name,
                t.shape,
                dst.data.len()
            ),
        ));
    }
    CpuDevice::vector_data(t, &mut dst.data)
}

/// `MemTotal` and `MemAvailable` of `/proc/meminfo`, in bytes.
fn meminfo() -> MemoryInfo {
    let Ok(info) = std::fs::read_to_string("/proc/meminfo") else {
        return MemoryInfo::default();
    };
    let field = |name: &str| {
        let line = info.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    MemoryInfo {
        total: field("MemTotal:"),
        free: field("MemAvailable:"),
    }
}

impl Device for CpuDevice {
    type Buf = CpuBuf;
    type Matrix = CpuMatrix;
    type Vector = CpuVector;
    type Bank = CpuBank;
    type Routes = CpuRoutes;
    type HostBuf = CpuHostBuf;
    type Stream = CpuStream;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn numerics(&self) -> Numerics {
        self.numerics
    }

    fn memory(&self) -> MemoryInfo {
        meminfo()
    }

    fn supports(&self, dtype: DType) -> bool {
        dtype == DType::F32
    }

    fn kv_dtype(&self) -> DType {
        // llama.cpp numerics round the cache to f16 but keep it in f32.
        DType::F32
    }

    fn copies_weights(&self) -> bool {
        self.numerics == Numerics::Fast && kernels::packs(self.isa)
    }

    fn upload_matrix(&self, t: &HostTensor) -> Result<CpuMatrix, BackendError> {
        self.matrix(t, self.numerics == Numerics::Fast)
    }

    fn upload_vector(&self, t: &HostTensor) -> Result<CpuVector, BackendError> {
        Ok(CpuVector {
            data: t.vector_values()?,
        })
    }

    fn matrix_shape(&self, m: &CpuMatrix) -> [usize; 2] {
        [m.rows, m.cols]
    }

    fn vector_len(&self, v: &CpuVector) -> usize {
        v.data.len()
    }

    fn upload_bank(&self, experts: &[ExpertTensors]) -> Result<CpuBank, BackendError> {
        let experts = experts
            .iter()
            .map(|e| self.upload_expert(e))
            .collect::<Result<Vec<_>, _>>()?;
        CpuBank::new(experts)
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<CpuBuf, BackendError> {
        if !self.supports(dtype) {
            return Err(BackendError::UnsupportedDType {
                backend: self.name(),
                dtype,
            });
        }
        let data = zeroed_f32(len).ok_or(BackendError::OutOfMemory {
            what: "a buffer (KV cache or activations)",
            need: (len as u64).saturating_mul(4),
            free: self.memory().free.unwrap_or(0),
        })?;
        Ok(CpuBuf { dtype, data })
    }

    fn alloc_routes(&self, max_tokens: usize, top_k: usize) -> Result<CpuRoutes, BackendError> {
        Ok(CpuRoutes {
            routes: vec![Route::default(); max_tokens * top_k],
            top_k,
        })
    }

    fn alloc_host(&self, len: usize) -> Result<CpuHostBuf, BackendError> {
        Ok(CpuHostBuf {
            data: vec![0.0; len],
        })
    }

    fn stream(&self, limits: &Limits) -> Result<CpuStream, BackendError> {
        let scratch = StreamScratch::new(self.pool.threads(), self.numerics, &self.needs(), limits);
        Ok(CpuStream::new(
            Arc::clone(&self.pool),
            self.numerics,
            self.isa,
            scratch,
        ))
    }
}

/// `len` zero f32 values, or `None` when the allocator refuses (a KV cache
/// larger than memory, say) — where `vec![0.0; len]` would abort the process.
/// Zeroed pages come from the allocator untouched, so a large buffer costs
/// memory only as it is written, as `vec!` does.
fn zeroed_f32(len: usize) -> Option<Vec<f32>> {
    let layout = std::alloc::Layout::array::<f32>(len).ok()?;
    if layout.size() == 0 {
        return Some(Vec::new());
    }
    // SAFETY: `layout` has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<f32>();
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout of
    // `[f32; len]` (which is how a `Vec<f32>` of capacity `len` frees it),
    // and all-zero bytes are `len` valid f32 zeros.
    Some(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer larger than memory is an error, not an abort; small and
    /// empty ones are zeros.
    #[test]
    fn oversized_buffers_are_an_error() {
        let dev = CpuDevice::new(1).unwrap();
        match dev.alloc(DType::F32, 1 << 46) {
            Err(BackendError::OutOfMemory { need, .. }) => assert_eq!(need, 1 << 48),
            Err(e) => panic!("expected OutOfMemory, got {e}"),
            Ok(_) => panic!("a 256 TiB buffer was allocated"),
        }
        assert!(matches!(
            dev.alloc(DType::F32, usize::MAX / 2),
            Err(BackendError::OutOfMemory { .. })
        ));
        for len in [0, 1, 4097] {
            let b = dev.alloc(DType::F32, len).unwrap();
            assert_eq!(b.data.len(), len);
            assert!(b.data.iter().all(|&v| v == 0.0));
        }
    }
}
