//! Sampler properties over random logits.

use proptest::prelude::*;
use turbospark_text::sampler::argmax;
use turbospark_text::{Sampler, SamplerConfig, TextError};

fn logits_strategy() -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-20.0f32..20.0, 1..300)
}

fn cfg(temperature: f32) -> SamplerConfig {
    SamplerConfig {
        temperature,
        ..Default::default()
    }
}

/// Reference probabilities: softmax(logits / t) computed independently.
fn softmax(logits: &[f32], t: f32) -> Vec<f64> {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = logits
        .iter()
        .map(|&l| ((l as f64 - m) / t as f64).exp())
        .collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// The one-pass scan `argmax` must agree with: the first strictly larger
/// value wins, NaN never does.
fn scan(x: &[f32]) -> u32 {
    x.iter()
        .enumerate()
        .fold((0usize, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
            if v > bv {
                (i, v)
            } else {
                (bi, bv)
            }
        })
        .0 as u32
}

#[test]
fn argmax_edge_cases_match_the_scan() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let cases: Vec<Vec<f32>> = vec![
        vec![],
        vec![nan],
        vec![f32::NEG_INFINITY; 70],
        vec![nan, f32::NEG_INFINITY, nan],
        vec![-0.0, 0.0, -0.0],
        vec![0.0, -0.0],
        vec![-1.0, -0.0, -2.0, 0.0],
        vec![nan, 3.0, 3.0, nan, 3.0],
        vec![1.0, inf, 2.0, inf],
    ];
    for c in &cases {
        assert_eq!(argmax(c), scan(c), "{c:?}");
    }
    // Long rows: the maximum in the tail, in the first and in a later
    // chunk, repeated, beside NaNs.
    for n in [15, 16, 17, 63, 64, 65, 200, 49_152] {
        for at in [0, n / 3, n - 1] {
            let mut x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 * 0.01).collect();
            x[at] = 50.0;
            x[n - 1 - (n - 1 - at) / 2] = 50.0;
            x[(at + 5) % n] = nan;
            assert_eq!(argmax(&x), scan(&x), "n {n} at {at}");
        }
    }
}

proptest! {
    #[test]
    fn greedy_is_argmax(logits in logits_strategy(), seed in any::<u64>()) {
        let mut s = Sampler::new(SamplerConfig { seed, ..SamplerConfig::greedy() }, logits.len()).unwrap();
        let expected = logits
            .iter()
            .enumerate()
            .fold((0usize, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) })
            .0 as u32;
        prop_assert_eq!(s.sample(&mut logits.clone()).unwrap(), expected);
        prop_assert_eq!(argmax(&logits), expected);
    }

    #[test]
    fn top_k_keeps_exactly_k_largest(logits in logits_strategy(), k in 1usize..50) {
        let mut s = Sampler::new(SamplerConfig { top_k: k, ..cfg(1.0) }, logits.len()).unwrap();
        let mut l = logits.clone();
        let (kept, _) = s.filter(&mut l).unwrap();
        let kept = kept.to_vec();
        prop_assert_eq!(kept.len(), k.min(logits.len()));
        let min_kept = kept.iter().map(|&i| logits[i as usize]).fold(f32::INFINITY, f32::min);
        for (i, &v) in logits.iter().enumerate() {
            if !kept.contains(&(i as u32)) {
                // Everything dropped is no larger than everything kept
                // (equal only on ties at the boundary).
                prop_assert!(v <= min_kept);
            }
        }
    }

    #[test]
    fn top_p_keeps_smallest_prefix_with_enough_mass(
        logits in logits_strategy(),
        p in 0.05f32..0.99,
        t in 0.3f32..2.0,
    ) {
        let mut s = Sampler::new(SamplerConfig { top_p: p, temperature: t, ..Default::default() }, logits.len()).unwrap();
        let probs = softmax(&logits, t);
        let mut l = logits.clone();
        let (kept, _) = s.filter(&mut l).unwrap();
        let kept = kept.to_vec();
        let mass: f64 = kept.iter().map(|&i| probs[i as usize]).sum();
        let tol = 1e-5;
        prop_assert!(mass >= p as f64 - tol, "mass {} < p {}", mass, p);
        let least = kept.iter().map(|&i| probs[i as usize]).fold(f64::INFINITY, f64::min);
        prop_assert!(mass - least < p as f64 + tol, "prefix not minimal: {} - {} >= {}", mass, least, p);
        for (i, &q) in probs.iter().enumerate() {
            if !kept.contains(&(i as u32)) {
                prop_assert!(q <= least + 1e-12);
            }
        }
    }

    #[test]
    fn min_p_keeps_tokens_above_fraction_of_max(logits in logits_strategy(), min_p in 0.01f32..0.9) {
        let mut s = Sampler::new(SamplerConfig { min_p, ..cfg(1.0) }, logits.len()).unwrap();
        let probs = softmax(&logits, 1.0);
        let pmax = probs.iter().cloned().fold(0.0, f64::max);
        let mut l = logits.clone();
        let (kept, _) = s.filter(&mut l).unwrap();
        let mut kept = kept.to_vec();
        kept.sort_unstable();
        let expected: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| probs[i as usize] >= min_p as f64 * pmax * (1.0 - 1e-6))
            .collect();
        // Allow a boundary token whose ratio is within float rounding of min_p.
        let boundary = |i: &u32| ((probs[*i as usize] / pmax) - min_p as f64).abs() < 1e-5;
        let a: Vec<u32> = kept.iter().copied().filter(|i| !boundary(i)).collect();
        let b: Vec<u32> = expected.iter().copied().filter(|i| !boundary(i)).collect();
        prop_assert_eq!(a, b);
    }

    #[test]
    fn same_seed_same_tokens(logits in logits_strategy(), seed in any::<u64>(), steps in 1usize..20) {
        let c = SamplerConfig { seed, temperature: 0.9, top_k: 40, top_p: 0.95, min_p: 0.02, repeat_penalty: 1.1, ..Default::default() };
        let mut a = Sampler::new(c.clone(), logits.len()).unwrap();
        let mut b = Sampler::new(c, logits.len()).unwrap();
        for step in 0..steps {
            let mut la = logits.clone();
            la.rotate_left(step % logits.len());
            let mut lb = la.clone();
            let ta = a.sample(&mut la).unwrap();
            let tb = b.sample(&mut lb).unwrap();
            prop_assert_eq!(ta, tb);
            a.accept(ta);
            b.accept(tb);
        }
    }

    #[test]
    fn penalties_apply_once_per_distinct_token(
        logits in prop::collection::vec(-5.0f32..5.0, 10..50),
        history in prop::collection::vec(0u32..10, 0..30),
        rep in 1.0f32..2.0,
        freq in 0.0f32..1.0,
        pres in 0.0f32..1.0,
    ) {
        let c = SamplerConfig {
            repeat_penalty: rep,
            frequency_penalty: freq,
            presence_penalty: pres,
            penalty_last_n: 64,
            top_k: logits.len(),
            ..cfg(1.0)
        };
        let mut s = Sampler::new(c, logits.len()).unwrap();
        for &t in &history {
            s.accept(t);
        }
        let mut l = logits.clone();
        s.filter(&mut l).unwrap();
        for (i, (&orig, &got)) in logits.iter().zip(&l).enumerate() {
            let count = history.iter().filter(|&&t| t as usize == i).count() as f32;
            let expected = if count == 0.0 {
                orig
            } else {
                let r = if orig > 0.0 { orig / rep } else { orig * rep };
                r - count * freq - pres
            };
            prop_assert!((got - expected).abs() < 1e-5, "token {}: {} vs {}", i, got, expected);
        }
    }
}

#[test]
fn penalty_window_forgets_old_tokens() {
    let c = SamplerConfig {
        repeat_penalty: 2.0,
        penalty_last_n: 2,
        ..SamplerConfig::greedy()
    };
    let mut s = Sampler::new(c, 4).unwrap();
    for t in [0, 1, 2] {
        s.accept(t);
    }
    // Token 0 left the window of 2; 1 and 2 are penalised.
    let mut l = vec![4.0, 4.0, 4.0, 3.0];
    assert_eq!(s.sample(&mut l).unwrap(), 0);
    assert_eq!(l, vec![4.0, 2.0, 2.0, 3.0]);
}

#[test]
fn different_seeds_explore() {
    let logits = vec![0.0f32; 100];
    let draws: std::collections::HashSet<u32> = (0..20)
        .map(|seed| {
            let mut s = Sampler::new(SamplerConfig { seed, ..cfg(1.0) }, 100).unwrap();
            s.sample(&mut logits.clone()).unwrap()
        })
        .collect();
    assert!(draws.len() > 5);
}

#[test]
fn top_p_does_not_sort_the_vocabulary() {
    let n = 100_000;
    let logits: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 50.0).collect();
    let mut s = Sampler::new(
        SamplerConfig {
            top_p: 0.5,
            ..cfg(0.5)
        },
        n,
    )
    .unwrap();
    s.sample(&mut logits.clone()).unwrap();
    assert!(
        s.stats().sorted < (n / 4) as u64,
        "sorted {}",
        s.stats().sorted
    );
}

#[test]
fn bad_parameters_and_logits_are_typed_errors() {
    for c in [
        SamplerConfig {
            temperature: -1.0,
            ..Default::default()
        },
        SamplerConfig {
            temperature: f32::NAN,
            ..Default::default()
        },
        SamplerConfig {
            top_p: 0.0,
            ..Default::default()
        },
        SamplerConfig {
            min_p: 1.5,
            ..Default::default()
        },
        SamplerConfig {
            repeat_penalty: 0.0,
            ..Default::default()
        },
    ] {
        assert!(matches!(
            Sampler::new(c, 10),
            Err(TextError::SamplerParam { .. })
        ));
    }
    let mut s = Sampler::new(SamplerConfig::default(), 10).unwrap();
    assert!(matches!(
        s.sample(&mut [0.0; 5]),
        Err(TextError::LogitsLen {
            got: 5,
            expected: 10
        })
    ));
}
