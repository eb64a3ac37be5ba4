//! Applying a [`RopeTable`] to `[tokens, heads, head_dim]` activations
//! (HF `apply_rotary_pos_emb` with `rotate_half` for neox; adjacent pairs for
//! the interleaved layout of GGUF llama checkpoints). See
//! `turbospark_backend::rope` for the frequencies.

use turbospark_backend::RopeTable;
use turbospark_core::arch::RopeKind;

/// Positions whose cos/sin a [`TrigCache`] keeps (by position modulo this).
const SLOTS: usize = 64;

/// cos/sin of the rope pairs at recently seen positions, for the
/// frequencies of the last table used: a decode step of several sequences
/// ropes each row's queries and keys at its own position in every layer,
/// and evaluating the pairs' f64 cos and sin again for each of those calls
/// cost more than the rotations. An entry is a pure function of the
/// table's frequencies, attention factor and the position (the values of
/// [`RopeTable::cos_sin`]), so entries are kept exactly while the
/// frequencies and factor stay equal to the ones they were computed for.
/// Sized once; a rope never allocates.
pub(crate) struct TrigCache {
    /// Most pairs a table may have.
    max_pairs: usize,
    /// The frequencies and attention factor (bits) the entries belong to.
    inv_freq: Vec<f32>,
    factor: u32,
    /// Per slot: position + 1 of its entry, 0 when empty.
    pos: Vec<usize>,
    /// Per slot: `max_pairs` cos, then `max_pairs` sin.
    trig: Vec<f32>,
}

impl TrigCache {
    /// A cache for tables of up to `max_pairs` pairs.
    pub(crate) fn new(max_pairs: usize) -> TrigCache {
        TrigCache {
            max_pairs,
            inv_freq: Vec::with_capacity(max_pairs),
            factor: 0,
            pos: vec![0; SLOTS],
            trig: vec![0.0; SLOTS * 2 * max_pairs],
        }
    }

    /// The cos and sin of every pair of `table` at `pos`; `None` when the
    /// table has more pairs than the cache holds.
    fn get(&mut self, table: &RopeTable, pos: usize) -> Option<(&[f32], &[f32])> {
        let pairs = table.pairs();
        if pairs > self.max_pairs || table.inv_freq.len() != pairs {
            return None;
        }
        let factor = table.attention_factor.to_bits();
        if self.inv_freq != table.inv_freq || self.factor != factor {
            self.inv_freq.clear();
            self.inv_freq.extend_from_slice(&table.inv_freq);
            self.factor = factor;
            self.pos.iter_mut().for_each(|p| *p = 0);
        }
        let slot = pos % SLOTS;
        let entry = &mut self.trig[slot * 2 * self.max_pairs..(slot + 1) * 2 * self.max_pairs];
        let (cos, sin) = entry.split_at_mut(self.max_pairs);
        if self.pos[slot] != pos + 1 {
            for i in 0..pairs {
                (cos[i], sin[i]) = table.cos_sin(pos, i);
            }
            self.pos[slot] = pos + 1;
        }
        Some((&cos[..pairs], &sin[..pairs]))
    }
}

/// Rotates `x` in place, with the cos/sin of each position from `cache`
/// (computed there when missing).
pub(crate) fn rope(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    first_pos: usize,
    table: &RopeTable,
    cache: &mut TrigCache,
) {
    let pairs = table.pairs();
    for (t, token) in x.chunks_exact_mut(n_heads * head_dim).enumerate() {
        let pos = first_pos + t;
        let Some((cos, sin)) = cache.get(table, pos) else {
            // A table wider than the cache (never for heads the stream was
            // sized for): the pairs computed in place.
            for head in token.chunks_exact_mut(head_dim) {
                for i in 0..pairs {
                    let (c, s) = table.cos_sin(pos, i);
                    rotate(head, table.kind, pairs, i, c, s);
                }
            }
            continue;
        };
        for head in token.chunks_exact_mut(head_dim) {
            for i in 0..pairs {
                rotate(head, table.kind, pairs, i, cos[i], sin[i]);
            }
        }
    }
}

/// Rotates pair `i` of one head by the angle whose cos and sin are given.
#[inline]
fn rotate(head: &mut [f32], kind: RopeKind, pairs: usize, i: usize, cos: f32, sin: f32) {
    let (a, b) = match kind {
        RopeKind::Neox => (i, i + pairs),
        RopeKind::Interleaved => (2 * i, 2 * i + 1),
    };
    let (xa, xb) = (head[a], head[b]);
    head[a] = xa * cos - xb * sin;
    head[b] = xb * cos + xa * sin;
}

#[cfg(test)]
mod tests {
    use super::*;
    use turbospark_core::arch::{RopeScaling, RopeSpec};

    #[test]
    fn neox_and_interleaved_pick_different_pairs() {
        let spec = |kind| RopeSpec {
            kind,
            theta: 10000.0,
            rotary_dim: 4,
            scaling: RopeScaling::None,
        };
        let mut trig = TrigCache::new(2);
        // head_dim 6 with rotary_dim 4: the last two dims pass through.
        let mut x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        rope(
            &mut x,
            1,
            6,
            1,
            &RopeTable::new(&spec(RopeKind::Neox)),
            &mut trig,
        );
        let (c, s) = (1f32.cos(), 1f32.sin());
        assert!((x[0] - (c - 3.0 * s)).abs() < 1e-6);
        assert!((x[2] - (3.0 * c + s)).abs() < 1e-6);
        assert_eq!(&x[4..], &[5.0, 6.0]);
        let mut y = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        rope(
            &mut y,
            1,
            6,
            1,
            &RopeTable::new(&spec(RopeKind::Interleaved)),
            &mut trig,
        );
        assert!((y[0] - (c - 2.0 * s)).abs() < 1e-6);
        assert!((y[1] - (2.0 * c + s)).abs() < 1e-6);
    }

    /// The cached cos/sin give the rotation computed afresh, across
    /// positions that share a slot and tables whose frequencies differ.
    #[test]
    fn cached_trig_follows_the_table_and_the_position() {
        let table = |theta| {
            RopeTable::new(&RopeSpec {
                kind: RopeKind::Neox,
                theta,
                rotary_dim: 8,
                scaling: RopeScaling::None,
            })
        };
        let (a, b) = (table(10000.0), table(500.0));
        let x: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
        let fresh = |t: &RopeTable, pos: usize| {
            let mut y = x.clone();
            rope(&mut y, 2, 8, pos, t, &mut TrigCache::new(4));
            y
        };
        let mut cache = TrigCache::new(4);
        for (t, pos) in [
            (&a, 3),
            (&a, 3),
            (&b, 3),
            (&a, 3 + SLOTS),
            (&a, 3),
            (&b, 70),
        ] {
            let mut y = x.clone();
            rope(&mut y, 2, 8, pos, t, &mut cache);
            assert_eq!(y, fresh(t, pos), "pos {pos}");
        }
    }
}
