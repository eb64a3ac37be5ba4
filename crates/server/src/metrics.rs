//! Server counters and their Prometheus text exposition (format 0.0.4:
//! `# HELP`, `# TYPE`, then `name{labels} value` lines; histograms as
//! cumulative `_bucket{le="…"}` lines with `_sum` and `_count`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use turbospark_engine::experts::LayerStats;

/// A histogram with fixed upper bounds.
struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative), one more for `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut acc = 0;
        for (i, b) in self.bounds.iter().enumerate() {
            acc += self.counts[i];
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {acc}");
        }
        acc += self.counts[self.bounds.len()];
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {acc}");
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

const TTFT_BOUNDS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];
const RATE_BOUNDS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0];

/// Everything `/metrics` shows; shared by the HTTP side and the scheduler.
pub struct Metrics {
    /// Requests by (endpoint, HTTP status).
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    prompt_tokens: AtomicU64,
    /// Prompt tokens whose keys and values an earlier sequence left in the
    /// cache the request got.
    reused_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    queued: AtomicU64,
    active: AtomicU64,
    cancelled: AtomicU64,
    timed_out: AtomicU64,
    decode_steps: AtomicU64,
    decode_rows: AtomicU64,
    ttft: Mutex<Histogram>,
    decode_rate: Mutex<Histogram>,
    experts: Mutex<LayerStats>,
    /// Decode tokens per second over recent steps (exponentially weighted).
    recent_rate: Mutex<f64>,
    /// `(layer, selections per expert)` of each MoE layer.
    expert_use: Mutex<Vec<(usize, Vec<u64>)>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::new(BTreeMap::new()),
            prompt_tokens: AtomicU64::new(0),
            reused_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            active: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            decode_steps: AtomicU64::new(0),
            decode_rows: AtomicU64::new(0),
            ttft: Mutex::new(Histogram::new(TTFT_BOUNDS)),
            decode_rate: Mutex::new(Histogram::new(RATE_BOUNDS)),
            experts: Mutex::new(LayerStats::default()),
            recent_rate: Mutex::new(0.0),
            expert_use: Mutex::new(Vec::new()),
        }
    }
}

/// Locks a mutex even if a thread panicked while holding it: counters stay
/// usable, at worst missing the panicking thread's last update.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    pub fn request(&self, endpoint: &str, status: u16) {
        *lock(&self.requests)
            .entry((endpoint.to_string(), status))
            .or_insert(0) += 1;
    }
    pub fn prompt(&self, tokens: usize) {
        self.prompt_tokens
            .fetch_add(tokens as u64, Ordering::Relaxed);
    }
    pub fn reused(&self, tokens: usize) {
        self.reused_tokens
            .fetch_add(tokens as u64, Ordering::Relaxed);
    }
    pub fn generated(&self, tokens: usize) {
        self.generated_tokens
            .fetch_add(tokens as u64, Ordering::Relaxed);
    }
    pub fn enqueued(&self) {
        self.queued.fetch_add(1, Ordering::Relaxed);
    }
    pub fn dequeued(&self) {
        let _ = self
            .queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| q.checked_sub(1));
    }
    pub fn queue_depth(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }
    pub fn set_active(&self, n: usize) {
        self.active.store(n as u64, Ordering::Relaxed);
    }
    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }
    pub fn cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }
    pub fn timed_out(&self) {
        self.timed_out.fetch_add(1, Ordering::Relaxed);
    }
    pub fn decode_step(&self, rows: usize, took: Duration) {
        self.decode_steps.fetch_add(1, Ordering::Relaxed);
        self.decode_rows.fetch_add(rows as u64, Ordering::Relaxed);
        let secs = took.as_secs_f64();
        if secs > 0.0 {
            let mut r = lock(&self.recent_rate);
            *r = 0.8 * *r + 0.2 * (rows as f64 / secs);
        }
    }
    /// The decode rate falls to zero while nothing decodes.
    pub fn idle(&self) {
        *lock(&self.recent_rate) = 0.0;
    }
    pub fn set_expert_use(&self, layers: &[(usize, Vec<u64>)]) {
        let mut u = lock(&self.expert_use);
        u.clear();
        u.extend_from_slice(layers);
    }

    /// What the page's live panel shows.
    pub fn snapshot(&self) -> serde_json::Value {
        let e = *lock(&self.experts);
        serde_json::json!({
            "active_sequences": self.active(),
            "queue_depth": self.queue_depth(),
            "generated_tokens": self.generated_tokens.load(Ordering::Relaxed),
            "decode_tok_per_s": *lock(&self.recent_rate),
            "expert_requests": e.requests,
            "expert_hit_rate": e.hit_rate(),
            "expert_bytes_read": e.bytes_read,
            "expert_use": *lock(&self.expert_use),
        })
    }
    pub fn time_to_first_token(&self, d: Duration) {
        lock(&self.ttft).observe(d.as_secs_f64());
    }
    pub fn decode_rate(&self, tok_per_s: f64) {
        lock(&self.decode_rate).observe(tok_per_s);
    }
    pub fn set_experts(&self, stats: &LayerStats) {
        *lock(&self.experts) = *stats;
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, kind: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        };
        let _ = writeln!(
            out,
            "# HELP turbospark_requests_total HTTP requests by endpoint and status.\n\
             # TYPE turbospark_requests_total counter"
        );
        for ((endpoint, status), n) in lock(&self.requests).iter() {
            let _ = writeln!(
                out,
                "turbospark_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
            );
        }
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            &mut out,
            "turbospark_prompt_tokens_total",
            "Prompt tokens of admitted requests.",
            "counter",
            ld(&self.prompt_tokens),
        );
        counter(
            &mut out,
            "turbospark_prompt_tokens_reused_total",
            "Prompt tokens not computed: a cached prefix left by an earlier request.",
            "counter",
            ld(&self.reused_tokens),
        );
        counter(
            &mut out,
            "turbospark_generated_tokens_total",
            "Tokens sampled.",
            "counter",
            ld(&self.generated_tokens),
        );
        counter(
            &mut out,
            "turbospark_queue_depth",
            "Requests waiting for a place.",
            "gauge",
            ld(&self.queued),
        );
        counter(
            &mut out,
            "turbospark_active_sequences",
            "Sequences holding a place (prefill or decode).",
            "gauge",
            ld(&self.active),
        );
        counter(
            &mut out,
            "turbospark_cancelled_total",
            "Sequences ended because the client went away.",
            "counter",
            ld(&self.cancelled),
        );
        counter(
            &mut out,
            "turbospark_timed_out_total",
            "Sequences ended by the request timeout.",
            "counter",
            ld(&self.timed_out),
        );
        counter(
            &mut out,
            "turbospark_decode_steps_total",
            "Batched decode passes.",
            "counter",
            ld(&self.decode_steps),
        );
        counter(
            &mut out,
            "turbospark_decode_rows_total",
            "Sequence rows over all decode passes.",
            "counter",
            ld(&self.decode_rows),
        );
        lock(&self.ttft).render(
            &mut out,
            "turbospark_time_to_first_token_seconds",
            "From admission to the first sampled token.",
        );
        lock(&self.decode_rate).render(
            &mut out,
            "turbospark_decode_tokens_per_second",
            "Per-request decode speed after the first token.",
        );
        let e = *lock(&self.experts);
        let _ = writeln!(
            out,
            "# HELP turbospark_expert_cache_hit_rate Routed-expert cache hits over requests.\n\
             # TYPE turbospark_expert_cache_hit_rate gauge\nturbospark_expert_cache_hit_rate {}",
            e.hit_rate()
        );
        counter(
            &mut out,
            "turbospark_expert_bytes_read_total",
            "Routed-expert bytes read from storage.",
            "counter",
            e.bytes_read,
        );
        out
    }
}
