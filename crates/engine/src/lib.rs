//! The generic decoder of turbospark: one layer loop for every family,
//! driven by [`ArchSpec`](turbospark_core::ArchSpec) data and computed by a
//! [`Backend`](turbospark_backend::Backend).
//!
//! - [`Model`]: the spec, its weights on a backend (loaded from an install
//!   through memory maps, or from any [`WeightSource`]), rope tables.
//! - [`Session`]: one sequence's [`KvCache`] and scratch, allocated once;
//!   [`Session::forward`] / [`Session::prefill`] / [`Session::decode`]
//!   return raw logits (after the family's multiplier and soft-cap, never
//!   probabilities).
//! - [`router`]: the MoE routers of `RouterKind` as host-side math.
//! - [`experts`]: where routed experts live (resident, mapped, or streamed
//!   into a per-session slot cache) and their statistics.
//! - [`synthetic`]: random weights for any spec (tests, benchmarks).
//! - [`synthetic_install`]: a random install of any spec on disk.
//! - [`synthetic_gguf`]: the same random gpt-oss weights as a GGUF file
//!   llama.cpp loads.
//! - [`timing`]: wall time per phase of the forward pass.
//!
//! Decoding `N` tokens one at a time gives the same logits as a prefill of
//! the same `N` tokens: every op computes a row the same way whatever the
//! batch, and routed experts are summed in router-rank order.

mod decoder;
pub mod error;
pub mod experts;
pub mod kv;
pub mod model;
pub mod router;
pub mod router_skew;
pub mod session;
pub mod source;
pub mod synthetic;
pub mod synthetic_gguf;
pub mod synthetic_install;
pub mod timing;
pub mod weights;

pub use error::EngineError;
pub use experts::{
    CachePolicy, ExpertMode, ExpertOptions, ExpertPlan, ExpertStats, ExpertStore, Residency,
    RouterHistogram, SlotCount,
};
pub use kv::KvCache;
pub use model::Model;
pub use session::{Logits, Session, SessionOptions};
pub use source::{InstallSource, WeightSource};
