//! The CUDA backend: every op of the backend seam
//! ([`turbospark_backend::Device`] / [`turbospark_backend::Stream`]) as
//! CUDA C kernels compiled at run time by NVRTC for the GPU's compute
//! capability ([`nvrtc`]), weights and expert banks in device memory
//! ([`CudaDevice`]), one CUDA stream per session ([`CudaStream`]).
//!
//! The driver and NVRTC are loaded at run time (cudarc's dynamic loading),
//! so the crate builds, and its host-side tests run, on machines with no
//! CUDA toolkit, driver or GPU; [`CudaDevice::new`] reports what is missing
//! as a [`CudaError`].
//!
//! Arithmetic: weights are decoded from their storage format inside the
//! kernels and every product and sum runs in f32 (f64 for the mean of
//! squares of RMS norm and for rotary angles' cosines), the same formulas
//! as the CPU backend's exact numerics, in another summation order. The
//! KV cache is f32 in [`Numerics::Exact`](turbospark_backend::Numerics)
//! and f16 in `Fast`. A row's result never depends on the other rows of
//! its batch.

pub mod device;
pub mod error;
mod fusion;
mod kernels;
mod knockout;
mod layout;
mod memory;
pub mod nvrtc;
mod pinned;
mod staging;
pub mod stream;
pub mod types;

pub use device::CudaDevice;
pub use error::CudaError;
pub use kernels::dynamic_shared_requests;
pub use memory::PinnedF32;
pub use stream::CudaStream;
