//! On-disk formats: readers for safetensors and GGUF, a GGUF writer, the
//! model families and their registry,
//! [`ArchSpec`] builders, tensor roles, the install format, and the
//! converter.
//!
//! [`ArchSpec`]: turbospark_core::ArchSpec

pub mod convert;
pub mod error;
pub mod families;
pub mod gguf;
pub mod gguf_writer;
pub mod identity;
pub mod install;
pub mod roles;
pub mod safetensors;
pub mod spec;

pub use error::FormatError;
