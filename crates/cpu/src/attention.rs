//! Causal attention of a batch of queries over a KV cache (HF
//! `eager_attention_forward`, with gpt-oss's sinks and Gemma's soft-cap).
//!
//! For query head `h` of the token at position `p`, over keys `j` in
//! `[lo, p]` (`lo = p − window + 1` on sliding layers, else 0):
//!
//! ```text
//! s_j = scale · q·k_j          (then c·tanh(s_j / c) with a soft-cap)
//! m   = max(max_j s_j, sink_h)
//! out = Σ_j e^(s_j − m) v_j / (Σ_j e^(s_j − m) + e^(sink_h − m))
//! ```
//!
//! (no sink term without sinks). Keys are read from cache row `j % capacity`.

use crate::matmul::dot;
use turbospark_backend::AttentionParams;

/// One attention call's inputs, shared by the threads that compute it.
pub(crate) struct AttentionInputs<'a> {
    /// `[n_tokens, n_heads, head_dim]`
    pub q: &'a [f32],
    /// `[capacity, n_kv_heads, head_dim]`
    pub k_cache: &'a [f32],
    pub v_cache: &'a [f32],
    pub params: &'a AttentionParams,
    /// One logit per query head.
    pub sinks: Option<&'a [f32]>,
}

impl AttentionInputs<'_> {
    /// Attends query head `h` of token `t` into `out` (`head_dim` floats);
    /// `scores` holds at least as many floats as the query sees keys.
    pub(crate) fn attend(&self, t: usize, h: usize, scores: &mut [f32], out: &mut [f32]) {
        let p = self.params;
        let hd = p.head_dim;
        let row = p.n_kv_heads * hd;
        let kv_head = h / (p.n_heads / p.n_kv_heads);
        let pos = p.first_pos + t;
        let lo = p.first_key(pos);
        let q = &self.q[(t * p.n_heads + h) * hd..][..hd];
        let scores = &mut scores[..pos - lo + 1];
        let sink = self.sinks.map(|s| s[h]);
        let mut max = sink.unwrap_or(f32::NEG_INFINITY);
        for (s, j) in scores.iter_mut().zip(lo..=pos) {
            let at = (j % p.capacity) * row + kv_head * hd;
            let mut v = dot(q, &self.k_cache[at..at + hd]) * p.scale;
            if let Some(c) = p.softcap {
                v = (v / c).tanh() * c;
            }
            *s = v;
            max = max.max(v);
        }
        let mut denom = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            denom += *s;
        }
        if let Some(sink) = sink {
            denom += (sink - max).exp();
        }
        out.fill(0.0);
        for (&s, j) in scores.iter().zip(lo..=pos) {
            let w = s / denom;
            let at = (j % p.capacity) * row + kv_head * hd;
            for (o, &v) in out.iter_mut().zip(&self.v_cache[at..at + hd]) {
                *o += w * v;
            }
        }
    }
}
