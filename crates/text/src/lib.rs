//! Text side of inference: tokenizers, chat templates, a streaming
//! detokenizer and the sampler.
//!
//! - [`Tokenizer`]: GGUF vocabularies (SentencePiece and byte-level BPE with
//!   llama.cpp's algorithms, `src/llama-vocab.cpp`) or HF `tokenizer.json`
//!   (the `tokenizers` crate).
//! - [`ChatTemplate`]: HF chat templates rendered with `minijinja` the way
//!   transformers' `apply_chat_template` renders them with jinja2.
//! - [`StreamDecoder`]: token ids in, complete UTF-8 text out, with stop strings.
//! - [`Sampler`]: temperature, top-k, top-p, min-p and repetition penalties
//!   over raw logits, without sorting the vocabulary.

mod bpe;
pub mod builtin_templates;
pub mod chat;
pub mod detok;
pub mod error;
#[cfg(feature = "hf-tokenizers")]
mod hf;
mod merge;
mod pretok;
pub mod prompt;
pub mod sampler;
mod spm;
pub mod tokenizer;
mod unicode;
mod unicode_data;
pub mod vocab;

pub use chat::{parse_json, ChatOptions, ChatTemplate, Message, TemplateValue};
pub use detok::StreamDecoder;
pub use error::{TemplateErrorKind, TextError};
pub use prompt::chat_prompt_tokens;
pub use sampler::{Sampler, SamplerConfig};
pub use tokenizer::{DecodeOptions, EncodeOptions, Tokenizer};
pub use vocab::GgufVocabFields;

#[cfg(test)]
mod tests {
    fn shareable<T: Send + Sync>() {}

    #[test]
    fn types_are_shareable_across_threads() {
        shareable::<crate::Tokenizer>();
        shareable::<crate::ChatTemplate>();
        shareable::<crate::Sampler>();
    }
}
