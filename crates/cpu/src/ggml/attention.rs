//! Attention as llama.cpp computes it without flash attention, on an f16
//! KV cache (normative: `llm_graph_context::build_attn_mha` in
//! `src/llama-graph.cpp`; `ggml_compute_forward_mul_mat` and
//! `ggml_compute_forward_soft_max_f32` in `ggml/src/ggml-cpu/ops.cpp`).
//!
//! For query head `h` of the token at position `p`, keys `j` in `[lo, p]`
//! (cached K and V already hold f16 values, see `kv_write`):
//!
//! ```text
//! s_j = scale · (f16(q) · k_j)        (f16 × f16 products, exact in f32)
//! s_j = tanhf(s_j · (1/c)) · c         (soft-cap, if any)
//! m   = max(max_j s_j, sink_h)
//! e_j = v_expf(s_j − m)
//! S   = Σ over 16-key groups (keys 16g … 16g + 15 of the cache, missing
//!       keys 0) of the group's f32 sum in `_mm512_reduce_add_ps` order,
//!       accumulated in f64;  S += expf(sink_h − m)
//! p_j = f16(e_j · f32(1 / S))
//! out = Σ_j p_j · v_j                  (f16 × f16 products, f32 sums)
//! ```
//!
//! Both f16 products are matmuls in ggml and are summed in its order
//! (`super::float_dot`: `vec_dot_f16` for one query token, tinyBLAS for a
//! batch), over llama.cpp's KV length: the cells in use padded to 256.
//! For `p·V` the elements are cache positions, so lanes follow key
//! positions from 0, which is how llama.cpp's cells are laid out for a
//! single sequence that fits its cache; the same holds for the softmax
//! groups.

use super::float_dot::{FloatAcc, FloatDot, FloatType};
use super::ops::{reduce_add_16, v_expf};
use super::quantize::round_f16;
use crate::attention::AttentionInputs;

impl AttentionInputs<'_> {
    /// Attends query head `h` of token `t` into `out` (`head_dim` floats)
    /// with llama.cpp's arithmetic. `scores` holds at least as many floats
    /// as the query sees keys, `q16` at least `head_dim`.
    pub(crate) fn attend_ggml(
        &self,
        t: usize,
        h: usize,
        scores: &mut [f32],
        q16: &mut [f32],
        out: &mut [f32],
    ) {
        let p = self.params;
        let hd = p.head_dim;
        let row = p.n_kv_heads * hd;
        let kv_head = h / (p.n_heads / p.n_kv_heads);
        let pos = p.first_pos + t;
        let lo = p.first_key(pos);
        let q16 = &mut q16[..hd];
        for (d, &s) in q16
            .iter_mut()
            .zip(&self.q[(t * p.n_heads + h) * hd..][..hd])
        {
            *d = round_f16(s);
        }
        let scores = &mut scores[..pos - lo + 1];
        let sink = self.sinks.map(|s| s[h]);
        let mut max = sink.unwrap_or(f32::NEG_INFINITY);
        // llama.cpp's KV length: the cache cells in use, padded to 256.
        let n_kv = (pos + 1).next_multiple_of(256);
        let qk = FloatDot::for_matmul(FloatType::F16, n_kv, hd, p.n_tokens);
        let pv = FloatDot::for_matmul(FloatType::F16, hd, n_kv, p.n_tokens);
        for (s, j) in scores.iter_mut().zip(lo..=pos) {
            let at = (j % p.capacity) * row + kv_head * hd;
            let mut v = qk.dot(q16, &self.k_cache[at..at + hd]) * p.scale;
            if let Some(c) = p.softcap {
                v = (v * (1.0 / c)).tanh() * c;
            }
            *s = v;
            if v > max {
                max = v;
            }
        }
        let mut sum = 0f64;
        let mut lanes = [0f32; 16];
        let mut group = lo / 16;
        for (s, j) in scores.iter_mut().zip(lo..=pos) {
            if j / 16 != group {
                sum += f64::from(reduce_add_16(&lanes));
                lanes = [0.0; 16];
                group = j / 16;
            }
            *s = v_expf(*s - max);
            lanes[j % 16] = *s;
        }
        sum += f64::from(reduce_add_16(&lanes));
        if let Some(sink) = sink {
            sum += f64::from((sink - max).exp());
        }
        let inv = (1.0 / sum) as f32;
        for s in scores.iter_mut() {
            *s = round_f16(*s * inv);
        }
        let kv_at = |j: usize| (j % p.capacity) * row + kv_head * hd;
        for (d, o) in out.iter_mut().enumerate() {
            let mut acc = FloatAcc::new(pv, n_kv);
            for (&w, j) in scores.iter().zip(lo..=pos) {
                acc.add(j, w, self.v_cache[kv_at(j) + d]);
            }
            *o = acc.finish();
        }
    }
}
