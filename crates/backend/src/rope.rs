//! Rotary position embedding frequencies, as HF transformers 5.24.0 computes
//! them (`modeling_rope_utils.py`: `_compute_default_rope_parameters`,
//! `_compute_linear_scaling_rope_parameters`, `_compute_yarn_parameters`,
//! `_compute_llama3_parameters`, `_compute_proportional_rope_parameters`).
//!
//! For pair `i` of a rotary block of `d` dimensions, `inv_freq[i] =
//! theta^(-2i/d)` before scaling; at position `p` the pair rotates by
//! `p · inv_freq[i]`, and cos/sin are multiplied by `attention_factor`
//! (YaRN's mscale, 1 otherwise):
//!
//! ```text
//! neox        (x[i], x[i + d/2])  →  (x[i]·c − x[i+d/2]·s, x[i+d/2]·c + x[i]·s)
//! interleaved (x[2i], x[2i+1])    →  (x[2i]·c − x[2i+1]·s, x[2i+1]·c + x[2i]·s)
//! ```
//!
//! Dimensions at and past `rotary_dim` pass through (partial rotary).
//! Proportional rope (Gemma 4) spans the whole head but gives the pairs past
//! `rotated_pairs` frequency 0, which leaves them unchanged.

use std::f64::consts::PI;
use turbospark_core::arch::{RopeKind, RopeScaling, RopeSpec};

/// The per-pair frequencies of one layer's rope.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeTable {
    pub kind: RopeKind,
    /// Leading head dimensions that rotate (even).
    pub rotary_dim: usize,
    /// `rotary_dim / 2` inverse frequencies (radians per position).
    pub inv_freq: Vec<f32>,
    /// Multiplier on cos and sin (YaRN mscale; 1 otherwise).
    pub attention_factor: f32,
    /// The spec the table was made from, for backends that reproduce
    /// another implementation's way of forming the angles.
    pub spec: RopeSpec,
}

impl RopeTable {
    /// Frequencies for `spec` (already validated: `rotary_dim` even, > 0).
    pub fn new(spec: &RopeSpec) -> RopeTable {
        let d = spec.rotary_dim;
        let pairs = d / 2;
        let theta = f64::from(spec.theta);
        let base = |i: usize, dim: usize| 1.0 / theta.powf((2 * i) as f64 / dim as f64);
        let mut attention_factor = 1.0f64;
        let inv_freq: Vec<f64> = match spec.scaling {
            RopeScaling::None => (0..pairs).map(|i| base(i, d)).collect(),
            RopeScaling::Linear { factor } => {
                (0..pairs).map(|i| base(i, d) / f64::from(factor)).collect()
            }
            RopeScaling::Yarn {
                factor,
                original_max_position,
                beta_fast,
                beta_slow,
                attention_factor: af,
                truncate,
            } => {
                attention_factor = f64::from(af);
                yarn_inv_freq(
                    d,
                    theta,
                    f64::from(factor),
                    original_max_position as f64,
                    f64::from(beta_fast),
                    f64::from(beta_slow),
                    truncate,
                )
            }
            RopeScaling::Proportional {
                factor,
                rotated_pairs,
            } => (0..pairs)
                .map(|i| {
                    if i < rotated_pairs {
                        base(i, d) / f64::from(factor)
                    } else {
                        0.0
                    }
                })
                .collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position,
            } => {
                let (factor, lo, hi) = (
                    f64::from(factor),
                    f64::from(low_freq_factor),
                    f64::from(high_freq_factor),
                );
                let old = original_max_position as f64;
                let (low_wavelen, high_wavelen) = (old / lo, old / hi);
                (0..pairs)
                    .map(|i| {
                        let f = base(i, d);
                        let wavelen = 2.0 * PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - lo) / (hi - lo);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
        };
        RopeTable {
            kind: spec.kind,
            rotary_dim: d,
            inv_freq: inv_freq.into_iter().map(|f| f as f32).collect(),
            attention_factor: attention_factor as f32,
            spec: *spec,
        }
    }

    /// Number of rotating pairs.
    pub fn pairs(&self) -> usize {
        self.inv_freq.len()
    }

    /// `(cos, sin)` of pair `i` at position `pos`, times the attention
    /// factor. The angle is formed in f32 as HF does (`position.float() *
    /// inv_freq`); cos and sin are then evaluated in f64 and rounded.
    pub fn cos_sin(&self, pos: usize, i: usize) -> (f32, f32) {
        let angle = f64::from(pos as f32 * self.inv_freq[i]);
        let af = f64::from(self.attention_factor);
        ((angle.cos() * af) as f32, (angle.sin() * af) as f32)
    }
}

/// HF `_compute_yarn_parameters`: blend interpolated (`/ factor`) and
/// extrapolated frequencies with a linear ramp between the dimensions where
/// `beta_fast` and `beta_slow` rotations fit the original context.
fn yarn_inv_freq(
    d: usize,
    theta: f64,
    factor: f64,
    original: f64,
    beta_fast: f64,
    beta_slow: f64,
    truncate: bool,
) -> Vec<f64> {
    let correction_dim =
        |rotations: f64| (d as f64 * (original / (rotations * 2.0 * PI)).ln()) / (2.0 * theta.ln());
    let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    let low = low.max(0.0);
    let mut high = high.min((d - 1) as f64);
    if low == high {
        high += 0.001;
    }
    (0..d / 2)
        .map(|i| {
            let pos_freq = theta.powf((2 * i) as f64 / d as f64);
            let extrapolation = 1.0 / pos_freq;
            let interpolation = 1.0 / (factor * pos_freq);
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let extrapolation_factor = 1.0 - ramp;
            interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(scaling: RopeScaling, d: usize) -> RopeSpec {
        RopeSpec {
            kind: RopeKind::Neox,
            theta: 10000.0,
            rotary_dim: d,
            scaling,
        }
    }

    #[test]
    fn default_frequencies_follow_theta() {
        let t = RopeTable::new(&spec(RopeScaling::None, 8));
        assert_eq!(t.pairs(), 4);
        assert_eq!(t.inv_freq[0], 1.0);
        assert!((t.inv_freq[1] - 0.1).abs() < 1e-7);
        assert!((t.inv_freq[3] - 1e-3).abs() < 1e-9);
        let (c, s) = t.cos_sin(0, 2);
        assert_eq!((c, s), (1.0, 0.0));
    }

    #[test]
    fn yarn_keeps_fast_pairs_and_interpolates_slow_ones() {
        // gpt-oss values: factor 32, original context 4096, theta 150000.
        let s = RopeSpec {
            theta: 150000.0,
            ..spec(
                RopeScaling::Yarn {
                    factor: 32.0,
                    original_max_position: 4096,
                    beta_fast: 32.0,
                    beta_slow: 1.0,
                    attention_factor: 1.3465736,
                    truncate: false,
                },
                64,
            )
        };
        let t = RopeTable::new(&s);
        let plain = RopeTable::new(&RopeSpec {
            scaling: RopeScaling::None,
            ..s
        });
        assert_eq!(t.inv_freq[0], plain.inv_freq[0]);
        let last = t.pairs() - 1;
        assert!((t.inv_freq[last] * 32.0 - plain.inv_freq[last]).abs() < 1e-9);
        assert_eq!(t.attention_factor, 1.3465736);
    }

    #[test]
    fn proportional_zeroes_unrotated_pairs() {
        let t = RopeTable::new(&spec(
            RopeScaling::Proportional {
                factor: 1.0,
                rotated_pairs: 2,
            },
            16,
        ));
        assert_eq!(t.pairs(), 8);
        assert!(t.inv_freq[..2].iter().all(|&f| f > 0.0));
        assert!(t.inv_freq[2..].iter().all(|&f| f == 0.0));
        assert_eq!(t.cos_sin(1000, 5), (1.0, 0.0));
    }
}
