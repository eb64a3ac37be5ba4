// Gated DeltaNet (turbospark_backend::delta_net gives the math; reference
// HF transformers 5.24.0 `causal_conv1d_fn`, `torch_recurrent_gated_delta_rule`
// and `torch_chunk_gated_delta_rule`, as the CPU backend's
// crates/cpu/src/delta_net.rs computes them):
//   causal_conv1d_silu: one thread per channel, tokens in order, the last
//     kernel − 1 inputs kept as the state;
//   gated_delta_rule: the token-by-token recurrence (decode, short calls):
//     one block per value head, tokens in order; thread j owns column j of
//     the head's state S [k_head_dim, v_head_dim], so every sum over the key
//     dimension runs in index order as on the CPU;
//   gated_delta_rule_chunked: the chunked form (prefill), the CPU's
//     equations in the CPU's order of sums (see below);
//   mul_sigmoid_rows: x[r, ·] *= sigmoid(gate[r]).

#define CONV_MAX_PAST 16

KERNEL void causal_conv1d_silu(const float* __restrict__ x, float* __restrict__ state,
                                              const float* __restrict__ w, int n, int ch, int k,
                                              int fresh, float* __restrict__ out) {
    KERNEL_ENTRY();
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ch) return;
    int past = k - 1;
    float st[CONV_MAX_PAST];
    for (int j = 0; j < past; j++) st[j] = fresh ? 0.0f : state[(i64)j * ch + c];
    for (int t = 0; t < n; t++) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) {
            int r = t + j - past;  // row of x, or (negative) of the state
            float v = r >= 0 ? x[(i64)r * ch + c] : st[t + j];
            s += w[(i64)c * k + j] * v;
        }
        out[(i64)t * ch + c] = s * sigmoidf_(s);
    }
    // The last `past` rows of [state, x].
    for (int j = 0; j < past; j++) {
        int r = n + j;  // row of the concatenation
        float v = r >= past ? x[(i64)(r - past) * ch + c] : st[r];
        state[(i64)j * ch + c] = v;
    }
}

__device__ __forceinline__ float softplus_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Σ over the block of one float per thread (blockDim.x ≤ 1024, a multiple
// of 32); every thread gets it.
__device__ float delta_block_sum(float v, float* red) { return block_sum(v, red); }

KERNEL void gated_delta_rule(const float* __restrict__ qkv,
                                            const float* __restrict__ alpha,
                                            const float* __restrict__ beta,
                                            const float* __restrict__ a_log,
                                            const float* __restrict__ dt_bias, int n, int hk,
                                            int hv, int dk, int dv, int fresh,
                                            float* __restrict__ state, float* __restrict__ out) {
    KERNEL_ENTRY();
    extern __shared__ float sh[];  // q [dk], k [dk]
    __shared__ float red[32];
    float* q = sh;
    float* kk = sh + dk;
    int h = blockIdx.x, kh = h / (hv / hk);
    int row = 2 * hk * dk + hv * dv;
    float* S = state + (i64)h * dk * dv;
    float q_scale = powf((float)dk, -0.5f);
    if (fresh)
        for (int i = threadIdx.x; i < dk * dv; i += blockDim.x) S[i] = 0.0f;
    __syncthreads();
    for (int t = 0; t < n; t++) {
        const float* r = qkv + (i64)t * row;
        float sq = 0.0f, sk = 0.0f;
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            float a = r[kh * dk + i], b = r[(hk + kh) * dk + i];
            q[i] = a;
            kk[i] = b;
            sq += a * a;
            sk += b * b;
        }
        sq = delta_block_sum(sq, red);
        __syncthreads();
        sk = delta_block_sum(sk, red);
        float rq = 1.0f / sqrtf(sq + 1e-6f), rk = 1.0f / sqrtf(sk + 1e-6f);
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            q[i] = q[i] * rq * q_scale;
            kk[i] = kk[i] * rk;
        }
        __syncthreads();
        float b = sigmoidf_(beta[(i64)t * hv + h]);
        float g = -expf(a_log[h]) * softplus_(alpha[(i64)t * hv + h] + dt_bias[h]);
        float decay = expf(g);
        const float* v = r + 2 * hk * dk + h * dv;
        for (int j = threadIdx.x; j < dv; j += blockDim.x) {
            float ks = 0.0f;
            for (int i = 0; i < dk; i++) {
                float s = S[(i64)i * dv + j] * decay;
                S[(i64)i * dv + j] = s;
                ks += s * kk[i];
            }
            float d = (v[j] - ks) * b;
            float o = 0.0f;
            for (int i = 0; i < dk; i++) {
                float s = S[(i64)i * dv + j] + kk[i] * d;
                S[(i64)i * dv + j] = s;
                o += s * q[i];
            }
            out[((i64)t * hv + h) * dv + j] = o;
        }
        __syncthreads();
    }
}

// The chunked gated delta rule. In a chunk of L ≤ DN_CHUNK tokens that
// starts from the state S, with G_i = Σ_{s ≤ i} g_s counted from the
// chunk's first token (the CPU module's docs derive it):
//   (I + A) U = R,  A_ij = β_i (k_i·k_j) e^{G_i − G_j} (j < i),
//                   R_i = β_i (v_i − e^{G_i} Sᵀk_i)
//   o_i = e^{G_i} Sᵀq_i + Σ_{j ≤ i} (q_i·k_j) e^{G_i − G_j} u_j
//   S  ← e^{G_{L−1}} S + Σ_j e^{G_{L−1} − G_j} k_j u_jᵀ
// Columns of S (and of v, u, o) evolve independently, so block (h, c) owns
// value head h's columns c·DN_BV .. c·DN_BV + DN_BV and works through the
// chunks in order; every block of a head recomputes the chunk's keys,
// queries and the k·k, q·k products it needs. Shared memory (floats,
// gated_delta_rule_chunked_smem in kernels.rs mirrors it):
//   Qs, Ks [DN_CHUNK][dk + 1]   normalised q (scaled) and k of the chunk
//   Ss     [dk][DN_BV]          the block's columns of S
//   U, O   [DN_CHUNK][DN_BV]    R then U; the outputs
//   A, At  [DN_CHUNK][DN_CHUNK + 1]  A and the decayed q·k scores
//   G, B, W, RQ, RK [DN_CHUNK]  G_i, β_i, e^{G_{L−1} − G_i}, 1/‖q_i‖, 1/‖k_i‖
// Rows past L hold zeros (A, At, U) so that the unrolled substitution reads
// finite values. Each sum runs over its index in order, as the CPU's
// product tiles do; rounding differs only in the l2 norms' sums and in the
// CPU's lane-wise dot products.
#define DN_CHUNK 64
#define DN_BV 32
#define DN_THREADS 256

KERNEL void __launch_bounds__(DN_THREADS)
    gated_delta_rule_chunked(const float* __restrict__ qkv, const float* __restrict__ alpha,
                             const float* __restrict__ beta, const float* __restrict__ a_log,
                             const float* __restrict__ dt_bias, int n, int hk, int hv, int dk,
                             int dv, int fresh, float* __restrict__ state,
                             float* __restrict__ out) {
    KERNEL_ENTRY();
    extern __shared__ float sh[];
    const int C = DN_CHUNK, BV = DN_BV, ldk = dk + 1, ldc = DN_CHUNK + 1;
    float* Qs = sh;
    float* Ks = Qs + C * ldk;
    float* Ss = Ks + C * ldk;
    float* U = Ss + dk * BV;
    float* O = U + C * BV;
    float* A = O + C * BV;
    float* At = A + C * ldc;
    float* G = At + C * ldc;
    float* B = G + C;
    float* W = B + C;
    float* RQ = W + C;
    float* RK = RQ + C;
    const int h = blockIdx.x, kh = h / (hv / hk), j0 = blockIdx.y * BV, tid = threadIdx.x;
    const int row = 2 * hk * dk + hv * dv;
    float* S = state + (i64)h * dk * dv;
    const float q_scale = powf((float)dk, -0.5f);
    for (int idx = tid; idx < dk * BV; idx += blockDim.x) {
        int d = idx / BV, j = j0 + idx % BV;
        Ss[idx] = (fresh || j >= dv) ? 0.0f : S[(i64)d * dv + j];
    }
    for (int c0 = 0; c0 < n; c0 += C) {
        const int L = min(C, n - c0);
        // The chunk's raw q and k rows.
        for (int idx = tid; idx < C * dk; idx += blockDim.x) {
            int i = idx / dk, d = idx % dk;
            float a = 0.0f, b = 0.0f;
            if (i < L) {
                const float* r = qkv + (i64)(c0 + i) * row;
                a = r[kh * dk + d];
                b = r[(hk + kh) * dk + d];
            }
            Qs[i * ldk + d] = a;
            Ks[i * ldk + d] = b;
        }
        __syncthreads();
        // Per token: the norms, β and g.
        if (tid < C) {
            int i = tid;
            float sq = 0.0f, sk = 0.0f;
            for (int d = 0; d < dk; d++) {
                float a = Qs[i * ldk + d], b = Ks[i * ldk + d];
                sq += a * a;
                sk += b * b;
            }
            RQ[i] = 1.0f / sqrtf(sq + 1e-6f);
            RK[i] = 1.0f / sqrtf(sk + 1e-6f);
            float bt = 0.0f, g = 0.0f;
            if (i < L) {
                i64 t = c0 + i;
                bt = sigmoidf_(beta[t * hv + h]);
                g = -expf(a_log[h]) * softplus_(alpha[t * hv + h] + dt_bias[h]);
            }
            B[i] = bt;
            G[i] = g;
        }
        __syncthreads();
        if (tid == 0) {
            float cum = 0.0f;
            for (int i = 0; i < C; i++) {
                cum += G[i];
                G[i] = cum;
            }
        }
        for (int idx = tid; idx < C * dk; idx += blockDim.x) {
            int i = idx / dk, d = idx % dk;
            Qs[i * ldk + d] = Qs[i * ldk + d] * RQ[i] * q_scale;
            Ks[i * ldk + d] = Ks[i * ldk + d] * RK[i];
        }
        __syncthreads();
        // A and the decayed scores (zero above the diagonal and past L);
        // R and the reads of S, o_i = e^{G_i} Sᵀq_i; the state's decays.
        for (int idx = tid; idx < C * C; idx += blockDim.x) {
            int i = idx / C, j = idx % C;
            float a = 0.0f, sc = 0.0f;
            if (i < L && j <= i) {
                float kk = 0.0f, qk = 0.0f;
                for (int d = 0; d < dk; d++) {
                    float kj = Ks[j * ldk + d];
                    kk = fmaf(Ks[i * ldk + d], kj, kk);
                    qk = fmaf(Qs[i * ldk + d], kj, qk);
                }
                float e = expf(G[i] - G[j]);
                sc = qk * e;
                a = j < i ? B[i] * kk * e : 0.0f;
            }
            A[i * ldc + j] = a;
            At[i * ldc + j] = sc;
        }
        for (int idx = tid; idx < C * BV; idx += blockDim.x) {
            int i = idx / BV, jj = idx % BV, j = j0 + jj;
            float u = 0.0f, o = 0.0f;
            if (i < L && j < dv) {
                float ks = 0.0f, qs = 0.0f;
                for (int d = 0; d < dk; d++) {
                    float s = Ss[d * BV + jj];
                    ks = fmaf(Ks[i * ldk + d], s, ks);
                    qs = fmaf(Qs[i * ldk + d], s, qs);
                }
                float e = expf(G[i]);
                float v = qkv[(i64)(c0 + i) * row + 2 * hk * dk + h * dv + j];
                o = qs * e;
                u = B[i] * (v - e * ks);
            }
            U[i * BV + jj] = u;
            O[i * BV + jj] = o;
        }
        if (tid < C) W[tid] = tid < L ? expf(G[L - 1] - G[tid]) : 0.0f;
        __syncthreads();
        // (I + A) U = R by forward substitution, one thread per column:
        // u_i = r_i − Σ_{m<i} A_im u_m, the terms added in the order of m.
        if (tid < BV) {
            float acc[DN_CHUNK];
#pragma unroll
            for (int i = 0; i < DN_CHUNK; i++) acc[i] = U[i * BV + tid];
#pragma unroll
            for (int m = 0; m < DN_CHUNK; m++) {
                U[m * BV + tid] = acc[m];
#pragma unroll
                for (int i = m + 1; i < DN_CHUNK; i++) acc[i] = fmaf(-A[i * ldc + m], acc[m], acc[i]);
            }
        }
        __syncthreads();
        // o_i += Σ_{m ≤ i} (q_i·k_m) e^{G_i − G_m} u_m, to the output.
        for (int idx = tid; idx < C * BV; idx += blockDim.x) {
            int i = idx / BV, jj = idx % BV, j = j0 + jj;
            if (i < L && j < dv) {
                float o = O[i * BV + jj];
                for (int m = 0; m <= i; m++) o = fmaf(At[i * ldc + m], U[m * BV + jj], o);
                out[((i64)(c0 + i) * hv + h) * dv + j] = o;
            }
        }
        // S ← e^{G_{L−1}} S + Σ_i e^{G_{L−1} − G_i} k_i u_iᵀ.
        const float decay = expf(G[L - 1]);
        for (int idx = tid; idx < dk * BV; idx += blockDim.x) {
            int d = idx / BV, jj = idx % BV;
            float s = decay * Ss[idx];
            for (int i = 0; i < L; i++) s = fmaf(Ks[i * ldk + d] * W[i], U[i * BV + jj], s);
            Ss[idx] = s;
        }
        __syncthreads();
    }
    for (int idx = tid; idx < dk * BV; idx += blockDim.x) {
        int d = idx / BV, j = j0 + idx % BV;
        if (j < dv) S[(i64)d * dv + j] = Ss[idx];
    }
}

KERNEL void mul_sigmoid_rows(float* x, const float* gate, i64 rows, int dim) {
    KERNEL_ENTRY();
    GRID_STRIDE(i, rows * dim) x[i] *= sigmoidf_(gate[i / dim]);
}
