//! x86-64 AVX2 + FMA versions of the fast-numerics element-wise ops and of
//! one query head's attention (the math of `crate::elementwise` and
//! `crate::attention`), eight f32 lanes at a time.
//!
//! `exp` is evaluated as `2^n · p(r)` with `x = n ln2 + r`, `|r| ≤ ln2/2`
//! and a degree-6 polynomial (Cephes `expf`; relative error about 2e-7 over
//! the range that does not underflow). Sums run in eight lanes, so results
//! differ from the exact path's ordered (f64) sums by rounding only.
//!
//! Every function here requires a CPU with AVX2 and FMA; the caller checks
//! once ([`super::Isa::detect`]).

// The tiles index several parallel arrays (accumulators, rows, scales) by
// the same register index; iterator chains would obscure that.
#![allow(clippy::needless_range_loop)]
use crate::attention::AttentionInputs;
use std::arch::x86_64::*;
use turbospark_core::arch::{Activation, NormScale, NormSpec};

/// The sum of the eight lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// `e^x` lane by lane (see the module docs); inputs below −87.3 give
/// about 1e-38, above 88.7 about 3e38.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.3)),
        _mm256_set1_ps(88.7),
    );
    let n = _mm256_round_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let y = _mm256_fmadd_ps(
        _mm256_mul_ps(p, r),
        r,
        _mm256_add_ps(r, _mm256_set1_ps(1.0)),
    );
    let pow2 = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
        23,
    );
    _mm256_mul_ps(y, _mm256_castsi256_ps(pow2))
}

/// `1 / (1 + e^−x)`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sigmoid8(x: __m256) -> __m256 {
    let one = _mm256_set1_ps(1.0);
    let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
    _mm256_div_ps(one, _mm256_add_ps(one, e))
}

/// `act(g) · u` for eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn glu8(g: __m256, u: __m256, act: Activation) -> __m256 {
    match act {
        Activation::Swiglu => _mm256_mul_ps(_mm256_mul_ps(g, sigmoid8(g)), u),
        Activation::GeluTanh => {
            // 0.5 x (1 + tanh(y)) = x · sigmoid(2y), y = √(2/π)(x + 0.044715 x³)
            let x3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
            let y = _mm256_fmadd_ps(_mm256_set1_ps(0.044_715), x3, g);
            let two_y = _mm256_mul_ps(y, _mm256_set1_ps(2.0 * 0.797_884_6));
            _mm256_mul_ps(_mm256_mul_ps(g, sigmoid8(two_y)), u)
        }
        Activation::ClampedSwiglu { alpha, limit } => {
            let x = _mm256_min_ps(g, _mm256_set1_ps(limit));
            let u = _mm256_max_ps(
                _mm256_min_ps(u, _mm256_set1_ps(limit)),
                _mm256_set1_ps(-limit),
            );
            let s = sigmoid8(_mm256_mul_ps(x, _mm256_set1_ps(alpha)));
            _mm256_mul_ps(_mm256_add_ps(u, _mm256_set1_ps(1.0)), _mm256_mul_ps(x, s))
        }
    }
}

/// `gate[i] = act(gate[i]) · up[i]` over the common length.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn glu(gate: &mut [f32], up: &[f32], act: Activation) {
    let n = gate.len().min(up.len());
    let body = n - n % 8;
    let (g, u) = (gate.as_mut_ptr(), up.as_ptr());
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 ≤ n` elements of both slices.
        unsafe {
            let v = glu8(_mm256_loadu_ps(g.add(i)), _mm256_loadu_ps(u.add(i)), act);
            _mm256_storeu_ps(g.add(i), v);
        }
        i += 8;
    }
    crate::elementwise::glu(&mut gate[body..n], &up[body..n], act);
}

/// RMS norm of every `dim`-wide row of `x`, sums in eight f32 lanes.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn rms_norm(x: &mut [f32], dim: usize, spec: NormSpec, weight: Option<&[f32]>) {
    if dim == 0 || !dim.is_multiple_of(8) {
        crate::elementwise::rms_norm(x, dim, spec, weight);
        return;
    }
    for row in x.chunks_exact_mut(dim) {
        let p = row.as_mut_ptr();
        let mut acc = _mm256_setzero_ps();
        // SAFETY (loads and stores below): `i + 8 ≤ dim` elements of the
        // row, and of the weight when there is one (`dim` long, checked by
        // the backend).
        unsafe {
            for i in (0..dim).step_by(8) {
                let v = _mm256_loadu_ps(p.add(i));
                acc = _mm256_fmadd_ps(v, v, acc);
            }
            let inv = 1.0 / (hsum(acc) / dim as f32 + spec.eps).sqrt();
            let inv = _mm256_set1_ps(inv);
            let one = _mm256_set1_ps(1.0);
            for i in (0..dim).step_by(8) {
                let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), inv);
                let v = match (spec.scale, weight) {
                    (NormScale::Plain, Some(w)) => {
                        _mm256_mul_ps(v, _mm256_loadu_ps(w.as_ptr().add(i)))
                    }
                    (NormScale::Centered, Some(w)) => {
                        _mm256_mul_ps(v, _mm256_add_ps(one, _mm256_loadu_ps(w.as_ptr().add(i))))
                    }
                    _ => v,
                };
                _mm256_storeu_ps(p.add(i), v);
            }
        }
    }
}

/// `Σ a[i] · b[i]` over `n` (a multiple of 8) elements.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot(a: *const f32, b: *const f32, n: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in (0..n).step_by(8) {
        // SAFETY: the caller's pointers hold `n` floats.
        acc = unsafe { _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc) };
    }
    hsum(acc)
}

/// Turns the scaled scores `s` in place into `e^(c(s) − m)`, with `c` the
/// soft-cap when there is one and `m` the largest of them and the sink;
/// returns `1 / (Σ e^(c(s) − m) + e^(sink − m))`, the softmax's scale.
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax(s: &mut [f32], softcap: Option<f32>, sink: Option<f32>) -> f32 {
    let mut max = sink.unwrap_or(f32::NEG_INFINITY);
    for v in s.iter_mut() {
        if let Some(c) = softcap {
            *v = (*v / c).tanh() * c;
        }
        max = max.max(*v);
    }
    let n = s.len();
    let body = n - n % 8;
    let mx = _mm256_set1_ps(max);
    let mut sum = _mm256_setzero_ps();
    let sp = s.as_mut_ptr();
    for x in (0..body).step_by(8) {
        // SAFETY: `x + 8 ≤ n`.
        unsafe {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sp.add(x)), mx));
            sum = _mm256_add_ps(sum, e);
            _mm256_storeu_ps(sp.add(x), e);
        }
    }
    let mut denom = hsum(sum);
    for v in &mut s[body..] {
        *v = (*v - max).exp();
        denom += *v;
    }
    if let Some(sink) = sink {
        denom += (sink - max).exp();
    }
    1.0 / denom
}

/// Query head `h` of token `t` (the math of [`AttentionInputs::attend`]):
/// scores, softmax and the weighted sum of values in eight lanes, the sum of
/// values in blocks of 32 dimensions.
///
/// # Safety
/// The CPU has AVX2 and FMA; the inputs were checked as for `attend`
/// (`scores` long enough, `out` `head_dim` long) and `head_dim` is a
/// multiple of 8.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn attend(
    inp: &AttentionInputs<'_>,
    t: usize,
    h: usize,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let p = inp.params;
    let hd = p.head_dim;
    let row = p.n_kv_heads * hd;
    let kv_head = h / (p.n_heads / p.n_kv_heads);
    let pos = p.first_pos + t;
    let lo = p.first_key(pos);
    let q = inp.q[(t * p.n_heads + h) * hd..][..hd].as_ptr();
    let scores = &mut scores[..pos - lo + 1];
    let at = |j: usize| (j % p.capacity) * row + kv_head * hd;
    let sink = inp.sinks.map(|s| s[h]);
    let k_cache = inp.k_cache.as_ptr();
    // Four keys at a time: four independent multiply-add chains.
    let mut j = lo;
    while j + 4 <= pos + 1 {
        let mut acc = [_mm256_setzero_ps(); 4];
        // SAFETY: rows `at(j .. j + 4)` hold `hd` floats of the checked cache.
        unsafe {
            let k: [*const f32; 4] = std::array::from_fn(|i| k_cache.add(at(j + i)));
            for d in (0..hd).step_by(8) {
                let qv = _mm256_loadu_ps(q.add(d));
                for i in 0..4 {
                    acc[i] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[i].add(d)), acc[i]);
                }
            }
        }
        for i in 0..4 {
            scores[j - lo + i] = hsum(acc[i]) * p.scale;
        }
        j += 4;
    }
    for j in j..=pos {
        // SAFETY: row `at(j)` holds `hd` floats of the checked cache.
        scores[j - lo] = unsafe { dot(q, k_cache.add(at(j)), hd) } * p.scale;
    }
    let inv = softmax(scores, p.softcap, sink);
    let o = out.as_mut_ptr();
    let v_cache = inp.v_cache.as_ptr();
    let mut d0 = 0;
    while d0 < hd {
        let width = (hd - d0).min(32);
        let mut acc = [_mm256_setzero_ps(); 4];
        for (&s, j) in scores.iter().zip(lo..=pos) {
            let w = _mm256_set1_ps(s);
            // SAFETY: dims `d0 .. d0 + width` of row `at(j)`.
            let v = unsafe { v_cache.add(at(j) + d0) };
            for (k, acc) in acc.iter_mut().enumerate().take(width / 8) {
                *acc = unsafe { _mm256_fmadd_ps(w, _mm256_loadu_ps(v.add(8 * k)), *acc) };
            }
        }
        let iv = _mm256_set1_ps(inv);
        for (k, acc) in acc.iter().enumerate().take(width / 8) {
            // SAFETY: `d0 + 8k + 8 ≤ hd = out.len()`.
            unsafe { _mm256_storeu_ps(o.add(d0 + 8 * k), _mm256_mul_ps(*acc, iv)) };
        }
        d0 += width;
    }
}

/// Query heads `h0 .. h0 + g` (`g ≤ 4`, sharing one KV head) of token `t`:
/// the math of [`attend`], with each key and value row loaded once for the
/// `g` heads. `scores` holds `g` rows of the query's key count; `out` is
/// the `g · head_dim` outputs of those heads.
///
/// # Safety
/// The CPU has AVX2 and FMA; the inputs were checked as for `attend`,
/// `head_dim` is a multiple of 8, the heads share a KV head, and `scores`
/// holds `g` times the keys the token sees.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn attend_heads(
    inp: &AttentionInputs<'_>,
    t: usize,
    h0: usize,
    g: usize,
    scores: &mut [f32],
    out: &mut [f32],
) {
    // SAFETY (all arms): forwarded; each computes exactly `g` heads.
    unsafe {
        match g {
            1 => heads::<1>(inp, t, h0, g, scores, out),
            2 => heads::<2>(inp, t, h0, g, scores, out),
            3 => heads::<3>(inp, t, h0, g, scores, out),
            _ => heads::<4>(inp, t, h0, g, scores, out),
        }
    }
}

/// The offsets in the caches of the rows of consecutive keys from `lo`,
/// for KV head offset `head_at`: key `j` sits in ring slot `j mod
/// capacity`, stepped rather than divided per key. (A plain struct with
/// an inlined step: a call inside the kernels' loops would make them spill
/// their accumulators around it.)
#[derive(Clone, Copy)]
struct Ring {
    slot: usize,
    cap: usize,
    row: usize,
    head_at: usize,
}

impl Ring {
    #[inline(always)]
    fn new(p: &turbospark_backend::AttentionParams, lo: usize, head_at: usize) -> Ring {
        Ring {
            slot: lo % p.capacity,
            cap: p.capacity,
            row: p.n_kv_heads * p.head_dim,
            head_at,
        }
    }

    /// The offset of the current key's row; moves to the next key.
    #[inline(always)]
    fn next_row(&mut self) -> usize {
        let at = self.slot * self.row + self.head_at;
        self.slot += 1;
        if self.slot == self.cap {
            self.slot = 0;
        }
        at
    }

    /// Moves `k` keys on.
    #[inline(always)]
    fn skip(mut self, k: usize) -> Ring {
        self.slot = (self.slot + k) % self.cap;
        self
    }
}

/// Keys ahead of the one being added whose value rows are fetched.
const VALUES_AHEAD: usize = 6;

/// Asks for the `len` floats at `base + at` to be brought into the cache.
///
/// # Safety
/// Each `base + row` is inside the allocation `base` points into.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn prefetch_row(base: *const f32, at: usize, len: usize) {
    // SAFETY: the address lies inside the allocation (contract); a
    // prefetch does not access memory architecturally.
    let p = unsafe { base.add(at) } as *const i8;
    for line in (0..len * 4).step_by(64) {
        _mm_prefetch(p.wrapping_add(line), _MM_HINT_T0);
    }
}

/// [`attend_heads`] for `G ≥ g` heads at a time.
///
/// Each score and each output lane is a chain of multiply-adds (over the
/// dims, over the keys) whose order fixes its bits; the loops keep eight
/// or nine of those chains going at once (several keys' scores, several
/// blocks of output dims), so the multiply-adds wait on each other's
/// latency as little as the registers allow.
///
/// # Safety
/// As for [`attend_heads`].
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn heads<const G: usize>(
    inp: &AttentionInputs<'_>,
    t: usize,
    h0: usize,
    g: usize,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let p = inp.params;
    let hd = p.head_dim;
    let kv_head = h0 / (p.n_heads / p.n_kv_heads);
    let pos = p.first_pos + t;
    let lo = p.first_key(pos);
    let n = pos - lo + 1;
    // SAFETY (both): forwarded.
    unsafe {
        match G {
            1 => key_scores::<G, 8>(inp, t, h0, g, lo, pos, kv_head, scores),
            2 => key_scores::<G, 4>(inp, t, h0, g, lo, pos, kv_head, scores),
            3 => key_scores::<G, 3>(inp, t, h0, g, lo, pos, kv_head, scores),
            _ => key_scores::<G, 2>(inp, t, h0, g, lo, pos, kv_head, scores),
        }
    }
    let mut inv = [0f32; G];
    for i in 0..g {
        let s = &mut scores[i * n..(i + 1) * n];
        inv[i] = softmax(s, p.softcap, inp.sinks.map(|sk| sk[h0 + i]));
    }
    // The weighted sum of values, dims in blocks of `8 · V` per pass over
    // the keys (`G · V` accumulators).
    let v_max = match G {
        1 => 8,
        2 => 4,
        3 => 3,
        _ => 2,
    };
    let mut d0 = 0;
    while d0 < hd {
        let v = ((hd - d0) / 8).min(v_max);
        let w = (inp, lo, pos, kv_head, d0, g);
        // SAFETY: forwarded; `d0 + 8v ≤ hd`, a multiple of 8.
        unsafe {
            match v {
                8 => values::<G, 8>(w, scores, &inv, out),
                7 => values::<G, 7>(w, scores, &inv, out),
                6 => values::<G, 6>(w, scores, &inv, out),
                5 => values::<G, 5>(w, scores, &inv, out),
                4 => values::<G, 4>(w, scores, &inv, out),
                3 => values::<G, 3>(w, scores, &inv, out),
                2 => values::<G, 2>(w, scores, &inv, out),
                _ => values::<G, 1>(w, scores, &inv, out),
            }
        }
        d0 += 8 * v;
    }
}

/// The scaled scores of heads `h0 .. h0 + g` of token `t` against keys
/// `lo ..= pos` into `scores` (`g` rows of the key count), `K` keys at a
/// time: per score the dims' multiply-adds in order, then [`hsum`].
///
/// # Safety
/// As for [`attend_heads`].
#[inline]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn key_scores<const G: usize, const K: usize>(
    inp: &AttentionInputs<'_>,
    t: usize,
    h0: usize,
    g: usize,
    lo: usize,
    pos: usize,
    kv_head: usize,
    scores: &mut [f32],
) {
    let p = inp.params;
    let hd = p.head_dim;
    let n = pos - lo + 1;
    let q: [*const f32; G] =
        std::array::from_fn(|i| inp.q[(t * p.n_heads + h0 + i.min(g - 1)) * hd..].as_ptr());
    let k_cache = inp.k_cache.as_ptr();
    let mut rows = Ring::new(p, lo, kv_head * hd);
    // The rows of the block after next, fetched while this one computes
    // (each head's slice of a cached row is a few cache lines; the cache of
    // a sequence is rarely still in the cache hierarchy a step later).
    let mut fetch = rows.skip(2 * K);
    let mut idx = 0;
    while idx < n {
        let kb = K.min(n - idx);
        let mut at = [0usize; K];
        for a in at.iter_mut().take(kb) {
            *a = rows.next_row();
        }
        let ahead = n.saturating_sub(idx + 2 * K).min(K);
        let mut acc = [[_mm256_setzero_ps(); G]; K];
        // SAFETY: the rows at `at[..kb]` hold `hd` floats of the checked
        // cache (the prefetched ones too: keys before `pos`); each query
        // head holds `hd` floats.
        unsafe {
            for _ in 0..ahead {
                prefetch_row(k_cache, fetch.next_row(), hd);
            }
            for d in (0..hd).step_by(8) {
                let qv: [__m256; G] = std::array::from_fn(|i| _mm256_loadu_ps(q[i].add(d)));
                for (kk, acc) in acc.iter_mut().enumerate().take(kb) {
                    let kv = _mm256_loadu_ps(k_cache.add(at[kk] + d));
                    for i in 0..G {
                        acc[i] = _mm256_fmadd_ps(qv[i], kv, acc[i]);
                    }
                }
            }
        }
        for (kk, acc) in acc.iter().enumerate().take(kb) {
            for i in 0..g {
                scores[i * n + idx + kk] = hsum(acc[i]) * p.scale;
            }
        }
        idx += kb;
    }
}

/// Dims `d0 .. d0 + 8V` of the outputs of heads `h0 .. h0 + g` (`w` is
/// `(inputs, lo, pos, kv_head, d0, g)`; their softmaxed scores in
/// `scores`, scales in `inv`): `Σ_j s_j · v_j` in key order, times the
/// scale.
///
/// # Safety
/// As for [`attend_heads`]; `d0 + 8V ≤ head_dim`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn values<const G: usize, const V: usize>(
    w: (&AttentionInputs<'_>, usize, usize, usize, usize, usize),
    scores: &[f32],
    inv: &[f32; G],
    out: &mut [f32],
) {
    let (inp, lo, pos, kv_head, d0, g) = w;
    let p = inp.params;
    let hd = p.head_dim;
    let n = pos - lo + 1;
    let v_cache = inp.v_cache.as_ptr();
    let mut acc = [[_mm256_setzero_ps(); V]; G];
    let mut rows = Ring::new(p, lo, kv_head * hd + d0);
    let mut fetch = rows.skip(VALUES_AHEAD);
    for idx in 0..n {
        let at = rows.next_row();
        if idx + VALUES_AHEAD < n {
            // SAFETY: a key before `pos`: its row is in the checked cache.
            unsafe { prefetch_row(v_cache, fetch.next_row(), 8 * V) };
        }
        // SAFETY: dims `d0 .. d0 + 8V` of the row at `at` in the checked
        // cache; `scores` holds `g` rows of `n` (rows past `g` repeat the
        // last, computed and dropped).
        unsafe {
            let v = v_cache.add(at);
            let wv: [__m256; G] = std::array::from_fn(|i| {
                _mm256_set1_ps(*scores.get_unchecked(i.min(g - 1) * n + idx))
            });
            for k in 0..V {
                let vk = _mm256_loadu_ps(v.add(8 * k));
                for i in 0..G {
                    acc[i][k] = _mm256_fmadd_ps(wv[i], vk, acc[i][k]);
                }
            }
        }
    }
    let o = out.as_mut_ptr();
    for i in 0..g {
        let iv = _mm256_set1_ps(inv[i]);
        for k in 0..V {
            // SAFETY: head `i`'s dims `d0 .. d0 + 8V` lie in `out`.
            unsafe { _mm256_storeu_ps(o.add(i * hd + d0 + 8 * k), _mm256_mul_ps(acc[i][k], iv)) };
        }
    }
}

/// `max |x|` over the `8 · R` floats at `x`, NaNs ignored (the scalar
/// `act::amax`: `maxps` returns its second operand when either is NaN, and
/// the running maximum is never NaN).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn amax8<const R: usize>(x: *const f32) -> f32 {
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let mut m = _mm256_setzero_ps();
    for r in 0..R {
        // SAFETY: the caller's `x` holds `8 · R` floats.
        let v = _mm256_and_ps(unsafe { _mm256_loadu_ps(x.add(8 * r)) }, abs);
        m = _mm256_max_ps(v, m);
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// The codes of 32 floats at `x` scaled by `id` (the scalar `act::code`:
/// NaN to 0, clamped to ±127, rounded half to even by `cvtps2dq` in the
/// default rounding mode) stored at `q`; returns the lane sums of codes
/// 0-15 and of codes 16-31.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn codes32(x: *const f32, id: __m256, q: *mut i8) -> (__m256i, __m256i) {
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    let mut c = [_mm256_setzero_si256(); 4];
    for (r, c) in c.iter_mut().enumerate() {
        // SAFETY: the caller's `x` holds 32 floats.
        let v = _mm256_mul_ps(unsafe { _mm256_loadu_ps(x.add(8 * r)) }, id);
        let v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
        *c = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
    }
    // Packing works within 128-bit halves; the permute restores the order.
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(c[0], c[1]),
        _mm256_packs_epi32(c[2], c[3]),
    );
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    // SAFETY: the caller's `q` holds 32 codes.
    unsafe { _mm256_storeu_si256(q as *mut __m256i, p) };
    (_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]))
}

/// The sum of the eight 32-bit lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// [`act::quantize_32`](super::act::quantize_32), the same blocks, eight
/// lanes at a time.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn quantize_32(x: &[f32], out: &mut [super::act::Block32]) {
    for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        // SAFETY: `xb` holds 32 floats and `b.qs` 32 codes.
        let (s0, s1) = unsafe {
            let (d, id) = super::act::scales(amax8::<4>(xb.as_ptr()));
            b.d = d;
            codes32(xb.as_ptr(), _mm256_set1_ps(id), b.qs.as_mut_ptr())
        };
        let sum = hsum_epi32(_mm256_add_epi32(s0, s1));
        b.s = b.d * sum as f32;
        b.sum128 = 128 * sum;
    }
}

/// [`act::quantize_256`](super::act::quantize_256), the same blocks, eight
/// lanes at a time.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn quantize_256(x: &[f32], out: &mut [super::act::Block256]) {
    for (xb, b) in x.chunks_exact(256).zip(out.iter_mut()) {
        // SAFETY: `xb` holds 256 floats and `b.qs` 256 codes.
        unsafe {
            let (d, id) = super::act::scales(amax8::<32>(xb.as_ptr()));
            b.d = d;
            let id = _mm256_set1_ps(id);
            for k in 0..8 {
                let (s0, s1) = codes32(xb.as_ptr().add(32 * k), id, b.qs.as_mut_ptr().add(32 * k));
                // At most 16 · 127 in magnitude: exact in 16 bits.
                b.bsums[2 * k] = hsum_epi32(s0) as i16;
                b.bsums[2 * k + 1] = hsum_epi32(s1) as i16;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turbospark_backend::AttentionParams;

    fn avx2() -> bool {
        super::super::Isa::detect().has_avx2()
    }

    fn values(n: usize, seed: u32, spread: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((s >> 8) as f32 / (1 << 24) as f32 - 0.5) * 2.0 * spread
            })
            .collect()
    }

    #[test]
    fn exp_is_accurate_to_a_few_ulp() {
        if !avx2() {
            eprintln!("skipped: this CPU has no AVX2/FMA");
            return;
        }
        let xs = values(4096, 1, 87.0);
        for c in xs.chunks_exact(8) {
            let mut got = [0f32; 8];
            // SAFETY: AVX2 and FMA checked above; 8 floats in and out.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), exp8(_mm256_loadu_ps(c.as_ptr()))) };
            for (&x, &g) in c.iter().zip(&got) {
                let want = (x as f64).exp();
                assert!(
                    ((g as f64 - want) / want).abs() < 1e-6,
                    "exp({x}) = {g}, want {want}"
                );
            }
        }
    }

    #[test]
    fn element_wise_ops_match_the_exact_kernels() {
        if !avx2() {
            eprintln!("skipped: this CPU has no AVX2/FMA");
            return;
        }
        let acts = [
            Activation::Swiglu,
            Activation::GeluTanh,
            Activation::ClampedSwiglu {
                alpha: 1.702,
                limit: 7.0,
            },
        ];
        for act in acts {
            let (g, u) = (values(203, 2, 9.0), values(203, 3, 9.0));
            let (mut want, mut got) = (g.clone(), g.clone());
            crate::elementwise::glu(&mut want, &u, act);
            // SAFETY: AVX2 and FMA checked above.
            unsafe { glu(&mut got, &u, act) };
            for (w, g) in want.iter().zip(&got) {
                assert!(
                    (w - g).abs() <= 2e-6 * w.abs().max(1.0),
                    "{act:?}: {g} vs {w}"
                );
            }
        }
        let w = values(64, 4, 1.0);
        for spec in [
            NormSpec::plain(1e-6),
            NormSpec::centered(1e-5),
            NormSpec::no_scale(1e-6),
        ] {
            let weight = spec.has_weight().then_some(w.as_slice());
            let x = values(64 * 5, 5, 3.0);
            let (mut want, mut got) = (x.clone(), x);
            crate::elementwise::rms_norm(&mut want, 64, spec, weight);
            // SAFETY: AVX2 and FMA checked above.
            unsafe { rms_norm(&mut got, 64, spec, weight) };
            for (w, g) in want.iter().zip(&got) {
                assert!(
                    (w - g).abs() <= 1e-5 * w.abs().max(1.0),
                    "{spec:?}: {g} vs {w}"
                );
            }
        }
    }

    #[test]
    fn grouped_heads_give_each_heads_bits_alone() {
        if !avx2() {
            eprintln!("skipped: this CPU has no AVX2/FMA");
            return;
        }
        // Every value-block width (head_dim 8 to 72), every group size, a
        // ring that wraps, a window, sinks and a soft-cap.
        for head_dim in [8, 16, 24, 40, 64, 72] {
            for (group, window, sinks, softcap, capacity, first_pos) in [
                (4, None, false, None, 64, 20),
                (3, Some(9), true, None, 16, 37),
                (2, None, true, Some(30.0), 48, 11),
                (1, Some(5), false, Some(20.0), 5, 40),
            ] {
                let (n_kv_heads, n_tokens) = (2, 3);
                let n_heads = group * n_kv_heads;
                let p = AttentionParams {
                    n_tokens,
                    first_pos,
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    capacity,
                    window,
                    scale: 0.15,
                    softcap,
                };
                let q = values(n_tokens * n_heads * head_dim, 6, 2.0);
                let k = values(capacity * n_kv_heads * head_dim, 7, 2.0);
                let v = values(capacity * n_kv_heads * head_dim, 8, 2.0);
                let s = values(n_heads, 9, 1.0);
                let inputs = AttentionInputs {
                    q: &q,
                    k_cache: &k,
                    v_cache: &v,
                    params: &p,
                    sinks: sinks.then_some(s.as_slice()),
                };
                let mut scores = vec![0f32; 4 * (first_pos + n_tokens)];
                for t in 0..n_tokens {
                    let mut want = vec![0f32; n_heads * head_dim];
                    for (h, w) in want.chunks_exact_mut(head_dim).enumerate() {
                        // SAFETY: AVX2 and FMA checked above; head_dim % 8 == 0.
                        unsafe { attend(&inputs, t, h, &mut scores, w) };
                    }
                    for h0 in (0..n_heads).step_by(group) {
                        let mut got = vec![0f32; group * head_dim];
                        // SAFETY: as above; the heads share a KV head.
                        unsafe { attend_heads(&inputs, t, h0, group, &mut scores, &mut got) };
                        let want = &want[h0 * head_dim..(h0 + group) * head_dim];
                        assert!(
                            want.iter()
                                .zip(&got)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "head_dim {head_dim} group {group} t={t} h0={h0}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn attention_matches_the_exact_kernel() {
        if !avx2() {
            eprintln!("skipped: this CPU has no AVX2/FMA");
            return;
        }
        let (n_heads, n_kv_heads, head_dim) = (6, 2, 40);
        // head_dim 40: a 16-wide value pass and an 8-wide tail.
        for (window, sinks, softcap, capacity, first_pos, n_tokens) in [
            (None, false, None, 64, 0, 13),
            (Some(7), true, None, 16, 30, 5),
            (None, true, Some(30.0), 48, 11, 3),
            (Some(5), false, Some(20.0), 5, 40, 1),
        ] {
            let p = AttentionParams {
                n_tokens,
                first_pos,
                n_heads,
                n_kv_heads,
                head_dim,
                capacity,
                window,
                scale: 0.15,
                softcap,
            };
            let q = values(n_tokens * n_heads * head_dim, 6, 2.0);
            let k = values(capacity * n_kv_heads * head_dim, 7, 2.0);
            let v = values(capacity * n_kv_heads * head_dim, 8, 2.0);
            let s = values(n_heads, 9, 1.0);
            let inputs = AttentionInputs {
                q: &q,
                k_cache: &k,
                v_cache: &v,
                params: &p,
                sinks: sinks.then_some(s.as_slice()),
            };
            let mut scores = vec![0f32; 4 * (first_pos + n_tokens)];
            let group = n_heads / n_kv_heads;
            for t in 0..n_tokens {
                let mut want = vec![0f32; n_heads * head_dim];
                for h in 0..n_heads {
                    let (mut got, w) =
                        (vec![0f32; head_dim], &mut want[h * head_dim..][..head_dim]);
                    inputs.attend(t, h, &mut scores, w);
                    // SAFETY: AVX2 and FMA checked above; head_dim % 8 == 0.
                    unsafe { attend(&inputs, t, h, &mut scores, &mut got) };
                    for (w, g) in w.iter().zip(&got) {
                        assert!((w - g).abs() <= 1e-5, "t={t} h={h}: {g} vs {w}");
                    }
                }
                // Heads in chunks of at most 4 sharing a KV head (2 + 1).
                for (h0, g) in [(0, 2), (2, 1), (3, 2), (5, 1)] {
                    assert!(h0 / group == (h0 + g - 1) / group);
                    let mut got = vec![0f32; g * head_dim];
                    // SAFETY: as above; the heads share a KV head.
                    unsafe { attend_heads(&inputs, t, h0, g, &mut scores, &mut got) };
                    for (w, g) in want[h0 * head_dim..].iter().zip(&got) {
                        assert!((w - g).abs() <= 1e-5, "t={t} h0={h0}: {g} vs {w}");
                    }
                }
            }
        }
    }
}
