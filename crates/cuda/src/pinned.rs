//! Host memory page-locked for direct copies to the device
//! ([`Device::pin_host`](turbospark_backend::Device::pin_host)).
//!
//! A streamed layer's expert slots are read from storage into host memory,
//! then copied to the device. From pageable memory that copy must go
//! through a page-locked staging buffer (`crate::staging`: a CPU copy of
//! every byte on the session's thread, then the DMA); once the slots' own
//! memory is registered with the driver (`cuMemHostRegister`), the DMA reads
//! it directly and the CPU copy disappears.
//!
//! The device keeps the registered ranges in a [`PinnedRanges`] shared with
//! its streams, so `fill_slot` can tell which host bytes it may copy from
//! directly. A [`Registration`] unregisters its range on drop, and holds
//! the memory's owner so the bytes outlive the lock.

use crate::memory::runtime;
use cudarc::driver::{sys, CudaContext};
use std::sync::{Arc, Mutex};
use turbospark_backend::host::ByteOwner;
use turbospark_backend::BackendError;

/// Host address ranges `[start, end)` registered with the driver.
#[derive(Default, Debug)]
pub(crate) struct PinnedRanges(Mutex<Vec<(usize, usize)>>);

impl PinnedRanges {
    /// Whether `bytes` lies wholly inside one registered range.
    pub(crate) fn contains(&self, bytes: &[u8]) -> bool {
        let (start, end) = (
            bytes.as_ptr() as usize,
            bytes.as_ptr() as usize + bytes.len(),
        );
        let ranges = self.0.lock().unwrap_or_else(|p| p.into_inner());
        ranges.iter().any(|&(s, e)| s <= start && end <= e)
    }

    fn add(&self, range: (usize, usize)) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(range);
    }

    fn remove(&self, range: (usize, usize)) {
        let mut ranges = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = ranges.iter().position(|&r| r == range) {
            ranges.swap_remove(i);
        }
    }
}

/// One registered range (see the module docs).
pub(crate) struct Registration {
    ctx: Arc<CudaContext>,
    ranges: Arc<PinnedRanges>,
    range: (usize, usize),
    /// Keeps the registered bytes allocated until they are unregistered.
    _owner: ByteOwner,
}

impl Registration {
    /// Registers the bytes of `owner`; `Ok(None)` when the driver refuses
    /// (too much locked memory, or memory it cannot lock), so the caller
    /// stages its copies instead.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        ranges: &Arc<PinnedRanges>,
        owner: &ByteOwner,
    ) -> Result<Option<Registration>, BackendError> {
        let bytes = (**owner).as_ref();
        if bytes.is_empty() {
            return Ok(None);
        }
        ctx.bind_to_thread().map_err(runtime("pin_host"))?;
        // SAFETY: `bytes` is a live allocation of `bytes.len()` bytes, kept
        // alive by `_owner` until Drop unregisters it. Registration only
        // locks the pages; the host still writes them (the expert store's
        // reads), ordered against the device's copies by the stream
        // (`Stream::wait_slot_fills`).
        let r = unsafe {
            sys::cuMemHostRegister_v2(bytes.as_ptr() as *mut std::ffi::c_void, bytes.len(), 0)
        };
        if r != sys::cudaError_enum::CUDA_SUCCESS {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                eprintln!(
                    "warning: could not page-lock {:.1} MiB of expert slots for the GPU ({r:?}); \
                     their copies go through staging buffers instead, which is slower",
                    bytes.len() as f64 / (1u64 << 20) as f64
                )
            });
            return Ok(None);
        }
        let range = (
            bytes.as_ptr() as usize,
            bytes.as_ptr() as usize + bytes.len(),
        );
        ranges.add(range);
        Ok(Some(Registration {
            ctx: ctx.clone(),
            ranges: ranges.clone(),
            range,
            _owner: owner.clone(),
        }))
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.ranges.remove(self.range);
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: registered once in `new`, unregistered once here,
            // while `_owner` still keeps the memory allocated; the context
            // is drained first, so no queued copy still reads the range.
            unsafe {
                let _ = sys::cuCtxSynchronize();
                let _ = sys::cuMemHostUnregister(self.range.0 as *mut std::ffi::c_void);
            }
        }
    }
}
