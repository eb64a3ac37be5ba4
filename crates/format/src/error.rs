//! The error type of format operations: every variant names the file,
//! tensor or field at fault and what was expected.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    #[error(transparent)]
    Safetensors(#[from] crate::safetensors::SafetensorsError),
    #[error("{path}: {source}")]
    Spec {
        path: PathBuf,
        #[source]
        source: crate::spec::SpecError,
    },
    #[error("{path}: not a GGUF file or a Hugging Face checkpoint directory (expected a .gguf file or a directory with config.json)")]
    UnknownSource { path: PathBuf },
    #[error("{path}: invalid JSON: {detail}")]
    Json { path: PathBuf, detail: String },
    #[error("destination {path} already exists (use --force to replace it)")]
    DestinationExists { path: PathBuf },
    #[error("tensor {tensor} has shape {found:?}, expected {expected:?} for this {family} model")]
    ShapeMismatch {
        tensor: String,
        expected: Vec<u64>,
        found: Vec<u64>,
        family: String,
    },
    #[error("tensor {tensor} is missing from the source (required by the {family} architecture)")]
    MissingTensor { tensor: String, family: String },
    #[error("source tensor {tensor} has no role in the {family} architecture")]
    UnexpectedTensor { tensor: String, family: String },
    #[error("tensor {tensor} has element type {dtype}, which turbospark does not support (supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, mxfp4)")]
    UnsupportedDtype { tensor: String, dtype: String },
    #[error("tensor {tensor}: {detail}")]
    BadTensor { tensor: String, detail: String },
    #[error("{path}: {detail}")]
    BadInstall { path: PathBuf, detail: String },
    #[error("{path}: install format version {found}, this build reads version {expected}")]
    VersionMismatch {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("interrupted")]
    Interrupted,
}

impl FormatError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        FormatError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Attaches a path to `std::io::Result`s.
pub trait IoContext<T> {
    fn at(self, path: &std::path::Path) -> Result<T, FormatError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: &std::path::Path) -> Result<T, FormatError> {
        self.map_err(|e| FormatError::io(path, e))
    }
}
