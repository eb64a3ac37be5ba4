//! Expert statistics of a session, always counted: cache traffic per MoE
//! layer ([`ExpertStats`]) and the router's choices ([`RouterHistogram`]).
//!
//! A request is one distinct expert needed by one group of work on one
//! layer (a decode token, or the tokens of a prefill chunk processed
//! together); it hits when the expert is already in memory. Resident and
//! mapped experts are always in memory, so there every request hits and
//! nothing is read: hit rates stay comparable across modes. Read time is the
//! wall time of a layer's parallel reads, so bytes over time is the
//! bandwidth the decoder actually saw; wait time is the part of it the
//! decoding thread spent blocked (the rest overlapped computing the hits).

use std::fmt;

/// Cache traffic of one layer, or of all of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerStats {
    pub requests: u64,
    pub hits: u64,
    /// Experts read from storage (misses).
    pub reads: u64,
    pub bytes_read: u64,
    /// Of `reads` and `bytes_read`, the misses the device copied straight
    /// from the page cache and their bytes (no read, no read time;
    /// `page_cache.rs`).
    pub page_cache_copies: u64,
    pub page_cache_bytes: u64,
    /// Wall time of the reads, from submission to the last one's end, in
    /// nanoseconds.
    pub read_nanos: u64,
    /// Wall time the decoding thread was blocked on reads (less than
    /// `read_nanos` by the compute overlapped with them), in nanoseconds.
    pub wait_nanos: u64,
}

impl LayerStats {
    /// Hits over requests (1 when nothing was requested).
    pub fn hit_rate(&self) -> f64 {
        if self.requests == 0 {
            1.0
        } else {
            self.hits as f64 / self.requests as f64
        }
    }

    /// Bytes read per second of read time (0 when nothing was read); the
    /// copies from the page cache, which take no read time, are left out.
    pub fn bandwidth(&self) -> f64 {
        if self.read_nanos == 0 {
            0.0
        } else {
            let read = self.bytes_read.saturating_sub(self.page_cache_bytes);
            read as f64 / (self.read_nanos as f64 * 1e-9)
        }
    }

    fn add(&mut self, o: &LayerStats) {
        self.requests += o.requests;
        self.hits += o.hits;
        self.reads += o.reads;
        self.bytes_read += o.bytes_read;
        self.page_cache_copies += o.page_cache_copies;
        self.page_cache_bytes += o.page_cache_bytes;
        self.read_nanos += o.read_nanos;
        self.wait_nanos += o.wait_nanos;
    }
}

/// [`LayerStats`] of every MoE layer of a session.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExpertStats {
    /// `(layer, stats)`, in layer order.
    layers: Vec<(usize, LayerStats)>,
}

impl ExpertStats {
    pub(crate) fn new(moe_layers: impl Iterator<Item = usize>) -> ExpertStats {
        ExpertStats {
            layers: moe_layers.map(|l| (l, LayerStats::default())).collect(),
        }
    }

    /// `(layer, stats)` of each MoE layer.
    pub fn layers(&self) -> &[(usize, LayerStats)] {
        &self.layers
    }

    pub fn layer(&self, layer: usize) -> Option<&LayerStats> {
        self.layers
            .iter()
            .find(|(l, _)| *l == layer)
            .map(|(_, s)| s)
    }

    pub(crate) fn layer_mut(&mut self, layer: usize) -> Option<&mut LayerStats> {
        self.layers
            .iter_mut()
            .find(|(l, _)| *l == layer)
            .map(|(_, s)| s)
    }

    /// Sum over layers (read time summed too: layers read one after another).
    pub fn total(&self) -> LayerStats {
        let mut t = LayerStats::default();
        for (_, s) in &self.layers {
            t.add(s);
        }
        t
    }

    /// Zeroes every counter.
    pub fn reset(&mut self) {
        for (_, s) in &mut self.layers {
            *s = LayerStats::default();
        }
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

impl fmt::Display for ExpertStats {
    /// A table: one row per layer and a total.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:>6} {:>10} {:>10} {:>7} {:>9} {:>11} {:>10} {:>10} {:>10}",
            "layer", "requests", "hits", "hit%", "reads", "MiB read", "read ms", "MiB/s", "wait ms"
        )?;
        let row = |f: &mut fmt::Formatter<'_>, name: &str, s: &LayerStats| {
            writeln!(
                f,
                "{:>6} {:>10} {:>10} {:>7.2} {:>9} {:>11.1} {:>10.1} {:>10.1} {:>10.1}",
                name,
                s.requests,
                s.hits,
                100.0 * s.hit_rate(),
                s.reads,
                mib(s.bytes_read),
                s.read_nanos as f64 * 1e-6,
                mib(s.bandwidth() as u64),
                s.wait_nanos as f64 * 1e-6,
            )
        };
        for (l, s) in &self.layers {
            row(f, &l.to_string(), s)?;
        }
        row(f, "total", &self.total())
    }
}

/// How often the router chose each expert of each MoE layer: one count per
/// (token, rank), so a layer's counts sum to `tokens × top_k`.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterHistogram {
    num_experts: usize,
    top_k: usize,
    /// `(layer, counts[num_experts])`, in layer order.
    layers: Vec<(usize, Vec<u64>)>,
}

impl RouterHistogram {
    pub(crate) fn new(
        moe_layers: impl Iterator<Item = usize>,
        num_experts: usize,
        top_k: usize,
    ) -> RouterHistogram {
        RouterHistogram {
            num_experts,
            top_k,
            layers: moe_layers.map(|l| (l, vec![0; num_experts])).collect(),
        }
    }

    pub fn num_experts(&self) -> usize {
        self.num_experts
    }

    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// `(layer, per-expert selection counts)` of each MoE layer.
    pub fn layers(&self) -> &[(usize, Vec<u64>)] {
        &self.layers
    }

    /// Selections over all layers and experts.
    pub fn total(&self) -> u64 {
        self.layers.iter().flat_map(|(_, c)| c.iter()).sum()
    }

    /// Share of all selections that went to the `n` most chosen experts of
    /// each layer (`n / num_experts` for uniform routing): a measure of
    /// routing skew: the hit rate of a cache that kept exactly those `n`
    /// experts of each layer.
    pub fn hot_share(&self, n: usize) -> f64 {
        let mut hot = 0u64;
        for (_, counts) in &self.layers {
            let mut sorted = counts.clone();
            sorted.sort_unstable_by(|a, b| b.cmp(a));
            hot += sorted.iter().take(n).sum::<u64>();
        }
        match self.total() {
            0 => 0.0,
            total => hot as f64 / total as f64,
        }
    }

    /// Counts one selection of each expert in `experts` at `layer`.
    pub(crate) fn record(&mut self, layer: usize, experts: impl Iterator<Item = u32>) {
        if let Some((_, counts)) = self.layers.iter_mut().find(|(l, _)| *l == layer) {
            for e in experts {
                if let Some(c) = counts.get_mut(e as usize) {
                    *c += 1;
                }
            }
        }
    }

    /// Zeroes every count.
    pub fn reset(&mut self) {
        for (_, c) in &mut self.layers {
            c.fill(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_and_rates() {
        let mut s = ExpertStats::new([1, 3].into_iter());
        *s.layer_mut(1).unwrap() = LayerStats {
            requests: 4,
            hits: 3,
            reads: 1,
            bytes_read: 1 << 20,
            page_cache_copies: 1,
            page_cache_bytes: 1 << 19,
            read_nanos: 1_000_000,
            wait_nanos: 250_000,
        };
        s.layer_mut(3).unwrap().requests = 4;
        s.layer_mut(3).unwrap().page_cache_copies = 2;
        s.layer_mut(3).unwrap().hits = 1;
        let t = s.total();
        assert_eq!((t.requests, t.hits, t.page_cache_copies), (8, 4, 3));
        assert_eq!((t.read_nanos, t.wait_nanos), (1_000_000, 250_000));
        assert_eq!(t.hit_rate(), 0.5);
        // Half of the MiB came from the page cache, in no read time.
        assert!((s.layer(1).unwrap().bandwidth() - 524288e3).abs() < 1.0);
        assert!(s.to_string().contains("total"));
        assert!(s.layer(2).is_none());

        let mut h = RouterHistogram::new([1, 3].into_iter(), 4, 2);
        h.record(3, [0, 2, 2, 9].into_iter());
        assert_eq!(h.layers()[1].1, [1, 0, 2, 0]);
        assert_eq!(h.total(), 3);
        h.record(1, [3, 3, 3, 1].into_iter());
        // Layer 1: [0,1,0,3], layer 3: [1,0,2,0]; the top one of each: 3 + 2.
        assert_eq!(h.hot_share(1), 5.0 / 7.0);
        assert_eq!(h.hot_share(4), 1.0);
    }
}
