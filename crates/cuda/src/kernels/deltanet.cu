// Gated DeltaNet (turbospark_backend::delta_net gives the math; reference
// HF transformers 5.24.0 `causal_conv1d_fn` / `torch_recurrent_gated_delta_rule`,
// as the CPU backend's crates/cpu/src/delta_net.rs computes them):
//   causal_conv1d_silu: one thread per channel, tokens in order, the last
//     kernel − 1 inputs kept as the state;
//   gated_delta_rule: one block per value head, tokens in order; thread j
//     owns column j of the head's state S [k_head_dim, v_head_dim], so every
//     sum over the key dimension runs in index order as on the CPU;
//   mul_sigmoid_rows: x[r, ·] *= sigmoid(gate[r]).

#define CONV_MAX_PAST 16

extern "C" __global__ void causal_conv1d_silu(const float* __restrict__ x, float* __restrict__ state,
                                              const float* __restrict__ w, int n, int ch, int k,
                                              int fresh, float* __restrict__ out) {
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

extern "C" __global__ void gated_delta_rule(const float* __restrict__ qkv,
                                            const float* __restrict__ alpha,
                                            const float* __restrict__ beta,
                                            const float* __restrict__ a_log,
                                            const float* __restrict__ dt_bias, int n, int hk,
                                            int hv, int dk, int dv, int fresh,
                                            float* __restrict__ state, float* __restrict__ out) {
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

extern "C" __global__ void mul_sigmoid_rows(float* x, const float* gate, i64 rows, int dim) {
    GRID_STRIDE(i, rows * dim) x[i] *= sigmoidf_(gate[i / dim]);
}
