//! The generic decoder of turbospark: one layer loop for every family,
//! driven by [`ArchSpec`](turbospark_core::ArchSpec) data and computed on a
//! [`Device`](turbospark_backend::Device).
//!
//! - [`Model`]: the spec, its weights uploaded once to a device (loaded
//!   from an install through memory maps, or from any [`WeightSource`]),
//!   rope tables, the router.
//! - [`Session`]: one sequence's [`KvCache`], its own
//!   [`Stream`](turbospark_backend::Stream) and scratch, allocated once;
//!   [`Session::forward`] / [`Session::prefill`] / [`Session::decode`]
//!   return raw logits (after the family's multiplier and soft-cap, never
//!   probabilities). Routing is a device op
//!   ([`turbospark_backend::routing`]).
//! - `mixers`: each kind of token mixer a layer can have (attention,
//!   latent attention, gated DeltaNet) in one module with its weights,
//!   per-sequence state, scratch and forward pass; the decoder, the
//!   [`KvCache`] and the weight loader dispatch to it and name no kind.
//! - [`experts`]: where routed experts live (resident, mapped, or streamed
//!   into a per-session slot cache) and their statistics.
//! - [`synthetic`]: random weights for any spec (tests, benchmarks).
//! - [`synthetic_install`]: a random install of any spec on disk.
//! - [`synthetic_gguf`]: the same random gpt-oss weights as a GGUF file
//!   llama.cpp loads.
//! - [`synthetic_like`]: random weights in exactly the layout of another
//!   install, or of its layout file ([`synthetic_quant`]: encoders for
//!   every tensor format).
//! - [`timing`]: wall time per phase of the forward pass.
//! - [`census`]: the FFN census (sparsity of the FFN intermediate, its
//!   strongest neurons).
//! - [`hooks`]: residual-stream capture and steering with control vectors
//!   ([`control_vector`]: llama.cpp's file format, and building one).
//!
//! Decoding `N` tokens one at a time gives the same logits as a prefill of
//! the same `N` tokens: every op computes a row the same way whatever the
//! batch, and routed experts are summed in router-rank order.

mod batch;
pub mod census;
pub mod control_vector;
mod decoder;
pub mod error;
mod expert_error;
pub mod experts;
pub mod hooks;
pub mod kv;
mod loader;
mod mixers;
pub mod model;
pub mod router_skew;
mod scratch;
pub mod session;
pub mod source;
pub mod synthetic;
pub mod synthetic_gguf;
pub mod synthetic_install;
pub mod synthetic_like;
pub mod synthetic_quant;
pub mod timing;
pub mod weights;

pub use batch::{BatchChunk, BatchRow};
pub use census::{FfnCensus, FfnSite, SiteCensus};
pub use control_vector::{BuildMethod, ControlVector, ControlVectorError};
pub use error::EngineError;
pub use experts::{
    CachePolicy, ExpertMode, ExpertOptions, ExpertPlan, ExpertStats, ExpertStore, Residency,
    RouterHistogram, SlotCount,
};
pub use hooks::{CapturedRows, PreparedSteering, ResidualSink, SteerMode, Steering};
pub use kv::KvCache;
pub use model::Model;
pub use session::{Logits, Session, SessionOptions};
pub use source::{InstallSource, WeightSource};
