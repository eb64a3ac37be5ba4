// Tensor-core products for batches (prefill) in fast numerics, Q8_0 and
// MXFP4 weights against 8-bit activations (q8dot.cu): per 32-element block
// one integer MMA (mma.sync m16n8k32 s8·s8 → s32) gives Σ code · q for a
// 16-row × 8-token tile, and the block's scales are applied in f32 in the
// canonical order of q8dot.cu (chunks of Q8_CHUNK blocks), so every
// (row, token) has the bits the matrix-vector kernels give it.
//
// A warp computes MMQ_MT row tiles of 16 × MMQ_NT token tiles of 8; a
// block of MMQ_WARPS warps shares its rows and takes 32 · MMQ_WARPS
// tokens. Fragment layouts are PTX's for m16n8k32 (.row.col): lane = 4g + q;
// A holds rows g and g + 8, bytes 4q..4q+3 and 16+4q..16+4q+3 of the block
// (in the order the codes decode, which the activations' order matches);
// B holds token g's same bytes; C holds rows g, g + 8 × tokens 2q, 2q + 1.

#define MMQ_WARPS 4
#define MMQ_MT 2
#define MMQ_NT 4
#define MMQ_TOKENS (MMQ_WARPS * MMQ_NT * 8)
// Blocks whose loads are in flight together (Q8_CHUNK is a multiple).
#define MMQ_PREFETCH 2

__device__ __forceinline__ void mma_s8(int* c, const u32* a, const u32* b) {
    asm(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(0), "r"(0),
          "r"(0), "r"(0));
}

// This lane's two A words (bytes 4q.., 16+4q.. in decoded order) of block b
// of a weight row, and the block's scale.
template <int F>
__device__ __forceinline__ void mmq_a(const u8* row, int cols, int b, int q, u32* lo, u32* hi,
                                      float* d) {
    const u8* c = split_codes<F>(row, b);
    if (F == F_Q8_0) {
        *lo = *(const u32*)(c + 4 * q);
        *hi = *(const u32*)(c + 16 + 4 * q);
        *d = f16_to_f32(*(const u16*)split_scale<F>(row, cols, b));
    } else {
        // Decoded word w is half w % 2 of code word w / 2 (q8dot.cu).
        u32 w0 = *(const u32*)(c + 4 * (q >> 1));
        u32 w1 = *(const u32*)(c + 8 + 4 * (q >> 1));
        int sh = 16 * (q & 1);
        *lo = (u32)mxfp4_word((w0 >> sh) & 0xFFFFu);
        *hi = (u32)mxfp4_word((w1 >> sh) & 0xFFFFu);
        *d = e8m0_half(*split_scale<F>(row, cols, b));
    }
}

// The tile of one warp: rows[mt][h] are the weight rows of this lane's
// A fragment (row g + 8h of row tile mt), xrow[nt] the quantized
// activations of token g of token tile nt, xs[nt][j] the block scales of
// tokens 2q + j. acc[mt][nt][i] ends with C element i's total.
template <int F>
__device__ __forceinline__ void mmq_warp(const u8* const (*rows)[2], int cols,
                                         const signed char* const* xrow,
                                         const float* const (*xs)[2],
                                         float (*acc)[MMQ_NT][4]) {
    int q = threadIdx.x & 3;
    int nb = cols / 32;
#pragma unroll
    for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
        for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;
    for (int b0 = 0; b0 < nb; b0 += Q8_CHUNK) {
        float part[MMQ_MT][MMQ_NT][4];
#pragma unroll
        for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) part[mt][nt][i] = 0.0f;
        // The chunk's blocks MMQ_PREFETCH at a time: their loads first,
        // then the products (fewer registers than the whole chunk at once).
        int nu = min(Q8_CHUNK, nb - b0);
        for (int u0 = 0; u0 < nu; u0 += MMQ_PREFETCH) {
            u32 a[MMQ_PREFETCH][MMQ_MT][4];
            float dw[MMQ_PREFETCH][MMQ_MT][2];
            u32 bx[MMQ_PREFETCH][MMQ_NT][2];
            float dx[MMQ_PREFETCH][MMQ_NT][2];
#pragma unroll
            for (int u = 0; u < MMQ_PREFETCH; u++) {
                if (u0 + u >= nu) break;
                int b = b0 + u0 + u;
#pragma unroll
                for (int mt = 0; mt < MMQ_MT; mt++) {
                    mmq_a<F>(rows[mt][0], cols, b, q, &a[u][mt][0], &a[u][mt][2], &dw[u][mt][0]);
                    mmq_a<F>(rows[mt][1], cols, b, q, &a[u][mt][1], &a[u][mt][3], &dw[u][mt][1]);
                }
#pragma unroll
                for (int nt = 0; nt < MMQ_NT; nt++) {
                    const signed char* x = xrow[nt] + (i64)b * 32;
                    bx[u][nt][0] = *(const u32*)(x + 4 * q);
                    bx[u][nt][1] = *(const u32*)(x + 16 + 4 * q);
                    dx[u][nt][0] = xs[nt][0][b];
                    dx[u][nt][1] = xs[nt][1][b];
                }
            }
#pragma unroll
            for (int u = 0; u < MMQ_PREFETCH; u++) {
                if (u0 + u >= nu) break;
#pragma unroll
                for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < MMQ_NT; nt++) {
                        int c[4];
                        mma_s8(c, a[u][mt], bx[u][nt]);
#pragma unroll
                        for (int i = 0; i < 4; i++)
                            part[mt][nt][i] = fmaf((float)c[i], dw[u][mt][i >> 1] * dx[u][nt][i & 1],
                                                   part[mt][nt][i]);
                    }
            }
        }
#pragma unroll
        for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[mt][nt][i] += part[mt][nt][i];
    }
}

// Which tokens a warp's tile covers. Token slot j (0 .. MMQ_TOKENS) of the
// block maps to list entry j of `ids` (route ids, or plain 0, 1, ... when
// ids is null) from `first`; `count` entries are valid (later ones reuse
// the last valid entry and are not written).
struct MmqTokens {
    const u32* ids;
    u32 first;
    int count;
};

__device__ __forceinline__ u32 mmq_token(const MmqTokens& t, int j) {
    int k = min(j, t.count - 1);
    return t.ids ? t.ids[t.first + k] : t.first + (u32)k;
}

// Sets up a warp's pointers: row tile mt holds rows r0 + off[mt] .. + 16
// of `w[mt]` (clamped to `rows`, the rows past it computed but not
// written); activations of token id `tok / x_div`.
template <int F>
__device__ __forceinline__ void mmq_setup(const u8* w0, const u8* w1, int off1, i64 row_bytes,
                                          int rows, int r0, const MmqTokens& tk, int warp_tok0,
                                          const signed char* xq, const float* xd, int cols,
                                          int x_div, const u8* (*ar)[2],
                                          const signed char** xrow, const float* (*xs)[2]) {
    int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const u8* w[2] = {w0, w1};
    int off[2] = {0, off1};
#pragma unroll
    for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            ar[mt][h] = w[mt] + (i64)min(r0 + off[mt] + g + 8 * h, rows - 1) * row_bytes;
    int nb = cols / 32;
#pragma unroll
    for (int nt = 0; nt < MMQ_NT; nt++) {
        int base = warp_tok0 + 8 * nt;
        xrow[nt] = xq + (i64)(mmq_token(tk, base + g) / x_div) * cols;
#pragma unroll
        for (int j = 0; j < 2; j++) xs[nt][j] = xd + (i64)(mmq_token(tk, base + 2 * q + j) / x_div) * nb;
    }
}

// Dense: out[t, o], grid (ceil(rows / 32), ceil(n / MMQ_TOKENS)).
template <int F>
__device__ void mmq_matmul_impl(const u8* __restrict__ W, int rows, int cols, i64 row_bytes,
                                const signed char* __restrict__ xq, const float* __restrict__ xd,
                                int n, float* __restrict__ out) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int r0 = blockIdx.x * 16 * MMQ_MT;
    MmqTokens tk = {nullptr, (u32)(blockIdx.y * MMQ_TOKENS), min(MMQ_TOKENS, n - (int)blockIdx.y * MMQ_TOKENS)};
    const u8* ar[MMQ_MT][2];
    const signed char* xrow[MMQ_NT];
    const float* xs[MMQ_NT][2];
    mmq_setup<F>(W, W, 16, row_bytes, rows, r0, tk, warp * MMQ_NT * 8, xq, xd, cols, 1, ar, xrow,
                 xs);
    float acc[MMQ_MT][MMQ_NT][4];
    mmq_warp<F>(ar, cols, xrow, xs, acc);
#pragma unroll
    for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
        for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int row = r0 + 16 * mt + g + 8 * (i >> 1);
                int j = warp * MMQ_NT * 8 + 8 * nt + 2 * q + (i & 1);
                if (row < rows && j < tk.count)
                    out[(i64)(tk.first + j) * rows + row] = acc[mt][nt][i];
            }
}

// Routed experts grouped by slot (moe_group's order/offsets), grid
// (ceil(rows / 16), slots) for gate/up — row tile 0 the gate rows, row tile
// 1 the same up rows, combined by the activation in registers — and
// (ceil(hidden / 32), slots) for down. A block walks its slot's routes
// 32 per warp at a time (these blocks are launched with one warp, so that
// no warp of a block idles when a slot has few routes).
template <int F>
__device__ void mmq_gate_up_impl(const signed char* __restrict__ xq, const float* __restrict__ xd,
                                 const u32* __restrict__ order, const u32* __restrict__ offsets,
                                 int k, BankView b, MoeAct a, float* __restrict__ act) {
    int slot = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2,
        q = lane & 3;
    int r0 = blockIdx.x * 16;
    const u8* gate = b.gate + (i64)slot * b.inter * b.gate_row_bytes;
    const u8* up = b.up + (i64)slot * b.inter * b.up_row_bytes;
    u32 end = offsets[slot + 1];
    u32 step = (blockDim.x >> 5) * MMQ_NT * 8;
    for (u32 c = offsets[slot]; c < end; c += step) {
        MmqTokens tk = {order, c, (int)min(step, end - c)};
        if (warp * MMQ_NT * 8 >= tk.count) break;  // uniform over the warp
        const u8* ar[MMQ_MT][2];
        const signed char* xrow[MMQ_NT];
        const float* xs[MMQ_NT][2];
        mmq_setup<F>(gate, up, 0, b.gate_row_bytes, b.inter, r0, tk, warp * MMQ_NT * 8, xq, xd,
                     b.hidden, k, ar, xrow, xs);
        float acc[MMQ_MT][MMQ_NT][4];
        mmq_warp<F>(ar, b.hidden, xrow, xs, acc);
#pragma unroll
        for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int row = r0 + g + 8 * (i >> 1);
                int j = warp * MMQ_NT * 8 + 8 * nt + 2 * q + (i & 1);
                if (row < b.inter && j < tk.count) {
                    i64 r = (i64)slot * b.inter + row;
                    float gv = acc[0][nt][i], uv = acc[1][nt][i];
                    if (b.gate_bias) gv += b.gate_bias[r];
                    if (b.up_bias) uv += b.up_bias[r];
                    act[(i64)order[c + j] * b.inter + row] = glu_one(gv, uv, a.act, a.alpha, a.limit);
                }
            }
    }
}

template <int F>
__device__ void mmq_down_impl(const signed char* __restrict__ aq, const float* __restrict__ ad,
                              const u32* __restrict__ order, const u32* __restrict__ offsets,
                              BankView b, float* __restrict__ y) {
    int slot = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2,
        q = lane & 3;
    int r0 = blockIdx.x * 16 * MMQ_MT;
    const u8* down = b.down + (i64)slot * b.hidden * b.down_row_bytes;
    u32 end = offsets[slot + 1];
    u32 step = (blockDim.x >> 5) * MMQ_NT * 8;
    for (u32 c = offsets[slot]; c < end; c += step) {
        MmqTokens tk = {order, c, (int)min(step, end - c)};
        if (warp * MMQ_NT * 8 >= tk.count) break;  // uniform over the warp
        const u8* ar[MMQ_MT][2];
        const signed char* xrow[MMQ_NT];
        const float* xs[MMQ_NT][2];
        mmq_setup<F>(down, down, 16, b.down_row_bytes, b.hidden, r0, tk, warp * MMQ_NT * 8, aq, ad,
                     b.inter, 1, ar, xrow, xs);
        float acc[MMQ_MT][MMQ_NT][4];
        mmq_warp<F>(ar, b.inter, xrow, xs, acc);
#pragma unroll
        for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int row = r0 + 16 * mt + g + 8 * (i >> 1);
                    int j = warp * MMQ_NT * 8 + 8 * nt + 2 * q + (i & 1);
                    if (row < b.hidden && j < tk.count) {
                        float v = acc[mt][nt][i];
                        if (b.down_bias) v += b.down_bias[(i64)slot * b.hidden + row];
                        y[(i64)order[c + j] * b.hidden + row] = v;
                    }
                }
    }
}

#define MMQ_KERNELS(fmt, F)                                                                      \
    extern "C" __global__ void mmq_matmul_##fmt(const u8* W, int rows, int cols, i64 row_bytes,  \
                                                const signed char* xq, const float* xd, int n,   \
                                                float* out) {                                    \
        mmq_matmul_impl<F>(W, rows, cols, row_bytes, xq, xd, n, out);                            \
    }                                                                                            \
    extern "C" __global__ void mmq_gate_up_##fmt(const signed char* xq, const float* xd,         \
                                                 const u32* order, const u32* offsets, int k,    \
                                                 BankView b, MoeAct a, float* act) {             \
        mmq_gate_up_impl<F>(xq, xd, order, offsets, k, b, a, act);                               \
    }                                                                                            \
    extern "C" __global__ void mmq_down_##fmt(const signed char* aq, const float* ad,            \
                                              const u32* order, const u32* offsets, BankView b,  \
                                              float* y) {                                        \
        mmq_down_impl<F>(aq, ad, order, offsets, b, y);                                          \
    }

MMQ_KERNELS(q8_0, F_Q8_0)
MMQ_KERNELS(mxfp4, F_MXFP4)
