//! Errors of the text crate.

use std::path::PathBuf;

/// What went wrong while rendering a chat template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateErrorKind {
    /// The template does not parse.
    Syntax,
    /// The template uses a filter that is not defined.
    UnknownFilter,
    /// The template calls a function that is not defined.
    UnknownFunction,
    /// The template calls a method that is not defined on a value.
    UnknownMethod,
    /// A test (`is foo`) that is not defined.
    UnknownTest,
    /// The template called `raise_exception(message)`.
    Raised,
    /// An operation on an undefined value or a value of the wrong type.
    InvalidOperation,
    /// Anything else minijinja reports.
    Other,
}

#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {detail}")]
    Json { path: PathBuf, detail: String },
    #[error("{path}: cannot read GGUF: {detail}")]
    Gguf { path: PathBuf, detail: String },
    #[error("install directory {dir} has no tokenizer (no tokenizer.json or vocab.gguf.json)")]
    NoTokenizer { dir: PathBuf },
    #[error("GGUF vocabulary: field `{field}` {problem}")]
    Vocab { field: String, problem: String },
    #[error("unsupported tokenizer model `{model}` (supported: llama, gpt2, gemma4)")]
    UnsupportedModel { model: String },
    #[error("unsupported pre-tokenizer `{pre}` for a BPE vocabulary")]
    UnsupportedPreTokenizer { pre: String },
    #[error("pre-tokenizer regex `{pattern}`: {detail}")]
    Regex { pattern: String, detail: String },
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfRange { id: u32, vocab_size: usize },
    #[error("HF tokenizer {path}: {detail}")]
    HfTokenizer { path: PathBuf, detail: String },
    #[error("HF tokenizer: {detail}")]
    HfEncode { detail: String },
    #[error("chat template{}: {kind:?}: {message}", name.as_deref().map(|n| format!(" {n}")).unwrap_or_default())]
    Template {
        name: Option<String>,
        kind: TemplateErrorKind,
        message: String,
        line: Option<usize>,
    },
    #[error("chat template input: {detail}")]
    TemplateInput { detail: String },
    #[error("sampler parameter `{name}` = {value}: {expected}")]
    SamplerParam {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("logits have {got} entries, expected {expected}")]
    LogitsLen { got: usize, expected: usize },
}

pub type Result<T, E = TextError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> TextError {
    let path = path.into();
    move |source| TextError::Io { path, source }
}
