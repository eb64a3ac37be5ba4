//! The CPU backend's buffer, matrix and vector types.

use crate::kernels::Packed;
use std::sync::Arc;
use turbospark_backend::SharedBytes;
use turbospark_core::QuantFormat;

/// An f32 activation buffer in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuBuf {
    pub(crate) data: Vec<f32>,
}

impl CpuBuf {
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }
    pub fn len(&self) -> usize {
        self.data.len()
    }
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// A weight matrix `[rows, cols]` kept in its storage format; rows are
/// dequantized on the fly by the matmul kernel.
#[derive(Debug, Clone)]
pub struct CpuMatrix {
    pub(crate) name: String,
    pub(crate) format: QuantFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) row_bytes: usize,
    pub(crate) bytes: SharedBytes,
    /// The whole groups of eight rows repacked for the fast SIMD kernels
    /// (fast numerics on a CPU that has them); `bytes` stays the source
    /// of truth for every other use (embedding rows, other numerics).
    pub(crate) packed: Option<Arc<Packed>>,
}

impl CpuMatrix {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn format(&self) -> QuantFormat {
        self.format
    }
    /// The packed bytes of row `r` (`r < rows`).
    pub(crate) fn row(&self, r: usize) -> &[u8] {
        &self.bytes.as_slice()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
}

/// An f32 vector.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuVector {
    pub(crate) data: Vec<f32>,
}

impl CpuVector {
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }
}
