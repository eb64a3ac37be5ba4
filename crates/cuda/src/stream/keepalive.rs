//! The device memory a stream's queued work may still touch, kept alive.
//!
//! The [`Stream`](turbospark_backend::Stream) contract lets a caller drop
//! a buffer as soon as the op's call returns. On the GPU the op may then
//! not have run yet: queued, held back for the next op to join
//! ([`crate::fusion`]), or recorded in a step that is replayed later.
//! Freed at once, the memory could go to another allocation — another
//! thread's, in the same context — before the op reads or writes it (the
//! conformance suite's exact and fast numerics on two threads showed it,
//! BENCHMARKS.md, forty-first session). So a stream holds a reference
//! (`Arc`) to every allocation an op was given until it next
//! synchronizes, and a recorded step holds its ops' for as long as it can
//! be replayed.

use crate::memory::DevMem;
use std::collections::HashMap;
use std::sync::Arc;

/// Allocations held alive, each once (keyed by address: a held
/// allocation's address cannot be handed out again).
#[derive(Default)]
pub(super) struct KeepAlive(HashMap<u64, Arc<DevMem>>);

impl KeepAlive {
    /// Holds `mems` too.
    pub(super) fn hold(&mut self, mems: &[&Arc<DevMem>]) {
        for m in mems {
            self.0.entry(m.ptr).or_insert_with(|| Arc::clone(m));
        }
    }

    /// Holds `mem`, which nothing else owns (a replaced scratch).
    pub(super) fn hold_owned(&mut self, mem: DevMem) {
        self.0.insert(mem.ptr, Arc::new(mem));
    }

    /// Holds everything `other` held, which is left empty.
    pub(super) fn absorb(&mut self, other: &mut KeepAlive) {
        self.0.extend(other.0.drain());
    }

    /// Lets everything go: the work that could touch it is done.
    pub(super) fn release(&mut self) {
        self.0.clear();
    }
}
