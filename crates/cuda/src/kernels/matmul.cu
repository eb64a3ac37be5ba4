// Matrix products against weights in their storage format:
// `out[t, o] = Σ_i W[o, i] · x[t, i]`, and `embed` (dequantized rows).
//
// One warp computes one output row for up to MM_TOKENS tokens (rows_dot in
// common.cuh): the lanes decode the row's blocks once and dot them with
// every token's activations; their partial sums meet in a fixed butterfly
// (warp_sum). A token's result is computed by the same instructions in the
// same order whatever else shares the batch, so a row's bits do not depend
// on the batch (the conformance suite checks it).

#define MM_TOKENS 4
#define MM_WARPS 8

template <int F>
__device__ void matmul_impl(const u8* __restrict__ W, int rows, int cols, i64 row_bytes,
                            const float* __restrict__ x, int n, float* __restrict__ out) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    int t0 = blockIdx.y * MM_TOKENS;
    if (row >= rows) return;
    float acc[MM_TOKENS];
    const float* xs[MM_TOKENS];
#pragma unroll
    for (int t = 0; t < MM_TOKENS; t++) xs[t] = x + (i64)(t0 + t) * cols;
    rows_dot<F, MM_TOKENS>(W + (i64)row * row_bytes, cols, xs, min(n - t0, MM_TOKENS), acc);
    if (lane == 0) {
#pragma unroll
        for (int t = 0; t < MM_TOKENS; t++)
            if (t0 + t < n) out[(i64)(t0 + t) * rows + row] = acc[t];
    }
}

#define MATMUL(name, F)                                                                      \
    KERNEL void name(const u8* W, int rows, int cols, i64 row_bytes,                         \
                                    const float* x, int n, float* out) {                     \
        KERNEL_ENTRY();                                                                      \
        matmul_impl<F>(W, rows, cols, row_bytes, x, n, out);                                 \
    }

MATMUL(matmul_f32, F_F32)
MATMUL(matmul_f16, F_F16)
MATMUL(matmul_bf16, F_BF16)
MATMUL(matmul_q8_0, F_Q8_0)
MATMUL(matmul_q4_0, F_Q4_0)
MATMUL(matmul_q4_1, F_Q4_1)
MATMUL(matmul_q5_0, F_Q5_0)
MATMUL(matmul_q5_1, F_Q5_1)
MATMUL(matmul_q4_k, F_Q4_K)
MATMUL(matmul_q5_k, F_Q5_K)
MATMUL(matmul_q6_k, F_Q6_K)
MATMUL(matmul_mxfp4, F_MXFP4)

// Tokens of an embedding lookup, passed by value so that no host buffer
// must outlive the launch (and a captured graph holds its own copy).
#define EMBED_MAX 256
struct EmbedTokens {
    u32 ids[EMBED_MAX];
};

// out[t] = dequantized table row tokens[t]; one block per token.
// `step`, when set, holds a recorded decode step's {token, position}: the
// token comes from there rather than from `tokens` (n is 1).
template <int F>
__device__ void embed_impl(const u8* __restrict__ table, int cols, i64 row_bytes,
                           EmbedTokens tokens, int n, float* __restrict__ out,
                           const int* __restrict__ step) {
    int t = blockIdx.x;
    if (t >= n) return;
    u32 id = step ? (u32)step[0] : tokens.ids[t];
    const u8* row = table + (i64)id * row_bytes;
    int units = (cols + 31) / 32;
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
        float w[32];
        load_unit<F>(row, u, cols, w);
        int base = u * 32;
        for (int j = 0; j < 32 && base + j < cols; j++) out[(i64)t * cols + base + j] = w[j];
    }
}

#define EMBED(name, F)                                                                       \
    KERNEL void name(const u8* table, int cols, i64 row_bytes, EmbedTokens tok,                \
                                    int n, float* out, const int* step) {                    \
        KERNEL_ENTRY();                                                                      \
        embed_impl<F>(table, cols, row_bytes, tok, n, out, step);                            \
    }

EMBED(embed_f32, F_F32)
EMBED(embed_f16, F_F16)
EMBED(embed_bf16, F_BF16)
EMBED(embed_q8_0, F_Q8_0)
EMBED(embed_q4_0, F_Q4_0)
EMBED(embed_q4_1, F_Q4_1)
EMBED(embed_q5_0, F_Q5_0)
EMBED(embed_q5_1, F_Q5_1)
EMBED(embed_q4_k, F_Q4_K)
EMBED(embed_q5_k, F_Q5_K)
EMBED(embed_q6_k, F_Q6_K)
EMBED(embed_mxfp4, F_MXFP4)
