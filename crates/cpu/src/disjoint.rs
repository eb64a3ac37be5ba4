//! Writing disjoint parts of one output slice from several pool threads.

use std::marker::PhantomData;

/// A mutable slice (of f32 unless said) that pool threads write in
/// disjoint ranges.
pub(crate) struct DisjointMut<'a, T = f32> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: the wrapper only hands out ranges through `range`, whose contract
// makes concurrent ranges disjoint, so sharing it is like sharing `&mut`
// sub-slices obtained by `split_at_mut`.
unsafe impl<T: Send> Sync for DisjointMut<'_, T> {}
unsafe impl<T: Send> Send for DisjointMut<'_, T> {}

impl<'a, T> DisjointMut<'a, T> {
    pub(crate) fn new(s: &'a mut [T]) -> Self {
        DisjointMut {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _borrow: PhantomData,
        }
    }

    /// The sub-slice `start .. start + len`.
    ///
    /// # Safety
    /// No two live results of `range` (on any thread) may overlap.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn range(&self, start: usize, len: usize) -> &mut [T] {
        assert!(
            start.checked_add(len).is_some_and(|end| end <= self.len),
            "disjoint range {start}+{len} outside {}",
            self.len
        );
        // SAFETY: in bounds (checked above) and, by the caller's contract,
        // not aliased by any other live reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

/// One element of a slice per pool thread: thread `i` of a [`Pool`] run
/// takes element `i`, and no two threads share one.
///
/// [`Pool`]: crate::pool::Pool
pub(crate) struct PerThread<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: elements are handed out only through `get`, whose contract gives
// each index to one thread at a time, like `&mut` elements sent to scoped
// threads; `T: Send` is what moving such a borrow to another thread needs.
unsafe impl<T: Send> Sync for PerThread<'_, T> {}

impl<'a, T> PerThread<'a, T> {
    pub(crate) fn new(s: &'a mut [T]) -> Self {
        PerThread {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _borrow: PhantomData,
        }
    }

    /// Element `i`.
    ///
    /// # Safety
    /// No two live results of `get` (on any thread) may have the same `i`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn get(&self, i: usize) -> &mut T {
        assert!(i < self.len, "thread {i} of {}", self.len);
        // SAFETY: in bounds (checked above) and, by the caller's contract,
        // not aliased by any other live reference.
        unsafe { &mut *self.ptr.add(i) }
    }
}
