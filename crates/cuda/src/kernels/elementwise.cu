// Element-wise ops, RMS norm, rotary embedding and the KV cache write.
// The math and conventions follow the CPU backend's `elementwise.rs` and
// `rope.rs` (HF LlamaRMSNorm / Gemma3RMSNorm, apply_rotary_pos_emb, the
// gated activations of Llama, Gemma and gpt-oss).

#define ACT_SWIGLU 0
#define ACT_GELU_TANH 1
#define ACT_CLAMPED_SWIGLU 2

#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

KERNEL void add_bias(float* x, const float* bias, int n, int d) {
    KERNEL_ENTRY();
    GRID_STRIDE(i, (i64)n * d) x[i] += bias[i % d];
}

KERNEL void add(float* dst, const float* src, i64 len) {
    KERNEL_ENTRY();
    GRID_STRIDE(i, len) dst[i] += src[i];
}

KERNEL void scale(float* x, i64 len, float s) {
    KERNEL_ENTRY();
    GRID_STRIDE(i, len) x[i] *= s;
}

KERNEL void mul_sigmoid(float* x, const float* gate, i64 len) {
    KERNEL_ENTRY();
    GRID_STRIDE(i, len) x[i] *= sigmoidf_(gate[i]);
}

KERNEL void softcap(float* x, i64 len, float cap) {
    KERNEL_ENTRY();
    GRID_STRIDE(i, len) x[i] = tanhf(x[i] / cap) * cap;
}

__device__ __forceinline__ float glu_one(float g, float u, int act, float alpha, float limit) {
    if (act == ACT_SWIGLU) return g * sigmoidf_(g) * u;
    if (act == ACT_GELU_TANH) {
        const float k = 0.7978846f;
        float inner = k * (g + 0.044715f * g * g * g);
        return 0.5f * g * (1.0f + tanhf(inner)) * u;
    }
    // gpt-oss: comparisons rather than fminf/fmaxf so that NaN propagates.
    float x = g > limit ? limit : g;
    float v = u > limit ? limit : (u < -limit ? -limit : u);
    return (v + 1.0f) * (x * sigmoidf_(alpha * x));
}

KERNEL void glu(float* gate, const float* up, i64 len, int act, float alpha,
                               float limit) {
    KERNEL_ENTRY();
    GRID_STRIDE(i, len) gate[i] = glu_one(gate[i], up[i], act, alpha, limit);
}

// Sum of a double over the block (blockDim.x a multiple of 32); every
// thread gets it.
__device__ double block_sum_f64(double s) {
    __shared__ double red[32];
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
    if (lane == 0) red[wp] = s;
    __syncthreads();
    double t = lane < nw ? red[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(FULL_MASK, t, o);
    return t;
}

#define NORM_PLAIN 0
#define NORM_CENTERED 1
#define NORM_NONE 2

// One block per row (NORM_THREADS threads); the mean of squares is
// accumulated in f64. Rows up to NORM_THREADS · NORM_PER wide are read once
// into registers, every load issued before any is used.
#define NORM_THREADS 1024
#define NORM_PER 4

// The order of a quantized row's codes (see q8_pos in q8dot.cu).
#define Q8_ORDER_NATURAL 0
#define Q8_ORDER_MXFP4 1
__device__ __forceinline__ int q8_pos_order(int order, int e) {
    if (order != Q8_ORDER_MXFP4) return e;
    int hi = e >= 16, r = e & 15;
    int i = r >> 2, h = (r >> 1) & 1, m = r & 1;
    return 8 * i + 4 * h + 2 * m + hi;
}

struct RouteOut;                                              // route.cu
__device__ float route_weight(const RouteOut* routes, int j);  // route.cu

// The MoE output that a norm's residual add reads, formed in the norm
// (rms_norm_row's `cy`): moe_combine's value for token t, column c — the
// routes' outputs y weighted in rank order, the same fmaf chain.
struct NormCombine {
    const float* y;
    const RouteOut* routes;
    int k;
};

// The MoE output for N columns of token t's row held by this thread, into
// acc (zeros where `live` is false): acc = fmaf(weight_r, y_r[c], acc) over
// the routes r in rank order, moe_combine's chain (so the same bits). The
// routes are taken NORM_COMBINE_RANKS at a time, each group's weights and
// outputs loaded together before their multiply-adds. `load(j, ok, yv)`
// reads this thread's N values of route output j when `ok` (the layout's
// columns; zeros past the row), zeros otherwise.
#define NORM_COMBINE_RANKS 4
template <int N, class Load>
__device__ __forceinline__ void norm_combine(const NormCombine& m, int t, bool live, float* acc,
                                             Load load) {
#pragma unroll
    for (int k = 0; k < N; k++) acc[k] = 0.0f;
    for (int r0 = 0; r0 < m.k; r0 += NORM_COMBINE_RANKS) {
        float wr[NORM_COMBINE_RANKS], yv[NORM_COMBINE_RANKS][N];
#pragma unroll
        for (int q = 0; q < NORM_COMBINE_RANKS; q++) {
            int j = t * m.k + r0 + q;
            bool rank = r0 + q < m.k;
            wr[q] = rank ? route_weight(m.routes, j) : 0.0f;
            load(j, rank && live, yv[q]);
        }
#pragma unroll
        for (int q = 0; q < NORM_COMBINE_RANKS; q++) {
            if (r0 + q >= m.k) break;
#pragma unroll
            for (int k = 0; k < N; k++) acc[k] = fmaf(wr[q], yv[q][k], acc[k]);
        }
    }
}

// A normed value: v · inv, then times the weight (NORM_PLAIN) or one plus
// it (NORM_CENTERED), each product rounded as the CPU's.
__device__ __forceinline__ float norm_scale(float v, float inv, int mode, float w) {
    float r = __fmul_rn(v, inv);
    if (mode == NORM_PLAIN) r = __fmul_rn(r, w);
    else if (mode == NORM_CENTERED) r = __fmul_rn(r, 1.0f + w);
    return r;
}

// The weights of a row held in registers (rms_norm_row's `held` case),
// this thread's NORM_PER of them; zeros elsewhere.
__device__ __forceinline__ void norm_weights(const float* w, int dim, int mode, float* wv) {
    bool held = dim <= (int)blockDim.x * NORM_PER;
#pragma unroll
    for (int k = 0; k < NORM_PER; k++) {
        int i = threadIdx.x + k * blockDim.x;
        wv[k] = held && i < dim && mode != NORM_NONE ? w[i] : 0.0f;
    }
}

// RMS norm of row blockIdx.x of `h` into `out` (which may be `h`), with
// two fused neighbours (each the same arithmetic as its own kernel, so the
// bits do not change):
// - `add_src` (null: none): first h += add_src, written back to h — the
//   residual add before the next norm; with `cy.y` set, add_src is first
//   formed here as moe_combine would (and written), the MoE output that
//   add reads (rows held in registers only: fusion.rs `absorb_norm`);
// - `q` (null: none): the normed row also quantized to 8 bits per block
//   as quantize_q8_* does (codes in `order`, scales to qd) for the matmul
//   that reads it next. Only for rows held in registers with dim a
//   multiple of 32: a warp then holds whole 32-element blocks. With `q`,
//   `q2` (null: none) takes the same codes again in MXFP4's order, their
//   scales `qd2`: a token's router product reads the natural order, its
//   MXFP4 routed experts the other (stream/products.rs `matmul_q8`).
// wv: this thread's weights, as norm_weights loads them.
__device__ __forceinline__ void rms_norm_row(float* add_src, float* h, float* out, int dim,
                                             float eps, int mode, const float* w,
                                             const float* wv, signed char* q, float* qd,
                                             int order, signed char* q2, float* qd2,
                                             NormCombine cy) {
    i64 at = (i64)blockIdx.x * dim;
    float* row = h + at;
    float* dst = out + at;
    double s = 0.0;
    float v[NORM_PER];
    bool held = dim <= (int)blockDim.x * NORM_PER;
    if (held) {
        // Every load before any store (a store to h or add_src could alias
        // a later load, so the compiler keeps their order): the row, and
        // what is added to it, all in flight together.
        float a[NORM_PER];
#pragma unroll
        for (int k = 0; k < NORM_PER; k++) {
            int i = threadIdx.x + k * blockDim.x;
            v[k] = i < dim ? row[i] : 0.0f;
            a[k] = add_src && !cy.y && i < dim ? add_src[at + i] : 0.0f;
        }
        if (add_src && cy.y)
            norm_combine<NORM_PER>(cy, blockIdx.x, true, a, [&](int j, bool ok, float* yv) {
#pragma unroll
                for (int k = 0; k < NORM_PER; k++) {
                    int c = threadIdx.x + k * blockDim.x;
                    yv[k] = ok && c < dim ? cy.y[(i64)j * dim + c] : 0.0f;
                }
            });
        if (add_src) {
#pragma unroll
            for (int k = 0; k < NORM_PER; k++) {
                int i = threadIdx.x + k * blockDim.x;
                if (i < dim) {
                    if (cy.y) add_src[at + i] = a[k];
                    v[k] += a[k];
                    row[i] = v[k];
                }
            }
        }
#pragma unroll
        for (int k = 0; k < NORM_PER; k++) s += (double)v[k] * (double)v[k];
    } else {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) {
            float x = row[i];
            if (add_src) {
                x += add_src[at + i];
                row[i] = x;
            }
            s += (double)x * (double)x;
        }
    }
    double t = block_sum_f64(s);
    float inv = (float)(1.0 / sqrt(t / (double)dim + (double)eps));
    if (held) {
        // Every column's value and 8-bit code first (the warps' maxima in
        // flight together), then the stores.
        float r[NORM_PER], scale[NORM_PER];
        int c[NORM_PER];
#pragma unroll
        for (int k = 0; k < NORM_PER; k++) {
            int i = threadIdx.x + k * blockDim.x;
            r[k] = norm_scale(v[k], inv, mode, wv[k]);
            // i < dim is uniform over the warp (see above).
            if (q && i < dim) c[k] = q8_lane_code(r[k], &scale[k]);
        }
#pragma unroll
        for (int k = 0; k < NORM_PER; k++) {
            int i = threadIdx.x + k * blockDim.x;
            if (i < dim) {
                dst[i] = r[k];
                if (q) {
                    i64 e = at + i;
                    q[(e & ~(i64)31) + q8_pos_order(order, (int)(e & 31))] = (signed char)c[k];
                    if ((i & 31) == 0) qd[e >> 5] = scale[k];
                    if (q2) {
                        q2[(e & ~(i64)31) + q8_pos_order(Q8_ORDER_MXFP4, (int)(e & 31))] =
                            (signed char)c[k];
                        if ((i & 31) == 0) qd2[e >> 5] = scale[k];
                    }
                }
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        // No weight is read for NORM_NONE (w may be null).
        dst[i] = norm_scale(row[i], inv, mode, mode == NORM_NONE ? 0.0f : w[i]);
    }
}

// rms_norm_row with its fused neighbours; `h` is only written with `add_src`.
// Blocks of up to NORM_THREADS threads (fusion.rs `norm_threads`), so at
// most 64 registers a thread.
// The norm's weights (a backend vector: made only by `upload_vector` and
// never written, so no kernel writes them) are loaded before waiting for
// the kernel before this one (KERNEL_ENTRY, common.cuh), so that their
// loads from memory overlap its tail; the row, which it writes, after.
KERNEL void __launch_bounds__(NORM_THREADS)
    rms_norm(float* add_src, float* h, float* out, int dim, float eps, int mode, const float* w,
             signed char* q, float* qd, int order, signed char* q2, float* qd2, NormCombine cy) {
    float wv[NORM_PER];
    norm_weights(w, dim, mode, wv);
    KERNEL_ENTRY();
    rms_norm_row(add_src, h, out, dim, eps, mode, w, wv, q, qd, order, q2, qd2, cy);
}

// The vector layout of a norm (rms_norm_vec): rows a multiple of 32 wide,
// up to NORM_VEC_THREADS · NORM_VEC, with every buffer 16-byte aligned
// (fusion.rs `norm_vec_fits`). Thread i holds the NORM_VEC consecutive
// columns from NORM_VEC · i, loaded and stored 16 bytes at a time, so four
// lanes hold a 32-column block of 8-bit codes. Against the strided layout
// above (a column of every blockDim.x), a row takes half the warps, each
// with about a third of the instructions: the block's sums, square root
// and divisions are formed once a warp, the 8-bit codes' maximum is taken
// over 8 values in a lane and then 4 lanes (not 32), and the codes go out
// as whole words. The arithmetic of each value is the same (the same
// fmaf chain of the MoE output, the same products, q8_scale / q8_code);
// only the order in which the f64 sum of squares is added differs.
#define NORM_VEC 8
#define NORM_VEC_THREADS 512

__device__ __forceinline__ void norm_load8(const float* p, float* v) {
    float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void norm_store8(float* p, const float* v) {
    *(float4*)p = make_float4(v[0], v[1], v[2], v[3]);
    *(float4*)(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}

// This thread's NORM_VEC weights (zeros past the row or without a weight).
__device__ __forceinline__ void norm_vec_weights(const float* w, int dim, int mode, float* wv) {
    int c0 = NORM_VEC * threadIdx.x;
    if (c0 < dim && mode != NORM_NONE) {
        norm_load8(w + c0, wv);
    } else {
#pragma unroll
        for (int k = 0; k < NORM_VEC; k++) wv[k] = 0.0f;
    }
}

// Four 8-bit codes (each in -127..127) as the bytes of a word, the first
// in the lowest byte.
__device__ __forceinline__ u32 pack_codes4(const int* c) {
    u32 lo = __byte_perm((u32)c[0], (u32)c[1], 0x0040);
    u32 hi = __byte_perm((u32)c[2], (u32)c[3], 0x0040);
    return __byte_perm(lo, hi, 0x5410);
}

// The codes of this thread's NORM_VEC values (words w[0], w[1]) and their
// block's scale, written to codes `q` and scales `qd` for the row's
// columns from e (this thread's first; live: it is in the row) in `order`.
// Every lane calls it. Natural order: the 8 codes are one 8-byte store.
// MXFP4's order (q8_pos_order) puts column 16 + r of a block beside
// column r (r < 16): byte 2r and 2r + 1. So lanes 0 and 1 of a block's
// four take their partner's codes (lanes 2 and 3: columns 16..31) and
// each writes 16 interleaved bytes.
__device__ __forceinline__ void norm_vec_store_codes(signed char* q, float* qd, int order, i64 e,
                                                     bool live, const u32* w, float scale) {
    int a = threadIdx.x & 3;  // this thread's quarter of its block
    if (order == Q8_ORDER_MXFP4) {
        u32 p0 = __shfl_xor_sync(FULL_MASK, w[0], 2), p1 = __shfl_xor_sync(FULL_MASK, w[1], 2);
        if (live && a < 2) {
            uint4 o = make_uint4(__byte_perm(w[0], p0, 0x5140), __byte_perm(w[0], p0, 0x7362),
                                 __byte_perm(w[1], p1, 0x5140), __byte_perm(w[1], p1, 0x7362));
            *(uint4*)(q + (e & ~(i64)31) + 16 * a) = o;
        }
    } else if (live) {
        *(uint2*)(q + e) = make_uint2(w[0], w[1]);
    }
    if (live && a == 0) qd[e >> 5] = scale;
}

// rms_norm_row in the vector layout: the same fused neighbours and
// arguments (see rms_norm_row).
__device__ __forceinline__ void rms_norm_vec_row(float* add_src, float* h, float* out, int dim,
                                                 float eps, int mode, const float* wv,
                                                 signed char* q, float* qd, int order,
                                                 signed char* q2, float* qd2, NormCombine cy) {
    i64 at = (i64)blockIdx.x * dim;
    float* row = h + at;
    int c0 = NORM_VEC * threadIdx.x;
    bool live = c0 < dim;
    float v[NORM_VEC], a[NORM_VEC];
    // Every load before any store (as rms_norm_row).
#pragma unroll
    for (int k = 0; k < NORM_VEC; k++) v[k] = a[k] = 0.0f;
    if (live) {
        norm_load8(row + c0, v);
        if (add_src && !cy.y) norm_load8(add_src + at + c0, a);
    }
    if (add_src && cy.y)
        norm_combine<NORM_VEC>(cy, blockIdx.x, live, a, [&](int j, bool ok, float* yv) {
            if (ok) {
                norm_load8(cy.y + (i64)j * dim + c0, yv);
            } else {
#pragma unroll
                for (int k = 0; k < NORM_VEC; k++) yv[k] = 0.0f;
            }
        });
    if (add_src) {
#pragma unroll
        for (int k = 0; k < NORM_VEC; k++) v[k] += a[k];
        if (live) {
            if (cy.y) norm_store8(add_src + at + c0, a);
            norm_store8(row + c0, v);
        }
    }
    double s = 0.0;
#pragma unroll
    for (int k = 0; k < NORM_VEC; k++) s += (double)v[k] * (double)v[k];
    double t = block_sum_f64(s);
    float inv = (float)(1.0 / sqrt(t / (double)dim + (double)eps));
    float r[NORM_VEC];
#pragma unroll
    for (int k = 0; k < NORM_VEC; k++) {
        r[k] = norm_scale(v[k], inv, mode, wv[k]);
    }
    if (live) norm_store8(out + at + c0, r);
    if (!q) return;
    // The block's maximum |value|: this lane's 8, then its block's 4 lanes
    // (fmaxf, as warp_max: the same maximum in any order).
    float amax = fabsf(r[0]);
#pragma unroll
    for (int k = 1; k < NORM_VEC; k++) amax = fmaxf(amax, fabsf(r[k]));
    amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, 2));
    float scale = q8_scale(amax);
    int c[NORM_VEC];
#pragma unroll
    for (int k = 0; k < NORM_VEC; k++) c[k] = q8_code(r[k], amax, scale);
    u32 w[2] = {pack_codes4(c), pack_codes4(c + 4)};
    norm_vec_store_codes(q, qd, order, at + c0, live, w, scale);
    if (q2) norm_vec_store_codes(q2, qd2, Q8_ORDER_MXFP4, at + c0, live, w, scale);
}

// rms_norm in the vector layout: blocks of ceil(dim / NORM_VEC) threads
// rounded up to whole warps (fusion.rs `norm_vec_threads`); the weights
// are loaded before the wait, as rms_norm's.
KERNEL void __launch_bounds__(NORM_VEC_THREADS)
    rms_norm_vec(float* add_src, float* h, float* out, int dim, float eps, int mode,
                 const float* w, signed char* q, float* qd, int order, signed char* q2,
                 float* qd2, NormCombine cy) {
    float wv[NORM_VEC];
    norm_vec_weights(w, dim, mode, wv);
    KERNEL_ENTRY();
    rms_norm_vec_row(add_src, h, out, dim, eps, mode, wv, q, qd, order, q2, qd2, cy);
}

#define ROPE_MAX_PAIRS 256
#define ROPE_NEOX 0
#define ROPE_INTERLEAVED 1

// The rotary table, by value (see EmbedTokens for why).
struct RopeParams {
    float inv_freq[ROPE_MAX_PAIRS];
    float attention_factor;
    int pairs;
    int kind;
};

// Rope, and the cache writes that follow it: a layer's rope of q and k and
// the cache writes of k and v in one launch (fusion.rs `RopeKvLaunch`), or
// any part of that (a rope alone: one tensor, no write). The angle is
// formed in f32 and its cosine and sine taken in f64, as the host table
// does (RopeTable::cos_sin); `step`, when set, holds a recorded decode
// step's {token, position} and the position comes from there (here and in
// kv_write and attention). A write is kv_write_*'s, element for element. Tensor i (x[i], [n_tokens, heads[i], head_dim]) is rotated in
// place pair by pair as `rope` does; write w copies src[w] ([n_tokens,
// row_len[w]]) into its cache as kv_write_* does, and when src[w] is a
// roped tensor (roped[w] = its index) the thread that rotates a pair also
// stores the two rotated values, the dimensions past the rotated ones
// having threads of their own. Threads, in order: the pairs of x[0], of
// x[1], the unrotated dimensions of each roped write, the elements of each
// plain write.
#define ROPE_KV_MAX 2
struct RopeKvParams {
    float* x[ROPE_KV_MAX];
    void* cache[ROPE_KV_MAX];
    const float* src[ROPE_KV_MAX];
    int heads[ROPE_KV_MAX];
    int row_len[ROPE_KV_MAX];
    int capacity[ROPE_KV_MAX];
    int f16[ROPE_KV_MAX];
    int roped[ROPE_KV_MAX];  // -1: a plain write
    int n_x, n_w;
    int n_tokens, head_dim, first_pos;
};

__device__ __forceinline__ void cache_store(void* cache, int f16, i64 at, float v) {
    if (f16) ((u16*)cache)[at] = f32_to_f16(v);
    else ((float*)cache)[at] = v;
}

// The rotation of pair `pair` at position `pos`: the angle in f32, its
// cosine and sine in f64, scaled by the attention factor.
__device__ __forceinline__ void rope_cos_sin(const RopeParams& p, int pos, int pair, float* c,
                                             float* s) {
    float angle = (float)pos * p.inv_freq[pair];
    double af = (double)p.attention_factor;
    *c = (float)(cos((double)angle) * af);
    *s = (float)(sin((double)angle) * af);
}

// Before it waits for the kernel before it (KERNEL_ENTRY, common.cuh), a
// thread reads the position (a decode step's is set before the step's
// first kernel) and forms its first pair's rotation, which depend on
// nothing a kernel writes; q, k and v are read after.
KERNEL void rope_kv(RopeKvParams r, RopeParams p, const int* step) {
    int first_pos = step ? step[1] : r.first_pos;
    const int n = r.n_tokens, hd = r.head_dim, tail = hd - 2 * p.pairs;
    // Which write stores tensor i's rotated values (-1: none), by
    // constant indices (a dynamic index into the parameter would copy it
    // to local memory).
    int w_of0 = r.n_w > 0 && r.roped[0] == 0 ? 0 : r.n_w > 1 && r.roped[1] == 0 ? 1 : -1;
    int w_of1 = r.n_w > 0 && r.roped[0] == 1 ? 0 : r.n_w > 1 && r.roped[1] == 1 ? 1 : -1;
    i64 pairs0 = (i64)n * r.heads[0] * p.pairs;
    i64 pairs1 = r.n_x > 1 ? (i64)n * r.heads[1] * p.pairs : 0;
    i64 tail0 = r.n_w > 0 && r.roped[0] >= 0 ? (i64)n * (r.row_len[0] / hd) * tail : 0;
    i64 tail1 = r.n_w > 1 && r.roped[1] >= 0 ? (i64)n * (r.row_len[1] / hd) * tail : 0;
    i64 plain0 = r.n_w > 0 && r.roped[0] < 0 ? (i64)n * r.row_len[0] : 0;
    i64 plain1 = r.n_w > 1 && r.roped[1] < 0 ? (i64)n * r.row_len[1] : 0;
    i64 total = pairs0 + pairs1 + tail0 + tail1 + plain0 + plain1;
    // This thread's first element, when it is a pair: its rotation now.
    const i64 g0 = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    float c0 = 0.0f, s0 = 0.0f;
    if (g0 < pairs0 + pairs1) {
        bool second = g0 >= pairs0;
        i64 i = second ? g0 - pairs0 : g0;
        int heads = second ? r.heads[1] : r.heads[0];
        rope_cos_sin(p, first_pos + (int)(i / p.pairs / heads), (int)(i % p.pairs), &c0, &s0);
    }
    KERNEL_ENTRY();
    GRID_STRIDE(g, total) {
        i64 i = g;
        if (i < pairs0 + pairs1) {
            bool second = i >= pairs0;
            if (second) i -= pairs0;
            int heads = second ? r.heads[1] : r.heads[0];
            float* x = second ? r.x[1] : r.x[0];
            int w = second ? w_of1 : w_of0;
            int pair = (int)(i % p.pairs);
            i64 th = i / p.pairs;
            int t = (int)(th / heads), h = (int)(th % heads);
            float* head = x + th * hd;
            float c = c0, s = s0;
            if (g != g0) rope_cos_sin(p, first_pos + t, pair, &c, &s);
            int a = p.kind == ROPE_NEOX ? pair : 2 * pair;
            int b = p.kind == ROPE_NEOX ? pair + p.pairs : 2 * pair + 1;
            float xa = head[a], xb = head[b];
            float ra = __fsub_rn(__fmul_rn(xa, c), __fmul_rn(xb, s));
            float rb = __fadd_rn(__fmul_rn(xb, c), __fmul_rn(xa, s));
            head[a] = ra;
            head[b] = rb;
            if (w >= 0) {
                void* cache = w ? r.cache[1] : r.cache[0];
                int f16 = w ? r.f16[1] : r.f16[0];
                int row_len = w ? r.row_len[1] : r.row_len[0];
                int cap = w ? r.capacity[1] : r.capacity[0];
                i64 row = (i64)((first_pos + t) % cap) * row_len + (i64)h * hd;
                cache_store(cache, f16, row + a, ra);
                cache_store(cache, f16, row + b, rb);
            }
            continue;
        }
        i -= pairs0 + pairs1;
        int w;
        bool tailed = i < tail0 + tail1;
        if (tailed) {
            w = i < tail0 ? 0 : 1;
            if (w) i -= tail0;
        } else {
            i -= tail0 + tail1;
            w = i < plain0 ? 0 : 1;
            if (w) i -= plain0;
        }
        void* cache = w ? r.cache[1] : r.cache[0];
        const float* src = w ? r.src[1] : r.src[0];
        int f16 = w ? r.f16[1] : r.f16[0];
        int row_len = w ? r.row_len[1] : r.row_len[0];
        int cap = w ? r.capacity[1] : r.capacity[0];
        int t, c;
        if (tailed) {
            // Dimension 2·pairs + d of head h (not rotated).
            int heads = row_len / hd;
            t = (int)(i / ((i64)heads * tail));
            i64 rest = i % ((i64)heads * tail);
            c = (int)(rest / tail) * hd + 2 * p.pairs + (int)(rest % tail);
        } else {
            t = (int)(i / row_len);
            c = (int)(i % row_len);
        }
        cache_store(cache, f16, (i64)((first_pos + t) % cap) * row_len + c, src[(i64)t * row_len + c]);
    }
}

// Rows of `row_len` into cache rows (first_pos + t) % capacity.
KERNEL void kv_write_f32(float* cache, const float* src, int n, int row_len,
                                        int first_pos, int capacity, const int* step) {
    KERNEL_ENTRY();
    if (step) first_pos = step[1];
    GRID_STRIDE(i, (i64)n * row_len) {
        int t = (int)(i / row_len), c = (int)(i % row_len);
        cache[(i64)((first_pos + t) % capacity) * row_len + c] = src[i];
    }
}

KERNEL void kv_write_f16(u16* cache, const float* src, int n, int row_len,
                                        int first_pos, int capacity, const int* step) {
    KERNEL_ENTRY();
    if (step) first_pos = step[1];
    GRID_STRIDE(i, (i64)n * row_len) {
        int t = (int)(i / row_len), c = (int)(i % row_len);
        cache[(i64)((first_pos + t) % capacity) * row_len + c] = f32_to_f16(src[i]);
    }
}

KERNEL void widen_f16(const u16* src, float* dst, i64 len) {
    KERNEL_ENTRY();
    GRID_STRIDE(i, len) dst[i] = f16_to_f32(src[i]);
}

// x[t] += (alpha · (u · x[t]) + beta) · u for each row of `d`; the dot in
// f64. One block per row.
KERNEL void adjust_projection(float* x, const float* u, int d, float alpha,
                                             float beta) {
    KERNEL_ENTRY();
    float* row = x + (i64)blockIdx.x * d;
    double s = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) s += (double)row[i] * (double)u[i];
    double t = block_sum_f64(s);
    float c = (float)((double)alpha * t + (double)beta);
    for (int i = threadIdx.x; i < d; i += blockDim.x) row[i] = fmaf(c, u[i], row[i]);
}
