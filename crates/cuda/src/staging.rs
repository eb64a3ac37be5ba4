//! Staging for [`Stream::fill_slot`](turbospark_backend::Stream::fill_slot):
//! a ring of page-locked host buffers, each with a device buffer and an
//! event, so that filling a slot neither waits for the GPU nor leaves the
//! caller's bytes in use.
//!
//! A piece (one projection or bias of an expert) is copied by the CPU into
//! the next ring entry's pinned buffer, then copied to the device
//! asynchronously on the session's stream (a true DMA, from page-locked
//! memory) — into the slot itself, or into the entry's device buffer when a
//! kernel must reorganise it (the split layout, `crate::layout`) — and the
//! entry's event is recorded after its last use. An entry is reused once its
//! event has completed: the host waits only when the ring has wrapped
//! around onto work the GPU has not reached. A piece whose bytes are already
//! page-locked (the slots registered by `crate::pinned`) skips the CPU copy:
//! the DMA reads it in place. Everything that writes a slot is ordered on the
//! session's stream, so a slot is never overwritten before the kernels queued
//! earlier have read it.
//!
//! A piece copied into an entry's device buffer may instead be copied on a
//! stream of its own ([`Lane::Beside`]), so that the DMA overlaps the kernels
//! queued before it (the layout kernel of the piece before, the experts that
//! hit): that stream first waits on the GPU for the entry's last use, and
//! the session's stream waits for the copy (a second event) before anything
//! queued after it. Only the entry's buffer is written off the session's
//! stream; the slot is still written by the layout kernel, on it.

use crate::memory::{runtime, DevMem};
use cudarc::driver::{result, sys, CudaContext};
use std::sync::Arc;
use turbospark_backend::BackendError;

/// Entries of the ring: pieces in flight at once (a gpt-oss layer's
/// misses are up to six pieces each, filled one expert after another as
/// each is read).
const ENTRIES: usize = 16;

/// Page-locked host bytes, freed on drop.
struct PinnedBytes {
    ptr: *mut u8,
    len: usize,
    ctx: Arc<CudaContext>,
}

impl PinnedBytes {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<PinnedBytes, BackendError> {
        ctx.bind_to_thread().map_err(runtime("fill_slot"))?;
        // SAFETY: a plain page-locked allocation, freed in Drop.
        let ptr = unsafe { result::malloc_host(len.max(1), 0) }.map_err(runtime("fill_slot"))?;
        Ok(PinnedBytes {
            ptr: ptr as *mut u8,
            len,
            ctx: ctx.clone(),
        })
    }
}

impl Drop for PinnedBytes {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_host, freed once (its entry's
            // event was waited for first, see Entry::drop).
            let _ = unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) };
        }
    }
}

/// An event recorded after some queued work, and whether it was recorded
/// since it was last waited for: the ring's entries and the stream's fills
/// from registered memory (`Stream::wait_slot_fills`) wait on one before
/// reusing what the work reads. Dropping it waits first.
pub(crate) struct Fence {
    event: sys::CUevent,
    pending: bool,
}

// SAFETY: an event is a handle usable from any thread that binds its
// context; a fence belongs to one entry or stream.
unsafe impl Send for Fence {}

impl Fence {
    /// Makes `stream` wait (on the GPU) for the work before the last
    /// record, if any was recorded since the last host wait.
    pub(crate) fn queue_wait(
        &self,
        stream: sys::CUstream,
        op: &'static str,
    ) -> Result<(), BackendError> {
        if self.pending {
            // SAFETY: a valid event and stream of this context.
            unsafe {
                result::stream::wait_event(
                    stream,
                    self.event,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            }
            .map_err(runtime(op))?;
        }
        Ok(())
    }

    /// A new event in the bound context.
    pub(crate) fn new(op: &'static str) -> Result<Fence, BackendError> {
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(runtime(op))?;
        Ok(Fence {
            event,
            pending: false,
        })
    }

    /// Records the event after the work queued on `stream` so far.
    pub(crate) fn record(
        &mut self,
        stream: sys::CUstream,
        op: &'static str,
    ) -> Result<(), BackendError> {
        // SAFETY: a valid event and stream of this context.
        unsafe { result::event::record(self.event, stream) }.map_err(runtime(op))?;
        self.pending = true;
        Ok(())
    }

    /// Waits for the work before the last record, if not waited for yet.
    pub(crate) fn wait(&mut self, op: &'static str) -> Result<(), BackendError> {
        if self.pending {
            // SAFETY: a valid event of this context.
            unsafe { result::event::synchronize(self.event) }.map_err(runtime(op))?;
            self.pending = false;
        }
        Ok(())
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        // The work may still read what the fence guards.
        let _ = self.wait("fill_slot");
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { result::event::destroy(self.event) };
    }
}

/// One piece in flight: its page-locked and device buffers, the fence
/// after its last use, and the event after its copy when that ran on a
/// copy stream. (Fields drop in order: the fences wait before the buffers
/// are freed.)
struct Entry {
    fence: Fence,
    copied: Fence,
    host: PinnedBytes,
    device: DevMem,
}

// SAFETY: the pinned buffer and the fence belong to this entry alone and
// are used from whichever thread owns the stream.
unsafe impl Send for Entry {}

/// The ring (see the module docs).
#[derive(Default)]
pub(crate) struct Ring {
    entries: Vec<Entry>,
    next: usize,
}

/// The streams a piece's copy is queued on.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Lane {
    /// The session's stream, in order with everything else.
    Same(sys::CUstream),
    /// `copies` (into an entry's device buffer only), with `compute`, the
    /// session's stream, waiting for it (see the module docs).
    Beside {
        copies: sys::CUstream,
        compute: sys::CUstream,
    },
}

/// A staged piece: where its bytes are on the device once the copy queued
/// on the stream has run (the entry's device buffer, or the destination).
pub(crate) struct Staged {
    pub(crate) device: u64,
    index: usize,
}

impl Ring {
    /// Copies `bytes` into the next entry and queues its copy to `dst` (or,
    /// when `dst` is None, to the entry's device buffer) on `stream`. When
    /// `bytes` is `pinned` (registered page-locked memory, `crate::pinned`)
    /// the DMA reads it in place: no CPU copy, and the caller's bytes stay
    /// in use until the copy has run.
    /// On [`Lane::Beside`], `dst` must be None.
    pub(crate) fn stage(
        &mut self,
        ctx: &Arc<CudaContext>,
        lane: Lane,
        bytes: &[u8],
        pinned: bool,
        dst: Option<u64>,
    ) -> Result<Staged, BackendError> {
        let stream = match lane {
            Lane::Same(s) => s,
            Lane::Beside { copies, .. } if dst.is_none() => copies,
            Lane::Beside { .. } => {
                return Err(BackendError::Shape {
                    op: "fill_slot",
                    detail: "a copy beside the stream goes to a staging buffer only".into(),
                })
            }
        };
        let index = self.next;
        self.next = (self.next + 1) % ENTRIES;
        if self.entries.len() <= index {
            ctx.bind_to_thread().map_err(runtime("fill_slot"))?;
            self.entries.push(Entry {
                fence: Fence::new("fill_slot")?,
                copied: Fence::new("fill_slot")?,
                host: PinnedBytes::new(ctx, if pinned { 0 } else { bytes.len() })?,
                device: DevMem::zeroed(
                    ctx,
                    if dst.is_some() { 0 } else { bytes.len() },
                    "fill_slot",
                )?,
            });
        }
        let e = &mut self.entries[index];
        let grows = dst.is_none() && e.device.bytes < bytes.len();
        match lane {
            // Neither of the entry's buffers is rewritten by the host: its
            // device buffer only has to wait, on the GPU, for its last
            // reader.
            Lane::Beside { copies, .. } if pinned && !grows => {
                e.fence.queue_wait(copies, "fill_slot")?
            }
            // (its last use ends after its last copy, on either lane)
            _ => e.fence.wait("fill_slot")?,
        }
        if !pinned && e.host.len < bytes.len() {
            e.host = PinnedBytes::new(ctx, bytes.len())?;
        }
        if grows {
            e.device = DevMem::zeroed(ctx, bytes.len(), "fill_slot")?;
        }
        let src = if pinned {
            bytes.as_ptr()
        } else {
            // SAFETY: the pinned buffer holds at least bytes.len() bytes
            // and no queued copy reads it (its event completed above).
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), e.host.ptr, bytes.len()) };
            e.host.ptr as *const u8
        };
        let to = dst.unwrap_or(e.device.ptr);
        // SAFETY: page-locked source of bytes.len() bytes (the entry's
        // buffer, alive until its event completes, or registered memory
        // the caller keeps unwritten until `Stream::wait_slot_fills`); the
        // destination holds that many bytes (the caller's slot range, or
        // the entry's device buffer, checked above).
        unsafe { sys::cuMemcpyHtoDAsync_v2(to, src as *const _, bytes.len(), stream).result() }
            .map_err(runtime("fill_slot"))?;
        if let Lane::Beside { copies, compute } = lane {
            e.copied.record(copies, "fill_slot")?;
            e.copied.queue_wait(compute, "fill_slot")?;
        }
        Ok(Staged { device: to, index })
    }

    /// Marks the end of a staged piece's use on `stream` (after the kernel
    /// that reads its device buffer, if any).
    pub(crate) fn release(&mut self, s: Staged, stream: sys::CUstream) -> Result<(), BackendError> {
        self.entries[s.index].fence.record(stream, "fill_slot")
    }
}
