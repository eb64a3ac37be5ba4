//! The [`Device`] trait: what a compute device holds for every session
//! (uploaded weights and expert banks) and what it hands out (buffers,
//! per-session [`Stream`]s).
//!
//! A model ties to one device: its weights are uploaded once and shared by
//! every session. Each session creates its own stream ([`Device::stream`]),
//! which owns the scratch its ops need, so two sessions on one model never
//! share mutable state (see [`crate::stream`]).

use crate::host::ByteOwner;
use crate::{BackendError, DType, ExpertWeights, HostTensor, Numerics, Stream};

/// Sizes a stream will use, so that its ops can run without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Most rows (tokens) in one op call (the prefill chunk).
    pub max_tokens: usize,
    /// Most keys one query attends to (the largest KV capacity).
    pub max_keys: usize,
    /// Widest attention head.
    pub max_head_dim: usize,
    /// Widest key or value head of the gated delta rule (0 without gated
    /// DeltaNet layers): backends that chunk its prefill keep a chunk's
    /// keys, queries and values per thread.
    pub max_delta_head_dim: usize,
    /// Most experts one router chooses among (0 without routing).
    pub max_experts: usize,
    /// Most routes (token, rank) one MoE call computes: `max_tokens ·
    /// top_k` (0 without routed experts). With
    /// [`Limits::max_expert_intermediate`] it sizes the stream's own
    /// expert activations on backends that compute every route at once.
    pub max_routes: usize,
    /// Widest expert intermediate (0 without routed experts).
    pub max_expert_intermediate: usize,
}

/// A device's memory, as far as it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryInfo {
    /// Bytes the device has in all.
    pub total: Option<u64>,
    /// Bytes it could give now.
    pub free: Option<u64>,
}

/// Host memory a device has page-locked for its copies
/// ([`Device::pin_host`]); dropping it unlocks the memory. It keeps the
/// memory's owner alive, so the bytes cannot be freed while locked.
pub struct HostPin {
    _guard: Box<dyn Send + Sync>,
}

impl HostPin {
    /// Wraps a device's guard, whose drop unlocks the memory.
    pub fn new(guard: Box<dyn Send + Sync>) -> HostPin {
        HostPin { _guard: guard }
    }
}

/// The host tensors of one expert, as handed to [`Device::upload_bank`]
/// and [`Stream::fill_slot`].
pub type ExpertTensors = ExpertWeights<HostTensor, HostTensor>;

/// A device buffer of activations or KV rows.
pub trait DeviceBuf: Send {
    fn dtype(&self) -> DType;
    /// Elements (not bytes).
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Routes of a batch in device memory: `[max_tokens, top_k]`
/// [`Route`](crate::Route)s,
/// best rank first, written by [`Stream::route`] or
/// [`Stream::write_routes`].
pub trait RouteBuf: Send {
    /// Tokens the buffer holds routes for.
    fn max_tokens(&self) -> usize;
    /// Routes per token.
    fn top_k(&self) -> usize;
}

/// A layer's routed experts on a device, all of one shape: either every
/// expert of the layer (resident; slot = expert id), or a bounded set of
/// slots that the expert store fills ([`Stream::fill_slot`]). The MoE ops
/// take routes into a bank, so a backend can run every selected expert in
/// one launch.
pub trait ExpertBank: Send + Sync {
    /// Experts (or slots) held.
    fn slots(&self) -> usize;
    /// Input and output width.
    fn hidden(&self) -> usize;
    /// Width of the gate and up projections.
    fn intermediate(&self) -> usize;
}

/// A compute device: uploads, memory, allocation, and streams.
///
/// Host↔device copies and ops go through a [`Stream`]; the device itself
/// only creates objects. All methods take `&self` and are safe to call from
/// several threads (uploads happen while a model loads, allocations while a
/// session is created).
pub trait Device: Send + Sync + Sized {
    /// An activation or KV-cache buffer of one [`DType`].
    type Buf: DeviceBuf;
    /// A weight matrix `[out, in]` in its storage format.
    type Matrix: Send + Sync;
    /// An f32 vector (norm weight, bias, sink logits, router tables).
    type Vector: Send + Sync;
    /// A layer's routed experts.
    type Bank: ExpertBank;
    /// Routes of a batch.
    type Routes: RouteBuf;
    /// Host memory a stream copies device data into asynchronously (pinned
    /// on a GPU); its contents are valid after [`Stream::synchronize`].
    /// Also a fast destination for [`Stream::read`] (a GPU copies into
    /// pinned memory directly, into pageable memory through staging).
    type HostBuf: AsRef<[f32]> + AsMut<[f32]> + Send;
    /// A per-session queue of ops with its own scratch.
    type Stream: Stream<Self>;

    /// A short name for logs (`cpu`, `cuda`).
    fn name(&self) -> &'static str;
    /// The arithmetic the device's ops follow.
    fn numerics(&self) -> Numerics;
    /// The device's memory.
    fn memory(&self) -> MemoryInfo;
    /// Whether [`Device::alloc`] can make buffers of `dtype`.
    fn supports(&self, dtype: DType) -> bool;
    /// The element type this device keeps its KV cache in.
    fn kv_dtype(&self) -> DType;
    /// Tokens a prefill pass takes at once unless told otherwise (a
    /// session's batch): a GPU fills its tensor cores and reads each
    /// expert once per 512 tokens (llama.cpp's default micro-batch); the
    /// CPU's kernels work best on smaller chunks.
    fn default_batch(&self) -> usize {
        64
    }

    /// Whether uploaded matrices keep their own copy of the weights, so
    /// that the host pages they were uploaded from (a memory map of the
    /// install) are no longer read after loading, except for embedding
    /// rows. A device memory upload does; the CPU does where it repacks
    /// weights for its kernels.
    fn copies_weights(&self) -> bool {
        false
    }

    /// Uploads a 2-D tensor `[out, in]`.
    fn upload_matrix(&self, t: &HostTensor) -> Result<Self::Matrix, BackendError>;
    /// Uploads a 1-D tensor, widened to f32.
    fn upload_vector(&self, t: &HostTensor) -> Result<Self::Vector, BackendError>;
    /// `[out, in]` of an uploaded matrix.
    fn matrix_shape(&self, m: &Self::Matrix) -> [usize; 2];
    /// Length of an uploaded vector.
    fn vector_len(&self, v: &Self::Vector) -> usize;
    /// Uploads a layer's experts (all of one shape, biases on all or none)
    /// as a bank whose slot `i` holds `experts[i]`. A streamed layer
    /// uploads its slots' initial contents and refills them with
    /// [`Stream::fill_slot`].
    fn upload_bank(&self, experts: &[ExpertTensors]) -> Result<Self::Bank, BackendError>;

    /// A zeroed buffer of `len` elements of `dtype`.
    fn alloc(&self, dtype: DType, len: usize) -> Result<Self::Buf, BackendError>;
    /// A route buffer for `max_tokens` tokens of `top_k` routes.
    fn alloc_routes(&self, max_tokens: usize, top_k: usize) -> Result<Self::Routes, BackendError>;
    /// Host memory for `len` f32 read back by [`Stream::read_async`].
    fn alloc_host(&self, len: usize) -> Result<Self::HostBuf, BackendError>;
    /// Page-locks the host memory of `bytes` (a streamed layer's expert
    /// slots) so that [`Stream::fill_slot`] can copy from it straight to
    /// the device, with no copy through a staging buffer; the bytes stay
    /// locked until the returned pin is dropped. `Ok(None)` when the device
    /// copies no differently from locked memory (the CPU) or the system
    /// refuses the lock (then slots are filled through staging as before).
    /// While locked, [`Stream::fill_slot`] may still be reading the bytes
    /// after it returns: see [`Stream::wait_slot_fills`].
    fn pin_host(&self, bytes: &ByteOwner) -> Result<Option<HostPin>, BackendError> {
        let _ = bytes;
        Ok(None)
    }
    /// Page-locks host memory the host never writes and the device only
    /// reads (a read-only mapping of a file: its page-cache pages), so that
    /// [`Stream::fill_slot`] copies from it straight to the device; locked
    /// until the returned pin is dropped. Registering pins the pages in
    /// place: a page not yet in memory is read in first. `Ok(None)` when
    /// the device copies no differently from locked memory (the CPU), or
    /// cannot lock read-only memory, or the system refuses.
    fn pin_host_read_only(&self, bytes: &ByteOwner) -> Result<Option<HostPin>, BackendError> {
        let _ = bytes;
        Ok(None)
    }
    /// A new stream whose scratch fits `limits` and every matrix uploaded
    /// so far; its ops never allocate.
    fn stream(&self, limits: &Limits) -> Result<Self::Stream, BackendError>;
}

/// The shape of a route buffer's first `n_tokens` tokens, checked.
pub fn routes_for(
    op: &'static str,
    routes: &impl RouteBuf,
    n_tokens: usize,
) -> Result<usize, BackendError> {
    if n_tokens > routes.max_tokens() {
        return Err(BackendError::BufferTooSmall {
            op,
            what: "routes",
            need: n_tokens * routes.top_k(),
            have: routes.max_tokens() * routes.top_k(),
        });
    }
    Ok(routes.top_k())
}
