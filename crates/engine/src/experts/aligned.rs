//! Page-aligned, zeroed host memory for expert slots.
//!
//! A streamed layer's slots live in one [`AlignedBuf`]: `slots` records of
//! `slot_bytes` each (a multiple of the page size), so every slot starts on
//! a page boundary, as `O_DIRECT` reads require of their destination. The
//! buffer is shared with the backend's slot matrices through
//! [`SharedBytes`](turbospark_backend::SharedBytes) (it is their byte owner)
//! and written by the I/O pool through raw pointers.
//!
//! Access protocol (what makes the shared writes sound): a slot's bytes are
//! written only by a read job of the session that owns the buffer, while that
//! session is inside its expert fetch and before any op of the current group
//! reads them; backend ops read slot bytes only after the fetch has returned,
//! and no reference to the bytes outlives an op. A device that copies slots
//! to its memory straight from this buffer (page-locked by
//! `Device::pin_host`) may still be reading after `fill_slot` returns: the
//! session waits for those copies (`Stream::wait_slot_fills`) before it
//! reads into a slot again. The buffer itself never moves or shrinks while
//! it is alive.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment of slot buffers: one page, the strictest `O_DIRECT` needs on
/// the filesystems Linux supports (and the install's expert stride).
pub(crate) const SLOT_ALIGN: usize = 4096;

/// A zeroed heap allocation aligned to [`SLOT_ALIGN`].
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is plain heap memory owned by this value; the engine
// mutates it only under the access protocol of the module docs (one writer
// per slot, never while a reader holds a reference), so sharing the owner
// between threads cannot create a data race.
unsafe impl Send for AlignedBuf {}
// SAFETY: as for `Send`: readers only create shared slices, and writes are
// serialised against reads by the owning session.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` zero bytes at a page boundary; `None` when the allocation fails
    /// or `len` is too large to describe.
    pub(crate) fn zeroed(len: usize) -> Option<AlignedBuf> {
        // A zero-sized layout may not be passed to the allocator.
        let layout = Layout::from_size_align(len.max(1), SLOT_ALIGN).ok()?;
        // SAFETY: `layout` has a non-zero size (see above) and a valid,
        // power-of-two alignment.
        let raw = unsafe { alloc_zeroed(layout) };
        NonNull::new(raw).map(|ptr| AlignedBuf { ptr, layout })
    }

    /// Bytes the buffer holds (at least 1 even when 0 were asked for; only
    /// the asked-for prefix is ever used).
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    /// The whole buffer, writable: for filling it before it is shared.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the pointer is valid for `layout.size()` initialised bytes
        // for the life of `self`, and `&mut self` excludes every other
        // borrow of them.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }

    /// The start of byte `offset`, for a read job's destination.
    ///
    /// Returns `None` when `offset + len` does not lie inside the buffer.
    pub(crate) fn region(&self, offset: usize, len: usize) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        (end <= self.len()).then(|| {
            // SAFETY: `offset ≤ end ≤ len`, so the result stays inside (or
            // one past the end of) this allocation.
            unsafe { self.ptr.as_ptr().add(offset) }
        })
    }

    /// `region(offset, len)` for a range the caller has already checked
    /// (once, when it laid out its slots); a pointer that must not be used
    /// when the range does not fit. Computing it is safe; writing through it
    /// is what the caller's checks must justify.
    pub(crate) fn region_unchecked(&self, offset: usize) -> *mut u8 {
        self.ptr.as_ptr().wrapping_add(offset)
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the pointer is valid for `layout.size()` initialised
        // (zeroed, then overwritten by reads) bytes for the life of `self`;
        // the access protocol guarantees no write overlaps the returned
        // borrow.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with exactly `layout` and is
        // freed once, here.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        let b = AlignedBuf::zeroed(3 * SLOT_ALIGN).unwrap();
        assert_eq!(b.as_ref().as_ptr() as usize % SLOT_ALIGN, 0);
        assert!(b.as_ref().iter().all(|&x| x == 0));
        assert!(b.region(2 * SLOT_ALIGN, SLOT_ALIGN).is_some());
        assert!(b.region(2 * SLOT_ALIGN, SLOT_ALIGN + 1).is_none());
        assert!(b.region(usize::MAX, 2).is_none());
        let empty = AlignedBuf::zeroed(0).unwrap();
        assert_eq!(empty.len(), 1);
    }
}
