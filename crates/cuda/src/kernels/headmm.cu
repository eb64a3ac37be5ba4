// The per-head matmul (turbospark_backend::HeadMatmul): head h's matrix is
// rows h·head_stride + first_row .. + rows of W [*, cols];
//   plain:      out[t, h, o] = Σ_{i < cols} W_h[o, i] · x[t, h, i]
//   transposed: out[t, h, j] = Σ_{i < rows} W_h[i, j] · x[t, h, i]
// with x[t, h, ·] at (t·n_heads + h)·x_stride + x_at and out likewise.
// One thread per output (plain) or per 32 outputs (transposed); sums run
// in index order in f32, so a token's outputs do not depend on the batch.
// Inputs and outputs may sit at any offset (no vector loads).

struct HeadParams {
    int n_tokens;
    int n_heads;
    int head_stride;
    int first_row;
    int rows;
    int x_stride;
    int x_at;
    int out_stride;
    int out_at;
};

template <int F>
__device__ void head_plain_impl(const u8* __restrict__ W, i64 row_bytes, int cols, HeadParams p,
                                const float* __restrict__ x, float* __restrict__ out) {
    i64 n = (i64)p.n_tokens * p.n_heads * p.rows;
    GRID_STRIDE(i, n) {
        int o = (int)(i % p.rows);
        i64 th = i / p.rows;  // t · n_heads + h
        int h = (int)(th % p.n_heads);
        const u8* row = W + (i64)(h * p.head_stride + p.first_row + o) * row_bytes;
        const float* xv = x + th * p.x_stride + p.x_at;
        float s = 0.0f;
        for (int u = 0; u < (cols + 31) / 32; u++) {
            float w[32];
            load_unit<F>(row, u, cols, w);
            int len = min(32, cols - 32 * u);
            for (int j = 0; j < len; j++) s = fmaf(w[j], xv[32 * u + j], s);
        }
        out[th * p.out_stride + p.out_at + o] = s;
    }
}

template <int F>
__device__ void head_t_impl(const u8* __restrict__ W, i64 row_bytes, int cols, HeadParams p,
                            const float* __restrict__ x, float* __restrict__ out) {
    int units = (cols + 31) / 32;
    i64 n = (i64)p.n_tokens * p.n_heads * units;
    GRID_STRIDE(i, n) {
        int u = (int)(i % units);
        i64 th = i / units;
        int h = (int)(th % p.n_heads);
        const float* xv = x + th * p.x_stride + p.x_at;
        float acc[32];
#pragma unroll
        for (int j = 0; j < 32; j++) acc[j] = 0.0f;
        for (int r = 0; r < p.rows; r++) {
            float w[32];
            load_unit<F>(W + (i64)(h * p.head_stride + p.first_row + r) * row_bytes, u, cols, w);
            float xr = xv[r];
#pragma unroll
            for (int j = 0; j < 32; j++) acc[j] = fmaf(w[j], xr, acc[j]);
        }
        int len = min(32, cols - 32 * u);
        for (int j = 0; j < len; j++) out[th * p.out_stride + p.out_at + 32 * u + j] = acc[j];
    }
}

#define HEADMM(fmt, F)                                                                          \
    KERNEL void head_plain_##fmt(const u8* W, i64 row_bytes, int cols,                          \
                                                HeadParams p, const float* x, float* out) {     \
        KERNEL_ENTRY();                                                                         \
        head_plain_impl<F>(W, row_bytes, cols, p, x, out);                                      \
    }                                                                                           \
    KERNEL void head_t_##fmt(const u8* W, i64 row_bytes, int cols, HeadParams p,                \
                                            const float* x, float* out) {                       \
        KERNEL_ENTRY();                                                                         \
        head_t_impl<F>(W, row_bytes, cols, p, x, out);                                          \
    }

HEADMM(f32, F_F32)
HEADMM(f16, F_F16)
HEADMM(bf16, F_BF16)
HEADMM(q8_0, F_Q8_0)
HEADMM(q4_0, F_Q4_0)
HEADMM(q4_1, F_Q4_1)
HEADMM(q5_0, F_Q5_0)
HEADMM(q5_1, F_Q5_1)
HEADMM(q4_k, F_Q4_K)
HEADMM(q5_k, F_Q5_K)
HEADMM(q6_k, F_Q6_K)
HEADMM(mxfp4, F_MXFP4)
