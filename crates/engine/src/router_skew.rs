//! Skewed routing for synthetic installs. Random router weights route
//! nearly uniformly, which makes an expert cache look worse than it will be
//! on a trained model, whose experts are used unevenly. This module gives a
//! synthetic MoE layer a router whose selections follow a chosen
//! popularity, a Zipf law over a per-layer random ranking of the experts:
//!
//! ```text
//! p_e = (r_e + 1)^(-s) / Σ_j (j + 1)^(-s)      r_e: rank of expert e, s ≥ 0
//! ```
//!
//! Mechanism (the Gumbel-top-k trick): if the router logit of expert e is
//! `ln p_e + g_e` with `g_e` i.i.d. standard Gumbel noise, the top-k set is a
//! draw of k experts without replacement with probabilities ∝ p (the
//! Plackett–Luce model; top-1 is exactly a draw from p). The router bias
//! is set to `ln p_e`, and the random router matrix plays the noise: its
//! rows are scaled so that `W·x` for a normed hidden state (RMS ≈ 1) has the
//! standard Gumbel's standard deviation π/√6. The noise is roughly Gaussian
//! rather than Gumbel, so the realised frequencies only approximate the
//! Plackett–Luce ones; `--router-hist` reports what actually happened.
//! `s = 0` keeps the bias uniform (the noise alone decides).

use crate::synthetic::Rng;

/// Standard deviation of the standard Gumbel distribution, π/√6.
pub const GUMBEL_STD: f64 = 1.282_549_830_161_864;

/// The Zipf popularity of ranks `0..n` with exponent `s`, summing to 1.
pub fn zipf(n: usize, s: f64) -> Vec<f64> {
    let w: Vec<f64> = (0..n).map(|r| ((r + 1) as f64).powf(-s)).collect();
    let total: f64 = w.iter().sum();
    w.into_iter().map(|x| x / total).collect()
}

/// The popularity ranking of layer `layer`'s `n` experts in an install
/// generated from `seed`: a seeded permutation of `0..n` (Fisher–Yates
/// over SplitMix64) whose entry e is the rank of expert e (0 = most used).
pub fn ranking(n: usize, seed: u64, layer: usize) -> Vec<usize> {
    let mut rng = Rng(seed ^ 0xA076_1D64_78BD_642F ^ ((layer as u64 + 1) << 32));
    let mut perm: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        perm.swap(i, j);
    }
    perm
}

/// Router bias `ln p_e` for the experts of layer `layer`: Zipf exponent
/// `s` over [`ranking`]`(num_experts, seed, layer)`.
pub fn skewed_bias(num_experts: usize, s: f64, seed: u64, layer: usize) -> Vec<f32> {
    let p = zipf(num_experts, s);
    ranking(num_experts, seed, layer)
        .into_iter()
        .map(|rank| p[rank].ln() as f32)
        .collect()
}

/// The factor that brings a router matrix drawn uniform in `±1/√hidden`
/// to noise of standard deviation [`GUMBEL_STD`] on a hidden state of RMS
/// `rms`: such a row dotted with x has standard deviation `rms/√3`.
pub fn router_gain(rms: f64) -> f64 {
    GUMBEL_STD / (rms / 3f64.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::f64::consts::PI;

    #[test]
    fn gumbel_std_is_pi_over_root_six() {
        assert!((GUMBEL_STD - PI / 6f64.sqrt()).abs() < 1e-15);
    }

    #[test]
    fn zipf_is_a_distribution_decreasing_in_rank() {
        let p = zipf(32, 1.0);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        // Hand-computed: H_32 = 4.058495..., p_0 = 1/H_32.
        assert!((p[0] - 1.0 / 4.058_495_195_5).abs() < 1e-9);
        assert!(p.windows(2).all(|w| w[0] > w[1]));
        assert!(zipf(8, 0.0).iter().all(|&x| (x - 0.125).abs() < 1e-15));
    }

    #[test]
    fn ranking_is_a_permutation_that_depends_on_the_seed() {
        let a = ranking(32, 7, 0);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..32).collect::<Vec<_>>());
        assert_ne!(a, ranking(32, 8, 0));
        assert_ne!(a, ranking(32, 7, 1));
        assert_eq!(a, ranking(32, 7, 0));
    }

    #[test]
    fn bias_differences_are_log_popularity_ratios() {
        let (n, s) = (16, 1.3);
        let bias = skewed_bias(n, s, 3, 5);
        let rank = ranking(n, 3, 5);
        for e in 0..n {
            for f in 0..n {
                let want = -s * (((rank[e] + 1) as f64) / ((rank[f] + 1) as f64)).ln();
                assert!((f64::from(bias[e] - bias[f]) - want).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn gain_gives_gumbel_std() {
        // Uniform in ±a has variance a²/3; with a = g/√h, a row dotted with
        // x (Σx² = h·rms²) has variance g²·rms²/3.
        let g = router_gain(1.0);
        assert!((g * g / 3.0 - PI * PI / 6.0).abs() < 1e-12);
    }
}
