//! The CPU backend's buffer, matrix, vector, expert-bank and route types.
//! Everything lives in host memory; "device" copies are plain copies.

use crate::kernels::Packed;
use crate::shape_err;
use std::sync::Arc;
use turbospark_backend::{
    BackendError, DType, DeviceBuf, ExpertBank, ExpertWeights, RouteBuf, SharedBytes,
};
use turbospark_core::QuantFormat;

/// An activation or KV buffer in host memory. The CPU backend allocates
/// f32 buffers only ([`crate::CpuDevice`] refuses other dtypes); every op
/// still checks the dtype it is handed.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuBuf {
    pub(crate) dtype: DType,
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
    /// The elements as f32, if that is the buffer's dtype.
    pub(crate) fn f32s(
        &self,
        op: &'static str,
        what: &'static str,
    ) -> Result<&[f32], BackendError> {
        self.expect_f32(op, what)?;
        Ok(&self.data)
    }
    pub(crate) fn f32s_mut(
        &mut self,
        op: &'static str,
        what: &'static str,
    ) -> Result<&mut [f32], BackendError> {
        self.expect_f32(op, what)?;
        Ok(&mut self.data)
    }
    fn expect_f32(&self, op: &'static str, what: &'static str) -> Result<(), BackendError> {
        if self.dtype != DType::F32 {
            return Err(BackendError::DType {
                op,
                what,
                expected: DType::F32,
                found: self.dtype,
            });
        }
        Ok(())
    }
}

impl DeviceBuf for CpuBuf {
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn len(&self) -> usize {
        self.data.len()
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

/// One expert's matrices and biases on the CPU.
pub(crate) type CpuExpert = ExpertWeights<CpuMatrix, CpuVector>;

/// A layer's experts: one [`CpuExpert`] per slot, each viewing its bytes
/// where they already are (the install's memory map, a resident copy, or a
/// streamed slot buffer), so "stacking" costs no copy on the CPU.
#[derive(Debug, Clone)]
pub struct CpuBank {
    pub(crate) experts: Vec<CpuExpert>,
    pub(crate) hidden: usize,
    pub(crate) intermediate: usize,
}

impl CpuBank {
    /// Checks that every expert has the shapes of the first.
    pub(crate) fn new(experts: Vec<CpuExpert>) -> Result<CpuBank, BackendError> {
        let (hidden, intermediate) = experts
            .first()
            .map_or((0, 0), |e| (e.gate.cols, e.gate.rows));
        let biases = experts.first().map(|e| {
            (
                e.gate_bias.is_some(),
                e.up_bias.is_some(),
                e.down_bias.is_some(),
            )
        });
        for e in &experts {
            let ok = e.gate.rows == intermediate
                && e.gate.cols == hidden
                && e.up.rows == intermediate
                && e.up.cols == hidden
                && e.down.rows == hidden
                && e.down.cols == intermediate
                && e.gate_bias
                    .as_ref()
                    .is_none_or(|b| b.data.len() == intermediate)
                && e.up_bias
                    .as_ref()
                    .is_none_or(|b| b.data.len() == intermediate)
                && e.down_bias.as_ref().is_none_or(|b| b.data.len() == hidden)
                && biases
                    == Some((
                        e.gate_bias.is_some(),
                        e.up_bias.is_some(),
                        e.down_bias.is_some(),
                    ));
            if !ok {
                return Err(shape_err(
                    "upload_bank",
                    format!(
                        "expert {} has gate [{}, {}], up [{}, {}], down [{}, {}] or other biases; \
                         the bank's experts are gate [{intermediate}, {hidden}]",
                        e.gate.name,
                        e.gate.rows,
                        e.gate.cols,
                        e.up.rows,
                        e.up.cols,
                        e.down.rows,
                        e.down.cols
                    ),
                ));
            }
        }
        Ok(CpuBank {
            experts,
            hidden,
            intermediate,
        })
    }
}

impl ExpertBank for CpuBank {
    fn slots(&self) -> usize {
        self.experts.len()
    }
    fn hidden(&self) -> usize {
        self.hidden
    }
    fn intermediate(&self) -> usize {
        self.intermediate
    }
}

/// Routes of a batch, `[max_tokens, top_k]`.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuRoutes {
    pub(crate) routes: Vec<turbospark_backend::Route>,
    pub(crate) top_k: usize,
}

impl RouteBuf for CpuRoutes {
    fn max_tokens(&self) -> usize {
        self.routes.len() / self.top_k.max(1)
    }
    fn top_k(&self) -> usize {
        self.top_k
    }
}

/// Host memory a read lands in (plain memory on the CPU).
#[derive(Debug, Clone, PartialEq)]
pub struct CpuHostBuf {
    pub(crate) data: Vec<f32>,
}

impl AsRef<[f32]> for CpuHostBuf {
    fn as_ref(&self) -> &[f32] {
        &self.data
    }
}

impl AsMut<[f32]> for CpuHostBuf {
    fn as_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }
}
