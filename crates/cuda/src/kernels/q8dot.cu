// Fast numerics (turbospark_backend::Numerics::Fast) for Q8_0 and MXFP4
// weights: activations are quantized to 8 bits per 32-element block,
//   d = max|x| / 127,   q_j = round(x_j / d)   (q = 0 when max|x| = 0),
// and each weight block is dotted with them in integers (dp4a), the scales
// applied once per block, f32 across blocks:
//   out[t, o] = Σ_b (dw[o, b] · dx[t, b]) · Σ_j c[o, 32b + j] · q[t, 32b + j]
// where c are the weight codes (Q8_0: the int8 codes, scale d; MXFP4: the
// doubled e2m1 values 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12 with half the e8m0
// scale, as load_unit reads them). The integer sums are exact, so a token's
// result depends only on its own activations and the weights.
//
// Layout of the quantized activations: codes `[n, cols]` int8, then (at
// the caller's offset) scales `[n, cols / 32]` f32. For MXFP4 the codes of
// each block are stored in the order the weight nibbles decode (q8_pos), so
// no byte shuffling is needed at dot time: code word w of a weight block
// (bytes 4i..4i+3, i = w / 2, half h = w % 2) packs the low and high nibbles
// of bytes 4i + 2h and 4i + 2h + 1, i.e. elements 4i+2h, 16+4i+2h,
// 4i+2h+1, 17+4i+2h.

// Byte position of element e (0..31) of a block in the order used for F.
template <int F>
__device__ __forceinline__ int q8_pos(int e) {
    if (F != F_MXFP4) return e;
    int hi = e >= 16, r = e & 15;
    int i = r >> 2, h = (r >> 1) & 1, m = r & 1;
    return 8 * i + 4 * h + 2 * m + hi;
}

// One warp per 32-element block of x [n, cols] (cols a multiple of 32).
template <int F>
__device__ void quantize_q8_impl(const float* __restrict__ x, i64 blocks, signed char* __restrict__ q,
                                 float* __restrict__ d) {
    int lane = threadIdx.x & 31;
    i64 b = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (b >= blocks) return;
    float v = x[b * 32 + lane];
    float amax = warp_max(fabsf(v));
    float scale = amax / 127.0f;
    int c = amax == 0.0f ? 0 : __float2int_rn(v / scale);
    q[b * 32 + q8_pos<F>(lane)] = (signed char)c;
    if (lane == 0) d[b] = scale;
}

extern "C" __global__ void quantize_q8_natural(const float* x, i64 blocks, signed char* q, float* d) {
    quantize_q8_impl<F_Q8_0>(x, blocks, q, d);
}
extern "C" __global__ void quantize_q8_mxfp4(const float* x, i64 blocks, signed char* q, float* d) {
    quantize_q8_impl<F_MXFP4>(x, blocks, q, d);
}

__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// Four MXFP4 nibbles (a 16-bit half of a code word) as four int8 values.
__device__ __forceinline__ int mxfp4_word(u32 h) {
    u32 sel = h & 0x7777u;
    u32 pos = __byte_perm(MXFP4_LO0, MXFP4_LO1, sel);
    u32 neg = __byte_perm(MXFP4_HI0, MXFP4_HI1, sel);
    return (int)__byte_perm(pos, neg, ((h & 0x8888u) >> 1) | 0x3210u);
}

// A weight block's 32 codes as eight int words (in q8_pos order) and its scale.
struct Q8Block {
    int c[8];
    float d;
};

// Raw bytes of a weight block, loaded before any is decoded.
struct RawBlock {
    uint4 a, b;  // MXFP4 uses a only
    u32 scale;
};

template <int F>
__device__ __forceinline__ RawBlock raw_block(const u8* row, int cols, int b) {
    RawBlock r;
    const uint4* p = (const uint4*)split_codes<F>(row, b);
    r.a = p[0];
    if (F == F_Q8_0) {
        r.b = p[1];
        r.scale = *(const u16*)split_scale<F>(row, cols, b);
    } else {
        r.scale = *split_scale<F>(row, cols, b);
    }
    return r;
}

template <int F>
__device__ __forceinline__ Q8Block decode_block(const RawBlock& r) {
    Q8Block k;
    if (F == F_Q8_0) {
        k.c[0] = (int)r.a.x, k.c[1] = (int)r.a.y, k.c[2] = (int)r.a.z, k.c[3] = (int)r.a.w;
        k.c[4] = (int)r.b.x, k.c[5] = (int)r.b.y, k.c[6] = (int)r.b.z, k.c[7] = (int)r.b.w;
        k.d = f16_to_f32((u16)r.scale);
    } else {
        u32 w[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            k.c[2 * i] = mxfp4_word(w[i] & 0xFFFFu);
            k.c[2 * i + 1] = mxfp4_word(w[i] >> 16);
        }
        k.d = e8m0_half((u8)r.scale);
    }
    return k;
}

// The order of the f32 sums, shared by the matrix-vector kernels below and
// the tensor-core kernels of mmq.cu so that a token's result has the same
// bits whichever computes it (the fast numerics' batch invariance): the
// blocks of a row are taken in chunks of Q8_CHUNK consecutive blocks;
// within a chunk, from 0, part = fmaf(Σ_block, dw · dx, part) block by
// block; the row's total, from 0, adds the chunks' parts in order.
#define Q8_CHUNK 4
// Lanes that share one row in the matrix-vector kernels (rows per warp:
// 32 / Q8_LANES); lane j of a row takes chunks j, j + Q8_LANES, ...
#define Q8_LANES 8
#define Q8_ROWS_PER_WARP (32 / Q8_LANES)
// Rounds of chunks a lane loads before computing.
#define Q8_ROUNDS 2
// Warps of a matrix-vector block (few, so that short matrices still
// spread over the GPU).
#define Q8_WARPS 4

// R weight rows (same format and width) dotted with up to T tokens'
// quantized activations into acc[r][t] (every lane of the row's group ends
// with the totals). Every lane of the warp must call it with the same
// cols and nt (the chunks' parts meet through warp shuffles).
template <int F, int T, int R>
__device__ __forceinline__ void q8_rows_dot(const u8* const* rows, int cols,
                                            const signed char* const* xq, const float* const* xd,
                                            int nt, float (*acc)[T]) {
    int lane = threadIdx.x & 31;
    int sub = lane & (Q8_LANES - 1), first = lane - sub;
    int nb = cols / 32;
    int chunks = (nb + Q8_CHUNK - 1) / Q8_CHUNK;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[r][t] = 0.0f;
    // Two rounds of chunks at a time (Q8_ROUNDS): every block of both is
    // loaded before any is used.
    for (int c0 = 0; c0 < chunks; c0 += Q8_LANES * Q8_ROUNDS) {
        float part[Q8_ROUNDS][R][T];
        RawBlock raw[Q8_ROUNDS][R][Q8_CHUNK];
#pragma unroll
        for (int h = 0; h < Q8_ROUNDS; h++) {
            int b0 = (c0 + h * Q8_LANES + sub) * Q8_CHUNK;
#pragma unroll
            for (int u = 0; u < Q8_CHUNK; u++)
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (b0 + u < nb) raw[h][r][u] = raw_block<F>(rows[r], cols, b0 + u);
        }
#pragma unroll
        for (int h = 0; h < Q8_ROUNDS; h++) {
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < T; t++) part[h][r][t] = 0.0f;
            int b0 = (c0 + h * Q8_LANES + sub) * Q8_CHUNK;
#pragma unroll
            for (int u = 0; u < Q8_CHUNK; u++) {
                int b = b0 + u;
                if (b >= nb) break;
                Q8Block k[R];
#pragma unroll
                for (int r = 0; r < R; r++) k[r] = decode_block<F>(raw[h][r][u]);
#pragma unroll
                for (int t = 0; t < T; t++) {
                    if (t >= nt) break;
                    const int4* xp = (const int4*)(xq[t] + (i64)b * 32);
                    int4 x0 = xp[0], x1 = xp[1];
                    float dx = xd[t][b];
                    int xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        int s = 0;
#pragma unroll
                        for (int j = 0; j < 8; j++) s = dp4a(k[r].c[j], xv[j], s);
                        part[h][r][t] = fmaf((float)s, k[r].d * dx, part[h][r][t]);
                    }
                }
            }
        }
        // The parts of chunks c0, c0 + 1, ..., in order.
#pragma unroll
        for (int h = 0; h < Q8_ROUNDS; h++) {
            for (int j = 0; j < Q8_LANES && c0 + h * Q8_LANES + j < chunks; j++) {
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int t = 0; t < T; t++)
                        acc[r][t] += __shfl_sync(FULL_MASK, part[h][r][t], first + j);
            }
        }
    }
}

// The row a lane group of a matrix-vector kernel computes: grids are
// (ceil(rows / Q8_BLOCK_ROWS), ...) with blocks of Q8_WARPS warps.
#define Q8_BLOCK_ROWS (Q8_WARPS * Q8_ROWS_PER_WARP)
__device__ __forceinline__ int q8_row() {
    return blockIdx.x * Q8_BLOCK_ROWS + (threadIdx.x >> 5) * Q8_ROWS_PER_WARP +
           ((threadIdx.x & 31) / Q8_LANES);
}
// Whether this lane writes its group's result.
__device__ __forceinline__ bool q8_writer() { return (threadIdx.x & (Q8_LANES - 1)) == 0; }

// out[t, o] for quantized x: grid (ceil(rows / Q8_BLOCK_ROWS), ceil(n / MM_TOKENS)).
template <int F>
__device__ void matmul_q8_impl(const u8* __restrict__ W, int rows, int cols, i64 row_bytes,
                               const signed char* __restrict__ xq, const float* __restrict__ xd,
                               int n, float* __restrict__ out) {
    int row = q8_row();
    int t0 = blockIdx.y * MM_TOKENS;
    bool live = row < rows;
    int nb = cols / 32;
    const u8* wr[1] = {W + (i64)min(row, rows - 1) * row_bytes};
    const signed char* qs[MM_TOKENS];
    const float* ds[MM_TOKENS];
#pragma unroll
    for (int t = 0; t < MM_TOKENS; t++) {
        qs[t] = xq + (i64)(t0 + t) * cols;
        ds[t] = xd + (i64)(t0 + t) * nb;
    }
    float acc[1][MM_TOKENS];
    q8_rows_dot<F, MM_TOKENS, 1>(wr, cols, qs, ds, min(n - t0, MM_TOKENS), acc);
    if (live && q8_writer()) {
#pragma unroll
        for (int t = 0; t < MM_TOKENS; t++)
            if (t0 + t < n) out[(i64)(t0 + t) * rows + row] = acc[0][t];
    }
}

// Routed experts with quantized activations, one route per (row, route):
// grid (ceil(inter / Q8_BLOCK_ROWS), routes) for gate/up (both rows of a
// lane group read together), (ceil(hidden / Q8_BLOCK_ROWS), routes) for
// down, whose input is the activations `act` quantized (aq, ad).
template <int F>
__device__ void moe_gate_up_q8_impl(const signed char* __restrict__ xq, const float* __restrict__ xd,
                                    const RouteOut* __restrict__ routes, int k, SlotMask only,
                                    BankView b, MoeAct a, float* __restrict__ act) {
    int i = blockIdx.y;
    int row = q8_row();
    bool live = row < b.inter;
    u32 slot = routes[i].slot;
    if (slot >= (u32)b.slots || skipped(only, slot)) return;  // uniform over the block
    int t = i / k, nb = b.hidden / 32;
    i64 r = (i64)slot * b.inter + min(row, b.inter - 1);
    const u8* wr[2] = {b.gate + r * b.gate_row_bytes, b.up + r * b.up_row_bytes};
    const signed char* qs[1] = {xq + (i64)t * b.hidden};
    const float* ds[1] = {xd + (i64)t * nb};
    float acc[2][1];
    q8_rows_dot<F, 1, 2>(wr, b.hidden, qs, ds, 1, acc);
    if (live && q8_writer()) {
        float g = acc[0][0], u = acc[1][0];
        if (b.gate_bias) g += b.gate_bias[r];
        if (b.up_bias) u += b.up_bias[r];
        act[(i64)i * b.inter + row] = glu_one(g, u, a.act, a.alpha, a.limit);
    }
}

template <int F>
__device__ void moe_down_q8_impl(const signed char* __restrict__ aq, const float* __restrict__ ad,
                                 const RouteOut* __restrict__ routes, SlotMask only, BankView b,
                                 float* __restrict__ y) {
    int i = blockIdx.y;
    int row = q8_row();
    bool live = row < b.hidden;
    u32 slot = routes[i].slot;
    if (slot >= (u32)b.slots || skipped(only, slot)) return;  // uniform over the block
    i64 r = (i64)slot * b.hidden + min(row, b.hidden - 1);
    const u8* wr[1] = {b.down + r * b.down_row_bytes};
    const signed char* qs[1] = {aq + (i64)i * b.inter};
    const float* ds[1] = {ad + (i64)i * (b.inter / 32)};
    float acc[1][1];
    q8_rows_dot<F, 1, 1>(wr, b.inter, qs, ds, 1, acc);
    if (live && q8_writer()) {
        float v = acc[0][0];
        if (b.down_bias) v += b.down_bias[r];
        y[(i64)i * b.hidden + row] = v;
    }
}

// Batches grouped by slot (moe_group): grid (ceil(rows / Q8_BLOCK_ROWS), slots),
// MOE_GROUP routes of a slot at a time; each route's row is the same
// instructions as alone.
template <int F>
__device__ void moe_gate_up_grouped_q8_impl(const signed char* __restrict__ xq,
                                            const float* __restrict__ xd,
                                            const u32* __restrict__ order,
                                            const u32* __restrict__ offsets, int k, BankView b,
                                            MoeAct a, float* __restrict__ act) {
    int slot = blockIdx.y;
    int row = q8_row();
    bool live = row < b.inter;
    int nb = b.hidden / 32;
    i64 r = (i64)slot * b.inter + min(row, b.inter - 1);
    const u8* wr[2] = {b.gate + r * b.gate_row_bytes, b.up + r * b.up_row_bytes};
    u32 end = offsets[slot + 1];
    for (u32 c = offsets[slot]; c < end; c += MOE_GROUP) {
        int nt = (int)min((u32)MOE_GROUP, end - c);
        u32 ids[MOE_GROUP];
        const signed char* qs[MOE_GROUP];
        const float* ds[MOE_GROUP];
#pragma unroll
        for (int t = 0; t < MOE_GROUP; t++) {
            ids[t] = t < nt ? order[c + t] : 0;
            qs[t] = xq + (i64)(ids[t] / k) * b.hidden;
            ds[t] = xd + (i64)(ids[t] / k) * nb;
        }
        float acc[2][MOE_GROUP];
        q8_rows_dot<F, MOE_GROUP, 2>(wr, b.hidden, qs, ds, nt, acc);
        if (live && q8_writer()) {
#pragma unroll
            for (int t = 0; t < MOE_GROUP; t++) {
                if (t >= nt) break;
                float g = acc[0][t], u = acc[1][t];
                if (b.gate_bias) g += b.gate_bias[r];
                if (b.up_bias) u += b.up_bias[r];
                act[(i64)ids[t] * b.inter + row] = glu_one(g, u, a.act, a.alpha, a.limit);
            }
        }
    }
}

template <int F>
__device__ void moe_down_grouped_q8_impl(const signed char* __restrict__ aq,
                                         const float* __restrict__ ad,
                                         const u32* __restrict__ order,
                                         const u32* __restrict__ offsets, BankView b,
                                         float* __restrict__ y) {
    int slot = blockIdx.y;
    int row = q8_row();
    bool live = row < b.hidden;
    int nb = b.inter / 32;
    i64 r = (i64)slot * b.hidden + min(row, b.hidden - 1);
    const u8* wr[1] = {b.down + r * b.down_row_bytes};
    u32 end = offsets[slot + 1];
    for (u32 c = offsets[slot]; c < end; c += MOE_GROUP) {
        int nt = (int)min((u32)MOE_GROUP, end - c);
        u32 ids[MOE_GROUP];
        const signed char* qs[MOE_GROUP];
        const float* ds[MOE_GROUP];
#pragma unroll
        for (int t = 0; t < MOE_GROUP; t++) {
            ids[t] = t < nt ? order[c + t] : 0;
            qs[t] = aq + (i64)ids[t] * b.inter;
            ds[t] = ad + (i64)ids[t] * nb;
        }
        float acc[1][MOE_GROUP];
        q8_rows_dot<F, MOE_GROUP, 1>(wr, b.inter, qs, ds, nt, acc);
        if (live && q8_writer()) {
#pragma unroll
            for (int t = 0; t < MOE_GROUP; t++) {
                if (t >= nt) break;
                float v = acc[0][t];
                if (b.down_bias) v += b.down_bias[r];
                y[(i64)ids[t] * b.hidden + row] = v;
            }
        }
    }
}

#define Q8_KERNELS(fmt, F)                                                                       \
    extern "C" __global__ void matmul_q8x_##fmt(const u8* W, int rows, int cols, i64 row_bytes,  \
                                                const signed char* xq, const float* xd, int n,   \
                                                float* out) {                                    \
        matmul_q8_impl<F>(W, rows, cols, row_bytes, xq, xd, n, out);                             \
    }                                                                                            \
    extern "C" __global__ void moe_gate_up_q8x_##fmt(const signed char* xq, const float* xd,     \
                                                     const RouteOut* routes, int k,              \
                                                     SlotMask only, BankView b, MoeAct a,        \
                                                     float* act) {                               \
        moe_gate_up_q8_impl<F>(xq, xd, routes, k, only, b, a, act);                              \
    }                                                                                            \
    extern "C" __global__ void moe_down_q8x_##fmt(const signed char* aq, const float* ad,        \
                                                  const RouteOut* routes, SlotMask only,         \
                                                  BankView b, float* y) {                        \
        moe_down_q8_impl<F>(aq, ad, routes, only, b, y);                                         \
    }                                                                                            \
    extern "C" __global__ void moe_gate_up_grouped_q8x_##fmt(                                    \
        const signed char* xq, const float* xd, const u32* order, const u32* offsets, int k,     \
        BankView b, MoeAct a, float* act) {                                                      \
        moe_gate_up_grouped_q8_impl<F>(xq, xd, order, offsets, k, b, a, act);                    \
    }                                                                                            \
    extern "C" __global__ void moe_down_grouped_q8x_##fmt(const signed char* aq, const float* ad, \
                                                          const u32* order, const u32* offsets,  \
                                                          BankView b, float* y) {                \
        moe_down_grouped_q8_impl<F>(aq, ad, order, offsets, b, y);                               \
    }

Q8_KERNELS(q8_0, F_Q8_0)
Q8_KERNELS(mxfp4, F_MXFP4)
