//! Errors of the expert store ([`crate::experts`]) and the byte counts
//! they show. A module of its own so that [`crate::EngineError`] can wrap
//! them without depending on the store.

use std::fmt;
use std::path::PathBuf;

/// A byte count shown in binary units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut v = self.0 as f64;
        let mut u = 0;
        while v >= 1024.0 && u + 1 < UNITS.len() {
            v /= 1024.0;
            u += 1;
        }
        if u == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{v:.2} {}", UNITS[u])
        }
    }
}

/// Errors of opening and reading experts.
#[derive(Debug, thiserror::Error)]
pub enum ExpertError {
    #[error("{slots} expert slot(s) per layer cannot hold the {top_k} experts each token is routed to: use at least {top_k}")]
    TooFewSlots { slots: usize, top_k: usize },
    #[error("the memory budget of {budget} is below the {need} needed by the resident weights ({resident}) and {top_k} expert slots per MoE layer")]
    BudgetTooSmall {
        budget: Bytes,
        need: Bytes,
        resident: Bytes,
        top_k: usize,
    },
    #[error("{path}: {found} bytes, but the manifest places {experts} experts at a stride of {stride} bytes ({expected} bytes)")]
    FileShort {
        path: PathBuf,
        found: u64,
        expected: u64,
        experts: usize,
        stride: u64,
    },
    #[error("{path}: reading expert {expert} of layer {layer} ({len} bytes at offset {offset}): {source}")]
    Read {
        layer: usize,
        expert: usize,
        path: PathBuf,
        offset: u64,
        len: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: opening{} the expert file: {source}", if *.direct { " for direct I/O (O_DIRECT; the filesystem may not support it)" } else { "" })]
    Open {
        path: PathBuf,
        direct: bool,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}: expert stride {stride} is not a multiple of {align} bytes, as direct I/O needs"
    )]
    Unaligned {
        path: PathBuf,
        stride: u64,
        align: u64,
    },
    #[error("allocating {bytes} of expert slots for layer {layer} failed")]
    Alloc { layer: usize, bytes: Bytes },
    #[error("starting the expert reader threads: {0}")]
    Threads(#[source] std::io::Error),
    #[error("streamed experts need an install's expert files; this model's weights came from another source")]
    NoExpertFiles,
    #[error("layer {layer}: the current group needs more experts than its {slots} slots")]
    SlotsExhausted { layer: usize, slots: usize },
}
