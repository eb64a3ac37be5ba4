//! Errors of backend ops and uploads.

use crate::DType;
use turbospark_core::quant::QuantError;

/// Why a backend op or upload failed. Ops validate their arguments before
/// touching memory, so an error leaves every buffer as it was (except where
/// the op documents partial output).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// A buffer is shorter than the op's shape requires.
    #[error("{op}: {what} needs {need} elements but holds {have}")]
    BufferTooSmall {
        op: &'static str,
        what: &'static str,
        need: usize,
        have: usize,
    },
    /// Arguments disagree with each other or with a weight's shape.
    #[error("{op}: {detail}")]
    Shape { op: &'static str, detail: String },
    /// A tensor's bytes are not a whole number of rows of its format.
    #[error("tensor {name}: {source}")]
    Quant {
        name: String,
        #[source]
        source: QuantError,
    },
    /// A tensor handed to an upload has the wrong number of dimensions.
    #[error("tensor {name}: expected a {expected}-dimensional tensor, shape is {shape:?}")]
    Rank {
        name: String,
        expected: usize,
        shape: Vec<usize>,
    },
    /// A byte range lies outside the buffer that owns it.
    #[error("byte range {start}..{end} lies outside a {len}-byte source")]
    OutOfBounds {
        start: usize,
        end: usize,
        len: usize,
    },
    /// An op needs more scratch than the stream was created with
    /// ([`crate::Device::stream`] and its [`crate::Limits`]).
    #[error(
        "{op}: needs {need} scratch elements, {have} reserved (create the stream with larger limits)"
    )]
    ScratchTooSmall {
        op: &'static str,
        need: usize,
        have: usize,
    },
    /// A route names an expert slot the bank does not have.
    #[error("moe: route to expert slot {slot}, but the bank holds {available}")]
    BadRoute { slot: usize, available: usize },
    /// A buffer's element type is not the one the op reads or writes.
    #[error("{op}: {what} holds {found} elements, the op takes {expected}")]
    DType {
        op: &'static str,
        what: &'static str,
        expected: DType,
        found: DType,
    },
    /// The backend cannot allocate buffers of this element type.
    #[error("the {backend} backend has no {dtype} buffers")]
    UnsupportedDType { backend: &'static str, dtype: DType },
    /// A router that cannot choose its experts.
    #[error("router over {num_experts} experts choosing {top_k}: {problem}")]
    Router {
        num_experts: usize,
        top_k: usize,
        problem: &'static str,
    },
    /// Routing found fewer eligible experts than it must choose (scores that
    /// are not numbers).
    #[error("route: only {eligible} experts were eligible, {top_k} are chosen")]
    TooFewEligible { top_k: usize, eligible: usize },
    /// Attention was asked for keys the cache no longer holds.
    #[error(
        "attention: query at position {position} needs keys from {oldest}, but a {capacity}-slot \
         cache written up to {newest} no longer holds them"
    )]
    KeysEvicted {
        position: usize,
        oldest: usize,
        newest: usize,
        capacity: usize,
    },
    /// The device (or the host's thread pool) could not be set up.
    #[error("backend setup: {0}")]
    Device(String),
    /// The device has too little free memory for an allocation.
    #[error(
        "{what}: needs {} of the device's memory ({need} bytes), {} are free",
        gib(*need),
        gib(*free)
    )]
    OutOfMemory {
        what: &'static str,
        need: u64,
        free: u64,
    },
    /// An optional op this backend does not provide.
    #[error("{op}: not provided by this backend")]
    Unsupported { op: &'static str },
    /// The device failed while running queued work (a fault inside a
    /// kernel, a lost device); its state is undefined afterwards.
    #[error("{op}: the device reported {detail}")]
    Runtime { op: &'static str, detail: String },
}

/// Bytes as GiB for messages.
fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}
