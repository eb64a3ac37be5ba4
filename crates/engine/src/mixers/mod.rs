//! Token mixers: what a layer computes between its input norm and its
//! residual add, chosen per layer by [`LayerSpec::mixer`]. Each kind lives
//! in one module, with everything the engine knows about it: its weights
//! and how they load from the tensor table, what it keeps per sequence
//! between passes (a layer's part of a [`KvCache`](crate::kv::KvCache)),
//! its scratch, and its forward pass over the session's own sequence or a
//! batch of sequences.
//!
//! - [`attention`]: softmax attention over a KV cache (with
//!   [`latent`], DeepSeek's multi-head latent attention, as its
//!   projections when the spec has [`ArchSpec::mla`]);
//! - [`delta_net`]: gated DeltaNet, a recurrence over a constant-size state.
//!
//! This file only dispatches: the decoder, the KV cache, the scratch and
//! the weight loader name no kind. A new kind of layer is a module here,
//! one arm in each `match` below and a field of [`MixerScratch`].
//!
//! [`LayerSpec::mixer`]: turbospark_core::arch::LayerSpec::mixer

mod attention;
mod delta_net;
mod latent;

use crate::loader::{Listed, Loader};
use crate::EngineError;
use turbospark_backend::{Device, RopeTable};
use turbospark_core::arch::{ArchSpec, Mixer};

/// What one layer's mixer reads and writes in one pass of `n` rows.
pub(crate) struct MixIo<'p, D: Device> {
    pub(crate) st: &'p mut D::Stream,
    pub(crate) spec: &'p ArchSpec,
    /// The layer.
    pub(crate) l: usize,
    /// The layer's rope table (`None` on layers without rope).
    pub(crate) rope: Option<&'p RopeTable>,
    /// The normed input `[n, hidden]`.
    pub(crate) a: &'p D::Buf,
    /// The output, before any post-norm and the residual add `[n, hidden]`.
    pub(crate) o: &'p mut D::Buf,
    pub(crate) n: usize,
}

/// The sequences the rows of one pass belong to, as a layer's mixer sees
/// them (`crate::batch::At` at one layer).
pub(crate) enum Seqs<'a, D: Device> {
    /// Every row belongs to the session's own sequence, at consecutive
    /// positions from `pos`; `cache` is the layer's part of its cache.
    Own {
        cache: &'a mut LayerCache<D>,
        pos: usize,
    },
    /// Several sequences, each with consecutive rows and a cache of its own.
    Parts(&'a mut dyn Parts<D>),
}

/// Several sequences of one pass, in the order of their rows.
pub(crate) trait Parts<D: Device> {
    /// How many sequences.
    fn count(&self) -> usize;
    /// Sequence `i`: its number of rows (which follow those of the
    /// sequences before it), its cache's next position, and layer `l`'s
    /// part of its cache.
    fn part(&mut self, i: usize, l: usize) -> (usize, usize, &mut LayerCache<D>);
    /// [`Parts::part`], to read.
    fn part_ref(&self, i: usize, l: usize) -> (usize, usize, &LayerCache<D>);
}

/// One layer's mixer weights.
pub(crate) enum MixerWeights<D: Device> {
    Attention(attention::AttentionWeights<D>),
    DeltaNet(delta_net::DeltaNetWeights<D>),
}

impl<D: Device> MixerWeights<D> {
    /// The mixer weights of layer `l`, whose tensors (from the table) are `ts`.
    pub(crate) fn load(
        ld: &Loader<'_, D>,
        spec: &ArchSpec,
        l: usize,
        ts: &Listed,
    ) -> Result<Self, EngineError> {
        Ok(match spec.layers[l].mixer {
            Mixer::Attention => Self::Attention(attention::load(ld, spec, l, ts)?),
            Mixer::DeltaNet => Self::DeltaNet(delta_net::load(ld, ts)?),
        })
    }

    /// The layer's mixing of the rows `io.a` into `io.o`, over the caches
    /// of `seqs`.
    pub(crate) fn forward(
        &self,
        io: MixIo<'_, D>,
        s: &mut MixerScratch<D>,
        seqs: Seqs<'_, D>,
    ) -> Result<(), EngineError> {
        match self {
            Self::Attention(w) => attention::forward(w, io, s.attention.as_mut(), seqs),
            Self::DeltaNet(w) => delta_net::forward(w, io, s.delta_net.as_mut(), seqs),
        }
    }
}

/// What a layer's mixer keeps for one sequence between passes.
pub(crate) enum LayerCache<D: Device> {
    Attention(attention::KvRows<D>),
    DeltaNet(delta_net::RecurrentState<D>),
}

/// What the KV cache asks of every layer's part of it.
pub(crate) trait LayerState {
    /// Elements one more position of the context takes in this layer, if
    /// it holds every position (keys and values of a full-attention layer).
    fn elements_per_position(&self, _context: usize) -> usize {
        0
    }
    /// Elements of a state whose size does not depend on the context.
    fn state_elements(&self) -> usize {
        0
    }
    /// Rows held.
    fn capacity(&self) -> usize {
        0
    }
    /// The state folds in every position before the cache's (a
    /// recurrence): it cannot go back but to position 0, and a pass that
    /// fails midway may have moved it.
    fn recurrent(&self) -> bool {
        false
    }
    /// Whether a cache at `position` no longer holds some position this
    /// layer would read after going back (a sliding window's ring that
    /// has wrapped).
    fn lost_positions(&self, _position: usize, _context: usize) -> bool {
        false
    }
}

impl<D: Device> LayerCache<D> {
    /// Layer `l`'s part of a cache of `context` positions whose passes hold
    /// at most `max_batch` tokens.
    pub(crate) fn new(
        device: &D,
        spec: &ArchSpec,
        l: usize,
        context: usize,
        max_batch: usize,
    ) -> Result<Self, EngineError> {
        let ls = &spec.layers[l];
        Ok(match ls.mixer {
            Mixer::Attention => Self::Attention(attention::KvRows::new(
                device, spec, ls, context, max_batch,
            )?),
            Mixer::DeltaNet => Self::DeltaNet(delta_net::RecurrentState::new(device, spec)?),
        })
    }

    pub(crate) fn state(&self) -> &dyn LayerState {
        match self {
            Self::Attention(r) => r,
            Self::DeltaNet(s) => s,
        }
    }

    /// Queues on `st` the copy of the first `positions` positions this
    /// layer's part `src` holds into `dst` (a cache of the same shape).
    /// The caller has checked that `src` still holds them
    /// (`KvCache::check_rewind`): a recurrent state only gets here at
    /// position 0, where there is nothing to copy.
    pub(crate) fn copy_prefix(
        st: &mut D::Stream,
        src: &Self,
        dst: &mut Self,
        positions: usize,
    ) -> Result<(), EngineError> {
        match (src, dst) {
            (Self::Attention(s), Self::Attention(d)) => s.copy_prefix(st, d, positions),
            (Self::DeltaNet(_), Self::DeltaNet(_)) if positions == 0 => Ok(()),
            _ => Err(EngineError::BadOptions {
                detail: format!(
                    "cannot copy {positions} positions between these layer caches \
                     (different kinds, or a recurrent state past position 0)"
                ),
            }),
        }
    }

    /// Whether `other` is this layer's part of a cache of the same shape.
    pub(crate) fn same_shape(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Attention(a), Self::Attention(b)) => a.same_shape(b),
            (Self::DeltaNet(a), Self::DeltaNet(b)) => a.same_shape(b),
            _ => false,
        }
    }
}

/// The mixers' scratch of a session, `T = max_batch` rows, each kind's
/// when some layer has it.
pub(crate) struct MixerScratch<D: Device> {
    attention: Option<attention::Scratch<D>>,
    delta_net: Option<delta_net::Scratch<D>>,
}

impl<D: Device> MixerScratch<D> {
    pub(crate) fn new(device: &D, spec: &ArchSpec, t: usize) -> Result<Self, EngineError> {
        Ok(MixerScratch {
            attention: attention::Scratch::new(device, spec, t)?,
            delta_net: delta_net::Scratch::new(device, spec, t)?,
        })
    }
}

/// What the mixers need of a stream's scratch
/// ([`turbospark_backend::Limits`]): the most keys one attention call
/// reads, and the widest head an op works on.
/// The widest key or value head of the gated delta rule (0: none), which
/// sizes the backend's chunk scratch (`Limits::max_delta_head_dim`).
pub(crate) fn delta_head_dim(spec: &ArchSpec) -> usize {
    delta_net::head_dim(spec)
}

pub(crate) fn stream_needs(spec: &ArchSpec, context: usize, max_batch: usize) -> (usize, usize) {
    attention::stream_needs(spec, context, max_batch)
        .chain(delta_net::stream_needs(spec))
        .fold((0, 0), |(k, h), (k2, h2)| (k.max(k2), h.max(h2)))
}
