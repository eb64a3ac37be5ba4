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

/// Host address ranges `[start, end)` registered with the driver, sorted
/// by start (the driver refuses overlapping registrations, so they do not
/// overlap; a streamed model may hold one per expert).
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
        // The last range starting at or before `start` is the only one
        // that can hold it.
        let i = ranges.partition_point(|&(s, _)| s <= start);
        i > 0 && end <= ranges[i - 1].1
    }

    fn add(&self, range: (usize, usize)) {
        let mut ranges = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let i = ranges.partition_point(|&r| r < range);
        ranges.insert(i, range);
    }

    fn remove(&self, range: (usize, usize)) {
        let mut ranges = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Ok(i) = ranges.binary_search(&range) {
            ranges.remove(i);
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
    /// stages its copies instead. `read_only`: the device only reads them
    /// (`CU_MEMHOSTREGISTER_READ_ONLY`), which a read-only mapping of a
    /// file needs; the caller checks the device supports it.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        ranges: &Arc<PinnedRanges>,
        owner: &ByteOwner,
        read_only: bool,
    ) -> Result<Option<Registration>, BackendError> {
        let bytes = (**owner).as_ref();
        if bytes.is_empty() {
            return Ok(None);
        }
        ctx.bind_to_thread().map_err(runtime("pin_host"))?;
        let flags = if read_only {
            sys::CU_MEMHOSTREGISTER_READ_ONLY
        } else {
            0
        };
        // SAFETY: `bytes` is a live allocation (or mapping) of
        // `bytes.len()` bytes, kept alive by `_owner` until Drop unregisters
        // it. Registration only locks the pages; the device only reads them
        // (copies to the device). Where the host still writes them (the
        // expert store's reads into its slots) those writes are ordered
        // against the device's copies by the stream
        // (`Stream::wait_slot_fills`); read-only memory is never written.
        let r = unsafe {
            sys::cuMemHostRegister_v2(bytes.as_ptr() as *mut std::ffi::c_void, bytes.len(), flags)
        };
        if r != sys::cudaError_enum::CUDA_SUCCESS && read_only {
            // A mapping the driver cannot lock (or no room to lock more):
            // the caller reads those bytes instead, as without a mapping.
            return Ok(None);
        }
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

#[cfg(test)]
mod tests {
    use super::PinnedRanges;

    /// A slice is pinned only when one range holds all of it, whatever the
    /// order the ranges came in.
    #[test]
    fn contains_needs_one_range_to_hold_the_slice() {
        let mem = vec![0u8; 1000];
        let base = mem.as_ptr() as usize;
        let r = PinnedRanges::default();
        for (s, e) in [(600, 900), (0, 100), (100, 300)] {
            r.add((base + s, base + e));
        }
        let holds = |s: usize, e: usize| r.contains(&mem[s..e]);
        assert!(holds(0, 100) && holds(150, 300) && holds(600, 900) && holds(700, 701));
        // Across two adjacent ranges, in a gap, past the end.
        assert!(!holds(50, 150) && !holds(300, 400) && !holds(350, 650) && !holds(850, 950));
        r.remove((base, base + 100));
        assert!(!holds(0, 100) && holds(100, 300));
    }
}
