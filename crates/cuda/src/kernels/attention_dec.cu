// One token's attention on the tensor cores (fast numerics, f16 KV cache,
// heads HD = 64 or 128 wide, G = n_heads / n_kv_heads ≤ 8 query heads a KV
// head): the math of attention.cu's attention_decode_impl (HF
// `eager_attention_forward` with gpt-oss sinks and Gemma's soft-cap, key j
// at cache row j % capacity, keys lo .. pos with lo = pos - window + 1 on
// sliding layers), for caches too long for that kernel's warps, which each
// read every key of their tiles for one query head: here each key is read
// once for the whole group.
//
// Grid (KV heads, S splits), DT_WARPS warps a block. Warp w of split s
// walks the key tiles s·DT_WARPS + w, then + S·DT_WARPS, ... (DT_KEYS keys
// a tile, counted from lo) with FlashAttention-2's running maximum m,
// denominator l and value sums o, for all G heads at once: the heads are
// the rows of m16n8k16 tiles (f16 · f16 + f32; rows G .. 15 are zero
// queries whose results are dropped). Per tile, S = Q·Kᵀ is HD/16 × 2 MMAs
// (8 keys each), and O += P·V is HD/8 MMAs with P taken from S's
// accumulators as the A fragment (the C layout of two n8 tiles is the A
// layout of one k16 step). The fragments come straight from the cache
// rows, no shared memory, by two relabelings that the sums allow:
// - S's dimensions: lane (g, qd) takes dimensions qd·HD/4 .. + HD/4 of
//   its keys (contiguous 16-byte loads), and its i-th 32-bit word is k
//   step i / 2's b0 (even i) or b1; the queries' A fragments take the
//   same dimensions (a0: qd·HD/4 + 4·kk + 0, 1; a2: + 2, 3), so each
//   product q·k is the same sum of the same terms in another order.
// - O's dimensions: in the MMA of value tile n, B's column g is dimension
//   g·HD/8 + n, so a lane's values of a key are one contiguous run; C's
//   columns 2qd, 2qd + 1 are then dimensions 2qd·HD/8 + n and
//   (2qd + 1)·HD/8 + n.
// Not attention_decode_impl's bits: q and the weights e^(s - m) are rounded
// to f16 for the MMAs, as in attention_tc.cu's prefill, and the sums run in
// the tensor cores' order. The conformance suite holds it to the fast
// numerics' tolerance against the f64 formula.
//
// The kernel reads nothing before waiting for the one before it
// (common.cuh KERNEL_ENTRY). A block's warps meet in shared memory (in
// warp order), its partial goes to `part` like attention_decode_impl's
// (o [G][HD], m [G], l [G], l without the sink), and the last block of a
// KV head adds the splits in order (attention.cu attention_decode_finish,
// with the sink and the output's quantization). The host takes it from
// 4096 keys and sizes its splits (kernels.rs `DecodeAttention`).

#define DT_WARPS 8  // warps a block (kernels.rs DECODE_TC_THREADS / 32)
#define DT_KEYS 16  // keys a tile: two n8 tiles of S, one k16 step of P·V

// c (2 floats) += rows 0 .. 7 of A·B (mma_f16 with rows 8 .. 15 of C
// dropped: the zero queries' rows, kept in no register between MMAs).
__device__ __forceinline__ void mma_f16_top(float* c, const u32* a, u32 b0, u32 b1) {
    float d[4] = {c[0], c[1], 0.0f, 0.0f};
    mma_f16(d, a, b0, b1);
    c[0] = d[0];
    c[1] = d[1];
}

template <int HD>
__device__ void attention_decode_tc_impl(const float* __restrict__ q, const u16* __restrict__ kc,
                                         const u16* __restrict__ vc, AttnParams p,
                                         const float* __restrict__ sinks, float* __restrict__ out,
                                         const int* __restrict__ step, signed char* __restrict__ oq,
                                         float* __restrict__ oqd, float* __restrict__ part,
                                         u32* __restrict__ tickets) {
    constexpr int KP = HD / 32;  // 16-byte pieces of a key a lane loads (HD/4 dimensions)
    constexpr int VP = HD / 64;  // 16-byte pieces of a value a lane loads (HD/8 dimensions)
    constexpr int MG = ATTN_MAX_GROUP;
    __shared__ __align__(16) float wo[DT_WARPS][MG * HD];
    __shared__ float wm[DT_WARPS][MG], wl[DT_WARPS][MG];
    __shared__ __align__(16) float fin[MG * (HD + 2)];
    __shared__ bool last;
    if (step) p.first_pos = step[1];
    int kvh = blockIdx.x, split = blockIdx.y, S = gridDim.y;
    int G = p.n_heads / p.n_kv_heads, h0 = kvh * G;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, qd = lane & 3;
    int pos = p.first_pos;
    int lo = p.window > 0 ? max(0, pos + 1 - p.window) : 0;
    int nk = pos - lo + 1;
    const i64 row = (i64)p.n_kv_heads * HD;
    const u16* kb = kc + (i64)kvh * HD + qd * (HD / 4);
    const u16* vb = vc + (i64)kvh * HD + g * (HD / 8);
    // The queries as A fragments (rows: the group's heads; a1 = a3 = 0).
    u32 qa[HD / 16][2];
    {
        const float* qh = q + (i64)(h0 + min(g, G - 1)) * HD + qd * (HD / 4);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            float4 v = g < G ? *(const float4*)(qh + 4 * kk) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            qa[kk][0] = f16x2_rn(v.x, v.y);
            qa[kk][1] = f16x2_rn(v.z, v.w);
        }
    }
    float m = -INFINITY, l = 0.0f;
    float o[HD / 8][2];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = 0.0f;
    for (int t0 = (split * DT_WARPS + warp) * DT_KEYS; t0 < nk; t0 += S * DT_WARPS * DT_KEYS) {
        // This lane's keys: t0 + 8n + g for S (pieces of dimensions
        // qd·HD/4 ..), t0 + {2qd, 2qd + 1, 2qd + 8, 2qd + 9} for P·V
        // (dimensions g·HD/8 ..). Keys past the last are zeros (their
        // weights are 0, and 0 · a stale row could be NaN).
        uint4 kr[2][KP], vr[4][VP];
#pragma unroll
        for (int n = 0; n < 2; n++) {
            int j = t0 + 8 * n + g;
            const uint4* kp = (const uint4*)(kb + (i64)((lo + j) % p.capacity) * row);
#pragma unroll
            for (int i = 0; i < KP; i++) kr[n][i] = j < nk ? kp[i] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int c = 0; c < 4; c++) {
            int j = t0 + 2 * qd + (c & 1) + 8 * (c >> 1);
            const uint4* vp = (const uint4*)(vb + (i64)((lo + j) % p.capacity) * row);
#pragma unroll
            for (int i = 0; i < VP; i++) vr[c][i] = j < nk ? vp[i] : make_uint4(0, 0, 0, 0);
        }
        // S = Q·Kᵀ: s[n][0], s[n][1] are head g's scores of keys
        // t0 + 8n + 2qd, + 1.
        float s[2][2];
#pragma unroll
        for (int n = 0; n < 2; n++) {
            s[n][0] = s[n][1] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                const uint4& w = kr[n][kk / 2];
                u32 b0 = kk % 2 ? w.z : w.x, b1 = kk % 2 ? w.w : w.y;
                u32 a[4] = {qa[kk][0], 0u, qa[kk][1], 0u};
                mma_f16_top(s[n], a, b0, b1);
            }
        }
        // Scale, soft-cap, the keys past the last; the tile's maximum.
        float tmax = -INFINITY;
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float v = s[n][e] * p.scale;
                if (p.softcap > 0.0f) v = tanhf(v / p.softcap) * p.softcap;
                s[n][e] = t0 + 8 * n + 2 * qd + e < nk ? v : -INFINITY;
                tmax = fmaxf(tmax, s[n][e]);
            }
        tmax = fmaxf(tmax, __shfl_xor_sync(FULL_MASK, tmax, 1));
        tmax = fmaxf(tmax, __shfl_xor_sync(FULL_MASK, tmax, 2));
        // (The tile's first key exists, so tmax is finite.)
        float mn = fmaxf(m, tmax);
        float alpha = expf(m - mn);  // 0 for the first tile
        m = mn;
        float w[2][2];
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) w[n][e] = expf(s[n][e] - mn);
        l = l * alpha + ((w[0][0] + w[0][1]) + (w[1][0] + w[1][1]));
        u32 pa[4] = {f16x2_rn(w[0][0], w[0][1]), 0u, f16x2_rn(w[1][0], w[1][1]), 0u};
        // O = alpha · O + P·V: value tile n is dimension n of each lane
        // group's run (its half e of 32-bit word n / 2 within piece n / 8).
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            o[n][0] *= alpha;
            o[n][1] *= alpha;
            int pc = n / 8, wd = (n % 8) / 2;
            u32 sel = n % 2 ? 0x7632u : 0x5410u;
            const u32* v0 = (const u32*)&vr[0][pc];
            const u32* v1 = (const u32*)&vr[1][pc];
            const u32* v2 = (const u32*)&vr[2][pc];
            const u32* v3 = (const u32*)&vr[3][pc];
            mma_f16_top(o[n], pa, __byte_perm(v0[wd], v1[wd], sel), __byte_perm(v2[wd], v3[wd], sel));
        }
    }
    // The warp's partial: head g's denominator (its 4 lanes' shares) and
    // value sums in the natural order of dimensions.
    l += __shfl_xor_sync(FULL_MASK, l, 1);
    l += __shfl_xor_sync(FULL_MASK, l, 2);
    if (g < G) {
        if (qd == 0) {
            wm[warp][g] = m;
            wl[warp][g] = l;
        }
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            wo[warp][g * HD + (2 * qd) * (HD / 8) + n] = o[n][0];
            wo[warp][g * HD + (2 * qd + 1) * (HD / 8) + n] = o[n][1];
        }
    }
    __syncthreads();
    // The block's partial: its warps in order.
    attention_decode_close<HD, true>(&wm[0][0], &wl[0][0], &wo[0][0], DT_WARPS, MG, MG * HD, G,
                                     kvh, split, S, p, sinks, out, oq, oqd, part, tickets, fin,
                                     last);
}

// Blocks an SM holds (registers: ptxas 13.0 for sm_90, no spills).
#define DT_MIN_BLOCKS_64 2
#define DT_MIN_BLOCKS_128 1
#define ATTN_DECODE_TC(hd)                                                                      \
    KERNEL void __launch_bounds__(DT_WARPS * 32, DT_MIN_BLOCKS_##hd)                            \
        attention_decode_tc_f16_##hd(                                                           \
        const float* q, const u16* kc, const u16* vc, AttnParams p, const float* sinks,         \
        float* out, const int* step, signed char* oq, float* oqd, float* part, u32* tickets) {  \
        KERNEL_ENTRY();                                                                         \
        attention_decode_tc_impl<hd>(q, kc, vc, p, sinks, out, step, oq, oqd, part, tickets);   \
    }

ATTN_DECODE_TC(64)
ATTN_DECODE_TC(128)
