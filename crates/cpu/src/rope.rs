//! Applying a [`RopeTable`] to `[tokens, heads, head_dim]` activations
//! (HF `apply_rotary_pos_emb` with `rotate_half` for neox; adjacent pairs for
//! the interleaved layout of GGUF llama checkpoints). See
//! `turbospark_backend::rope` for the frequencies.

use turbospark_backend::RopeTable;
use turbospark_core::arch::RopeKind;

/// Rotates `x` in place. `trig` holds at least `2 · table.pairs()` floats.
pub(crate) fn rope(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    first_pos: usize,
    table: &RopeTable,
    trig: &mut [f32],
) {
    let pairs = table.pairs();
    let (cos, sin) = trig[..2 * pairs].split_at_mut(pairs);
    for (t, token) in x.chunks_exact_mut(n_heads * head_dim).enumerate() {
        let pos = first_pos + t;
        for i in 0..pairs {
            (cos[i], sin[i]) = table.cos_sin(pos, i);
        }
        for head in token.chunks_exact_mut(head_dim) {
            for i in 0..pairs {
                let (a, b) = match table.kind {
                    RopeKind::Neox => (i, i + pairs),
                    RopeKind::Interleaved => (2 * i, 2 * i + 1),
                };
                let (xa, xb) = (head[a], head[b]);
                head[a] = xa * cos[i] - xb * sin[i];
                head[b] = xb * cos[i] + xa * sin[i];
            }
        }
    }
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
        let mut trig = [0f32; 8];
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
}
