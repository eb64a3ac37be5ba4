//! [`CudaDevice`]: one NVIDIA GPU behind the backend seam.
//!
//! Creating a device checks, in order, that the driver library loads, that
//! the GPU exists, and that NVRTC loads; then compiles the kernels for the
//! GPU's compute capability (or takes them from the disk cache, see
//! [`crate::nvrtc`]). Uploads copy weights into device memory, so after
//! loading the host pages of an install are no longer read
//! ([`Device::copies_weights`]). Expert banks stack a layer's experts per
//! projection so that one launch reaches any of them.

use crate::kernels::Kernels;
use crate::memory::runtime;
use crate::memory::{DevMem, PinnedF32};
use crate::pinned::{PinnedRanges, Registration};
use crate::stream::CudaStream;
use crate::types::{CudaBank, CudaBuf, CudaMatrix, CudaRoutes, CudaVector, Stacked};
use crate::{layout, nvrtc, CudaError};
use cudarc::driver::{sys, CudaContext};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use turbospark_backend::host::ByteOwner;
use turbospark_backend::{
    BackendError, DType, Device, ExpertTensors, HostPin, HostTensor, Limits, MemoryInfo, Numerics,
};
use turbospark_core::QuantFormat;

/// One CUDA GPU (see the module docs).
pub struct CudaDevice {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) kernels: Arc<Kernels>,
    numerics: Numerics,
    name: String,
    capability: (i32, i32),
    /// The widest matrix input uploaded so far (columns), which sizes a
    /// new stream's quantized-activation scratch.
    pub(crate) widest: AtomicUsize,
    /// Host memory registered by [`Device::pin_host`], which streams copy
    /// from directly.
    pub(crate) pinned: Arc<PinnedRanges>,
    /// Whether the driver registers read-only host memory
    /// ([`Device::pin_host_read_only`]).
    read_only_pins: bool,
}

impl CudaDevice {
    /// GPU `ordinal`, computing with `numerics`: [`Numerics::Exact`] keeps
    /// the KV cache in f32, [`Numerics::Fast`] in f16. The CUDA backend
    /// does not reproduce llama.cpp's CPU arithmetic, so
    /// [`Numerics::LlamaCpp`] is refused.
    pub fn new(ordinal: usize, numerics: Numerics) -> Result<CudaDevice, CudaError> {
        if numerics == Numerics::LlamaCpp {
            return Err(CudaError::Numerics(numerics));
        }
        // SAFETY: only tries to open the driver library by its known names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        let count = CudaContext::device_count().map_err(CudaError::driver("counting devices"))?;
        if ordinal >= count.max(0) as usize {
            return Err(CudaError::NoDevice {
                ordinal,
                count: count.max(0) as usize,
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(CudaError::driver("creating a context"))?;
        // Every buffer is used on one stream, or ordered explicitly with
        // events: the context's per-buffer event tracking is not needed.
        // SAFETY: no CudaSlice of cudarc's safe API is used by this crate.
        unsafe { ctx.disable_event_tracking() };
        let capability = ctx
            .compute_capability()
            .map_err(CudaError::driver("reading the compute capability"))?;
        let name = ctx.name().map_err(CudaError::driver("reading the name"))?;
        let (major, minor) = capability;
        let kernels = load_kernels(&ctx, &name, major, minor)?;
        let kernels = Arc::new(kernels);
        crate::kernels::note_device(capability.0);
        let read_only_pins = ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
            )
            .is_ok_and(|v| v != 0);
        Ok(CudaDevice {
            ctx,
            kernels,
            numerics,
            name,
            capability,
            widest: AtomicUsize::new(0),
            pinned: Arc::default(),
            read_only_pins,
        })
    }

    /// The GPU's name as the driver reports it.
    pub fn gpu_name(&self) -> &str {
        &self.name
    }

    /// `(major, minor)` compute capability.
    pub fn capability(&self) -> (i32, i32) {
        self.capability
    }

    fn f32_mem(&self, v: &[f32], what: &'static str) -> Result<DevMem, BackendError> {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        DevMem::from_host(&self.ctx, &bytes, what)
    }

    /// Copies `bytes` (`rows` rows of `host_row_bytes` in `format`, as the
    /// host holds them) to byte `at` of `dst`, in the device layout
    /// ([`crate::layout`]); synchronous.
    #[allow(clippy::too_many_arguments)]
    fn upload_rows(
        &self,
        dst: &DevMem,
        at: usize,
        bytes: &[u8],
        format: QuantFormat,
        rows: usize,
        host_row_bytes: usize,
        what: &'static str,
    ) -> Result<(), BackendError> {
        if layout::split_parts(format).is_none() {
            return dst.upload_at(at, bytes, what);
        }
        let need = rows * layout::device_row_bytes(format, host_row_bytes);
        if at + need > dst.bytes {
            return Err(BackendError::OutOfBounds {
                start: at,
                end: at + need,
                len: dst.bytes,
            });
        }
        let staging = DevMem::from_host(&self.ctx, bytes, what)?;
        let stream = self.ctx.default_stream();
        layout::queue_split(
            &self.kernels,
            &stream,
            format,
            staging.ptr,
            dst.ptr + at as u64,
            rows,
            host_row_bytes,
        )?;
        stream.synchronize().map_err(runtime(what))
    }

    /// Stacks one projection of every expert.
    fn stack(
        &self,
        experts: &[ExpertTensors],
        pick: fn(&ExpertTensors) -> &HostTensor,
        shape: [usize; 2],
    ) -> Result<Stacked, BackendError> {
        let first = pick(&experts[0]);
        let (_, _, host_rb) = first.matrix_layout()?;
        let rb = layout::device_row_bytes(first.format, host_rb);
        let slot_bytes = shape[0] * rb;
        let mem = DevMem::zeroed(&self.ctx, slot_bytes * experts.len(), "upload_bank")?;
        for (s, e) in experts.iter().enumerate() {
            let t = pick(e);
            let (rows, cols, _) = t.matrix_layout()?;
            if [rows, cols] != shape || t.format != first.format {
                return Err(BackendError::Shape {
                    op: "upload_bank",
                    detail: format!(
                        "{} is {:?} {}, the bank's experts are {shape:?} {}",
                        t.name, t.shape, t.format, first.format
                    ),
                });
            }
            self.upload_rows(
                &mem,
                s * slot_bytes,
                t.bytes.as_slice(),
                t.format,
                rows,
                host_rb,
                "upload_bank",
            )?;
        }
        Ok(Stacked {
            format: first.format,
            rows: shape[0],
            row_bytes: rb,
            host_row_bytes: host_rb,
            mem,
        })
    }

    /// Stacks one bias of every expert (all or none have it).
    fn stack_bias(
        &self,
        experts: &[ExpertTensors],
        pick: fn(&ExpertTensors) -> Option<&HostTensor>,
        len: usize,
    ) -> Result<Option<DevMem>, BackendError> {
        if experts.iter().all(|e| pick(e).is_none()) {
            return Ok(None);
        }
        let mut all = Vec::with_capacity(experts.len() * len);
        for e in experts {
            let t = pick(e).ok_or_else(|| BackendError::Shape {
                op: "upload_bank",
                detail: format!("{} has no bias where other experts do", e.gate.name),
            })?;
            let v = t.vector_values()?;
            if v.len() != len {
                return Err(BackendError::Shape {
                    op: "upload_bank",
                    detail: format!("bias {} has {} elements, expected {len}", t.name, v.len()),
                });
            }
            all.extend(v);
        }
        self.f32_mem(&all, "upload_bank").map(Some)
    }
}

impl Device for CudaDevice {
    type Buf = CudaBuf;
    type Matrix = CudaMatrix;
    type Vector = CudaVector;
    type Bank = CudaBank;
    type Routes = CudaRoutes;
    type HostBuf = PinnedF32;
    type Stream = CudaStream;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn numerics(&self) -> Numerics {
        self.numerics
    }

    fn memory(&self) -> MemoryInfo {
        match self.ctx.mem_get_info() {
            Ok((free, total)) => MemoryInfo {
                total: Some(total as u64),
                free: Some(free as u64),
            },
            Err(_) => MemoryInfo::default(),
        }
    }

    fn supports(&self, dtype: DType) -> bool {
        matches!(dtype, DType::F32 | DType::F16)
    }

    fn default_batch(&self) -> usize {
        512
    }

    fn kv_dtype(&self) -> DType {
        match self.numerics {
            Numerics::Exact => DType::F32,
            _ => DType::F16,
        }
    }

    fn copies_weights(&self) -> bool {
        true
    }

    fn upload_matrix(&self, t: &HostTensor) -> Result<CudaMatrix, BackendError> {
        let (rows, cols, host_rb) = t.matrix_layout()?;
        let rb = layout::device_row_bytes(t.format, host_rb);
        let mem = DevMem::zeroed(&self.ctx, rows * rb, "upload_matrix")?;
        let bytes = t.bytes.as_slice();
        self.upload_rows(&mem, 0, bytes, t.format, rows, host_rb, "upload_matrix")?;
        self.widest.fetch_max(cols, Ordering::Relaxed);
        Ok(CudaMatrix {
            format: t.format,
            rows,
            cols,
            row_bytes: rb,
            mem,
        })
    }

    fn upload_vector(&self, t: &HostTensor) -> Result<CudaVector, BackendError> {
        let v = t.vector_values()?;
        Ok(CudaVector {
            len: v.len(),
            mem: self.f32_mem(&v, "upload_vector")?,
        })
    }

    fn matrix_shape(&self, m: &CudaMatrix) -> [usize; 2] {
        [m.rows, m.cols]
    }

    fn vector_len(&self, v: &CudaVector) -> usize {
        v.len
    }

    fn upload_bank(&self, experts: &[ExpertTensors]) -> Result<CudaBank, BackendError> {
        let Some(first) = experts.first() else {
            return Err(BackendError::Shape {
                op: "upload_bank",
                detail: "a bank of no experts".into(),
            });
        };
        let (inter, hidden, _) = first.gate.matrix_layout()?;
        self.widest.fetch_max(hidden.max(inter), Ordering::Relaxed);
        let gate = self.stack(experts, |e| &e.gate, [inter, hidden])?;
        let up = self.stack(experts, |e| &e.up, [inter, hidden])?;
        let down = self.stack(experts, |e| &e.down, [hidden, inter])?;
        Ok(CudaBank {
            slots: experts.len(),
            hidden,
            inter,
            gate,
            up,
            down,
            gate_bias: self.stack_bias(experts, |e| e.gate_bias.as_ref(), inter)?,
            up_bias: self.stack_bias(experts, |e| e.up_bias.as_ref(), inter)?,
            down_bias: self.stack_bias(experts, |e| e.down_bias.as_ref(), hidden)?,
        })
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<CudaBuf, BackendError> {
        if !self.supports(dtype) {
            return Err(BackendError::UnsupportedDType {
                backend: self.name(),
                dtype,
            });
        }
        let bytes = dtype.bytes_for(len).ok_or(BackendError::Shape {
            op: "alloc",
            detail: format!("{len} elements of {dtype}"),
        })?;
        Ok(CudaBuf {
            dtype,
            len,
            mem: Arc::new(DevMem::zeroed(&self.ctx, bytes, "alloc")?),
        })
    }

    fn alloc_routes(&self, max_tokens: usize, top_k: usize) -> Result<CudaRoutes, BackendError> {
        Ok(CudaRoutes {
            max_tokens,
            top_k,
            mem: Arc::new(DevMem::zeroed(
                &self.ctx,
                max_tokens * top_k * 8,
                "alloc_routes",
            )?),
            max_slot: 0,
        })
    }

    fn alloc_host(&self, len: usize) -> Result<PinnedF32, BackendError> {
        PinnedF32::new(&self.ctx, len)
    }

    /// `TURBOSPARK_CUDA_PIN=0` leaves the slots pageable (every fill
    /// staged through the ring, as before pinning; for comparisons).
    fn pin_host(&self, bytes: &ByteOwner) -> Result<Option<HostPin>, BackendError> {
        if std::env::var("TURBOSPARK_CUDA_PIN").as_deref() == Ok("0") {
            return Ok(None);
        }
        Ok(Registration::new(&self.ctx, &self.pinned, bytes, false)?
            .map(|r| HostPin::new(Box::new(r))))
    }

    /// Needs `CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED` (an
    /// H200 with driver 580 has it); `TURBOSPARK_CUDA_PIN=0` turns it off
    /// too.
    fn pin_host_read_only(&self, bytes: &ByteOwner) -> Result<Option<HostPin>, BackendError> {
        if !self.read_only_pins || std::env::var("TURBOSPARK_CUDA_PIN").as_deref() == Ok("0") {
            return Ok(None);
        }
        Ok(Registration::new(&self.ctx, &self.pinned, bytes, true)?
            .map(|r| HostPin::new(Box::new(r))))
    }

    fn stream(&self, limits: &Limits) -> Result<CudaStream, BackendError> {
        CudaStream::new(self, limits)
    }
}

/// The kernels for `sm_{major}{minor}` loaded into `ctx`: the programs'
/// CUBINs from the disk cache, or compiled now (said on stderr, with the
/// time it took: a first start on a GPU kind or NVRTC version waits for
/// it). Cached CUBINs the driver refuses (damaged, or from a compiler it
/// does not take) are compiled afresh, once.
fn load_kernels(
    ctx: &Arc<CudaContext>,
    gpu: &str,
    major: i32,
    minor: i32,
) -> Result<Kernels, CudaError> {
    let started = std::time::Instant::now();
    let told = std::cell::Cell::new(false);
    let compile = || {
        nvrtc::compile_cached(major, minor, |programs| {
            if !told.replace(true) {
                let place = nvrtc::cache_dir()
                    .map_or("not cached: no HOME or TURBOSPARK_CACHE".into(), |d| {
                        format!("cached in {}", d.display())
                    });
                eprintln!(
                    "compiling the CUDA kernels for sm_{major}{minor} ({gpu}): {programs} \
                     programs on {} threads, once for this GPU kind and NVRTC version ({place})",
                    nvrtc::compile_threads(programs)
                );
            }
        })
    };
    let built = compile()?;
    let fresh = built.compiled == nvrtc::PROGRAMS.len();
    let kernels = match Kernels::load(ctx, built.cubins) {
        Ok(k) => k,
        Err(e) if fresh => return Err(e),
        Err(_) => {
            nvrtc::forget_cached(major, minor);
            Kernels::load(ctx, compile()?.cubins)?
        }
    };
    if told.get() {
        eprintln!(
            "compiled the CUDA kernels in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(kernels)
}
