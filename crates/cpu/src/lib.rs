//! The CPU backend: the reference implementation of the
//! [`turbospark_backend`] seam that every other backend is tested against.
//!
//! - [`CpuDevice`]: uploads (weights stay in their storage format, often
//!   inside a memory map, and are dequantized row by row inside the matmul
//!   kernel), allocation, and the persistent thread pool shared by all of
//!   its streams.
//! - [`CpuStream`]: one session's ops and scratch (per-thread tiles,
//!   attention scores, rope tables, activation quantization, router
//!   scratch), sized when the stream is created; no op allocates.
//!
//! Activations, norm weights, biases and the KV cache are f32. Work is
//! split over the pool by output rows (matmul) and by (token, head)
//! (attention); each output element is computed the same way whatever the
//! split, so results do not depend on the thread count or the batch size.
//!
//! A device built with [`Numerics::LlamaCpp`] ([`CpuDevice::with_numerics`])
//! instead reproduces the arithmetic of llama.cpp's CPU backend: quantized
//! activations and integer dot products, an f16 KV cache, f16 attention
//! operands, ggml's element-wise kernels (see [`ggml`]). One built with
//! [`Numerics::Fast`] runs the fast kernels of the best instruction set the
//! CPU has ([`Isa`]): 8-bit activations and integer block dots against
//! weights repacked at upload, SIMD attention, GLU and RMS norm.

mod attention;
mod delta_net;
mod dequant;
mod device;
mod disjoint;
mod elementwise;
pub mod ggml;
mod head_matmul;
mod kernels;
mod matmul;
mod moe;
mod ops;
mod pool;
mod rope;
mod scratch;
mod stream;
mod types;

pub use device::CpuDevice;
pub use kernels::Isa;
pub use stream::CpuStream;
pub use turbospark_backend::Numerics;
pub use types::{CpuBank, CpuBuf, CpuHostBuf, CpuMatrix, CpuRoutes, CpuVector};

use turbospark_backend::BackendError;

pub(crate) use turbospark_backend::check_len;

fn shape_err(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}
