// One token's fast-numerics products (the decode step) for Q8_0 and MXFP4
// rows up to CTA_MAX_COLS wide, a block of threads a row (opt-in,
// `TURBOSPARK_CUDA_ONE=cta`; kernels.rs `one_token_kernels`), as an
// alternative to q8one.cu's warp a row. On an H200 (gpt-oss-20b shapes)
// they give the same bits and execute 37 % (expert gate/up) to 50 % (down)
// fewer instructions than the per-row kernels, but their registers (128 to
// 170 a thread: a group's 16 rows of loads) leave 10-16 % occupancy: the
// experts' time unchanged, the Q8_0 products slower (BENCHMARKS.md,
// eleventh session); fewer registers a group is the next step. The sums of
// q8_rows_dot (q8dot.cu)
// in its canonical order — per block the exact integer Σ c·q, per chunk of
// Q8_CHUNK blocks part = fmaf((float)Σ, dw · dx, part) from 0 block by
// block, the row's total the chunks' parts added in order — so the same
// bits as the batched and tensor-core kernels, with the work laid out for
// HBM bandwidth and few instructions a byte:
//
// - A block (CTA) takes groups of CTA_GROUP rows one after another, grid-
//   stride (the grid holds no more blocks than the GPU runs at once, each
//   with the same number of groups within one).
// - Thread t owns piece t of every row: the t-th 16 bytes of its codes (an
//   MXFP4 block; half of a Q8_0 block, whose halves' integer sums meet by
//   one shuffle) and the block's scale, so a warp's loads of a row are one
//   coalesced run; the block has a thread a piece, and holds
//   the token's codes of its piece in registers across rows.
// - Each thread loads its piece of the group's CTA_GROUP rows at once (the
//   next group's while the current one's totals are formed), forms each
//   block's integer sum and sets down (float)Σ and dw · dx in a shared
//   stash (a row of blocks each). After a barrier, lane j of warp 0 walks
//   stash row j block by block in the canonical order (part = fmaf(Σ, dw ·
//   dx, part) from 0 over each chunk, total += part chunk by chunk) — the
//   order written out sequentially, so the same bits as the shuffled form
//   of q8_rows_dot — and stores the row's total. The stash is double
//   buffered: the walk of one group overlaps the sums of the next, and one
//   barrier a group orders both.

#define CTA_GROUP 16                   // rows a group
#define CTA_MAX_PIECES 256             // pieces (threads) a row at most
#define CTA_MAX_COLS 4096              // Q8_0: 256 pieces; MXFP4: 128

// float2 a stash row: one a block, odd so that the rows that warp 0's
// lanes walk side by side fall in different banks.
__device__ __forceinline__ int cta_stride(int nb) { return nb % 2 ? nb : nb + 1; }

// The walk of the stash row at `p` (see the top); every lane that calls it
// ends with that row's total.
__device__ __forceinline__ float cta_walk(const float2* p, int nb) {
    float acc = 0.0f;
    for (int c = 0; c < nb; c += Q8_CHUNK) {
        float part = 0.0f;
#pragma unroll
        for (int u = 0; u < Q8_CHUNK; u++) {
            if (c + u < nb) {
                float2 v = p[c + u];
                part = fmaf(v.x, v.y, part);
            }
        }
        acc += part;
    }
    return acc;
}

// The rows of a group: row j < n starts at base[0] + j · step[0], or with
// `interleave` at base[j % 2] + (j / 2) · step[j % 2] (gate and up rows).
struct CtaRows {
    const u8* base[2];
    i64 step[2];
    int n;
    bool interleave;
    __device__ __forceinline__ const u8* row(int j) const {
        if (interleave) return (j & 1 ? base[1] : base[0]) + (i64)(j >> 1) * (j & 1 ? step[1] : step[0]);
        return base[0] + (i64)j * step[0];
    }
};

// The groups of a launch (see the top). `Work` gives the number of groups
// (`groups`), whether a group is computed (`live`: uniform over the block),
// where its rows lie (`rows`) and the token codes and scales it reads
// (`x`), and stores totals (`write`, called by lane j < CTA_GROUP of warp
// 0 with row j's total; every lane of warp 0 calls it, so that it may
// exchange totals between lanes).
//
// EARLY (the kernel has not yet run KERNEL_ENTRY): the first group's
// weight loads are issued before waiting for the kernel before this one,
// so they overlap its tail. Only for Work whose `live` and `rows` read
// nothing a kernel writes (resident weights and the launch's own
// parameters): the token's codes and scales, which the previous kernel
// writes, are read after the wait.
template <int F, bool EARLY, class Work>
__device__ __forceinline__ void cta_token_units(const Work& wk, int cols) {
    constexpr int P = Q8Pieces<F>::per_block;
    extern __shared__ float2 cta_stash[];
    int t = threadIdx.x, nb = cols / 32, stride = cta_stride(nb);
    bool own = t < nb * P;
    int b = t / P, h = t % P;
    int groups = wk.groups();
    int g = blockIdx.x;
    uint4 w[CTA_GROUP];
    u32 sw[CTA_GROUP];
    const uint4 z4 = make_uint4(0, 0, 0, 0);
    // The weight loads of group g (every thread; zeros where it owns no piece).
    auto load = [&](int g) {
        CtaRows rs = wk.rows(g);
#pragma unroll
        for (int j = 0; j < CTA_GROUP; j++) {
            const u8* row = rs.row(j);
            bool ok = j < rs.n && own;
            w[j] = ok ? *(const uint4*)(row + 16 * t) : z4;
            sw[j] = ok ? q8_load_scale<F>(row, cols, b) : 0u;
        }
    };
    bool live = g < groups && wk.live(g);
    if (live) load(g);
    if (EARLY) KERNEL_ENTRY();  // every thread waits (none returns early)
    const signed char* xq_held = nullptr;
    Q8Act<F> xa{make_int4(0, 0, 0, 0), make_int4(0, 0, 0, 0)};
    float dx = 0.0f;
    int buf = 0;
    for (; g < groups; g += gridDim.x) {  // uniform over the block
        float2* st = cta_stash + buf * CTA_GROUP * stride;
        if (live) {
            const signed char* xq;
            const float* xd;
            wk.x(g, &xq, &xd);
            if (xq != xq_held) {  // uniform
                if (own) {
                    xa = q8_load_act<F>(xq, b, h);
                    dx = xd[b];
                }
                xq_held = xq;
            }
#pragma unroll
            for (int j = 0; j < CTA_GROUP; j++) {
                int v = q8_piece_dot<F>(w[j], xa);
                if (P == 2) v += __shfl_xor_sync(FULL_MASK, v, 1);
                if (own && h == 0) st[j * stride + b] = make_float2((float)v, q8_weight_scale<F>(sw[j]) * dx);
            }
        }
        __syncthreads();  // the stash of g is whole; the walk of g - grid (other buffer) is done
        int next = g + gridDim.x;
        bool next_live = next < groups && wk.live(next);
        if (next_live) load(next);
        if (live && t < 32) {
            float acc = cta_walk(st + (t < CTA_GROUP ? t : 0) * stride, nb);
            wk.write(g, t, acc);
        }
        live = next_live;
        buf ^= 1;
    }
}

// A MatGroup's rows (q, k and v): each matrix's rows in groups of
// CTA_GROUP (its last group short), the matrices' groups one after another.
struct CtaMat {
    const MatGroup& g;
    const signed char* xq;
    const float* xd;
    __device__ __forceinline__ int rows_of(int m) const {
        return m < g.count ? (m == 2 ? g.rows[2] : m == 1 ? g.rows[1] : g.rows[0]) : 0;
    }
    __device__ __forceinline__ int groups_of(int m) const { return (rows_of(m) + CTA_GROUP - 1) / CTA_GROUP; }
    __device__ __forceinline__ int groups() const { return groups_of(0) + groups_of(1) + groups_of(2); }
    __device__ __forceinline__ bool live(int) const { return true; }
    // The group's matrix and first row.
    __device__ __forceinline__ int pick(int grp, int* row) const {
        int g0 = groups_of(0), g1 = groups_of(1);
        int m = grp >= g0 + g1 ? 2 : grp >= g0 ? 1 : 0;
        *row = (grp - (m == 2 ? g0 + g1 : m == 1 ? g0 : 0)) * CTA_GROUP;
        return m;
    }
    __device__ __forceinline__ CtaRows rows(int grp) const {
        int row, m = pick(grp, &row);
        const u8* w = m == 2 ? g.w[2] : m == 1 ? g.w[1] : g.w[0];
        i64 rb = m == 2 ? g.row_bytes[2] : m == 1 ? g.row_bytes[1] : g.row_bytes[0];
        CtaRows r;
        r.interleave = false;
        r.base[0] = r.base[1] = w + (i64)row * rb;
        r.step[0] = r.step[1] = rb;
        r.n = min(CTA_GROUP, rows_of(m) - row);
        return r;
    }
    __device__ __forceinline__ void x(int, const signed char** q, const float** d) const {
        *q = xq;
        *d = xd;
    }
    __device__ __forceinline__ void write(int grp, int j, float acc) const {
        int row, m = pick(grp, &row);
        row += j;
        if (j >= CTA_GROUP || row >= rows_of(m)) return;
        float* out = m == 2 ? g.out[2] : m == 1 ? g.out[1] : g.out[0];
        const float* bias = m == 2 ? g.bias[2] : m == 1 ? g.bias[1] : g.bias[0];
        out[row] = bias ? acc + bias[row] : acc;
    }
};

// Routed experts' gate and up rows with the GLU: a group is CTA_GROUP / 2
// rows of one route, its gate and up rows alternating (row j: the gate
// row of j / 2 when j is even, else the up row).
struct CtaGateUp {
    const signed char* xq;
    const float* xd;
    const RouteOut* routes;
    int k, n_routes;
    const SlotMask& only;
    const BankView& b;
    const MoeAct& a;
    float* act;
    __device__ __forceinline__ int per_route() const { return (b.inter + CTA_GROUP / 2 - 1) / (CTA_GROUP / 2); }
    __device__ __forceinline__ int groups() const { return n_routes * per_route(); }
    __device__ __forceinline__ bool live(int grp) const {
        u32 slot = routes[grp / per_route()].slot;
        return slot_computed(only, slot, b.slots);
    }
    __device__ __forceinline__ CtaRows rows(int grp) const {
        int i = grp / per_route(), r = (grp - i * per_route()) * (CTA_GROUP / 2);
        i64 rr = (i64)routes[i].slot * b.inter + r;
        CtaRows o;
        o.interleave = true;
        o.base[0] = b.gate + rr * b.gate_row_bytes;
        o.base[1] = b.up + rr * b.up_row_bytes;
        o.step[0] = b.gate_row_bytes;
        o.step[1] = b.up_row_bytes;
        o.n = 2 * min(CTA_GROUP / 2, b.inter - r);
        return o;
    }
    __device__ __forceinline__ void x(int grp, const signed char** q, const float** d) const {
        int t = grp / per_route() / k;
        *q = xq + (i64)t * b.hidden;
        *d = xd + (i64)t * (b.hidden / 32);
    }
    __device__ __forceinline__ void write(int grp, int j, float acc) const {
        float u = __shfl_down_sync(FULL_MASK, acc, 1);
        int i = grp / per_route(), r = (grp - i * per_route()) * (CTA_GROUP / 2) + j / 2;
        if (j >= CTA_GROUP || j % 2 || r >= b.inter) return;
        i64 rr = (i64)routes[i].slot * b.inter + r;
        act[(i64)i * b.inter + r] = moe_act_value(b, a, rr, acc, u);
    }
};

// Routed experts' down rows (CTA_GROUP rows of one route a group) over the
// routes' quantized activations.
struct CtaDown {
    const signed char* aq;
    const float* ad;
    const RouteOut* routes;
    int n_routes;
    const SlotMask& only;
    const BankView& b;
    float* y;
    __device__ __forceinline__ int per_route() const { return (b.hidden + CTA_GROUP - 1) / CTA_GROUP; }
    __device__ __forceinline__ int groups() const { return n_routes * per_route(); }
    __device__ __forceinline__ bool live(int grp) const {
        u32 slot = routes[grp / per_route()].slot;
        return slot_computed(only, slot, b.slots);
    }
    __device__ __forceinline__ CtaRows rows(int grp) const {
        int i = grp / per_route(), r = (grp - i * per_route()) * CTA_GROUP;
        CtaRows o;
        o.interleave = false;
        o.base[0] = o.base[1] = b.down + ((i64)routes[i].slot * b.hidden + r) * b.down_row_bytes;
        o.step[0] = o.step[1] = b.down_row_bytes;
        o.n = min(CTA_GROUP, b.hidden - r);
        return o;
    }
    __device__ __forceinline__ void x(int grp, const signed char** q, const float** d) const {
        int i = grp / per_route();
        *q = aq + (i64)i * b.inter;
        *d = ad + (i64)i * (b.inter / 32);
    }
    __device__ __forceinline__ void write(int grp, int j, float acc) const {
        int i = grp / per_route(), r = (grp - i * per_route()) * CTA_GROUP + j;
        if (j >= CTA_GROUP || r >= b.hidden) return;
        i64 rr = (i64)routes[i].slot * b.hidden + r;
        y[(i64)i * b.hidden + r] = moe_down_value(b, rr, acc);
    }
};

#define Q8_CTA_KERNELS(fmt, F)                                                                   \
    KERNEL void __launch_bounds__(CTA_MAX_PIECES)                                                \
        matmul1c_q8x_##fmt(MatGroup g, int cols, const signed char* xq, const float* xd) {        \
        cta_token_units<F, true>(CtaMat{g, xq, xd}, cols);                                       \
    }                                                                                            \
    KERNEL void __launch_bounds__(CTA_MAX_PIECES) moe_gate_up1c_q8x_##fmt(                        \
        const signed char* xq, const float* xd, const RouteOut* routes, int k, int n_routes,    \
        SlotMask only, BankView b, MoeAct a, float* act) {                                       \
        KERNEL_ENTRY();                                                                          \
        cta_token_units<F, false>(CtaGateUp{xq, xd, routes, k, n_routes, only, b, a, act}, b.hidden); \
    }                                                                                            \
    KERNEL void __launch_bounds__(CTA_MAX_PIECES)                                                \
        moe_down1c_q8x_##fmt(const signed char* aq, const float* ad, const RouteOut* routes,      \
                            int n_routes, SlotMask only, BankView b, float* y) {                 \
        KERNEL_ENTRY();                                                                          \
        cta_token_units<F, false>(CtaDown{aq, ad, routes, n_routes, only, b, y}, b.inter);       \
    }

Q8_CTA_KERNELS(q8_0, F_Q8_0)
Q8_CTA_KERNELS(mxfp4, F_MXFP4)

// router1_q8x_q8_0 (q8one.cu) with this file's product: the router's
// logits, then router_finish (the quantization, the ticket, the routing).
KERNEL void __launch_bounds__(CTA_MAX_PIECES)
    router1c_q8x_q8_0(MatGroup g, int cols, const signed char* xq, const float* xd, RouterParams p,
                     const float* correction, const float* expert_scale, RouteOut* out,
                     u32* ticket, const float* x, signed char* mq, float* md) {
    cta_token_units<F_Q8_0, true>(CtaMat{g, xq, xd}, cols);
    router_finish(g, cols, p, correction, expert_scale, out, ticket, x, mq, md);
}
