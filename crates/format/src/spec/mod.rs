//! Building an [`ArchSpec`](turbospark_core::ArchSpec) from a source
//! checkpoint's own description: an HF `config.json` ([`hf`]) or GGUF
//! metadata ([`gguf`]). What is common to every family is here; what a
//! family reads differently is in its module of [`crate::families`].

pub mod gguf;
pub mod hf;
mod rope;

/// Why a checkpoint's description could not become an `ArchSpec`.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("unknown architecture {found:?} ({source_kind}); supported: {supported}")]
    UnknownArchitecture {
        found: String,
        source_kind: &'static str,
        supported: String,
    },
    #[error("{source_kind} field {field:?} is missing (needed for {family})")]
    MissingField {
        field: String,
        family: String,
        source_kind: &'static str,
    },
    #[error("{source_kind} field {field:?} has an unexpected value {found}: expected {expected}")]
    BadField {
        field: String,
        found: String,
        expected: String,
        source_kind: &'static str,
    },
    #[error("unsupported {what}: {detail}")]
    Unsupported { what: String, detail: String },
    #[error("inconsistent model description: {0}")]
    Inconsistent(String),
}
