//! Device memory and pinned host memory owned by the backend's objects.

use cudarc::driver::{result, sys, CudaContext, DriverError};
use std::sync::Arc;
use turbospark_backend::BackendError;

/// Maps a driver error of `op` to a backend error.
pub(crate) fn runtime(op: &'static str) -> impl Fn(DriverError) -> BackendError {
    move |e| BackendError::Runtime {
        op,
        detail: format!("{e}"),
    }
}

/// `bytes` of device memory, freed on drop.
#[derive(Debug)]
pub(crate) struct DevMem {
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) bytes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: a device pointer is an address in the context's memory, usable
// from any thread that binds the context (every use does).
unsafe impl Send for DevMem {}
unsafe impl Sync for DevMem {}

impl DevMem {
    /// Zeroed device memory (at least one byte, so that the pointer is
    /// valid even for empty buffers).
    pub(crate) fn zeroed(
        ctx: &Arc<CudaContext>,
        bytes: usize,
        what: &'static str,
    ) -> Result<DevMem, BackendError> {
        ctx.bind_to_thread().map_err(runtime(what))?;
        let n = bytes.max(1);
        // SAFETY: plain allocation in the bound context; freed in Drop.
        let ptr = unsafe { result::malloc_sync(n) }.map_err(|e| {
            if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
                let free = ctx.mem_get_info().map(|(f, _)| f as u64).unwrap_or(0);
                BackendError::OutOfMemory {
                    what,
                    need: n as u64,
                    free,
                }
            } else {
                runtime(what)(e)
            }
        })?;
        let mem = DevMem {
            ptr,
            bytes,
            ctx: ctx.clone(),
        };
        // SAFETY: `ptr` holds `n` bytes.
        unsafe { result::memset_d8_sync(ptr, 0, n) }.map_err(runtime(what))?;
        legacy_stream_done(what)?;
        Ok(mem)
    }

    /// Device memory holding `data`.
    pub(crate) fn from_host(
        ctx: &Arc<CudaContext>,
        data: &[u8],
        what: &'static str,
    ) -> Result<DevMem, BackendError> {
        let mem = DevMem::zeroed(ctx, data.len(), what)?;
        mem.upload_at(0, data, what)?;
        Ok(mem)
    }

    /// Synchronous copy of `data` to byte offset `at`.
    pub(crate) fn upload_at(
        &self,
        at: usize,
        data: &[u8],
        what: &'static str,
    ) -> Result<(), BackendError> {
        if at + data.len() > self.bytes {
            return Err(BackendError::OutOfBounds {
                start: at,
                end: at + data.len(),
                len: self.bytes,
            });
        }
        if data.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(runtime(what))?;
        // SAFETY: the range lies inside the allocation (checked above).
        unsafe { result::memcpy_htod_sync(self.ptr + at as u64, data) }.map_err(runtime(what))?;
        legacy_stream_done(what)
    }
}

/// Waits for the work queued on the legacy default stream: `cuMemsetD8`
/// and `cuMemcpyHtoD` from pageable memory return before the device has
/// done them (the copy once its data is staged), and the backend's work
/// streams are non-blocking, so nothing would order a later kernel or copy
/// on them after a buffer's zeroing or upload. Allocations and uploads are
/// set-up work; the wait costs microseconds.
fn legacy_stream_done(what: &'static str) -> Result<(), BackendError> {
    // SAFETY: the null stream handle names the current context's legacy
    // default stream, which always exists (the caller bound the context).
    unsafe { result::stream::synchronize(std::ptr::null_mut()) }.map_err(runtime(what))
}

impl Drop for DevMem {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_sync in this context, freed once.
            // A failure here (a device already lost) leaves nothing to do.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Page-locked host memory of f32 that device copies write into.
pub struct PinnedF32 {
    ptr: *mut f32,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the memory is owned by this value alone.
unsafe impl Send for PinnedF32 {}

impl PinnedF32 {
    pub(crate) fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<PinnedF32, BackendError> {
        ctx.bind_to_thread().map_err(runtime("alloc_host"))?;
        let bytes = (len * 4).max(4);
        // SAFETY: a plain page-locked allocation, freed in Drop.
        let ptr = unsafe { result::malloc_host(bytes, 0) }.map_err(runtime("alloc_host"))?;
        // SAFETY: `bytes` writable bytes at `ptr`.
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, bytes) };
        Ok(PinnedF32 {
            ptr: ptr as *mut f32,
            len,
            ctx: ctx.clone(),
        })
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut f32 {
        self.ptr
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl AsRef<[f32]> for PinnedF32 {
    fn as_ref(&self) -> &[f32] {
        // SAFETY: `len` initialised floats live at `ptr` while self does;
        // device writes land only between a read_async and the
        // synchronize that the caller must wait for before reading.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl AsMut<[f32]> for PinnedF32 {
    fn as_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in as_ref; the exclusive borrow keeps host reads and
        // writes off the memory while a stream's `read` copies into it
        // (it returns after its synchronize).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedF32 {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_host, freed once.
            let _ = unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) };
        }
    }
}
