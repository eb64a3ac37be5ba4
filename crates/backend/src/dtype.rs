//! Element types of device buffers.
//!
//! Weights carry a [`QuantFormat`](turbospark_core::QuantFormat) (any block
//! layout a checkpoint uses); activation and KV-cache buffers carry a
//! [`DType`], the few element types a backend computes on. A backend says
//! which it can allocate ([`crate::Device::supports`]); every op checks the
//! dtypes of the buffers it is handed and refuses the ones it does not
//! read or write ([`crate::BackendError::DType`]).

use std::fmt;

/// The element type of an activation or KV-cache buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    Bf16,
    /// 8-bit integers in blocks of 32 sharing one f16 scale (ggml's Q8_0
    /// layout): quantized activations or a quantized KV cache.
    Q8_0,
}

impl DType {
    pub const ALL: [DType; 4] = [DType::F32, DType::F16, DType::Bf16, DType::Q8_0];

    /// Elements per block (1 for the float types).
    pub const fn block_elems(self) -> usize {
        match self {
            DType::Q8_0 => 32,
            _ => 1,
        }
    }

    /// Bytes of one block.
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
            DType::Q8_0 => 34,
        }
    }

    /// Bytes of `len` elements; `None` when `len` is not a whole number of
    /// blocks or the size overflows.
    pub fn bytes_for(self, len: usize) -> Option<usize> {
        if len % self.block_elems() != 0 {
            return None;
        }
        (len / self.block_elems()).checked_mul(self.block_bytes())
    }

    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::Q8_0 => "q8_0",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(DType::F32.bytes_for(3), Some(12));
        assert_eq!(DType::Bf16.bytes_for(3), Some(6));
        assert_eq!(DType::Q8_0.bytes_for(64), Some(68));
        assert_eq!(DType::Q8_0.bytes_for(33), None);
        assert_eq!(DType::F32.bytes_for(usize::MAX), None);
    }
}
