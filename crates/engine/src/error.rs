//! Errors of loading a model and running a session.

use std::path::PathBuf;
use turbospark_backend::BackendError;
use turbospark_format::FormatError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A token id the embedding table has no row for.
    #[error("token id {token} (input index {index}) is outside the vocabulary of {vocab} tokens")]
    TokenOutOfVocab {
        token: u32,
        index: usize,
        vocab: usize,
    },
    /// Tokens must continue the cache exactly where it stands.
    #[error("position {got} does not continue the KV cache, whose next position is {expected}")]
    NonSequentialPosition { expected: usize, got: usize },
    /// The tokens would run past the session's context.
    #[error(
        "{tokens} token(s) at position {position} exceed the session context of {context} positions"
    )]
    ContextOverflow {
        position: usize,
        tokens: usize,
        context: usize,
    },
    /// A forward call with no tokens.
    #[error("no tokens to run")]
    EmptyInput,
    /// The caller's logits buffer does not match the rows asked for.
    #[error("the logits buffer holds {have} floats, {need} are needed ({rows} rows × {vocab})")]
    LogitsBuffer {
        need: usize,
        have: usize,
        rows: usize,
        vocab: usize,
    },
    /// Session options that cannot work.
    #[error("session options: {detail}")]
    BadOptions { detail: String },
    /// A weight the architecture needs is not in the install.
    #[error("tensor {name} is missing")]
    MissingTensor { name: String },
    /// A weight has a shape the architecture does not expect.
    #[error("tensor {name} has shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    /// A part of the architecture the decoder does not run yet.
    #[error("{feature} is not implemented yet")]
    NotImplemented { feature: &'static str },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A steering layer range outside the model (llama.cpp's
    /// `--control-vector-layer-range A B`, inclusive).
    #[error(
        "control vector layer range {start}..={end} is not within the model's layers 0..={}",
        n_layers.saturating_sub(1)
    )]
    SteeringLayerRange {
        start: usize,
        end: usize,
        n_layers: usize,
    },
    /// A control vector of another model's width.
    #[error(
        "the control vector has {found} elements per layer, the model's hidden size is {hidden}"
    )]
    ControlVectorWidth { found: usize, hidden: usize },
    /// A control vector for a layer the model does not have.
    #[error(
        "the control vector has a direction for layer {layer}, the model has {n_layers} layers"
    )]
    ControlVectorLayer { layer: usize, n_layers: usize },
    #[error(transparent)]
    ControlVector(#[from] crate::control_vector::ControlVectorError),
    /// A captured layer the model does not have.
    #[error("cannot capture layer {layer}: the model has {n_layers} layers")]
    CaptureLayer { layer: usize, n_layers: usize },
    #[error("layer {layer} is listed twice for capture")]
    CaptureRepeat { layer: usize },
    /// Writing captured residuals failed.
    #[error("writing captured residuals: {source}")]
    CaptureSink {
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Format(#[from] FormatError),
    /// Opening or reading routed experts.
    #[error(transparent)]
    Experts(#[from] crate::expert_error::ExpertError),
}
