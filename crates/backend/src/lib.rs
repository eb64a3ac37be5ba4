//! The [`Backend`] trait: what the generic decoder asks of a compute device.
//!
//! A backend owns three kinds of objects:
//!
//! - [`Backend::Matrix`]: a quantized weight matrix, row-major `[out, in]`
//!   (any [`QuantFormat`](turbospark_core::QuantFormat)), uploaded once.
//! - [`Backend::Vector`]: a small f32 vector (norm weights, biases, sinks),
//!   widened to f32 at upload.
//! - [`Backend::Buf`]: an f32 activation buffer, allocated once per session
//!   and reused; a batch of `n` rows of width `d` is its first `n · d`
//!   elements, row-major.
//!
//! Ops never allocate: everything they need beyond their arguments is sized
//! up front by [`Backend::reserve`]. The model code names no device and no
//! SIMD; it only composes these ops (see `turbospark-engine`).
//!
//! The crate also holds the host-side data every backend consumes the same
//! way: [`rope::RopeTable`] (rotary frequencies from a
//! [`RopeSpec`](turbospark_core::arch::RopeSpec)) and [`host::SharedBytes`]
//! (weight bytes that may live in a memory map), and [`Numerics`], the
//! choice between exact arithmetic and a reproduction of llama.cpp's.

pub mod backend;
pub mod error;
pub mod host;
pub mod numerics;
pub mod rope;

pub use backend::{AttentionParams, Backend, ExpertWeights, Limits, MoeInput, MoeScratch, Route};
pub use error::BackendError;
pub use host::{HostTensor, SharedBytes};
pub use numerics::{Numerics, UnknownNumerics};
pub use rope::RopeTable;
