// Tensor-core products for batches (prefill) in fast numerics, Q8_0 and
// MXFP4 weights against 8-bit activations (q8dot.cu): per 32-element block
// one integer MMA (mma.sync m16n8k32 s8·s8 → s32) gives Σ code · q for a
// 16-row × 8-token tile, and the block's scales are applied in f32 in the
// canonical order of q8dot.cu (chunks of Q8_CHUNK blocks), so every
// (row, token) has the bits the matrix-vector kernels give it.
//
// Fragment layouts are PTX's for m16n8k32 (.row.col): lane = 4g + q; A
// holds rows g and g + 8, bytes 4q..4q+3 and 16+4q..16+4q+3 of the block
// (in the order the codes decode, which the activations' order matches);
// B holds token g's same bytes; C holds rows g, g + 8 × tokens 2q, 2q + 1.
//
// A block of MQ_THREADS (8 warps) computes MQ_BM weight rows × MQ_BN
// tokens. Per step of Q8_CHUNK blocks (128 codes) it loads the rows' codes
// (MXFP4 decoded to int8 in the order the activations use) and the tokens'
// quantized activations into shared memory with 16-byte loads, all issued
// before any is used, then the warps take their MMA fragments from there.
// Two sets of tiles: the next step's loads are issued before this step's
// MMAs and stored into the other set after them, one barrier a step; the
// step's blocks are unrolled, so their fragment reads take constant
// offsets. (Each alone measured level with the single-buffered, rolled
// step on an H100; together +2 % on pp512: BENCHMARKS.md, fortieth
// session.)
// Warp w covers rows 32·(w % 2) .. + 32 (two 16-row tiles) and tokens
// 16·(w / 2) .. + 16 (two 8-token tiles): few accumulators a thread, so
// that two blocks fit an SM's registers. For gate/up the 64 rows are 32
// gate rows then the same 32 up rows, and warp w's two row tiles are the
// gate and up rows 16·(w % 2) .. + 16, combined by the activation in
// registers.

#define MMQ_MT 2  // 16-row tiles a warp
#define MMQ_NT 2  // 8-token tiles a warp (mq_products takes 2 or 1 of them)

#ifndef TURBOSPARK_HOST_EMULATION  // tests/emulation defines these on the host
__device__ __forceinline__ void mma_s8(int* c, const u32* a, const u32* b) {
    asm(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0), "r"(0),
          "r"(0), "r"(0));
}
// The same MMA added to c (q8mma.cu's one-token products accumulate a
// chunk's MMAs in one accumulator).
__device__ __forceinline__ void mma_s8_acc(int* c, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// PTX ldmatrix.m8n8.x4 (b16): lane l names row l % 8 of 8×16-byte matrix
// l / 8 in shared memory (16-byte aligned); register i of lane l gets
// 32-bit word l % 4 of row l / 4 of matrix i — for int8 tiles, exactly
// the m16n8k32 fragments' bytes 4q..4q+3 of row g.
__device__ __forceinline__ void ldmatrix_x4(u32* r, const void* row) {
    u32 s = (u32)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
#endif

// Which tokens a tile covers: token slot j of the tile maps to list entry
// j of `ids` (route ids, or plain 0, 1, ... when ids is null) from
// `first`; `count` entries are valid (later ones reuse the last valid entry
// and are not written).
struct MmqTokens {
    const u32* ids;
    u32 first;
    int count;
};

__device__ __forceinline__ u32 mmq_token(const MmqTokens& t, int j) {
    int k = min(j, t.count - 1);
    return t.ids ? t.ids[t.first + k] : t.first + (u32)k;
}

#define MQ_THREADS 256
// Blocks an SM must hold at once (registers ≤ 65536 / (2 · 256) = 128 a
// thread).
#define MQ_MIN_BLOCKS 2
#define MQ_BM 64
#define MQ_BN 64
#define MQ_LD (Q8_CHUNK * 32 + 16)  // bytes per shared row: 16 spare spread the banks

struct __align__(16) MqTiles {
    u8 a[MQ_BM][MQ_LD];
    float as[MQ_BM][Q8_CHUNK];
    u8 b[MQ_BN][MQ_LD];
    float bs[MQ_BN][Q8_CHUNK];
};

// The raw bytes of one (row, block) unit of A: its codes (MXFP4 uses lo
// only) and scale bits.
struct MqRawA {
    uint4 lo, hi;
    u32 scale;
};

template <int F>
__device__ __forceinline__ MqRawA mq_load_a(const u8* row, int cols, int b) {
    MqRawA r;
    const uint4* p = (const uint4*)split_codes<F>(row, b);
    r.lo = p[0];
    if (F == F_Q8_0) {
        r.hi = p[1];
        r.scale = *(const u16*)split_scale<F>(row, cols, b);
    } else {
        r.scale = *split_scale<F>(row, cols, b);
    }
    return r;
}

// A loaded unit into shared memory: 32 int8 codes (decoded order) at dst,
// and its scale.
template <int F>
__device__ __forceinline__ void mq_store_a(const MqRawA& r, u8* dst, float* d) {
    if (F == F_Q8_0) {
        ((uint4*)dst)[0] = r.lo;
        ((uint4*)dst)[1] = r.hi;
        *d = f16_to_f32((u16)r.scale);
    } else {
        u32 c[4] = {r.lo.x, r.lo.y, r.lo.z, r.lo.w};
        uint4 o0, o1;
        o0.x = (u32)mxfp4_word(c[0] & 0xFFFFu);
        o0.y = (u32)mxfp4_word(c[0] >> 16);
        o0.z = (u32)mxfp4_word(c[1] & 0xFFFFu);
        o0.w = (u32)mxfp4_word(c[1] >> 16);
        o1.x = (u32)mxfp4_word(c[2] & 0xFFFFu);
        o1.y = (u32)mxfp4_word(c[2] >> 16);
        o1.z = (u32)mxfp4_word(c[3] & 0xFFFFu);
        o1.w = (u32)mxfp4_word(c[3] >> 16);
        ((uint4*)dst)[0] = o0;
        ((uint4*)dst)[1] = o1;
        *d = e8m0_half((u8)r.scale);
    }
}

#define MQ_A_UNITS (MQ_BM * Q8_CHUNK / MQ_THREADS)      // (row, block) units a thread
#define MQ_B_PIECES (MQ_BN * Q8_CHUNK * 2 / MQ_THREADS)  // 16-byte pieces a thread
#define MQ_B_SCALES (MQ_BN * Q8_CHUNK / MQ_THREADS)      // scales a thread

// A thread's share of one step's bytes, held in registers between the
// loads and the stores into shared memory.
struct MqStep {
    MqRawA ra[MQ_A_UNITS];
    uint4 rb[MQ_B_PIECES];
    float rs[MQ_B_SCALES];
};

// One step's loads: blocks b0 .. b0 + nu of the tile's rows (arow[r]) and
// tokens (xrow[t], xsc[t]), all issued before any is used.
template <int F>
__device__ __forceinline__ void mq_load_step(MqStep& st, const u8* const* arow, int cols,
                                             const signed char* const* xrow,
                                             const float* const* xsc, int b0, int nu) {
#pragma unroll
    for (int j = 0; j < MQ_A_UNITS; j++) {
        int i = threadIdx.x + j * MQ_THREADS, r = i / Q8_CHUNK, u = i % Q8_CHUNK;
        if (u < nu) st.ra[j] = mq_load_a<F>(arow[r], cols, b0 + u);
    }
#pragma unroll
    for (int j = 0; j < MQ_B_PIECES; j++) {
        int i = threadIdx.x + j * MQ_THREADS, t = i / (Q8_CHUNK * 2), piece = i % (Q8_CHUNK * 2);
        if ((piece >> 1) < nu)
            st.rb[j] = ((const uint4*)(xrow[t] + (i64)(b0 + (piece >> 1)) * 32))[piece & 1];
    }
#pragma unroll
    for (int j = 0; j < MQ_B_SCALES; j++) {
        int i = threadIdx.x + j * MQ_THREADS, t = i / Q8_CHUNK, u = i % Q8_CHUNK;
        if (u < nu) st.rs[j] = xsc[t][b0 + u];
    }
}

// A step's loaded bytes into shared memory (MXFP4 codes decoded to int8).
template <int F>
__device__ __forceinline__ void mq_store_step(const MqStep& st, MqTiles& s, int nu) {
#pragma unroll
    for (int j = 0; j < MQ_A_UNITS; j++) {
        int i = threadIdx.x + j * MQ_THREADS, r = i / Q8_CHUNK, u = i % Q8_CHUNK;
        if (u < nu) mq_store_a<F>(st.ra[j], &s.a[r][u * 32], &s.as[r][u]);
    }
#pragma unroll
    for (int j = 0; j < MQ_B_PIECES; j++) {
        int i = threadIdx.x + j * MQ_THREADS, t = i / (Q8_CHUNK * 2), piece = i % (Q8_CHUNK * 2);
        if ((piece >> 1) < nu) ((uint4*)&s.b[t][0])[piece] = st.rb[j];
    }
#pragma unroll
    for (int j = 0; j < MQ_B_SCALES; j++) {
        int i = threadIdx.x + j * MQ_THREADS, t = i / Q8_CHUNK, u = i % Q8_CHUNK;
        if (u < nu) s.bs[t][u] = st.rs[j];
    }
}

// The steps' tiles, two of them: while the warps take one step's
// fragments from one, the next step's bytes are in flight to registers,
// stored into the other once this step's MMAs are issued.
struct MqTiles2 {
    MqTiles t[2];
};

// One step's MMAs of a warp into part (the first NV of its token tiles):
// fragments by ldmatrix — lane l names row l % 8 (+ 8 for odd l / 8 in A)
// and byte half (l / 16 in A, l / 8 % 2 in B) of the tile, so A's
// registers are rows g / g + 8 × halves, B's both token tiles × halves —
// then each block's scales in q8dot.cu's order.
template <int NV>
__device__ __forceinline__ void mq_step_mmas(const MqTiles& s, const int* ra, int tb, int nu,
                                             float (*part)[MMQ_NT][4]) {
    int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int u = 0; u < Q8_CHUNK; u++) {
        if (u >= nu) break;  // uniform over the block (the last step's tail)
        u32 a[MMQ_MT][4];
        float dw[MMQ_MT][2];
#pragma unroll
        for (int mt = 0; mt < MMQ_MT; mt++) {
            ldmatrix_x4(a[mt], &s.a[ra[mt] + (lane & 7) + 8 * ((lane >> 3) & 1)]
                                   [u * 32 + 16 * (lane >> 4)]);
            dw[mt][0] = s.as[ra[mt] + g][u];
            dw[mt][1] = s.as[ra[mt] + g + 8][u];
        }
        u32 bq[4];
        ldmatrix_x4(bq, &s.b[tb + 8 * (lane >> 4) + (lane & 7)][u * 32 + 16 * ((lane >> 3) & 1)]);
#pragma unroll
        for (int nt = 0; nt < NV; nt++) {
            u32 bx[2] = {bq[2 * nt], bq[2 * nt + 1]};
            float dx[2] = {s.bs[tb + 8 * nt + 2 * q][u], s.bs[tb + 8 * nt + 2 * q + 1][u]};
#pragma unroll
            for (int mt = 0; mt < MMQ_MT; mt++) {
                int c[4];
                mma_s8(c, a[mt], bx);
#pragma unroll
                for (int i = 0; i < 4; i++)
                    part[mt][nt][i] = fmaf((float)c[i], dw[mt][i >> 1] * dx[i & 1], part[mt][nt][i]);
            }
        }
    }
}

// The warp's products over all blocks (cols / 32): acc[mt][nt][i] for C
// element i of row tile mt (shared rows ra[mt] + g, + 8) and token tile nt
// (shared tokens tb + 8 nt + g for B, + 2q + j for the scales). Only the
// first `valid` token slots hold tokens: a token tile past them takes no
// MMAs (its acc stays 0 and is not written), so a slot's last, partial
// tile of routes costs the block its loads but few products. The caller
// has synchronized the block since its last read of `s2`.
template <int F>
__device__ __forceinline__ void mq_products(MqTiles2& s2, const u8* const* arow, int cols,
                                            const signed char* const* xrow,
                                            const float* const* xsc, const int* ra, int tb,
                                            int valid, float (*acc)[MMQ_NT][4]) {
    int nb = cols / 32;
    // The warp's token tiles that hold tokens (0 .. MMQ_NT).
    int nv = min(max(valid - tb + 7, 0) / 8, MMQ_NT);
#pragma unroll
    for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
        for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;
    MqStep st;
    mq_load_step<F>(st, arow, cols, xrow, xsc, 0, min(Q8_CHUNK, nb));
    mq_store_step<F>(st, s2.t[0], min(Q8_CHUNK, nb));
    __syncthreads();
    for (int b0 = 0, cur = 0; b0 < nb; b0 += Q8_CHUNK, cur ^= 1) {
        int nu = min(Q8_CHUNK, nb - b0);
        int next = b0 + Q8_CHUNK, next_nu = min(Q8_CHUNK, nb - next);
        // The next step's loads, in flight during this step's MMAs.
        if (next < nb) mq_load_step<F>(st, arow, cols, xrow, xsc, next, next_nu);
        MqTiles& s = s2.t[cur];
        float part[MMQ_MT][MMQ_NT][4];
#pragma unroll
        for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) part[mt][nt][i] = 0.0f;
        // The warp's valid token tiles decide the code path once a step
        // (uniform over the warp): a full warp's loop has no test in it.
        if (nv == MMQ_NT)
            mq_step_mmas<MMQ_NT>(s, ra, tb, nu, part);
        else if (nv == 1)
            mq_step_mmas<1>(s, ra, tb, nu, part);
#pragma unroll
        for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[mt][nt][i] += part[mt][nt][i];
        // The other tiles were last read a step ago, before the barrier
        // that ended it; the barrier below ends this step's reads of
        // these before the step after stores into them.
        if (next < nb) mq_store_step<F>(st, s2.t[cur ^ 1], next_nu);
        __syncthreads();
    }
}

// Token slots 0 .. MQ_BN of a tile: their activation rows and scales
// (called by every thread of the block).
__device__ __forceinline__ void mq_token_rows(const MmqTokens& tk, const signed char* xq,
                                              const float* xd, int cols, int x_div,
                                              const signed char** xrow, const float** xsc) {
    int nb = cols / 32;
    for (int t = threadIdx.x; t < MQ_BN; t += MQ_THREADS) {
        u32 id = mmq_token(tk, t) / x_div;
        xrow[t] = xq + (i64)id * cols;
        xsc[t] = xd + (i64)id * nb;
    }
}

// The tiles below take their products from a policy P: its shared tiles
// (P::Tiles) and the warp's products over a row's blocks (P::products,
// mq_products's signature, token tiles past `valid` skipped). mmq.cu's
// own, Q8_0 and MXFP4: MqProducts; kq.cu's formats bring theirs
// (KqProducts).
template <int F>
struct MqProducts {
    using Tiles = MqTiles2;
    __device__ __forceinline__ static void products(Tiles& s, const u8* const* arow, int cols,
                                                    const signed char* const* xrow,
                                                    const float* const* xsc, const int* ra, int tb,
                                                    int valid, float (*acc)[MMQ_NT][4]) {
        mq_products<F>(s, arow, cols, xrow, xsc, ra, tb, valid, acc);
    }
};

// Dense: out[t, o] (+ bias[o], null: none); grid (ceil(rows / MQ_BM),
// ceil(n / MQ_BN)).
template <class P>
__device__ void mq_matmul_impl(const u8* __restrict__ W, int rows, int cols, i64 row_bytes,
                               const signed char* __restrict__ xq, const float* __restrict__ xd,
                               int n, float* __restrict__ out, const float* __restrict__ bias) {
    __shared__ typename P::Tiles s;
    __shared__ const u8* arow[MQ_BM];
    __shared__ const signed char* xrow[MQ_BN];
    __shared__ const float* xsc[MQ_BN];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int r0 = blockIdx.x * MQ_BM;
    MmqTokens tk = {nullptr, (u32)(blockIdx.y * MQ_BN), min(MQ_BN, n - (int)blockIdx.y * MQ_BN)};
    mq_token_rows(tk, xq, xd, cols, 1, xrow, xsc);
    for (int r = threadIdx.x; r < MQ_BM; r += MQ_THREADS)
        arow[r] = W + (i64)min(r0 + r, rows - 1) * row_bytes;
    __syncthreads();
    int ra[MMQ_MT] = {32 * (warp & 1), 32 * (warp & 1) + 16};
    int tb = 8 * MMQ_NT * (warp >> 1);
    float acc[MMQ_MT][MMQ_NT][4];
    P::products(s, arow, cols, xrow, xsc, ra, tb, tk.count, acc);
#pragma unroll
    for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
        for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int row = r0 + ra[mt] + g + 8 * (i >> 1);
                int j = tb + 8 * nt + 2 * q + (i & 1);
                if (row < rows && j < tk.count)
                    out[(i64)(tk.first + j) * rows + row] = bias ? acc[mt][nt][i] + bias[row] : acc[mt][nt][i];
            }
}

// Routed experts grouped by slot: grid (ceil(inter / 32), slots) for
// gate/up, (ceil(hidden / MQ_BM), slots) for down; a block walks its
// slot's routes MQ_BN at a time.
template <class P>
__device__ void mq_gate_up_impl(const signed char* __restrict__ xq, const float* __restrict__ xd,
                                const u32* __restrict__ order, const u32* __restrict__ offsets,
                                int k, BankView b, MoeAct a, float* __restrict__ act) {
    __shared__ typename P::Tiles s;
    __shared__ const u8* arow[MQ_BM];
    __shared__ const signed char* xrow[MQ_BN];
    __shared__ const float* xsc[MQ_BN];
    int slot = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2,
        q = lane & 3;
    int r0 = blockIdx.x * (MQ_BM / 2);
    const u8* gate = b.gate + (i64)slot * b.inter * b.gate_row_bytes;
    const u8* up = b.up + (i64)slot * b.inter * b.up_row_bytes;
    for (int r = threadIdx.x; r < MQ_BM; r += MQ_THREADS) {
        int row = min(r0 + (r % (MQ_BM / 2)), b.inter - 1);
        arow[r] = r < MQ_BM / 2 ? gate + (i64)row * b.gate_row_bytes : up + (i64)row * b.up_row_bytes;
    }
    int ra[MMQ_MT] = {16 * (warp & 1), MQ_BM / 2 + 16 * (warp & 1)};
    int tb = 8 * MMQ_NT * (warp >> 1);
    u32 end = offsets[slot + 1];
    for (u32 c = offsets[slot]; c < end; c += MQ_BN) {
        MmqTokens tk = {order, c, (int)min((u32)MQ_BN, end - c)};
        __syncthreads();  // the previous tile's token rows are no longer read
        mq_token_rows(tk, xq, xd, b.hidden, k, xrow, xsc);
        __syncthreads();
        float acc[MMQ_MT][MMQ_NT][4];
        P::products(s, arow, b.hidden, xrow, xsc, ra, tb, tk.count, acc);
#pragma unroll
        for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int row = r0 + 16 * (warp & 1) + g + 8 * (i >> 1);
                int j = tb + 8 * nt + 2 * q + (i & 1);
                if (row < b.inter && j < tk.count) {
                    i64 r = (i64)slot * b.inter + row;
                    act[(i64)order[c + j] * b.inter + row] =
                        moe_act_value(b, a, r, acc[0][nt][i], acc[1][nt][i]);
                }
            }
    }
}

template <class P>
__device__ void mq_down_impl(const signed char* __restrict__ aq, const float* __restrict__ ad,
                             const u32* __restrict__ order, const u32* __restrict__ offsets,
                             BankView b, float* __restrict__ y) {
    __shared__ typename P::Tiles s;
    __shared__ const u8* arow[MQ_BM];
    __shared__ const signed char* xrow[MQ_BN];
    __shared__ const float* xsc[MQ_BN];
    int slot = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2,
        q = lane & 3;
    int r0 = blockIdx.x * MQ_BM;
    const u8* down = b.down + (i64)slot * b.hidden * b.down_row_bytes;
    for (int r = threadIdx.x; r < MQ_BM; r += MQ_THREADS)
        arow[r] = down + (i64)min(r0 + r, b.hidden - 1) * b.down_row_bytes;
    int ra[MMQ_MT] = {32 * (warp & 1), 32 * (warp & 1) + 16};
    int tb = 8 * MMQ_NT * (warp >> 1);
    u32 end = offsets[slot + 1];
    for (u32 c = offsets[slot]; c < end; c += MQ_BN) {
        MmqTokens tk = {order, c, (int)min((u32)MQ_BN, end - c)};
        __syncthreads();
        mq_token_rows(tk, aq, ad, b.inter, 1, xrow, xsc);
        __syncthreads();
        float acc[MMQ_MT][MMQ_NT][4];
        P::products(s, arow, b.inter, xrow, xsc, ra, tb, tk.count, acc);
#pragma unroll
        for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int row = r0 + ra[mt] + g + 8 * (i >> 1);
                    int j = tb + 8 * nt + 2 * q + (i & 1);
                    if (row < b.hidden && j < tk.count) {
                        y[(i64)order[c + j] * b.hidden + row] =
                            moe_down_value(b, (i64)slot * b.hidden + row, acc[mt][nt][i]);
                    }
                }
    }
}

#define MQ_KERNELS(fmt, F)                                                                      \
    KERNEL void __launch_bounds__(MQ_THREADS, MQ_MIN_BLOCKS)                                    \
        mq_matmul_##fmt(const u8* W, int rows, int cols, i64 row_bytes, const signed char* xq,  \
                        const float* xd, int n, float* out, const float* bias) {                \
        KERNEL_ENTRY();                                                                         \
        mq_matmul_impl<MqProducts<F>>(W, rows, cols, row_bytes, xq, xd, n, out, bias);          \
    }                                                                                           \
    KERNEL void __launch_bounds__(MQ_THREADS, MQ_MIN_BLOCKS)                                    \
        mq_gate_up_##fmt(const signed char* xq, const float* xd, const u32* order,              \
                         const u32* offsets, int k, BankView b, MoeAct a, float* act) {         \
        KERNEL_ENTRY();                                                                         \
        mq_gate_up_impl<MqProducts<F>>(xq, xd, order, offsets, k, b, a, act);                   \
    }                                                                                           \
    KERNEL void __launch_bounds__(MQ_THREADS, MQ_MIN_BLOCKS)                                    \
        mq_down_##fmt(const signed char* aq, const float* ad, const u32* order,                 \
                      const u32* offsets, BankView b, float* y) {                               \
        KERNEL_ENTRY();                                                                         \
        mq_down_impl<MqProducts<F>>(aq, ad, order, offsets, b, y);                              \
    }

MQ_KERNELS(q8_0, F_Q8_0)
MQ_KERNELS(mxfp4, F_MXFP4)
