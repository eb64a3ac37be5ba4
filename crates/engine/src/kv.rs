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

use crate::EngineError;
use turbospark_backend::Device;
use turbospark_core::arch::ArchSpec;

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
                let capacity = layer_capacity(l.window, context, max_batch);
                let row = l.num_kv_heads * l.head_dim;
                Ok(KvLayer {
                    k: device.alloc(dtype, capacity * row)?,
                    v: device.alloc(dtype, if latent { 0 } else { capacity * row })?,
                    capacity,
                    row,
                    values_are_keys: latent,
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
    /// past the cache's, or when a sliding layer's ring has wrapped (its
    /// rows no longer hold every position the prefix's last queries read).
    pub fn rewind(&mut self, position: usize) -> Result<(), EngineError> {
        let wrapped = self
            .layers
            .iter()
            .any(|l| l.capacity < self.context && self.position > l.capacity);
        if position > self.position || (wrapped && position != self.position) {
            return Err(EngineError::BadOptions {
                detail: format!(
                    "cannot rewind a KV cache at position {} to {position}{}",
                    self.position,
                    if wrapped {
                        " (a sliding layer's ring has wrapped)"
                    } else {
                        ""
                    }
                ),
            });
        }
        self.position = position;
        Ok(())
    }
}
