// Routed experts on the tensor cores in fast numerics, for the weight
// formats tcmm.cu takes (bf16, and the others decoded to bf16 in
// registers): moe.cu's computation,
//   act[i] = act(gate_e · x[t] + bg) ⊙ (up_e · x[t] + bu)   route i = t·k + r, e = its slot
//   y[i]   = down_e · act[i] + bd
// with each product formed as tcmm.cu forms it (weights and inputs rounded
// to bf16, f32 sums in tcmm.cu's order: chunks of 32 columns, segments of
// tc_seg_chunks, the segments added in order). A route's sums depend only
// on its own row and input (an MMA's output column depends only on its
// input column), so a route has the same bits computed alone (a decode
// step: a block per 16 rows of a route, a warp per segment) or grouped
// with the other routes of its expert (a batch: moe.cu's moe_group lists
// them; a block per TC_BATCH_ROWS rows of an expert, ROUTES routes a
// pass). The gate and up projections must share a format (stream/moe.rs
// picks); the activation and biases are moe_act_value's and
// moe_down_value's.

// The rows a stage reads: the gate/up stage two matrices of `inter` rows
// over `hidden` columns, the down stage one of `hidden` rows over `inter`.
struct TcExpertRows {
    const u8* w[2];
    i64 row_bytes[2];
    int rows, cols;
    i64 base;  // the slot's first bank row: slot · rows
};

__device__ __forceinline__ TcExpertRows tc_expert_rows(const BankView& b, bool gate_up, u32 slot) {
    TcExpertRows e;
    e.w[0] = gate_up ? b.gate : b.down;
    e.w[1] = b.up;
    e.row_bytes[0] = gate_up ? b.gate_row_bytes : b.down_row_bytes;
    e.row_bytes[1] = b.up_row_bytes;
    e.rows = gate_up ? b.inter : b.hidden;
    e.cols = gate_up ? b.hidden : b.inter;
    e.base = (i64)slot * e.rows;
    return e;
}

// Lane group q's reading point of matrix m's row r of the slot (the last
// row past the end: computed, never written).
template <int F>
__device__ __forceinline__ const u8* tc_expert_row(const TcExpertRows& e, int m, int r, int q) {
    return tc_lane_row<F>(e.w[m] + (e.base + min(r, e.rows - 1)) * e.row_bytes[m], q);
}

// One route (blockIdx.y) of a few: grid (ceil(rows / 16), routes), a warp
// per segment of the columns (blockDim.x = 32 · segments); MATS 2: the
// gate/up stage (x: the tokens, a route reading token i / k; out: act),
// 1: the down stage (x: act, a route's own row; out: y). The token sits in
// column 0 of the MMA's 8; the segments' sums meet in shared memory and
// are added in order.
template <int F, int MATS>
__device__ __forceinline__ void moe_tc1_impl(const float* __restrict__ x,
                                             const RouteOut* __restrict__ routes, int k,
                                             const SlotMask& only, const BankView& b,
                                             const MoeAct& a, float* __restrict__ out) {
    __shared__ float parts[MATS][TC_MAX_SEGS][16];
    KERNEL_ENTRY();
    int i = blockIdx.y;
    u32 slot = routes[i].slot;
    if (!slot_computed(only, slot, b.slots)) return;
    TcExpertRows e = tc_expert_rows(b, MATS == 2, slot);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int gr = lane >> 2, q = lane & 3;
    int r0 = blockIdx.x * 16;
    int chunks = e.cols / TC_CHUNK, per = tc_seg_chunks(e.cols);
    int c0 = warp * per, c1 = min(c0 + per, chunks);
    const u8* row_a[MATS];
    const u8* row_b[MATS];
#pragma unroll
    for (int m = 0; m < MATS; m++) {
        row_a[m] = tc_expert_row<F>(e, m, r0 + gr, q);
        row_b[m] = tc_expert_row<F>(e, m, r0 + gr + 8, q);
    }
    const float* xt = x + (i64)(MATS == 2 ? i / k : i) * e.cols + q * 8;
    bool token = gr == 0;
    float c[MATS][4];
#pragma unroll
    for (int m = 0; m < MATS; m++)
#pragma unroll
        for (int j = 0; j < 4; j++) c[m][j] = 0.0f;
    // ROUND chunks' weights loaded (and decoded) before their MMAs.
    constexpr int ROUND = MATS == 2 ? 2 : tc_round(F);
    for (int r = c0; r < c1; r += ROUND) {
        uint4 wa[MATS][ROUND], wb[MATS][ROUND], xv[ROUND];
#pragma unroll
        for (int j = 0; j < ROUND; j++)
            if (r + j < c1)
#pragma unroll
                for (int m = 0; m < MATS; m++) {
                    wa[m][j] = tc_w8<F>(row_a[m], r + j, q);
                    wb[m][j] = tc_w8<F>(row_b[m], r + j, q);
                }
#pragma unroll
        for (int j = 0; j < ROUND; j++)
            if (r + j < c1)
                xv[j] = token ? tc_load_x8(xt + (r + j) * TC_CHUNK) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < ROUND; j++)
            if (r + j < c1)
#pragma unroll
                for (int m = 0; m < MATS; m++) tc_chunk(c[m], wa[m][j], wb[m][j], xv[j]);
    }
    if (q == 0) {
#pragma unroll
        for (int m = 0; m < MATS; m++) {
            parts[m][warp][gr] = c[m][0];
            parts[m][warp][gr + 8] = c[m][2];
        }
    }
    __syncthreads();
    int segs = (chunks + per - 1) / per;
    if (threadIdx.x < 16) {
        int o = r0 + threadIdx.x;
        float total[MATS];
#pragma unroll
        for (int m = 0; m < MATS; m++) {
            total[m] = 0.0f;
            for (int s = 0; s < segs; s++) total[m] += parts[m][s][threadIdx.x];
        }
        if (o < e.rows) {
            if (MATS == 2) out[(i64)i * e.rows + o] = moe_act_value(b, a, e.base + o, total[0], total[1]);
            else out[(i64)i * e.rows + o] = moe_down_value(b, e.base + o, total[0]);
        }
    }
}

// The routes of one expert (blockIdx.y, moe.cu's order/offsets), a block
// per TC_BATCH_ROWS rows: warp w takes rows 16w .. 16w + 15 for every
// route, ROUTES (NT tiles of 8) a pass, walking all the chunks and closing
// a segment every tc_seg_chunks, as tcmm.cu's matmul_tc_impl; a chunk of
// the pass's inputs is rounded to bf16 once, into shared memory
// (double-buffered), and each warp's next chunk of weights loaded while
// this one's MMAs run. MATS as moe_tc1_impl's.
template <int F, int MATS, int NT>
__device__ __forceinline__ void moe_tc_grouped_impl(const float* __restrict__ x,
                                                    const u32* __restrict__ order,
                                                    const u32* __restrict__ offsets, int k,
                                                    const BankView& b, const MoeAct& a,
                                                    float* __restrict__ out) {
    constexpr int ROUTES = NT * 8;
    __shared__ __align__(16) uint4 xs[2][ROUTES][TC_CHUNK / 8];
    __shared__ u32 ids[ROUTES];
    KERNEL_ENTRY();
    u32 slot = blockIdx.y;
    u32 begin = offsets[slot], end = offsets[slot + 1];
    if (begin == end) return;
    TcExpertRows e = tc_expert_rows(b, MATS == 2, slot);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int gr = lane >> 2, q = lane & 3;
    int r0 = blockIdx.x * TC_BATCH_ROWS + warp * 16;
    int chunks = e.cols / TC_CHUNK, per = tc_seg_chunks(e.cols);
    const u8* row_a[MATS];
    const u8* row_b[MATS];
#pragma unroll
    for (int m = 0; m < MATS; m++) {
        row_a[m] = tc_expert_row<F>(e, m, r0 + gr, q);
        row_b[m] = tc_expert_row<F>(e, m, r0 + gr + 8, q);
    }
    // This thread's share of the staging: route st_t of the pass, 8
    // values at st_q (threads past ROUTES · 4 stage nothing).
    int st_t = threadIdx.x >> 2, st_q = threadIdx.x & 3;
    bool stager = st_t < ROUTES;
    for (u32 p = begin; p < end; p += ROUTES) {
        int count = (int)min((u32)ROUTES, end - p);
        __syncthreads();  // the last pass's reads of ids and xs are done
        // Past the pass's routes, its first again: computed, never written.
        if (threadIdx.x < ROUTES) ids[threadIdx.x] = order[p + (threadIdx.x < count ? threadIdx.x : 0)];
        __syncthreads();
        const float* xt = x;
        if (stager) xt += (i64)(MATS == 2 ? ids[st_t] / k : ids[st_t]) * e.cols + st_q * 8;
        float c[MATS][NT][4], total[MATS][NT][4];
#pragma unroll
        for (int m = 0; m < MATS; m++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int v = 0; v < 4; v++) c[m][j][v] = total[m][j][v] = 0.0f;
        if (stager) xs[0][st_t][st_q] = tc_load_x8(xt);
        uint4 wa[MATS], wb[MATS];
#pragma unroll
        for (int m = 0; m < MATS; m++) {
            wa[m] = tc_w8<F>(row_a[m], 0, q);
            wb[m] = tc_w8<F>(row_b[m], 0, q);
        }
        __syncthreads();
        for (int kc = 0; kc < chunks; kc++) {
            bool more = kc + 1 < chunks;
            uint4 xn = make_uint4(0, 0, 0, 0), na[MATS], nb[MATS];
            if (more) {
                if (stager) xn = tc_load_x8(xt + (kc + 1) * TC_CHUNK);
#pragma unroll
                for (int m = 0; m < MATS; m++) {
                    na[m] = tc_w8<F>(row_a[m], kc + 1, q);
                    nb[m] = tc_w8<F>(row_b[m], kc + 1, q);
                }
            }
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int m = 0; m < MATS; m++) tc_chunk(c[m][j], wa[m], wb[m], xs[kc & 1][j * 8 + gr][q]);
            if ((kc + 1) % per == 0 || !more) {
#pragma unroll
                for (int m = 0; m < MATS; m++)
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int v = 0; v < 4; v++) {
                            total[m][j][v] += c[m][j][v];
                            c[m][j][v] = 0.0f;
                        }
            }
            if (more) {
                if (stager) xs[(kc + 1) & 1][st_t][st_q] = xn;
#pragma unroll
                for (int m = 0; m < MATS; m++) {
                    wa[m] = na[m];
                    wb[m] = nb[m];
                }
            }
            __syncthreads();
        }
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int v = 0; v < 4; v++) {
                int o = r0 + gr + (v >> 1) * 8, t = j * 8 + 2 * q + (v & 1);
                if (o < e.rows && t < count) {
                    i64 at = (i64)ids[t] * e.rows + o;
                    if (MATS == 2) out[at] = moe_act_value(b, a, e.base + o, total[0][j][v], total[MATS - 1][j][v]);
                    else out[at] = moe_down_value(b, e.base + o, total[0][j][v]);
                }
            }
    }
}

// Routes a pass of the grouped kernels: 32 for gate/up (two matrices'
// sums held), 64 for down.
#define TC_MOE_GATE_UP_NT 4
#define TC_MOE_DOWN_NT 8

// The kernels of expert format F, named after the format. Few routes:
// grid (ceil(rows / 16), routes), 32 · tc_segments(cols) threads;
// grouped: grid (ceil(rows / TC_BATCH_ROWS), slots), TC_BATCH_WARPS warps.
#define TC_MOE_KERNELS(fmt, F)                                                                   \
    KERNEL void __launch_bounds__(TC_MAX_SEGS * 32)                                              \
        moe_gate_up_tc1_##fmt(const float* x, const RouteOut* routes, int k, SlotMask only,      \
                              BankView b, MoeAct a, float* act) {                                \
        moe_tc1_impl<F, 2>(x, routes, k, only, b, a, act);                                       \
    }                                                                                            \
    KERNEL void __launch_bounds__(TC_MAX_SEGS * 32)                                              \
        moe_down_tc1_##fmt(const float* act, const RouteOut* routes, SlotMask only, BankView b,  \
                           float* y) {                                                           \
        moe_tc1_impl<F, 1>(act, routes, 1, only, b, MoeAct{}, y);                                \
    }                                                                                            \
    KERNEL void __launch_bounds__(TC_BATCH_WARPS * 32)                                           \
        moe_gate_up_tc_##fmt(const float* x, const u32* order, const u32* offsets, int k,        \
                             BankView b, MoeAct a, float* act) {                                 \
        moe_tc_grouped_impl<F, 2, TC_MOE_GATE_UP_NT>(x, order, offsets, k, b, a, act);           \
    }                                                                                            \
    KERNEL void __launch_bounds__(TC_BATCH_WARPS * 32)                                           \
        moe_down_tc_##fmt(const float* act, const u32* order, const u32* offsets, BankView b,    \
                          float* y) {                                                            \
        moe_tc_grouped_impl<F, 1, TC_MOE_DOWN_NT>(act, order, offsets, 1, b, MoeAct{}, y);       \
    }

TC_MOE_KERNELS(f32, F_F32)
TC_MOE_KERNELS(f16, F_F16)
TC_MOE_KERNELS(bf16, F_BF16)
TC_MOE_KERNELS(q4_0, F_Q4_0)
TC_MOE_KERNELS(q4_1, F_Q4_1)
TC_MOE_KERNELS(q5_0, F_Q5_0)
TC_MOE_KERNELS(q5_1, F_Q5_1)
TC_MOE_KERNELS(q4_k, F_Q4_K)
TC_MOE_KERNELS(q5_k, F_Q5_K)
TC_MOE_KERNELS(q6_k, F_Q6_K)
