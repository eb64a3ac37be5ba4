//! Where the rows of one forward pass belong: to the session's own
//! sequence, or to several sequences, each with a KV cache of its own.
//! The decoder ([`crate::decoder`]) runs every batched op over all rows;
//! the token mixers ([`crate::mixers`]) run what is per sequence (rope,
//! cache write, attention, a recurrence) over each sequence's cache.

use crate::hooks::PreparedSteering;
use crate::kv::KvCache;
use crate::mixers::{LayerCache, Parts, Seqs};
use turbospark_backend::Device;

/// Where the tokens of a pass sit and which KV cache each attends to.
pub(crate) enum At<'a, 'b, D: Device> {
    /// Consecutive positions from the given one, in the session's own cache.
    Own(usize),
    /// Row `i` is the next position of `rows[i].kv`, a sequence of its own:
    /// rope, cache write and attention are per row, everything else is one
    /// batched op over all rows.
    Rows(&'a mut [BatchRow<'b, D>]),
    /// Consecutive rows per sequence: chunk `c`'s tokens are at the next
    /// positions of `chunks[c].kv`, after the rows of the chunks before it.
    Chunks(&'a mut [BatchChunk<'b, D>]),
}

/// One sequence of a batched decode step: its cache and the token fed at
/// the cache's next position.
pub struct BatchRow<'k, D: Device> {
    pub kv: &'k mut KvCache<D>,
    pub token: u32,
}

/// One sequence's part of a pass over several sequences
/// (`Session::forward_chunks`): `tokens` at the next positions of `kv`
/// (one token of a decode step, or a chunk of a prompt), whether the pass
/// returns the logits of its last token, and control vectors that steer
/// this sequence's rows alone (after the session's own steering, if any).
pub struct BatchChunk<'k, D: Device> {
    pub kv: &'k mut KvCache<D>,
    pub tokens: &'k [u32],
    pub logits: bool,
    pub steering: Option<&'k PreparedSteering<D>>,
}

impl<'b, D: Device> At<'_, 'b, D> {
    /// The sequences of the pass as layer `l`'s mixer sees them; `own` is
    /// the session's own cache, and `view` a place for the view of several
    /// sequences to live in while the mixer runs.
    pub(crate) fn seqs<'s>(
        &'s mut self,
        l: usize,
        own: &'s mut KvCache<D>,
        view: &'s mut Option<PartsOf<'s, 'b, D>>,
    ) -> Seqs<'s, D> {
        let parts = match self {
            At::Own(pos) => {
                return Seqs::Own {
                    cache: &mut own.layers[l],
                    pos: *pos,
                }
            }
            At::Rows(rows) => PartsOf::Rows(rows),
            At::Chunks(chunks) => PartsOf::Chunks(chunks),
        };
        Seqs::Parts(view.insert(parts))
    }
}

/// The sequences of a pass over several, for the mixers.
pub(crate) enum PartsOf<'s, 'b, D: Device> {
    Rows(&'s mut [BatchRow<'b, D>]),
    Chunks(&'s mut [BatchChunk<'b, D>]),
}

impl<D: Device> Parts<D> for PartsOf<'_, '_, D> {
    fn count(&self) -> usize {
        match self {
            PartsOf::Rows(r) => r.len(),
            PartsOf::Chunks(c) => c.len(),
        }
    }

    fn part(&mut self, i: usize, l: usize) -> (usize, usize, &mut LayerCache<D>) {
        let (n, kv) = match self {
            PartsOf::Rows(r) => (1, &mut *r[i].kv),
            PartsOf::Chunks(c) => (c[i].tokens.len(), &mut *c[i].kv),
        };
        (n, kv.position(), &mut kv.layers[l])
    }

    fn part_ref(&self, i: usize, l: usize) -> (usize, usize, &LayerCache<D>) {
        let (n, kv) = match self {
            PartsOf::Rows(r) => (1, &*r[i].kv),
            PartsOf::Chunks(c) => (c[i].tokens.len(), &*c[i].kv),
        };
        (n, kv.position(), &kv.layers[l])
    }
}
