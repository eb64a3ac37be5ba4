//! The CUDA device's buffers, weights, expert banks and route buffers.

use crate::memory::DevMem;
use std::sync::Arc;
use turbospark_backend::{DType, DeviceBuf, ExpertBank, Projection, RouteBuf};
use turbospark_core::QuantFormat;

/// An activation or KV-cache buffer in device memory.
#[derive(Debug)]
pub struct CudaBuf {
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    /// Shared with the streams whose ops were given the buffer, until
    /// each next synchronizes ([`crate::CudaStream`]'s `retained`).
    pub(crate) mem: Arc<DevMem>,
}

impl DeviceBuf for CudaBuf {
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl CudaBuf {
    /// The buffer's address after checking that it holds at least `need`
    /// f32 elements.
    pub(crate) fn f32_ptr(
        &self,
        op: &'static str,
        what: &'static str,
        need: usize,
    ) -> Result<u64, turbospark_backend::BackendError> {
        if self.dtype != DType::F32 {
            return Err(turbospark_backend::BackendError::DType {
                op,
                what,
                expected: DType::F32,
                found: self.dtype,
            });
        }
        turbospark_backend::check_len(op, what, self.len, need)?;
        Ok(self.mem.ptr)
    }
}

/// A weight matrix `[rows, cols]` in its storage format, in the device
/// layout of `crate::layout`.
#[derive(Debug)]
pub struct CudaMatrix {
    pub(crate) format: QuantFormat,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// Bytes between rows on the device.
    pub(crate) row_bytes: usize,
    pub(crate) mem: DevMem,
}

/// An f32 vector.
#[derive(Debug)]
pub struct CudaVector {
    pub(crate) len: usize,
    pub(crate) mem: DevMem,
}

/// Routes `[max_tokens, top_k]` of `(u32 slot, f32 weight)`.
#[derive(Debug)]
pub struct CudaRoutes {
    pub(crate) max_tokens: usize,
    pub(crate) top_k: usize,
    /// Shared as [`CudaBuf`]'s memory is.
    pub(crate) mem: Arc<DevMem>,
    /// The largest slot the buffer's routes may name (routes live on the
    /// device, so the MoE ops check banks against this bound): the last
    /// expert of the router that wrote them, or the largest slot written
    /// from the host.
    pub(crate) max_slot: u32,
}

impl RouteBuf for CudaRoutes {
    fn max_tokens(&self) -> usize {
        self.max_tokens
    }
    fn top_k(&self) -> usize {
        self.top_k
    }
}

/// One stacked projection of a bank: slot `s`'s rows start at
/// `s · rows · row_bytes`.
#[derive(Debug)]
pub(crate) struct Stacked {
    pub(crate) format: QuantFormat,
    pub(crate) rows: usize,
    /// Bytes between rows on the device (see [`crate::layout`]).
    pub(crate) row_bytes: usize,
    /// Bytes of a row as the host holds it.
    pub(crate) host_row_bytes: usize,
    pub(crate) mem: DevMem,
}

impl Stacked {
    /// Bytes of one slot on the device.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.rows * self.row_bytes
    }

    /// Bytes of one expert's projection as the host holds it.
    pub(crate) fn host_slot_bytes(&self) -> usize {
        self.rows * self.host_row_bytes
    }
}

/// A layer's experts (or slots) stacked per projection, so one launch
/// reaches every selected expert.
#[derive(Debug)]
pub struct CudaBank {
    pub(crate) slots: usize,
    pub(crate) hidden: usize,
    pub(crate) inter: usize,
    /// `[slots, inter, hidden]`
    pub(crate) gate: Stacked,
    /// `[slots, inter, hidden]`
    pub(crate) up: Stacked,
    /// `[slots, hidden, inter]`
    pub(crate) down: Stacked,
    /// `[slots, inter]`, `[slots, inter]`, `[slots, hidden]` f32.
    pub(crate) gate_bias: Option<DevMem>,
    pub(crate) up_bias: Option<DevMem>,
    pub(crate) down_bias: Option<DevMem>,
}

impl CudaBank {
    /// The stacked projection `p`.
    pub(crate) fn projection(&self, p: Projection) -> &Stacked {
        match p {
            Projection::Gate => &self.gate,
            Projection::Up => &self.up,
            Projection::Down => &self.down,
        }
    }
}

impl ExpertBank for CudaBank {
    fn slots(&self) -> usize {
        self.slots
    }
    fn hidden(&self) -> usize {
        self.hidden
    }
    fn intermediate(&self) -> usize {
        self.inter
    }
}
