//! The KV cache of a session: per layer, keys and values as
//! `[capacity, n_kv_heads · head_dim]` rows in the device's KV dtype
//! ([`Device::kv_dtype`]), position `p` in row `p % capacity`.
//!
//! Full-attention layers hold the whole context. A sliding layer with window
//! `w` only ever needs the last `w` keys, but a batch of `b` queries written
//! together needs the `w − 1` keys before the batch plus the batch itself, so
//! its ring holds `min(w + b − 1, context)` rows (`b` the session's largest
//! batch). Writing a batch then never overwrites a key a query of this or a
//! later batch still reads.
//!
//! With latent attention (DeepSeek-V3) a layer caches one row `[rope(k_rope),
//! c]` per position, read as both keys and values: the `v` buffer is empty.
//!
//! A gated DeltaNet layer (Qwen3.5) keeps no rows: its state is the last
//! `kernel − 1` convolution inputs and the recurrent matrix per value head
//! ([`RecurrentState`], f32), constant in the sequence length. The state
//! holds exactly the positions before [`KvCache::position`]: a pass starts
//! there (a sequence cannot rewind), and one at position 0 reads the state
//! as zeros, so a reset sequence never sees a stale state. A pass that
//! fails midway may have moved the state without the position; the session
//! then resets the cache ([`KvCache::reset`]) so that it recomputes.

use crate::EngineError;
use turbospark_backend::DType;
use turbospark_backend::{Device, DeviceBuf};
use turbospark_core::arch::{ArchSpec, Mixer};

/// The per-sequence state of a gated DeltaNet layer, f32.
pub struct RecurrentState<D: Device> {
    /// The last `kernel − 1` inputs of the convolution `[kernel − 1,
    /// conv_dim]`, oldest first.
    pub conv: D::Buf,
    /// `[v_heads, k_head_dim, v_head_dim]`
    pub recurrent: D::Buf,
}

/// One layer's cache.
pub struct KvLayer<D: Device> {
    /// `[capacity, row]`
    pub k: D::Buf,
    /// `[capacity, row]`; empty with latent attention, whose values are
    /// the key rows.
    pub v: D::Buf,
    pub capacity: usize,
    /// `n_kv_heads · head_dim`
    pub row: usize,
    /// Values are the key rows (latent attention); `v` is empty.
    pub values_are_keys: bool,
    /// A DeltaNet layer's state; `k` and `v` are then empty and the
    /// capacity 0.
    pub state: Option<RecurrentState<D>>,
}

pub struct KvCache<D: Device> {
    pub(crate) layers: Vec<KvLayer<D>>,
    position: usize,
    context: usize,
}

/// Rows a layer with `window` keeps for a session of `context` positions
/// whose batches hold at most `max_batch` tokens.
pub fn layer_capacity(window: Option<usize>, context: usize, max_batch: usize) -> usize {
    match window {
        Some(w) => (w + max_batch - 1).min(context),
        None => context,
    }
}

impl<D: Device> KvCache<D> {
    pub fn new(
        device: &D,
        spec: &ArchSpec,
        context: usize,
        max_batch: usize,
    ) -> Result<Self, EngineError> {
        let dtype = device.kv_dtype();
        let latent = spec.mla.is_some();
        let layers = spec
            .layers
            .iter()
            .map(|l| {
                if let (Mixer::DeltaNet, Some(d)) = (l.mixer, &spec.delta_net) {
                    return Ok(KvLayer {
                        k: device.alloc(dtype, 0)?,
                        v: device.alloc(dtype, 0)?,
                        capacity: 0,
                        row: 0,
                        values_are_keys: false,
                        state: Some(RecurrentState {
                            conv: device.alloc(DType::F32, d.conv_state_len())?,
                            recurrent: device.alloc(DType::F32, d.recurrent_state_len())?,
                        }),
                    });
                }
                let capacity = layer_capacity(l.window, context, max_batch);
                let row = l.num_kv_heads * l.head_dim;
                Ok(KvLayer {
                    k: device.alloc(dtype, capacity * row)?,
                    v: device.alloc(dtype, if latent { 0 } else { capacity * row })?,
                    capacity,
                    row,
                    values_are_keys: latent,
                    state: None,
                })
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        Ok(KvCache {
            layers,
            position: 0,
            context,
        })
    }

    /// The next position the cache expects.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Positions the session can hold.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Cache elements (keys and values, every layer) one position takes in
    /// the layers that hold the whole context; multiply by the KV dtype's
    /// size for bytes.
    pub fn elements_per_position(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.capacity == self.context)
            .map(|l| if l.values_are_keys { l.row } else { 2 * l.row })
            .sum()
    }

    /// Elements of the recurrent (DeltaNet) state of every layer: the same
    /// whatever the context; multiply by 4 for bytes (f32).
    pub fn state_elements(&self) -> usize {
        self.layers
            .iter()
            .filter_map(|l| l.state.as_ref())
            .map(|s| s.conv.len() + s.recurrent.len())
            .sum()
    }

    /// Whether some layer keeps a recurrent state (which a pass that
    /// failed midway may have moved).
    pub fn has_recurrent_state(&self) -> bool {
        self.layers.iter().any(|l| l.state.is_some())
    }

    /// Rows held for `layer`.
    pub fn capacity(&self, layer: usize) -> Option<usize> {
        self.layers.get(layer).map(|l| l.capacity)
    }

    /// Checks that `tokens` tokens at `position` continue the cache and fit.
    pub fn check_append(&self, position: usize, tokens: usize) -> Result<(), EngineError> {
        if position != self.position {
            return Err(EngineError::NonSequentialPosition {
                expected: self.position,
                got: position,
            });
        }
        if position
            .checked_add(tokens)
            .is_none_or(|end| end > self.context)
        {
            return Err(EngineError::ContextOverflow {
                position,
                tokens,
                context: self.context,
            });
        }
        Ok(())
    }

    pub(crate) fn advance(&mut self, tokens: usize) {
        self.position += tokens;
    }

    /// Forgets every position (the buffers are reused as they are).
    pub fn reset(&mut self) {
        self.position = 0;
    }

    /// Forgets the positions from `position` on, keeping the keys and
    /// values of the positions before it, so that a sequence sharing those
    /// first `position` tokens can continue from there (a prompt prefix
    /// computed once for several requests). A row depends only on its
    /// token and the positions before it, so what follows computes as it
    /// would after computing the prefix anew. Refused when `position` is
    /// past the cache's, when a sliding layer's ring has wrapped (its rows
    /// no longer hold every position the prefix's last queries read), or,
    /// but for position 0, when a layer keeps a recurrent state (it holds
    /// every position before the cache's, and cannot go back).
    pub fn rewind(&mut self, position: usize) -> Result<(), EngineError> {
        self.check_rewind(position)?;
        self.position = position;
        Ok(())
    }

    /// Whether the first `position` positions can be kept (by
    /// [`KvCache::rewind`], or copied to another cache by
    /// `Session::copy_prefix`).
    pub(crate) fn check_rewind(&self, position: usize) -> Result<(), EngineError> {
        let wrapped = self
            .layers
            .iter()
            .any(|l| l.state.is_none() && l.capacity < self.context && self.position > l.capacity);
        let recurrent = self.has_recurrent_state() && position != 0;
        if position > self.position || ((wrapped || recurrent) && position != self.position) {
            return Err(EngineError::BadOptions {
                detail: format!(
                    "cannot rewind a KV cache at position {} to {position}{}",
                    self.position,
                    if recurrent {
                        " (a layer keeps a recurrent state)"
                    } else if wrapped {
                        " (a sliding layer's ring has wrapped)"
                    } else {
                        ""
                    }
                ),
            });
        }
        Ok(())
    }
}
