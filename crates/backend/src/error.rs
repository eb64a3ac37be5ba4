//! Errors of backend ops and uploads.

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
    /// An op needs more scratch than [`crate::Backend::reserve`] provided.
    #[error(
        "{op}: needs {need} scratch elements, {have} reserved (call reserve with larger limits)"
    )]
    ScratchTooSmall {
        op: &'static str,
        need: usize,
        have: usize,
    },
    /// A route names an expert slot that was not passed to the op.
    #[error("moe: route to expert slot {slot}, but only {available} slots were given")]
    BadRoute { slot: usize, available: usize },
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
}
