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
    i64 gate_row_bytes;      // bytes of one gate row (`hidden` elements)
    i64 up_row_bytes;        // bytes of one up row (`hidden` elements)
    i64 down_row_bytes;      // bytes of one down row (`inter` elements)
    int hidden;
    int inter;
    int slots;
};

// Which slots a call computes (bit s of bits[s / 32]); all when `on` is 0.
struct SlotMask {
    u32 bits[16];
    int on;
};

// Whether a call computes the route to `slot`: a slot of the bank's
// `slots` (a route past them, such as one the host dropped, is not) that
// the mask lets through. Every per-route and grouped expert kernel asks.
__device__ __forceinline__ bool slot_computed(const SlotMask& m, u32 slot, int slots) {
    return slot < (u32)slots && (!m.on || ((m.bits[slot >> 5] >> (slot & 31)) & 1u));
}

// The opening of a per-route kernel: route i's slot, and whether the call
// computes it (slot_computed; uniform over a block, whose routes are one).
// EARLY: the kernel reads the slot before its wait (common.cuh: the routing
// finished before the launch before this one began), from the L2
// (`ld.global.cg`, past any L1 line of an earlier layer's routes), and a
// route it does not compute waits here before its block returns, as every
// kernel waits on every path.
template <bool EARLY>
__device__ __forceinline__ bool route_slot(const RouteOut* __restrict__ routes, int i,
                                           const SlotMask& only, int slots, u32& slot) {
    slot = EARLY ? __ldcg(&routes[i].slot) : routes[i].slot;
    if (slot_computed(only, slot, slots)) return true;
    if (EARLY) KERNEL_ENTRY();
    return false;
}

struct MoeAct {
    int act;
    float alpha;
    float limit;
};

// The activation of a gate and up row pair's totals (g, u) of bank row r
// (slot · inter + row): the biases added when the bank has them, then the
// GLU — the store of every routed gate/up kernel (q8dot.cu, q8one.cu,
// q8cta.cu, mmq.cu).
__device__ __forceinline__ float moe_act_value(const BankView& b, const MoeAct& a, i64 r, float g,
                                               float u) {
    if (b.gate_bias) g += b.gate_bias[r];
    if (b.up_bias) u += b.up_bias[r];
    return glu_one(g, u, a.act, a.alpha, a.limit);
}

// A down row's total v of bank row r (slot · hidden + row), its bias added
// when the bank has one.
__device__ __forceinline__ float moe_down_value(const BankView& b, i64 r, float v) {
    return b.down_bias ? v + b.down_bias[r] : v;
}

// A row's dot with one token, as matmul_impl computes it for one token.
template <int F>
__device__ __forceinline__ float row_dot(const u8* wr, int cols, const float* x) {
    float acc[1];
    const float* xs[1] = {x};
    rows_dot<F, 1>(wr, cols, xs, 1, acc);
    return acc[0];
}

// grid (ceil(inter / MM_WARPS), routes); warp = one intermediate row of one
// route. `mode` 0: gate and up (both in format F) and the activation;
// when the two projections are stored in different formats, mode 1 writes
// the gate projection into `act` and mode 2 (in the up projection's format)
// combines it with the up projection: the same values either way.
template <int F>
__device__ void moe_gate_up_impl(const float* __restrict__ x, const RouteOut* __restrict__ routes,
                                 int k, SlotMask only, BankView b, MoeAct a,
                                 float* __restrict__ act, int mode) {
    int i = blockIdx.y;
    int row = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (row >= b.inter) return;
    u32 slot = routes[i].slot;
    if (!slot_computed(only, slot, b.slots)) return;
    const float* xt = x + (i64)(i / k) * b.hidden;
    i64 r = (i64)slot * b.inter + row;
    float g = 0.0f, u = 0.0f;
    if (mode != 2) g = row_dot<F>(b.gate + r * b.gate_row_bytes, b.hidden, xt);
    if (mode != 1) u = row_dot<F>(b.up + r * b.up_row_bytes, b.hidden, xt);
    if ((threadIdx.x & 31) == 0) {
        float* o = act + (i64)i * b.inter + row;
        if (mode == 2) g = *o;
        else if (b.gate_bias) g += b.gate_bias[r];
        if (mode != 1 && b.up_bias) u += b.up_bias[r];
        *o = mode == 1 ? g : glu_one(g, u, a.act, a.alpha, a.limit);
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
    if (!slot_computed(only, slot, b.slots)) return;
    i64 r = (i64)slot * b.hidden + row;
    float v = row_dot<F>(b.down + r * b.down_row_bytes, b.inter, act + (i64)i * b.inter);
    if ((threadIdx.x & 31) == 0) {
        if (b.down_bias) v += b.down_bias[r];
        y[(i64)i * b.hidden + row] = v;
    }
}

#define MOE(fmt, F)                                                                             \
    KERNEL void moe_gate_up_##fmt(const float* x, const RouteOut* routes, int k,                \
                                                 SlotMask only, BankView b, MoeAct a,           \
                                                 float* act, int mode) {                        \
        KERNEL_ENTRY();                                                                         \
        moe_gate_up_impl<F>(x, routes, k, only, b, a, act, mode);                               \
    }                                                                                           \
    KERNEL void moe_down_##fmt(const float* act, const RouteOut* routes,                        \
                                              SlotMask only, BankView b, float* y) {            \
        KERNEL_ENTRY();                                                                         \
        moe_down_impl<F>(act, routes, only, b, y);                                              \
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
KERNEL void moe_combine(const float* y, const RouteOut* routes, int n, int k,
                                       int hidden, float* out) {
    KERNEL_ENTRY();
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

// ---------------------------------------------------------------------
// Batches: the routes grouped by slot, so each expert's weights are read
// once per MOE_GROUP routes instead of once per route.
//   moe_group: order[offsets[s] .. offsets[s + 1]] lists the routes of slot s
//   (those `only` keeps); one block.
//   moe_gate_up_grouped / moe_down_grouped: grid (rows / MM_WARPS, slots).
// Each route's row is the same instructions as in moe_gate_up / moe_down
// (rows_dot), so its bits are those of the route computed alone.

#define MOE_GROUP 8

// The routes of chunk `c` of a slot's list (up to `end`) and the rows of
// `src` (`width` wide, indexed by token when `per_token`, else by route)
// they read; returns how many the chunk holds.
__device__ __forceinline__ int moe_chunk(const u32* order, u32 c, u32 end, int k, bool per_token,
                                         const float* src, int width, u32* ids,
                                         const float** xs) {
    int nt = (int)min((u32)MOE_GROUP, end - c);
#pragma unroll
    for (int t = 0; t < MOE_GROUP; t++) {
        ids[t] = t < nt ? order[c + t] : 0;
        xs[t] = src + (i64)(per_token ? ids[t] / k : ids[t]) * width;
    }
    return nt;
}

KERNEL void moe_group(const RouteOut* routes, int n_routes, int slots,
                                     SlotMask only, u32* order, u32* offsets) {
    KERNEL_ENTRY();
    extern __shared__ u32 cnt[];  // slots + 1
    for (int s = threadIdx.x; s <= slots; s += blockDim.x) cnt[s] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n_routes; i += blockDim.x) {
        u32 s = routes[i].slot;
        if (slot_computed(only, s, slots)) atomicAdd(&cnt[s + 1], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int s = 1; s <= slots; s++) cnt[s] += cnt[s - 1];
        for (int s = 0; s <= slots; s++) offsets[s] = cnt[s];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n_routes; i += blockDim.x) {
        u32 s = routes[i].slot;
        if (slot_computed(only, s, slots)) order[atomicAdd(&cnt[s], 1u)] = (u32)i;
    }
}

template <int F>
__device__ void moe_gate_up_grouped_impl(const float* __restrict__ x, const u32* __restrict__ order,
                                         const u32* __restrict__ offsets, int k, BankView b,
                                         MoeAct a, float* __restrict__ act, int mode) {
    int slot = blockIdx.y;
    int row = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (row >= b.inter) return;
    i64 r = (i64)slot * b.inter + row;
    const u8* gw = b.gate + r * b.gate_row_bytes;
    const u8* uw = b.up + r * b.up_row_bytes;
    u32 end = offsets[slot + 1];
    for (u32 c = offsets[slot]; c < end; c += MOE_GROUP) {
        const float* xs[MOE_GROUP];
        u32 ids[MOE_GROUP];
        int nt = moe_chunk(order, c, end, k, true, x, b.hidden, ids, xs);
        float g[MOE_GROUP], u[MOE_GROUP];
        if (mode != 2) rows_dot<F, MOE_GROUP>(gw, b.hidden, xs, nt, g);
        if (mode != 1) rows_dot<F, MOE_GROUP>(uw, b.hidden, xs, nt, u);
        if ((threadIdx.x & 31) == 0) {
#pragma unroll
            for (int t = 0; t < MOE_GROUP; t++) {
                if (t >= nt) break;
                float* o = act + (i64)ids[t] * b.inter + row;
                float gv = g[t], uv = u[t];
                if (mode == 2) gv = *o;
                else if (b.gate_bias) gv += b.gate_bias[r];
                if (mode != 1 && b.up_bias) uv += b.up_bias[r];
                *o = mode == 1 ? gv : glu_one(gv, uv, a.act, a.alpha, a.limit);
            }
        }
    }
}

template <int F>
__device__ void moe_down_grouped_impl(const float* __restrict__ act, const u32* __restrict__ order,
                                      const u32* __restrict__ offsets, BankView b,
                                      float* __restrict__ y) {
    int slot = blockIdx.y;
    int row = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    if (row >= b.hidden) return;
    i64 r = (i64)slot * b.hidden + row;
    const u8* dw = b.down + r * b.down_row_bytes;
    u32 end = offsets[slot + 1];
    for (u32 c = offsets[slot]; c < end; c += MOE_GROUP) {
        const float* xs[MOE_GROUP];
        u32 ids[MOE_GROUP];
        int nt = moe_chunk(order, c, end, 1, false, act, b.inter, ids, xs);
        float v[MOE_GROUP];
        rows_dot<F, MOE_GROUP>(dw, b.inter, xs, nt, v);
        if ((threadIdx.x & 31) == 0) {
#pragma unroll
            for (int t = 0; t < MOE_GROUP; t++) {
                if (t >= nt) break;
                float o = v[t];
                if (b.down_bias) o += b.down_bias[r];
                y[(i64)ids[t] * b.hidden + row] = o;
            }
        }
    }
}

#define MOE_GROUPED(fmt, F)                                                                     \
    KERNEL void moe_gate_up_grouped_##fmt(const float* x, const u32* order,                     \
                                                         const u32* offsets, int k, BankView b, \
                                                         MoeAct a, float* act, int mode) {      \
        KERNEL_ENTRY();                                                                         \
        moe_gate_up_grouped_impl<F>(x, order, offsets, k, b, a, act, mode);                     \
    }                                                                                           \
    KERNEL void moe_down_grouped_##fmt(const float* act, const u32* order,                      \
                                                      const u32* offsets, BankView b,           \
                                                      float* y) {                               \
        KERNEL_ENTRY();                                                                         \
        moe_down_grouped_impl<F>(act, order, offsets, b, y);                                    \
    }

MOE_GROUPED(f32, F_F32)
MOE_GROUPED(f16, F_F16)
MOE_GROUPED(bf16, F_BF16)
MOE_GROUPED(q8_0, F_Q8_0)
MOE_GROUPED(q4_0, F_Q4_0)
MOE_GROUPED(q4_1, F_Q4_1)
MOE_GROUPED(q5_0, F_Q5_0)
MOE_GROUPED(q5_1, F_Q5_1)
MOE_GROUPED(q4_k, F_Q4_K)
MOE_GROUPED(q5_k, F_Q5_K)
MOE_GROUPED(q6_k, F_Q6_K)
MOE_GROUPED(mxfp4, F_MXFP4)
