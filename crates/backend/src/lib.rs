//! The backend seam: what the generic decoder asks of a compute device,
//! split as in ggml-backend into a [`Device`] and per-session [`Stream`]s.
//!
//! - [`Device`]: uploads (weight matrices, f32 vectors, [`ExpertBank`]s of
//!   a layer's routed experts), memory query, allocation of typed buffers
//!   ([`DType`]), and creation of streams. A model is tied to one device;
//!   its weights are uploaded once and shared by every session.
//! - [`Stream`]: one session's queue of ops with its own scratch, explicit
//!   synchronisation points and asynchronous host↔device copies (see
//!   [`stream`]). Routing ([`Stream::route`], the math in [`routing`]) and
//!   routed experts over a bank ([`Stream::moe`]) are ops, so a resident
//!   decode step never waits on the host.
//!
//! Ops never allocate. The model code names no device and no SIMD; it only
//! composes these ops (see `turbospark-engine`). A backend proves itself by
//! passing [`conformance`] (feature `conformance`), which checks every op
//! against a scalar f64 reference.
//!
//! The crate also holds the host-side data every backend consumes the same
//! way: [`rope::RopeTable`] (rotary frequencies from a
//! [`RopeSpec`](turbospark_core::arch::RopeSpec)), [`host::SharedBytes`]
//! (weight bytes that may live in a memory map), and [`Numerics`], the
//! choice between exact arithmetic and a reproduction of llama.cpp's.

#[cfg(feature = "conformance")]
pub mod conformance;
pub mod delta_net;
pub mod device;
pub mod dtype;
pub mod error;
pub mod host;
pub mod moe;
pub mod numerics;
pub mod rope;
pub mod routing;
pub mod stream;

pub use delta_net::{ConvParams, DeltaNetInput, DeltaNetLens, DeltaNetParams};
pub use device::{
    routes_for, Device, DeviceBuf, ExpertBank, ExpertTensors, HostPin, Limits, MemoryInfo, RouteBuf,
};
pub use dtype::DType;
pub use error::BackendError;
pub use host::{HostTensor, SharedBytes};
pub use moe::{ExpertWeights, MoeInput, MoeScratch, Projection, Route};
pub use numerics::{Numerics, UnknownNumerics};
pub use rope::RopeTable;
pub use routing::{RouterScratch, RouterSpec, RouterTables};
pub use stream::{
    bias_mismatch, check_rope, check_tokens, AttentionParams, AttentionPart, HeadMatmul, Stream,
};

/// Fails with [`BackendError::BufferTooSmall`] when `have < need`.
pub fn check_len(
    op: &'static str,
    what: &'static str,
    have: usize,
    need: usize,
) -> Result<(), BackendError> {
    if have < need {
        return Err(BackendError::BufferTooSmall {
            op,
            what,
            need,
            have,
        });
    }
    Ok(())
}
