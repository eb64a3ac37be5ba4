//! Token sampling over raw logits.
//!
//! Order of operations (that of HF transformers' `generate`: the logits
//! processors, then the warpers temperature → top-k → top-p → min-p):
//!
//! 1. penalties over the last `penalty_last_n` accepted tokens, each distinct
//!    token once: repetition (CTRL, Keskar et al. 2019: a positive logit is
//!    divided by `repeat_penalty`, a negative one multiplied), frequency
//!    (`logit -= count · frequency_penalty`) and presence
//!    (`logit -= presence_penalty`), as llama.cpp's `penalties` sampler;
//! 2. `temperature == 0`: the argmax (lowest id on ties), nothing else;
//! 3. top-k: the `k` largest logits (ties broken by lower id, so exactly `k`);
//! 4. softmax with temperature over what is left;
//! 5. top-p: the smallest set of most probable tokens whose mass is ≥ `p`;
//! 6. min-p: tokens with probability ≥ `min_p` · the largest probability;
//! 7. a draw from the renormalised distribution with the seeded generator.
//!
//! Nothing sorts the vocabulary: top-k is a `select_nth_unstable` partition,
//! and top-p partitions and sorts growing blocks of the most probable tokens
//! only until the mass is reached. Scratch buffers are sized once in
//! [`Sampler::new`]; sampling a token allocates nothing.

use std::cmp::Ordering;
use std::time::Instant;

use crate::error::{Result, TextError};

/// Sampling parameters. `Default` is plain sampling at temperature 1.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// 0 selects greedy decoding.
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables.
    pub min_p: f32,
    /// 1 disables.
    pub repeat_penalty: f32,
    /// 0 disables.
    pub presence_penalty: f32,
    /// 0 disables.
    pub frequency_penalty: f32,
    /// How many of the most recent accepted tokens the penalties look at.
    pub penalty_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |name: &'static str, value: f32, expected: &'static str| {
            Err(TextError::SamplerParam {
                name,
                value: value.to_string(),
                expected,
            })
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", self.temperature, "a finite number ≥ 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p, "in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p, "in [0, 1]");
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad("repeat_penalty", self.repeat_penalty, "a finite number > 0");
        }
        if !self.presence_penalty.is_finite() {
            return bad("presence_penalty", self.presence_penalty, "a finite number");
        }
        if !self.frequency_penalty.is_finite() {
            return bad(
                "frequency_penalty",
                self.frequency_penalty,
                "a finite number",
            );
        }
        Ok(())
    }
}

/// Counters the sampler keeps about its own cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SamplerStats {
    pub calls: u64,
    /// Elements that went through a comparison sort (top-p blocks).
    pub sorted: u64,
    pub nanos: u64,
}

/// xoshiro256** seeded through SplitMix64.
#[derive(Debug, Clone)]
struct Rng([u64; 4]);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A sampler over one vocabulary, with its scratch and penalty history.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    vocab: usize,
    /// Candidate ids; the first `n_kept` survive the filters.
    idx: Vec<u32>,
    n_kept: usize,
    /// Unnormalised probability of each candidate, indexed by token id.
    weight: Vec<f32>,
    /// Ring of the last `penalty_last_n` accepted tokens.
    history: Vec<u32>,
    history_pos: usize,
    /// Occurrences of each token in `history`.
    counts: Vec<u32>,
    /// Marks tokens already penalised in the current call.
    stamp: Vec<u32>,
    generation: u32,
    stats: SamplerStats,
}

/// Descending by value, then ascending id: a total order, so every filter is
/// deterministic under ties.
fn desc(w: &[f32]) -> impl Fn(&u32, &u32) -> Ordering + '_ {
    move |&a, &b| w[b as usize].total_cmp(&w[a as usize]).then(a.cmp(&b))
}

impl Sampler {
    pub fn new(cfg: SamplerConfig, vocab_size: usize) -> Result<Sampler> {
        cfg.validate()?;
        Ok(Sampler {
            rng: Rng::new(cfg.seed),
            vocab: vocab_size,
            idx: Vec::with_capacity(vocab_size),
            n_kept: 0,
            weight: vec![0.0; vocab_size],
            history: Vec::with_capacity(cfg.penalty_last_n),
            history_pos: 0,
            counts: vec![0; vocab_size],
            stamp: vec![0; vocab_size],
            generation: 0,
            stats: SamplerStats::default(),
            cfg,
        })
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    pub fn stats(&self) -> SamplerStats {
        self.stats
    }

    /// Records a token (prompt or generated) for the penalties.
    pub fn accept(&mut self, token: u32) {
        let n = self.cfg.penalty_last_n;
        if n == 0 || token as usize >= self.vocab {
            return;
        }
        if self.history.len() < n {
            self.history.push(token);
        } else {
            let old = std::mem::replace(&mut self.history[self.history_pos], token);
            self.counts[old as usize] -= 1;
            self.history_pos = (self.history_pos + 1) % n;
        }
        self.counts[token as usize] += 1;
    }

    /// Forgets the penalty history and reseeds.
    pub fn reset(&mut self) {
        for &t in &self.history {
            self.counts[t as usize] = 0;
        }
        self.history.clear();
        self.history_pos = 0;
        self.rng = Rng::new(self.cfg.seed);
    }

    /// Picks the next token. `logits` (one per vocabulary entry) is used as
    /// scratch: penalties are applied to it in place.
    pub fn sample(&mut self, logits: &mut [f32]) -> Result<u32> {
        let t0 = Instant::now();
        let r = self.sample_inner(logits);
        self.stats.calls += 1;
        self.stats.nanos += t0.elapsed().as_nanos() as u64;
        r
    }

    fn sample_inner(&mut self, logits: &mut [f32]) -> Result<u32> {
        if self.cfg.temperature == 0.0 {
            self.check_len(logits)?;
            self.apply_penalties(logits);
            return Ok(argmax(logits));
        }
        self.filter(logits)?;
        let kept = &self.idx[..self.n_kept];
        let total: f64 = kept.iter().map(|&i| self.weight[i as usize] as f64).sum();
        let mut r = self.rng.next_f64() * total;
        for &i in kept {
            r -= self.weight[i as usize] as f64;
            if r < 0.0 {
                return Ok(i);
            }
        }
        Ok(*kept.last().unwrap_or(&0))
    }

    fn check_len(&self, logits: &[f32]) -> Result<()> {
        if logits.len() != self.vocab || self.vocab == 0 {
            return Err(TextError::LogitsLen {
                got: logits.len(),
                expected: self.vocab,
            });
        }
        Ok(())
    }

    /// Applies penalties and the filters; returns the surviving candidate ids
    /// (most probable first when top-p ran, otherwise in no particular order)
    /// and the unnormalised probabilities, indexed by token id (entries of
    /// tokens that did not survive are stale).
    pub fn filter(&mut self, logits: &mut [f32]) -> Result<(&[u32], &[f32])> {
        self.check_len(logits)?;
        self.apply_penalties(logits);
        let n = self.vocab;
        self.idx.clear();
        self.idx.extend(0..n as u32);
        let mut len = n;
        let mut sorted_prefix = 0;

        let k = self.cfg.top_k;
        if k > 0 && k < n {
            let cmp = desc(logits);
            self.idx.select_nth_unstable_by(k - 1, &cmp);
            len = k;
        }
        // Softmax with temperature over the candidates.
        let inv_t = 1.0 / self.cfg.temperature;
        let max = self.idx[..len]
            .iter()
            .map(|&i| logits[i as usize])
            .fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0f64;
        for &i in &self.idx[..len] {
            let l = logits[i as usize];
            // All -inf: uniform; +inf: only the +inf entries.
            let w = if max.is_finite() {
                ((l - max) * inv_t).exp()
            } else if max == f32::INFINITY {
                (l == f32::INFINITY) as u8 as f32
            } else {
                1.0
            };
            self.weight[i as usize] = w;
            total += w as f64;
        }

        let p = self.cfg.top_p;
        if p < 1.0 && len > 1 {
            let target = p as f64 * total;
            let mut cum = 0.0f64;
            let mut block = 64usize;
            let mut cut = len;
            'outer: while sorted_prefix < len {
                let w = &self.weight;
                let cmp = desc(w);
                let rest = &mut self.idx[sorted_prefix..len];
                let b = block.min(rest.len());
                if b < rest.len() {
                    rest.select_nth_unstable_by(b - 1, &cmp);
                }
                rest[..b].sort_unstable_by(&cmp);
                self.stats.sorted += b as u64;
                for j in sorted_prefix..sorted_prefix + b {
                    cum += w[self.idx[j] as usize] as f64;
                    if cum >= target {
                        cut = j + 1;
                        break 'outer;
                    }
                }
                sorted_prefix += b;
                block *= 2;
            }
            len = cut;
        }

        let min_p = self.cfg.min_p;
        if min_p > 0.0 && len > 1 {
            let wmax = self.idx[..len]
                .iter()
                .map(|&i| self.weight[i as usize])
                .fold(0.0f32, f32::max);
            let threshold = min_p * wmax;
            let mut w = 0;
            for r in 0..len {
                let id = self.idx[r];
                if self.weight[id as usize] >= threshold {
                    self.idx[w] = id;
                    w += 1;
                }
            }
            len = w.max(1);
        }
        self.n_kept = len;
        Ok((&self.idx[..len], &self.weight))
    }

    fn apply_penalties(&mut self, logits: &mut [f32]) {
        let c = &self.cfg;
        if self.history.is_empty()
            || (c.repeat_penalty == 1.0 && c.presence_penalty == 0.0 && c.frequency_penalty == 0.0)
        {
            return;
        }
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.stamp.iter_mut().for_each(|s| *s = 0);
            self.generation = 1;
        }
        for &t in &self.history {
            let t = t as usize;
            if self.stamp[t] == self.generation {
                continue;
            }
            self.stamp[t] = self.generation;
            let count = self.counts[t] as f32;
            let l = &mut logits[t];
            if *l > 0.0 {
                *l /= c.repeat_penalty;
            } else {
                *l *= c.repeat_penalty;
            }
            *l -= count * c.frequency_penalty + c.presence_penalty;
        }
    }
}

/// Index of the largest value; the lowest index among equals; NaN never wins
/// (0 when no value is above −∞).
///
/// Two passes the compiler vectorises, instead of one whose branch on each
/// of a vocabulary's logits it cannot: the largest value (lane by lane,
/// NaNs skipped as `v > m` skips them), then the first index holding it.
/// The first pass's maximum is the value the one-pass scan would keep, and
/// the first index equal to it is the one that scan would stop updating at
/// (`-0.0 == 0.0`, so a maximum of zero finds the first zero of either
/// sign, as the scan, which does not replace a zero by another, does).
pub fn argmax(x: &[f32]) -> u32 {
    const LANES: usize = 16;
    let mut m = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            m[l] = if c[l] > m[l] { c[l] } else { m[l] };
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &v in m.iter().chain(tail) {
        if v > max {
            max = v;
        }
    }
    if max == f32::NEG_INFINITY {
        return 0;
    }
    let mut at = 0;
    for c in x.chunks(LANES * 4) {
        if c.iter().fold(false, |hit, &v| hit | (v == max)) {
            return (at + c.iter().position(|&v| v == max).unwrap_or(0)) as u32;
        }
        at += c.len();
    }
    0
}
