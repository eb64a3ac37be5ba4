//! The KV cache of a sequence: per layer, what the layer's token mixer
//! keeps between passes (`crate::mixers`): keys and values for an
//! attention layer (rows of a ring sized by its window), a constant-size
//! recurrent state for a DeltaNet layer. The cache knows the position
//! every layer's part has reached; it names no kind of layer.
//!
//! A layer whose state folds in every position (a recurrence) cannot go
//! back: a pass must start at the cache's position, and a pass that fails
//! midway may have moved the state without the position, so the session
//! then resets the cache ([`KvCache::reset`]) to have it recomputed.

use crate::mixers::LayerCache;
use crate::EngineError;
use turbospark_backend::Device;
use turbospark_core::arch::ArchSpec;

pub struct KvCache<D: Device> {
    pub(crate) layers: Vec<LayerCache<D>>,
    position: usize,
    context: usize,
}

impl<D: Device> KvCache<D> {
    pub fn new(
        device: &D,
        spec: &ArchSpec,
        context: usize,
        max_batch: usize,
    ) -> Result<Self, EngineError> {
        let layers = (0..spec.layers.len())
            .map(|l| LayerCache::new(device, spec, l, context, max_batch))
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
            .map(|l| l.state().elements_per_position(self.context))
            .sum()
    }

    /// Elements of the recurrent (DeltaNet) state of every layer: the same
    /// whatever the context; multiply by 4 for bytes (f32).
    pub fn state_elements(&self) -> usize {
        self.layers.iter().map(|l| l.state().state_elements()).sum()
    }

    /// Whether some layer keeps a recurrent state (which a pass that
    /// failed midway may have moved).
    pub fn has_recurrent_state(&self) -> bool {
        self.layers.iter().any(|l| l.state().recurrent())
    }

    /// Rows held for `layer`.
    pub fn capacity(&self, layer: usize) -> Option<usize> {
        self.layers.get(layer).map(|l| l.state().capacity())
    }

    /// Whether `other` has this cache's context and every layer's shape.
    pub(crate) fn same_shape(&self, other: &Self) -> bool {
        self.context == other.context
            && self.layers.len() == other.layers.len()
            && self
                .layers
                .iter()
                .zip(&other.layers)
                .all(|(a, b)| a.same_shape(b))
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
            .any(|l| l.state().lost_positions(self.position, self.context));
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
