//! The install directory: `manifest.json`, `resident.bin` with its index,
//! one `experts/NNN.bin` per MoE layer, tokenizer and template files.
//! `docs/FORMAT.md` is the normative description.

pub mod manifest;
pub mod reader;
pub mod verify;
pub mod writer;

pub use manifest::*;
pub use reader::Install;
pub use verify::{verify_install, VerifyReport};
pub use writer::{InstallWriter, ManifestParts};
