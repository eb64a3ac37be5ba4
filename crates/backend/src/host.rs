//! Host-side weight bytes handed to [`crate::Backend`] uploads.
//!
//! Bytes are shared, not copied: a [`SharedBytes`] keeps its owner (a memory
//! map of an install file, or a plain vector) alive through an `Arc`, so a
//! host backend can compute straight from the mapping.

use crate::BackendError;
use std::ops::Range;
use std::sync::Arc;
use turbospark_core::QuantFormat;

/// An owner of bytes: a memory map, a `Vec<u8>`, ...
pub type ByteOwner = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A byte range of a shared owner.
#[derive(Clone)]
pub struct SharedBytes {
    owner: ByteOwner,
    start: usize,
    len: usize,
}

impl SharedBytes {
    /// The bytes `range` of `owner`.
    pub fn new(owner: ByteOwner, range: Range<usize>) -> Result<Self, BackendError> {
        let total = (*owner).as_ref().len();
        if range.start > range.end || range.end > total {
            return Err(BackendError::OutOfBounds {
                start: range.start,
                end: range.end,
                len: total,
            });
        }
        Ok(SharedBytes {
            owner,
            start: range.start,
            len: range.end - range.start,
        })
    }

    /// Owns `bytes` outright.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        SharedBytes {
            owner: Arc::new(bytes),
            start: 0,
            len,
        }
    }

    /// Little-endian f32 values as bytes (tests and synthetic models).
    pub fn from_f32(values: &[f32]) -> Self {
        Self::from_vec(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    /// The bytes `range` of these bytes, sharing their owner.
    pub fn slice(&self, range: Range<usize>) -> Result<Self, BackendError> {
        if range.start > range.end || range.end > self.len {
            return Err(BackendError::OutOfBounds {
                start: range.start,
                end: range.end,
                len: self.len,
            });
        }
        Ok(SharedBytes {
            owner: Arc::clone(&self.owner),
            start: self.start + range.start,
            len: range.end - range.start,
        })
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({} bytes at {})", self.len, self.start)
    }
}

/// A tensor on the host, ready to upload: its checkpoint name (for error
/// messages), element format, row-major shape (`[out, in]` for a matrix,
/// `[len]` for a vector) and bytes.
#[derive(Debug, Clone)]
pub struct HostTensor {
    pub name: String,
    pub format: QuantFormat,
    pub shape: Vec<usize>,
    pub bytes: SharedBytes,
}

impl HostTensor {
    /// `[rows, cols]` and the bytes of one row of a 2-D tensor, checked
    /// against its bytes: what every backend's matrix upload accepts.
    pub fn matrix_layout(&self) -> Result<(usize, usize, usize), BackendError> {
        let &[rows, cols] = self.shape.as_slice() else {
            return Err(BackendError::Rank {
                name: self.name.clone(),
                expected: 2,
                shape: self.shape.clone(),
            });
        };
        let quant = |source| BackendError::Quant {
            name: self.name.clone(),
            source,
        };
        let rb = turbospark_core::quant::row_bytes(self.format, cols).map_err(quant)?;
        let total = rows.checked_mul(rb);
        if total != Some(self.bytes.len()) {
            return Err(quant(turbospark_core::quant::QuantError::LengthMismatch {
                format: self.format,
                elements: rows.saturating_mul(cols),
                expected_bytes: total.unwrap_or(usize::MAX),
                got_bytes: self.bytes.len(),
            }));
        }
        Ok((rows, cols, rb))
    }

    /// Rows `rows` of a 2-D tensor as a tensor of their own named `name`,
    /// sharing the bytes (no copy, whatever the format: every format packs
    /// rows independently).
    pub fn row_block(&self, name: String, rows: Range<usize>) -> Result<HostTensor, BackendError> {
        let (n_rows, cols, rb) = self.matrix_layout()?;
        if rows.start > rows.end || rows.end > n_rows {
            return Err(BackendError::OutOfBounds {
                start: rows.start,
                end: rows.end,
                len: n_rows,
            });
        }
        Ok(HostTensor {
            name,
            format: self.format,
            shape: vec![rows.len(), cols],
            bytes: self.bytes.slice(rows.start * rb..rows.end * rb)?,
        })
    }

    /// The values of a 1-D tensor, widened to f32.
    pub fn vector_values(&self) -> Result<Vec<f32>, BackendError> {
        let &[len] = self.shape.as_slice() else {
            return Err(BackendError::Rank {
                name: self.name.clone(),
                expected: 1,
                shape: self.shape.clone(),
            });
        };
        let mut v = vec![0f32; len];
        turbospark_core::quant::dequantize_row(self.format, self.bytes.as_slice(), &mut v)
            .map_err(|source| BackendError::Quant {
                name: self.name.clone(),
                source,
            })?;
        Ok(v)
    }
}
