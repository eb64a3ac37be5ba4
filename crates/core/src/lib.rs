//! Core data of turbospark: tensor element formats (plain and block-quantized)
//! with scalar reference kernels, and [`arch::ArchSpec`], the data row that
//! describes what a model family computes.

pub mod arch;
pub mod dtype;
pub mod quant;

pub use arch::ArchSpec;
pub use dtype::QuantFormat;
