//! The identity table: each family's names in every source format. The
//! rows live with their families ([`crate::families`]); these are the
//! lookups by name.

pub use crate::families::{
    canonical_from_gguf, default_chat_template, family_for_gguf, family_for_hf,
    gguf_from_canonical, supported_gguf_architectures, supported_hf_model_types,
};
