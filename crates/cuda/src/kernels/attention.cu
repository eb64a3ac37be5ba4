// Causal attention of a batch of queries over a KV cache (HF
// `eager_attention_forward`, gpt-oss sinks, Gemma soft-cap), as the CPU
// backend's attention.rs: for query head h of the token at position p,
// over keys j in [lo, p] (lo = p - window + 1 on sliding layers),
//   s_j = scale · q·k_j (then c·tanh(s_j / c)),  m = max(max_j s_j, sink_h),
//   out = Σ_j e^(s_j - m) / (Σ_j e^(s_j - m) + e^(sink_h - m)) · v_j.
// Key j lives in cache row j % capacity.
//
// One block per (query head, token); a warp per key for the scores (lanes
// over the head dimension, so each key row is read coalesced), the scores
// in shared memory, then a thread per output dimension sums over the keys
// in key order.

struct AttnParams {
    int first_pos;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int capacity;
    int window;  // 0: none
    float scale;
    float softcap;  // 0: none
    int has_sinks;
};

template <bool HALF>
__device__ __forceinline__ float kv_at(const void* cache, i64 i) {
    if (HALF) return f16_to_f32(((const u16*)cache)[i]);
    return ((const float*)cache)[i];
}

template <bool HALF>
__device__ void attention_impl(const float* __restrict__ q, const void* __restrict__ kc,
                               const void* __restrict__ vc, AttnParams p,
                               const float* __restrict__ sinks, float* __restrict__ out,
                               const int* __restrict__ step) {
    extern __shared__ float sm[];
    if (step) p.first_pos = step[1];
    __shared__ float red[32];
    int h = blockIdx.x, t = blockIdx.y;
    int hd = p.head_dim;
    int pos = p.first_pos + t;
    int lo = p.window > 0 ? max(0, pos + 1 - p.window) : 0;
    int nk = pos - lo + 1;
    float* qs = sm;
    float* sc = sm + hd;
    const float* qh = q + ((i64)t * p.n_heads + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qh[d];
    __syncthreads();
    i64 row = (i64)p.n_kv_heads * hd;
    int kvh = h / (p.n_heads / p.n_kv_heads);
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int j = wp; j < nk; j += nw) {
        i64 at = (i64)((lo + j) % p.capacity) * row + (i64)kvh * hd;
        float s = 0.0f;
        for (int d = lane; d < hd; d += 32) s = fmaf(qs[d], kv_at<HALF>(kc, at + d), s);
        s = warp_sum(s) * p.scale;
        if (p.softcap > 0.0f) s = tanhf(s / p.softcap) * p.softcap;
        if (lane == 0) sc[j] = s;
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
    float* oh = out + ((i64)t * p.n_heads + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < nk; j++) {
            i64 at = (i64)((lo + j) % p.capacity) * row + (i64)kvh * hd + d;
            acc = fmaf(sc[j] / denom, kv_at<HALF>(vc, at), acc);
        }
        oh[d] = acc;
    }
}

extern "C" __global__ void attention_f32(const float* q, const float* kc, const float* vc,
                                         AttnParams p, const float* sinks, float* out,
                                         const int* step) {
    attention_impl<false>(q, kc, vc, p, sinks, out, step);
}

extern "C" __global__ void attention_f16(const float* q, const u16* kc, const u16* vc,
                                         AttnParams p, const float* sinks, float* out,
                                         const int* step) {
    attention_impl<true>(q, kc, vc, p, sinks, out, step);
}
