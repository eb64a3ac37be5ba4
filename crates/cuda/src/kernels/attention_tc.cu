// Prefill attention on the tensor cores (fast numerics, f16 KV cache,
// heads HD = 64 or 128 wide): the same math as attention.cu's attention_impl (HF
// `eager_attention_forward` with gpt-oss sinks and Gemma's soft-cap), for
// query head h of the token at position p over keys j in [lo, p] (lo =
// p - window + 1 on sliding layers, else 0), key j at cache row
// j % capacity:
//   s_j = scale · q·k_j (then c·tanh(s_j / c)),
//   out = Σ_j e^(s_j - M) v_j / (Σ_j e^(s_j - M) + e^(sink_h - M)),
// formed as FlashAttention-2 forms it: keys tile by tile with a running
// maximum m, denominator l and value sums o rescaled by e^(m - m') when
// the maximum grows (the sink enters as a key of value 0: m = sink, l = 1
// before the first tile). Not the scalar kernels' bits: q and the
// weights e^(s - m) are rounded to f16 for the MMAs (the cache is f16
// already), and the sums run in the tensor cores' order. The conformance
// suite holds it to the fast numerics' tolerance against the f64 formula.
//
// Grid (KV heads, ceil(tokens / PA_TOKENS)), a warp per query head of
// the group (G = n_heads / n_kv_heads ≤ PA_MAX_GROUP warps a block). Warp
// w computes head h0 + w for the block's PA_TOKENS tokens, one m16 tile;
// the block stages each tile of PA_KEYS keys' k and v rows once in shared
// memory for all G heads (v transposed, so that a lane's B fragment is
// one 32-bit read). Per tile and warp: S = Q·Kᵀ in 2 × 4 MMAs (m16n8k16,
// f16 · f16 + f32: 8 keys × 16 dimensions each), the masks, the online
// softmax in the fragments' rows (a row's 4 lanes meet by shuffles), and
// O += P·V in 8 MMAs, P taken from S's accumulators as the A fragment
// (FlashAttention-2's register reuse: the C layout of two n8 tiles is the
// A layout of one k16 step).
//
// Fragments (PTX m16n8k16 .row.col, lane = 4g + q): A a0 = (row g, k 2q,
// 2q+1), a1 = (row g+8, same k), a2 = (row g, k 2q+8, 2q+9), a3 = (row
// g+8, those k); B b0 = (k 2q, 2q+1; column g), b1 = (k 2q+8, 2q+9;
// column g); C c0, c1 = (row g; columns 2q, 2q+1), c2, c3 = (row g+8;
// same). A register's lower half holds the lower k.

#define PA_TOKENS 16     // tokens a block (the MMA's m)
#define PA_KEYS 16       // keys a tile (two n8 tiles for S, one k16 step for P·V)
#define PA_MAX_GROUP 8   // query heads a KV head, at most (warps a block)
#define PA_V_LD (PA_KEYS + 8)  // halves a staged (transposed) v row (16 B spare spread the banks)

#ifndef TURBOSPARK_HOST_EMULATION  // tests/emulation defines it on the host
__device__ __forceinline__ void mma_f16(float* c, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// Two f32 as an f16 pair (each to the nearest, ties to even): lo in the
// lower half.
__device__ __forceinline__ u32 f16x2_rn(float lo, float hi) {
    return (u32)f32_to_f16(lo) | ((u32)f32_to_f16(hi) << 16);
}

// The first key position of the token at position `pos`.
__device__ __forceinline__ int pa_first_key(const AttnParams& p, int pos) {
    return p.window > 0 ? max(0, pos + 1 - p.window) : 0;
}

template <int HD>
__device__ void attention_prefill_tc_impl(const float* __restrict__ q, const u16* __restrict__ kc,
                                          const u16* __restrict__ vc, AttnParams p, int n_tokens,
                                          const float* __restrict__ sinks, float* __restrict__ out) {
    constexpr int K_LD = HD + 8;  // halves a staged k row (16 B spare spread the banks)
    __shared__ __align__(16) u16 ks[PA_KEYS][K_LD];
    __shared__ __align__(16) u16 vt[HD][PA_V_LD];
    int kvh = blockIdx.x, t0 = blockIdx.y * PA_TOKENS;
    int G = p.n_heads / p.n_kv_heads, h0 = kvh * G;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, qd = lane & 3;
    int h = h0 + warp;
    int last = min(t0 + PA_TOKENS, n_tokens) - 1;  // the block's last token
    // The keys any of the block's tokens reads.
    int lo = pa_first_key(p, p.first_pos + t0), hi = p.first_pos + last;
    // This lane's rows: tokens t0 + g and t0 + g + 8 (positions, key ranges).
    int pos[2], first[2];
    bool live[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int t = t0 + g + 8 * r;
        live[r] = t < n_tokens;
        pos[r] = p.first_pos + t;
        first[r] = pa_first_key(p, pos[r]);
    }
    // The queries as A fragments (f16), dimension steps of 16.
    u32 qa[HD / 16][4];
    const i64 q_row = (i64)p.n_heads * HD;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = i & 1, d = 16 * kk + 2 * qd + 8 * (i >> 1);
            float2 v = make_float2(0.0f, 0.0f);
            if (live[r]) v = *(const float2*)(q + (t0 + g + 8 * r) * q_row + (i64)h * HD + d);
            qa[kk][i] = f16x2_rn(v.x, v.y);
        }
    }
    // Running maximum, this lane's share of the denominator, value sums
    // (o[n][i]: dimension 8n + 2qd + (i & 1), row i >> 1).
    float sink = p.has_sinks ? sinks[h] : -INFINITY;
    float m[2] = {sink, sink};
    float l[2] = {p.has_sinks && qd == 0 ? 1.0f : 0.0f, p.has_sinks && qd == 0 ? 1.0f : 0.0f};
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) o[n][i] = 0.0f;
    const i64 kv_row = (i64)p.n_kv_heads * HD;
    for (int j0 = lo; j0 <= hi; j0 += PA_KEYS) {
        __syncthreads();  // the previous tile's fragments are read
        // Stage the tile: k rows as they are, v rows transposed; keys past
        // the block's last position are zeros (their weights are 0, and
        // 0 · a stale row could be NaN).
        for (int i = threadIdx.x; i < 2 * PA_KEYS * (HD / 8); i += blockDim.x) {
            int which = i / (PA_KEYS * (HD / 8)), u = i % (PA_KEYS * (HD / 8));
            // (Consecutive threads take consecutive keys, so a warp's
            // transposed v stores meet 2 to a bank, not 8.)
            int key = u % PA_KEYS, piece = u / PA_KEYS, j = j0 + key;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (j <= hi) {
                i64 at = (i64)(j % p.capacity) * kv_row + (i64)kvh * HD + 8 * piece;
                v = *(const uint4*)((which ? vc : kc) + at);
            }
            if (which == 0) {
                *(uint4*)&ks[key][8 * piece] = v;
            } else {
                u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int e = 0; e < 8; e++) vt[8 * piece + e][key] = (u16)(w[e >> 1] >> (16 * (e & 1)));
            }
        }
        __syncthreads();
        if (warp >= G) continue;  // (no such warps: the host launches G)
        // S = Q·Kᵀ for the tile's two groups of 8 keys.
        float s[2][4];
#pragma unroll
        for (int n = 0; n < 2; n++) {
#pragma unroll
            for (int i = 0; i < 4; i++) s[n][i] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                const u16* kr = &ks[8 * n + g][16 * kk + 2 * qd];
                mma_f16(s[n], qa[kk], *(const u32*)kr, *(const u32*)(kr + 8));
            }
        }
        // Scale, soft-cap and masks; the tile's maximum of each row.
        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int r = i >> 1, j = j0 + 8 * n + 2 * qd + (i & 1);
                float v = s[n][i] * p.scale;
                if (p.softcap > 0.0f) v = tanhf(v / p.softcap) * p.softcap;
                bool ok = live[r] && j >= first[r] && j <= pos[r];
                s[n][i] = ok ? v : -INFINITY;
                tmax[r] = fmaxf(tmax[r], s[n][i]);
            }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(FULL_MASK, tmax[r], 1));
            tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(FULL_MASK, tmax[r], 2));
            float mn = fmaxf(m[r], tmax[r]);
            // (Nothing seen yet: no rescaling, and e^(-inf - 0) = 0 below.)
            float base = mn == -INFINITY ? 0.0f : mn;
            alpha[r] = expf(m[r] - base);
            m[r] = mn;
            tmax[r] = base;
        }
        // The weights, this lane's share of the row sums, and P as the A
        // fragment of one k16 step (keys 2qd, 2qd + 1 and 8 + those).
        float w[2][4];
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) w[n][i] = expf(s[n][i] - tmax[i >> 1]);
#pragma unroll
        for (int r = 0; r < 2; r++)
            l[r] = l[r] * alpha[r] + ((w[0][2 * r] + w[0][2 * r + 1]) + (w[1][2 * r] + w[1][2 * r + 1]));
        u32 pa[4] = {f16x2_rn(w[0][0], w[0][1]), f16x2_rn(w[0][2], w[0][3]),
                     f16x2_rn(w[1][0], w[1][1]), f16x2_rn(w[1][2], w[1][3])};
        // O = alpha · O + P·V, 8 dimensions an MMA.
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
#pragma unroll
            for (int i = 0; i < 4; i++) o[n][i] *= alpha[i >> 1];
            const u16* vr = &vt[8 * n + g][2 * qd];
            mma_f16(o[n], pa, *(const u32*)vr, *(const u32*)(vr + 8));
        }
    }
    if (warp >= G) return;
    // The denominators: a row's 4 lanes' shares.
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(FULL_MASK, l[r], 1);
        l[r] += __shfl_xor_sync(FULL_MASK, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (!live[r]) continue;
        float* orow = out + (t0 + g + 8 * r) * q_row + (i64)h * HD;
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            *(float2*)(orow + 8 * n + 2 * qd) =
                make_float2(o[n][2 * r] / l[r], o[n][2 * r + 1] / l[r]);
    }
}

#define PREFILL_TC_KERNEL(hd)                                                                 \
    KERNEL void __launch_bounds__(PA_MAX_GROUP * 32) attention_prefill_tc_f16_##hd(             \
        const float* q, const u16* kc, const u16* vc, AttnParams p, int n_tokens,                \
        const float* sinks, float* out) {                                                        \
        KERNEL_ENTRY();                                                                          \
        attention_prefill_tc_impl<hd>(q, kc, vc, p, n_tokens, sinks, out);                       \
    }

PREFILL_TC_KERNEL(64)
PREFILL_TC_KERNEL(128)
