// Causal attention of a batch of queries over a KV cache (HF
// `eager_attention_forward`, gpt-oss sinks, Gemma soft-cap), as the CPU
// backend's attention.rs: for query head h of the token at position p,
// over keys j in [lo, p] (lo = p - window + 1 on sliding layers),
//   s_j = scale · q·k_j (then c·tanh(s_j / c)),  m = max(max_j s_j, sink_h),
//   out = Σ_j e^(s_j - m) / (Σ_j e^(s_j - m) + e^(sink_h - m)) · v_j.
// Key j lives in cache row j % capacity.
//
// One block per (query head, token) of ATTN_THREADS threads; a thread per
// key for the scores (kept in shared memory, then turned into weights),
// then threads per output dimension sum the weighted values. Past the
// shared memory of the scores, attention_long_impl forms the same bits a
// chunk of keys at a time.

#define ATTN_THREADS 128
#define ATTN_VALUE_BATCH 16  // values a thread loads at once (attention_impl)

template <bool HALF>
__device__ __forceinline__ float kv_at(const void* cache, i64 i) {
    if (HALF) return f16_to_f32(((const u16*)cache)[i]);
    return ((const float*)cache)[i];
}

// Output element e (of a warp holding 32 consecutive ones, a whole block)
// also quantized to 8 bits as quantize_q8_natural does (q8dot.cu), into
// codes `q` and block scales `qd`, for the fast product that reads it next.
__device__ __forceinline__ void attention_quantize(float v, i64 e, signed char* q, float* qd) {
    float scale;
    q[e] = (signed char)q8_lane_code(v, &scale);
    if ((e & 31) == 0) qd[e >> 5] = scale;
}

// Key j's score for the query in shared memory `qs` (of a block's head):
// scale · q·k_j, soft-capped where asked; k_j at cache row at (elements).
// One definition for every pass that forms it, so each forms the same bits.
template <bool HALF>
__device__ __forceinline__ float attention_score(const float* qs, const void* __restrict__ kc,
                                                 i64 at, int hd, const AttnParams& p) {
    float s = 0.0f;
    if (HALF && (hd & 7) == 0) {
        const uint4* kp = (const uint4*)((const u16*)kc + at);
        for (int d = 0; d < hd; d += 8) {
            uint4 v = kp[d >> 3];
            u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s = fmaf(qs[d + 2 * e], f16_to_f32((u16)(w[e] & 0xFFFF)), s);
                s = fmaf(qs[d + 2 * e + 1], f16_to_f32((u16)(w[e] >> 16)), s);
            }
        }
    } else if (!HALF && (hd & 3) == 0) {
        const float4* kp = (const float4*)((const float*)kc + at);
        for (int d = 0; d < hd; d += 4) {
            float4 v = kp[d >> 2];
            s = fmaf(qs[d], v.x, s);
            s = fmaf(qs[d + 1], v.y, s);
            s = fmaf(qs[d + 2], v.z, s);
            s = fmaf(qs[d + 3], v.w, s);
        }
    } else {
        for (int d = 0; d < hd; d++) s = fmaf(qs[d], kv_at<HALF>(kc, at + d), s);
    }
    // (__fmul_rn: never contracted into an FMA with what the caller does
    // next, so a score kept in shared memory and one used at once agree)
    s = __fmul_rn(s, p.scale);
    if (p.softcap > 0.0f) s = __fmul_rn(tanhf(s / p.softcap), p.softcap);
    return s;
}

// A thread's weighted sum of one value dimension (element `base` of a
// cache row `row` elements long) over keys j = j0, j0 + groups, … < end,
// from acc: one acc = fmaf(w[j], v_j, acc) after another in ascending j
// (the order that fixes the bits, however the loop is blocked); the
// values of ATTN_VALUE_BATCH keys are loaded before their multiply-adds,
// so at long context a thread waits for memory once a batch, not once
// every few keys. r: key j0's cache row, stepped instead of taken modulo
// the capacity key by key.
template <bool HALF>
__device__ __forceinline__ float attention_value_sum(const float* w, int j0, int end, int groups,
                                                     int r, int capacity,
                                                     const void* __restrict__ vc, i64 row,
                                                     i64 base, float acc) {
    int j = j0;
    for (; j + (ATTN_VALUE_BATCH - 1) * groups < end; j += ATTN_VALUE_BATCH * groups) {
        float v[ATTN_VALUE_BATCH];
#pragma unroll
        for (int b = 0; b < ATTN_VALUE_BATCH; b++) {
            v[b] = kv_at<HALF>(vc, (i64)r * row + base);
            r += groups;
            while (r >= capacity) r -= capacity;
        }
#pragma unroll
        for (int b = 0; b < ATTN_VALUE_BATCH; b++) acc = fmaf(w[j + b * groups], v[b], acc);
    }
    for (; j < end; j += groups) {
        acc = fmaf(w[j], kv_at<HALF>(vc, (i64)r * row + base), acc);
        r += groups;
        while (r >= capacity) r -= capacity;
    }
    return acc;
}

// A block's (query head, token) of the scalar kernels: its head h and
// token t, its keys lo .. lo + nk - 1, its KV head and the cache row's
// length; the query is staged in shared memory at qs (every thread calls
// it; it ends with a barrier).
struct AttnBlock {
    int h, t, lo, nk, kvh;
    i64 row;
};
__device__ __forceinline__ AttnBlock attention_block(const float* __restrict__ q,
                                                     const AttnParams& p, float* qs) {
    AttnBlock b;
    b.h = blockIdx.x;
    b.t = blockIdx.y;
    int hd = p.head_dim, pos = p.first_pos + b.t;
    b.lo = p.window > 0 ? max(0, pos + 1 - p.window) : 0;
    b.nk = pos - b.lo + 1;
    const float* qh = q + ((i64)b.t * p.n_heads + b.h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qh[d];
    __syncthreads();
    b.row = (i64)p.n_kv_heads * hd;
    b.kvh = b.h / (p.n_heads / p.n_kv_heads);
    return b;
}

// Output dimension d (of a head's row oh, element o_at of the output) from
// this thread's sum over its set g of the keys: with `groups` > 1 sets the
// sums meet in set order through `part` (ATTN_THREADS floats of shared
// memory), then set 0 stores; else the thread stores its own. Also
// quantized where asked (oq). Every thread of the block calls it.
__device__ __forceinline__ void attention_store(float acc, int d, int g, int groups, int hd,
                                               float* part, float* oh, i64 o_at, signed char* oq,
                                               float* oqd) {
    if (groups > 1) {
        part[threadIdx.x] = acc;
        __syncthreads();
        if (g == 0) {
            float o = part[d];
            for (int k = 1; k < groups; k++) o += part[k * hd + d];
            oh[d] = o;
            // g == 0 is threads 0 .. hd - 1: whole warps.
            if (oq) attention_quantize(o, o_at + d, oq, oqd);
        }
        __syncthreads();
    } else if (d < hd) {
        oh[d] = acc;
        if (oq) attention_quantize(acc, o_at + d, oq, oqd);
    }
}

// q (null: none): the output also quantized (attention_quantize); only for
// head_dim a multiple of 32, so that each warp writes whole blocks.
template <bool HALF>
__device__ void attention_impl(const float* __restrict__ q, const void* __restrict__ kc,
                               const void* __restrict__ vc, AttnParams p,
                               const float* __restrict__ sinks, float* __restrict__ out,
                               const int* __restrict__ step, signed char* __restrict__ oq,
                               float* __restrict__ oqd) {
    DYNAMIC_SHARED(float, sm);
    if (step) p.first_pos = step[1];
    __shared__ float red[32];
    AttnBlock ab = attention_block(q, p, sm);
    int h = ab.h, t = ab.t, hd = p.head_dim, lo = ab.lo, nk = ab.nk, kvh = ab.kvh;
    i64 row = ab.row;
    float *qs = sm, *sc = sm + hd;
    // Scores: a thread per key, reading its key row with 16-byte loads
    // (independent of each other) against the query in shared memory.
    for (int j = threadIdx.x; j < nk; j += blockDim.x) {
        i64 at = (i64)((lo + j) % p.capacity) * row + (i64)kvh * hd;
        float s = attention_score<HALF>(qs, kc, at, hd, p);
        sc[j] = s;
    }
    __syncthreads();
    float sink = p.has_sinks ? sinks[h] : -INFINITY;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) m = fmaxf(m, sc[j]);
    m = fmaxf(block_max(m, red), sink);
    float local = 0.0f;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) {
        float e = expf(sc[j] - m);
        sc[j] = e;
        local += e;
    }
    float denom = block_sum(local, red);
    if (p.has_sinks) denom += expf(sink - m);
    __syncthreads();
    for (int j = threadIdx.x; j < nk; j += blockDim.x) sc[j] = sc[j] / denom;
    __syncthreads();
    // Values: `groups` sets of threads, set g summing keys g, g + groups, ...
    // for one output dimension each; the sets' sums then meet in set order.
    __shared__ float part[ATTN_THREADS];
    float* oh = out + ((i64)t * p.n_heads + h) * hd;
    int groups = hd <= (int)blockDim.x ? (int)blockDim.x / hd : 1;
    int g = threadIdx.x / hd;
    for (int d0 = 0; d0 < hd; d0 += blockDim.x) {
        int d = d0 + (groups > 1 ? threadIdx.x % hd : threadIdx.x);
        float acc = 0.0f;
        if (g < groups && d < hd) {
            i64 base = (i64)kvh * hd + d;
            // Keys j = g, g + groups, … in ascending order.
            acc = attention_value_sum<HALF>(sc, g, nk, groups, (lo + g) % p.capacity, p.capacity,
                                            vc, row, base, acc);
        }
        attention_store(acc, d, g, groups, hd, part, oh, ((i64)t * p.n_heads + h) * hd, oq, oqd);
    }
}

// The same attention for more keys than the scores of attention_impl fit
// in shared memory, with the same bits: its passes over the keys are taken
// `chunk` keys at a time, each score formed again where a pass needs it
// (attention_score, the same bits):
//   1. the maximum: each thread's keys j = tid, tid + blockDim, … (max
//      does not depend on the order), then block_max and the sink;
//   2. the denominator: each thread adds e^(s_j - m) over the same keys in
//      the same order, then block_sum and the sink's term;
//   3. the weights e^(s_j - m) / denom of a chunk into shared memory, then
//      each output thread's multiply-adds over that chunk's keys of its
//      set, ascending — across the chunks the order of attention_impl —
//      its sums held in registers from chunk to chunk.
// The keys are read three times. Dynamic shared memory: (head_dim +
// chunk) floats. Heads up to ATTN_LONG_MAX_DIM wide.
#define ATTN_LONG_MAX_DIM 512
template <bool HALF>
__device__ void attention_long_impl(const float* __restrict__ q, const void* __restrict__ kc,
                                    const void* __restrict__ vc, AttnParams p, int chunk,
                                    const float* __restrict__ sinks, float* __restrict__ out,
                                    const int* __restrict__ step, signed char* __restrict__ oq,
                                    float* __restrict__ oqd) {
    DYNAMIC_SHARED(float, sm);
    if (step) p.first_pos = step[1];
    __shared__ float red[32];
    __shared__ float part[ATTN_THREADS];
    constexpr int D_SETS = ATTN_LONG_MAX_DIM / ATTN_THREADS;  // output dims a thread, at most
    AttnBlock ab = attention_block(q, p, sm);
    int h = ab.h, t = ab.t, hd = p.head_dim, lo = ab.lo, nk = ab.nk, kvh = ab.kvh;
    i64 row = ab.row;
    float *qs = sm, *sc = sm + hd;
    auto key_at = [&](int j) { return (i64)((lo + j) % p.capacity) * row + (i64)kvh * hd; };
    float sink = p.has_sinks ? sinks[h] : -INFINITY;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < nk; j += blockDim.x)
        m = fmaxf(m, attention_score<HALF>(qs, kc, key_at(j), hd, p));
    m = fmaxf(block_max(m, red), sink);
    float local = 0.0f;
    for (int j = threadIdx.x; j < nk; j += blockDim.x)
        local += expf(attention_score<HALF>(qs, kc, key_at(j), hd, p) - m);
    float denom = block_sum(local, red);
    if (p.has_sinks) denom += expf(sink - m);
    int groups = hd <= (int)blockDim.x ? (int)blockDim.x / hd : 1;
    int g = threadIdx.x / hd;
    float acc[D_SETS];
#pragma unroll
    for (int i = 0; i < D_SETS; i++) acc[i] = 0.0f;
    for (int c0 = 0; c0 < nk; c0 += chunk) {
        int cn = min(chunk, nk - c0);
        __syncthreads();  // the last chunk's weights are read
        for (int j = threadIdx.x; j < cn; j += blockDim.x)
            sc[j] = expf(attention_score<HALF>(qs, kc, key_at(c0 + j), hd, p) - m) / denom;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < D_SETS; i++) {
            int d = i * (int)blockDim.x + (groups > 1 ? threadIdx.x % hd : threadIdx.x);
            if (i * (int)blockDim.x >= hd || g >= groups || d >= hd) continue;
            i64 base = (i64)kvh * hd + d;
            // The chunk's keys of set g: c0 + j for j ≡ g - c0 (mod groups).
            int j = ((g - c0) % groups + groups) % groups;
            acc[i] = attention_value_sum<HALF>(sc, j, cn, groups, (lo + c0 + j) % p.capacity,
                                               p.capacity, vc, row, base, acc[i]);
        }
    }
    float* oh = out + ((i64)t * p.n_heads + h) * hd;
#pragma unroll
    for (int i = 0; i < D_SETS; i++) {
        if (i * (int)blockDim.x >= hd) break;  // uniform over the block
        int d = i * (int)blockDim.x + (groups > 1 ? threadIdx.x % hd : threadIdx.x);
        attention_store(acc[i], d, g, groups, hd, part, oh, ((i64)t * p.n_heads + h) * hd, oq,
                        oqd);
    }
}

KERNEL void attention_f32(const float* q, const float* kc, const float* vc,
                                         AttnParams p, const float* sinks, float* out,
                                         const int* step, signed char* oq, float* oqd) {
    KERNEL_ENTRY();
    attention_impl<false>(q, kc, vc, p, sinks, out, step, oq, oqd);
}

KERNEL void attention_f16(const float* q, const u16* kc, const u16* vc,
                                         AttnParams p, const float* sinks, float* out,
                                         const int* step, signed char* oq, float* oqd) {
    KERNEL_ENTRY();
    attention_impl<true>(q, kc, vc, p, sinks, out, step, oq, oqd);
}

KERNEL void attention_long_f32(const float* q, const float* kc, const float* vc, AttnParams p,
                               int chunk, const float* sinks, float* out, const int* step,
                               signed char* oq, float* oqd) {
    KERNEL_ENTRY();
    attention_long_impl<false>(q, kc, vc, p, chunk, sinks, out, step, oq, oqd);
}

KERNEL void attention_long_f16(const float* q, const u16* kc, const u16* vc, AttnParams p,
                               int chunk, const float* sinks, float* out, const int* step,
                               signed char* oq, float* oqd) {
    KERNEL_ENTRY();
    attention_long_impl<true>(q, kc, vc, p, chunk, sinks, out, step, oq, oqd);
}

// Grouped-query attention of a batch (prefill): one block per (KV head,
// token) computes all G = n_heads / n_kv_heads query heads that share the
// KV head, so each key and value row is read once for the group instead
// of once per head. Same math as attention_impl: a thread per key forms
// the G scores, a warp per head turns its scores into weights, and thread
// (dim d, heads i·hpt .. + hpt) sums the weighted values key by key.
// Shared memory: the G queries, then G rows of nk scores. The host
// launches it only where G ≤ ATTN_MAX_GROUP, head_dim divides ATTN_THREADS
// and the heads split evenly over min(G, ATTN_THREADS / head_dim) thread
// sets.
#define ATTN_MAX_GROUP 8

template <bool HALF>
__device__ void attention_group_impl(const float* __restrict__ q, const void* __restrict__ kc,
                                     const void* __restrict__ vc, AttnParams p,
                                     const float* __restrict__ sinks, float* __restrict__ out) {
    DYNAMIC_SHARED(float, sm);
    int kvh = blockIdx.x, t = blockIdx.y;
    int G = p.n_heads / p.n_kv_heads, hd = p.head_dim, h0 = kvh * G;
    int pos = p.first_pos + t;
    int lo = p.window > 0 ? max(0, pos + 1 - p.window) : 0;
    int nk = pos - lo + 1;
    float* qs = sm;
    float* sc = sm + G * hd;
    const float* qh = q + ((i64)t * p.n_heads + h0) * hd;
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) qs[i] = qh[i];
    __syncthreads();
    i64 row = (i64)p.n_kv_heads * hd;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) {
        i64 at = (i64)((lo + j) % p.capacity) * row + (i64)kvh * hd;
        float s[ATTN_MAX_GROUP];
#pragma unroll
        for (int g = 0; g < ATTN_MAX_GROUP; g++) s[g] = 0.0f;
        for (int d = 0; d < hd; d += 4) {
            float k4[4];
            if (HALF) {
                uint2 v = *(const uint2*)((const u16*)kc + at + d);
                k4[0] = f16_to_f32((u16)(v.x & 0xFFFF)), k4[1] = f16_to_f32((u16)(v.x >> 16));
                k4[2] = f16_to_f32((u16)(v.y & 0xFFFF)), k4[3] = f16_to_f32((u16)(v.y >> 16));
            } else {
                float4 v = *(const float4*)((const float*)kc + at + d);
                k4[0] = v.x, k4[1] = v.y, k4[2] = v.z, k4[3] = v.w;
            }
#pragma unroll
            for (int g = 0; g < ATTN_MAX_GROUP; g++) {
                if (g >= G) break;
#pragma unroll
                for (int e = 0; e < 4; e++) s[g] = fmaf(qs[g * hd + d + e], k4[e], s[g]);
            }
        }
#pragma unroll
        for (int g = 0; g < ATTN_MAX_GROUP; g++) {
            if (g >= G) break;
            float v = s[g] * p.scale;
            if (p.softcap > 0.0f) v = tanhf(v / p.softcap) * p.softcap;
            sc[g * nk + j] = v;
        }
    }
    __syncthreads();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int g = warp; g < G; g += warps) {
        float* sg = sc + g * nk;
        float sink = p.has_sinks ? sinks[h0 + g] : -INFINITY;
        float m = -INFINITY;
        for (int j = lane; j < nk; j += 32) m = fmaxf(m, sg[j]);
        m = fmaxf(warp_max(m), sink);
        float local = 0.0f;
        for (int j = lane; j < nk; j += 32) {
            float e = expf(sg[j] - m);
            sg[j] = e;
            local += e;
        }
        float denom = warp_sum(local);
        if (p.has_sinks) denom += expf(sink - m);
        for (int j = lane; j < nk; j += 32) sg[j] = sg[j] / denom;
    }
    __syncthreads();
    int sets = min((int)blockDim.x / hd, G), hpt = G / sets;
    int d = threadIdx.x % hd, set = threadIdx.x / hd;
    if (set >= sets) return;
    float acc[ATTN_MAX_GROUP];
#pragma unroll
    for (int i = 0; i < ATTN_MAX_GROUP; i++) acc[i] = 0.0f;
    i64 base = (i64)kvh * hd + d;
    const float* w0 = sc + (i64)set * hpt * nk;
    // Keys in ascending order, each head's acc[i] = fmaf(w, v_j, acc[i])
    // one key after another (the order that fixes the bits); the values of
    // ATTN_VALUE_BATCH keys are loaded before their multiply-adds, and the
    // cache row r is stepped instead of taken modulo the capacity key by key.
    int r = lo % p.capacity, j = 0;
    for (; j + ATTN_VALUE_BATCH <= nk; j += ATTN_VALUE_BATCH) {
        float v[ATTN_VALUE_BATCH];
#pragma unroll
        for (int b = 0; b < ATTN_VALUE_BATCH; b++) {
            v[b] = kv_at<HALF>(vc, (i64)r * row + base);
            if (++r == p.capacity) r = 0;
        }
#pragma unroll
        for (int b = 0; b < ATTN_VALUE_BATCH; b++) {
#pragma unroll
            for (int i = 0; i < ATTN_MAX_GROUP; i++) {
                if (i >= hpt) break;
                acc[i] = fmaf(w0[i * nk + j + b], v[b], acc[i]);
            }
        }
    }
    for (; j < nk; j++) {
        float v = kv_at<HALF>(vc, (i64)r * row + base);
        if (++r == p.capacity) r = 0;
#pragma unroll
        for (int i = 0; i < ATTN_MAX_GROUP; i++) {
            if (i >= hpt) break;
            acc[i] = fmaf(w0[i * nk + j], v, acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < ATTN_MAX_GROUP; i++) {
        if (i >= hpt) break;
        out[((i64)t * p.n_heads + h0 + set * hpt + i) * hd + d] = acc[i];
    }
}

KERNEL void attention_group_f32(const float* q, const float* kc, const float* vc,
                                               AttnParams p, const float* sinks, float* out) {
    KERNEL_ENTRY();
    attention_group_impl<false>(q, kc, vc, p, sinks, out);
}

KERNEL void attention_group_f16(const float* q, const u16* kc, const u16* vc,
                                               AttnParams p, const float* sinks, float* out) {
    KERNEL_ENTRY();
    attention_group_impl<true>(q, kc, vc, p, sinks, out);
}

// One token's attention over an f16 cache, split over the keys
// (flash-decoding): grid (KV heads, splits), DEC_WARPS warps a block. A
// block serves the G = n_heads / n_kv_heads query heads of its KV head
// (G ≤ ATTN_MAX_GROUP); its warps split as KG = DEC_WARPS / G key groups of
// G warps, warp w taking head g = w % G of key group kg = w / G (warps from
// G · KG on idle), so that each head's serial work — its scores, softmax
// reductions and value sums — runs in warps of its own, at least two (a
// sliding window of 128 keys, one split: two tiles a warp). Warp (g, kg)
// takes tiles of DEC_TILE keys, tile i = split · KG + kg, then i + splits ·
// KG, …, lane l the tile's key l; its score is the head's query dot the
// key row (four interleaved partial sums over d, then scale and soft-cap),
// and the warp updates its running max m, denominator l and value sums o
// (lane l holds dimensions l·HD/32 … of the head) as the online softmax
// does:
//   m' = max(m, max_tile s),  c = e^(m - m'),  l' = c·l + Σ_tile e^(s - m'),
//   o' = c·o + Σ_tile e^(s - m') v          (keys in order)
// A head's key groups then meet in group order into one partial (m, l, o)
// per head; the last block of a KV head to finish (a ticket, as router1's;
// with one split, that block at once, its partial kept in shared memory)
// adds the splits' partials in split order with the sink:
//   M = max(max_s m_s, sink),  out = Σ_s e^(m_s - M) o_s / (Σ_s e^(m_s - M) l_s + e^(sink - M))
// The splits' number depends only on the cache (host: stream/attention.rs), so a
// position's bits are the same whether a step is recorded or not.
#define DEC_WARPS 16
#define DEC_TILE 32
#define DEC_BATCH 16  // values a lane loads before their multiply-adds
// STAGE (attention_decode_staged_*: by default for heads 64 wide,
// kernels.rs DecodeAttention::split_form_for): a warp first copies its
// tile's key rows, 64 dimensions at a time, into rows of its own in
// dynamic shared memory, 8 lanes a row and 4 rows a load, then each lane
// reads its key's row from there: the same values into the same
// registers, so the same bits. Each lane loading its own key's row from
// the cache (the plain form) takes 32 lines a load, 256 L1 wavefronts a
// warp for a tile's 64 dimensions; staged, 32. A staged row is
// DEC_STAGE_ROW 16-byte words, 8 and one of padding, so that neither the
// copies' stores nor the lanes' reads meet in a bank. (The
// fifty-fourth session's timeline put a tile at 2.4–3.3 µs of an H100
// decode step; staged, a layer's launch took ~0.17 µs less: the loads'
// wavefronts were not the tile's cost. BENCHMARKS.md, fifty-fifth
// session. Loading the first tile's older rows into registers before the
// wait, the newest after, and a later tile's values with its keys (the
// same bits) took ~1.5 µs a layer more: withdrawn, fifty-sixth session.)
#define DEC_STAGE_ROW 9
#define DEC_STAGE_BYTES (DEC_WARPS * DEC_TILE * DEC_STAGE_ROW * 16)  // kernels.rs DECODE_STAGE_BYTES

#ifndef TURBOSPARK_HOST_EMULATION  // tests/emulation defines it on the host
__device__ __forceinline__ float ld_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
#endif

// Loads of a partial: from the L2 (other blocks wrote it) or, when the
// block holds the only split, from its own shared memory.
template <bool CG>
__device__ __forceinline__ float part_ld(const float* p) {
    return CG ? ld_cg(p) : *p;
}

// The splits' partials of KV head group h0 (kp0: S partials of `stride`
// floats) added in split order with the sink, into out (and oq, oqd). A
// thread loads every split's m, l and o of its output first (all in flight
// together), then adds them. MANY (S past DEC_MAX_SPLITS, attention_dec.cu):
// DEC_MAX_SPLITS splits at a time, the sums so far rescaled by e^(M - M')
// when a later group raises the maximum; without it (attention_decode_impl,
// S ≤ DEC_MAX_SPLITS) one group.
#define DEC_MAX_SPLITS 16  // kernels.rs DECODE_MAX_SPLITS
template <int HD, bool CG, bool MANY = false>
__device__ __forceinline__ void attention_decode_finish(const float* kp0, int S, int stride, int G,
                                                        int h0, const AttnParams& p,
                                                        const float* __restrict__ sinks,
                                                        float* __restrict__ out,
                                                        signed char* __restrict__ oq,
                                                        float* __restrict__ oqd) {
    // Loops uniform over each warp, which holds 32 consecutive outputs:
    // whole blocks for attention_quantize.
    for (int i0 = 0; i0 < G * HD; i0 += blockDim.x) {
        int i = i0 + threadIdx.x;
        if (i >= G * HD) break;
        int g = i / HD;
        float M = p.has_sinks ? sinks[h0 + g] : -INFINITY;
        float den = 0.0f, acc = 0.0f;
        for (int s0 = 0; s0 < (MANY ? S : 1); s0 += DEC_MAX_SPLITS) {
            int n = MANY ? min(DEC_MAX_SPLITS, S - s0) : S;
            float ms[DEC_MAX_SPLITS], ls[DEC_MAX_SPLITS], os[DEC_MAX_SPLITS];
#pragma unroll
            for (int sp = 0; sp < DEC_MAX_SPLITS; sp++) {
                if (sp >= n) break;
                const float* pp = kp0 + (s0 + sp) * stride;
                ms[sp] = part_ld<CG>(pp + G * HD + g);
                ls[sp] = part_ld<CG>(pp + G * HD + G + g);
                os[sp] = part_ld<CG>(pp + i);
            }
            float Mg = M;
#pragma unroll
            for (int sp = 0; sp < DEC_MAX_SPLITS; sp++) {
                if (sp >= n) break;
                Mg = fmaxf(Mg, ms[sp]);
            }
            if (MANY && Mg != M) {  // (the first group's den and acc are 0: no change)
                float r = expf(M - Mg);
                den *= r;
                acc *= r;
            }
            M = Mg;
#pragma unroll
            for (int sp = 0; sp < DEC_MAX_SPLITS; sp++) {
                if (sp >= n) break;
                float c = ms[sp] == -INFINITY ? 0.0f : expf(ms[sp] - M);
                den = fmaf(c, ls[sp], den);
                acc = fmaf(c, os[sp], acc);
            }
        }
        if (p.has_sinks) den += expf(sinks[h0 + g] - M);
        float r = acc / den;
        out[(i64)h0 * HD + i] = r;
        if (oq) attention_quantize(r, (i64)h0 * HD + i, oq, oqd);
    }
}

// A split's block, its warps' partials in shared memory: key group k of
// head hg has its maximum and denominator at wm[k·mk + hg], wl[k·mk + hg]
// and output i (of the group's G·HD) at wo[k·ok + i], for k < groups.
// Adds them in key-group order into the block's partial (o [G][HD], m [G],
// l [G], l without the sink): with one split (S = 1) in `fin` (shared
// memory, G·(HD + 2) floats), where the block finishes at once; else in
// `part`, where the last of the KV head's S blocks to finish (a ticket
// counted in tickets[kvh], put back to 0) adds them (MANY: more than
// DEC_MAX_SPLITS of them, attention_decode_finish). `last`: a shared flag.
template <int HD, bool MANY>
__device__ __forceinline__ void attention_decode_close(
    const float* wm, const float* wl, const float* wo, int groups, int mk, int ok, int G,
    int kvh, int split, int S, const AttnParams& p, const float* __restrict__ sinks,
    float* __restrict__ out, signed char* __restrict__ oq, float* __restrict__ oqd,
    float* __restrict__ part, u32* __restrict__ tickets, float* fin, bool& last) {
    int h0 = kvh * G;
    int stride = G * (HD + 2);  // a partial: o [G][HD], m [G], l [G]
    float* bp = S == 1 ? fin : part + ((i64)kvh * S + split) * stride;
    for (int i = threadIdx.x; i < G * (HD + 1); i += blockDim.x) {
        int hg = i < G * HD ? i / HD : i - G * HD;
        float M = -INFINITY;
        for (int k = 0; k < groups; k++) M = fmaxf(M, wm[k * mk + hg]);
        float acc = 0.0f;
        for (int k = 0; k < groups; k++) {
            float mw = wm[k * mk + hg];
            float c = mw == -INFINITY ? 0.0f : expf(mw - M);
            acc = fmaf(c, i < G * HD ? wo[k * ok + i] : wl[k * mk + hg], acc);
        }
        if (i < G * HD) bp[i] = acc;
        else {
            bp[G * HD + hg] = M;
            bp[G * HD + G + hg] = acc;
        }
    }
    if (S == 1) {
        __syncthreads();
        attention_decode_finish<HD, false>(fin, 1, stride, G, h0, p, sinks, out, oq, oqd);
        return;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&tickets[kvh], 1u) == (u32)S - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    attention_decode_finish<HD, true, MANY>(part + (i64)kvh * S * stride, S, stride, G, h0, p,
                                            sinks, out, oq, oqd);
    if (threadIdx.x == 0) tickets[kvh] = 0;
}

template <int HD, bool STAGE>
__device__ void attention_decode_impl(const float* __restrict__ q, const u16* __restrict__ kc,
                                      const u16* __restrict__ vc, AttnParams p,
                                      const float* __restrict__ sinks, float* __restrict__ out,
                                      const int* __restrict__ step, signed char* __restrict__ oq,
                                      float* __restrict__ oqd, float* __restrict__ part,
                                      u32* __restrict__ tickets) {
    constexpr int PER = HD / 32;  // value dimensions a lane owns
    constexpr int MG = ATTN_MAX_GROUP;
    // qs also holds the partial when S == 1 (the queries are read no
    // more by then).
    __shared__ __align__(16) float qs[MG * (HD + 2)];
    __shared__ __align__(16) float ps[DEC_WARPS][DEC_TILE];
    __shared__ float wm[DEC_WARPS], wl[DEC_WARPS];
    __shared__ float wo[DEC_WARPS][HD];
    __shared__ bool last;
    DYNAMIC_SHARED(uint4, stage);  // STAGE: DEC_STAGE_BYTES
    float* fin = qs;
    if (step) p.first_pos = step[1];
    int kvh = blockIdx.x, split = blockIdx.y, S = gridDim.y;
    int G = p.n_heads / p.n_kv_heads, h0 = kvh * G, KG = DEC_WARPS / G;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int g = warp % G, kg = warp / G;
    bool active = kg < KG;
    int pos = p.first_pos;
    int lo = p.window > 0 ? max(0, pos + 1 - p.window) : 0;
    int nk = pos - lo + 1;
    i64 row = (i64)p.n_kv_heads * HD;
    int first = (split * KG + kg) * DEC_TILE, round = S * KG * DEC_TILE;
    // Before waiting for the kernel before (common.cuh KERNEL_ENTRY), only
    // what this step's kernels do not write: the position (set before the
    // step's first kernel) and the cache rows of the keys before pos
    // (written by earlier steps), fetched into the L2 — each key group's
    // tiles (by its head-0 warp), as the loop below takes them.
    if (active && g == 0) {
        for (int t0 = first; t0 < nk; t0 += round) {
            int j = t0 + lane;
            if (j >= nk - 1) break;
            i64 at = (i64)((lo + j) % p.capacity) * row + (i64)kvh * HD;
#pragma unroll
            for (int b = 0; b < HD * 2; b += 128) {
                prefetch_l2((const char*)(kc + at) + b);
                prefetch_l2((const char*)(vc + at) + b);
            }
        }
    }
    kernel_entry();
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) qs[i] = q[(i64)h0 * HD + i];
    __syncthreads();
    const u16* kb = kc + (i64)kvh * HD;
    const u16* vb = vc + (i64)kvh * HD + lane * PER;
    const float4* qg = (const float4*)(qs + g * HD);
    float m = -INFINITY, l = 0.0f, o[PER];
#pragma unroll
    for (int e = 0; e < PER; e++) o[e] = 0.0f;
    for (int t0 = active ? first : nk; t0 < nk; t0 += round) {
        int j = t0 + lane;
        bool in = j < nk;
        // Lanes past the last key score the tile's first (a row that
        // exists) and weigh it 0.
        const uint4* kp = (const uint4*)(kb + (i64)((lo + (in ? j : t0)) % p.capacity) * row);
        float s4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int d0 = 0; d0 < HD; d0 += 64) {
            uint4 kr[8];
            if (STAGE) {
                // Row r of the tile by lanes 8·(r % 4) …, word lane % 8 each
                // (rows past the last key: the tile's first, as kp).
                uint4* st = stage + warp * DEC_TILE * DEC_STAGE_ROW;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    int r = 4 * i + (lane >> 3), jr = t0 + r;
                    const uint4* rp =
                        (const uint4*)(kb + (i64)((lo + (jr < nk ? jr : t0)) % p.capacity) * row);
                    st[r * DEC_STAGE_ROW + (lane & 7)] = rp[(d0 >> 3) + (lane & 7)];
                }
                __syncwarp();
#pragma unroll
                for (int i = 0; i < 8; i++) kr[i] = st[lane * DEC_STAGE_ROW + i];
                __syncwarp();  // read before the next chunk's copies
            } else {
#pragma unroll
                for (int i = 0; i < 8; i++) kr[i] = kp[(d0 >> 3) + i];
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 qa = qg[(d0 >> 2) + 2 * i], qb = qg[(d0 >> 2) + 2 * i + 1];
                u32 w4[4] = {kr[i].x, kr[i].y, kr[i].z, kr[i].w};
                float qv[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s4[e] = fmaf(qv[2 * e], f16_to_f32((u16)(w4[e] & 0xFFFF)), s4[e]);
                    s4[e] = fmaf(qv[2 * e + 1], f16_to_f32((u16)(w4[e] >> 16)), s4[e]);
                }
            }
        }
        float v = ((s4[0] + s4[1]) + (s4[2] + s4[3])) * p.scale;
        if (p.softcap > 0.0f) v = tanhf(v / p.softcap) * p.softcap;
        if (!in) v = -INFINITY;
        float mt = fmaxf(m, warp_max(v));  // finite: lane 0 holds a key
        float c = expf(m - mt);            // 0 for the first tile
        float e = in ? expf(v - mt) : 0.0f;
        l = fmaf(l, c, warp_sum(e));
#pragma unroll
        for (int x = 0; x < PER; x++) o[x] *= c;
        m = mt;
        ps[warp][lane] = e;
        __syncwarp();
        int nt = min(DEC_TILE, nk - t0);
        int r = (lo + t0) % p.capacity;
        for (int jb = 0; jb < nt; jb += DEC_BATCH) {
            float vv[DEC_BATCH][PER];
#pragma unroll
            for (int b = 0; b < DEC_BATCH; b++) {
                const u16* vp = vb + (i64)r * row;
                bool here = jb + b < nt;
                if (PER == 2) {
                    u32 w2 = here ? *(const u32*)vp : 0u;
                    vv[b][0] = f16_to_f32((u16)(w2 & 0xFFFF));
                    vv[b][PER - 1] = f16_to_f32((u16)(w2 >> 16));
                } else {
#pragma unroll
                    for (int x = 0; x < PER; x++) vv[b][x] = here ? f16_to_f32(vp[x]) : 0.0f;
                }
                r += 1;
                if (r == p.capacity) r = 0;
            }
#pragma unroll
            for (int b4 = 0; b4 < DEC_BATCH; b4 += 4) {
                float4 w = *(const float4*)&ps[warp][jb + b4];
                float wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                for (int b = 0; b < 4; b++)
#pragma unroll
                    for (int x = 0; x < PER; x++) o[x] = fmaf(wv[b], vv[b4 + b][x], o[x]);
            }
        }
        __syncwarp();
    }
    // The block's partial: each head's key groups in order.
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int x = 0; x < PER; x++) wo[warp][lane * PER + x] = o[x];
    __syncthreads();
    // A single split's partial stays in shared memory and the block
    // finishes at once; else the partials meet in global memory and the
    // last block finishes. (Warp w = k·G + hg: its m at wm[k·G + hg], its
    // output i at wo[w][i - hg·HD] = wo[0][k·G·HD + i].)
    attention_decode_close<HD, false>(wm, wl, &wo[0][0], KG, G, G * HD, G, kvh, split, S, p,
                                      sinks, out, oq, oqd, part, tickets, fin, last);
}

// (attention_decode_impl waits for the kernel before, KERNEL_ENTRY, after
// its early reads.)
#define ATTN_DECODE_KERNEL(suffix, hd, stage)                                                   \
    KERNEL void __launch_bounds__(DEC_WARPS * 32) attention_decode_##suffix(                    \
        const float* q, const u16* kc, const u16* vc, AttnParams p, const float* sinks,         \
        float* out, const int* step, signed char* oq, float* oqd, float* part, u32* tickets) {  \
        attention_decode_impl<hd, stage>(q, kc, vc, p, sinks, out, step, oq, oqd, part, tickets); \
    }
#define ATTN_DECODE(hd)                                        \
    ATTN_DECODE_KERNEL(f16_##hd, hd, false)                    \
    ATTN_DECODE_KERNEL(staged_f16_##hd, hd, true)

ATTN_DECODE(64)
ATTN_DECODE(128)
