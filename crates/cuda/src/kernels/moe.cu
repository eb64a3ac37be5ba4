// Routed experts over a bank (HF MixtralExperts / GptOssExperts forward),
// every selected expert of a batch in one launch per stage:
//   act[i] = act(gate_e · x[t] + bg) ⊙ (up_e · x[t] + bu)   for route i = t·k + r, e = slot
//   y[i]   = down_e · act[i] + bd
//   out[t] = Σ_r w[t, r] · y[t·k + r]                        (rank order)
// Each route's row is computed alone, by the same instructions as a lone
// token's, so a token's output depends only on its route. A bank stacks
// its slots: slot s's gate rows start at gate + s · inter · gate_row_bytes.

struct BankView {
    const u8* gate;
    const u8* up;
    const u8* down;
    const float* gate_bias;  // [slots, inter] or null
    const float* up_bias;
    const float* down_bias;  // [slots, hidden] or null
    i64 gate_row_bytes;      // bytes of one row of `hidden` elements
    i64 down_row_bytes;      // bytes of one row of `inter` elements
    int hidden;
    int inter;
    int slots;
};

// Which slots a call computes (bit s of bits[s / 32]); all when `on` is 0.
struct SlotMask {
    u32 bits[16];
    int on;
};

__device__ __forceinline__ bool skipped(const SlotMask& m, u32 slot) {
    return m.on && !((m.bits[slot >> 5] >> (slot & 31)) & 1u);
}

struct MoeAct {
    int act;
    float alpha;
    float limit;
};

// A row's dot with one token, as matmul_impl computes it for one token.
template <int F>
__device__ __forceinline__ float row_dot(const u8* wr, int cols, const float* x) {
    if (F == F_Q8_0 || F == F_MXFP4) {
        float acc[1];
        coop_row_dot<F, 1>(wr, cols, x, 0, 1, acc);
        return acc[0];
    }
    int lane = threadIdx.x & 31;
    int units = (cols + 31) / 32;
    float acc = 0.0f;
    for (int u = lane; u < units; u += 32) {
        float w[32];
        load_unit<F>(wr, u, cols, w);
        int base = u * 32;
        int len = min(32, cols - base);
        const float* xp = x + base;
        float s = 0.0f;
        if (len == 32) {
#pragma unroll
            for (int j = 0; j < 32; j++) s = fmaf(w[j], xp[j], s);
        } else {
            for (int j = 0; j < len; j++) s = fmaf(w[j], xp[j], s);
        }
        acc += s;
    }
    return warp_sum(acc);
}

// grid (ceil(inter / MM_WARPS), routes); warp = one intermediate row of one route.
template <int F>
__device__ void moe_gate_up_impl(const float* __restrict__ x, const RouteOut* __restrict__ routes,
                                 int k, SlotMask only, BankView b, MoeAct a,
                                 float* __restrict__ act) {
    int i = blockIdx.y;
    int row = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (row >= b.inter) return;
    u32 slot = routes[i].slot;
    if (slot >= (u32)b.slots || skipped(only, slot)) return;
    const float* xt = x + (i64)(i / k) * b.hidden;
    i64 r = (i64)slot * b.inter + row;
    float g = row_dot<F>(b.gate + r * b.gate_row_bytes, b.hidden, xt);
    float u = row_dot<F>(b.up + r * b.gate_row_bytes, b.hidden, xt);
    if ((threadIdx.x & 31) == 0) {
        if (b.gate_bias) g += b.gate_bias[r];
        if (b.up_bias) u += b.up_bias[r];
        act[(i64)i * b.inter + row] = glu_one(g, u, a.act, a.alpha, a.limit);
    }
}

// grid (ceil(hidden / MM_WARPS), routes); warp = one output row of one route.
template <int F>
__device__ void moe_down_impl(const float* __restrict__ act, const RouteOut* __restrict__ routes,
                              SlotMask only, BankView b, float* __restrict__ y) {
    int i = blockIdx.y;
    int row = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (row >= b.hidden) return;
    u32 slot = routes[i].slot;
    if (slot >= (u32)b.slots || skipped(only, slot)) return;
    i64 r = (i64)slot * b.hidden + row;
    float v = row_dot<F>(b.down + r * b.down_row_bytes, b.inter, act + (i64)i * b.inter);
    if ((threadIdx.x & 31) == 0) {
        if (b.down_bias) v += b.down_bias[r];
        y[(i64)i * b.hidden + row] = v;
    }
}

#define MOE(fmt, F)                                                                            \
    extern "C" __global__ void moe_gate_up_##fmt(const float* x, const RouteOut* routes, int k, \
                                                 SlotMask only, BankView b, MoeAct a,         \
                                                 float* act) {                                 \
        moe_gate_up_impl<F>(x, routes, k, only, b, a, act);                                    \
    }                                                                                          \
    extern "C" __global__ void moe_down_##fmt(const float* act, const RouteOut* routes,       \
                                              SlotMask only, BankView b, float* y) {           \
        moe_down_impl<F>(act, routes, only, b, y);                                             \
    }

MOE(f32, F_F32)
MOE(f16, F_F16)
MOE(bf16, F_BF16)
MOE(q8_0, F_Q8_0)
MOE(q4_0, F_Q4_0)
MOE(q4_1, F_Q4_1)
MOE(q5_0, F_Q5_0)
MOE(q5_1, F_Q5_1)
MOE(q4_k, F_Q4_K)
MOE(q5_k, F_Q5_K)
MOE(q6_k, F_Q6_K)
MOE(mxfp4, F_MXFP4)

// out[t, c] = Σ_r w[t, r] · y[t·k + r, c], in rank order.
extern "C" __global__ void moe_combine(const float* y, const RouteOut* routes, int n, int k,
                                       int hidden, float* out) {
    GRID_STRIDE(i, (i64)n * hidden) {
        int t = (int)(i / hidden), c = (int)(i % hidden);
        float acc = 0.0f;
        for (int r = 0; r < k; r++) {
            int j = t * k + r;
            acc = fmaf(routes[j].weight, y[(i64)j * hidden + c], acc);
        }
        out[i] = acc;
    }
}
