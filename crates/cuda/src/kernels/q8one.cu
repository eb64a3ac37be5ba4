// One token's fast-numerics products (the decode step) for Q8_0 and MXFP4
// rows up to ONE_MAX_COLS wide: the sums of q8_rows_dot (q8dot.cu) in its
// canonical order — per block the exact integer Σ c·q, per chunk of
// Q8_CHUNK blocks part = fmaf((float)Σ, dw · dx, part) from 0 block by
// block, the row's total the chunks' parts added in order — so the same
// bits as the batched and tensor-core kernels, with the work laid out for
// HBM bandwidth instead of one row per warp:
//
// - A warp takes units (a row; a gate row and an up row) one after another,
//   grid-stride over the units of the launch (the grid is as many blocks
//   as the GPU holds at once, so there is no tail wave). As soon as a
//   unit's integer sums are formed it issues the weight loads (codes and
//   scales) of its next unit, and the shuffles and f32 sums of the
//   reduction run while those bytes are in flight. The token's codes and
//   scales, shared by every row and so in the L1 or L2, are read when a
//   unit's sums are formed (holding them across would cost registers, and
//   with them warps).
//
// Used for Q8_0 (see kernels.rs `one_token_kernels`): MXFP4's products are
// bound by the instructions of their nibble decoding, and run slower here.
// - Lane l owns block l of each stretch of 32 blocks. MXFP4: the block's 16
//   code bytes, one coalesced load for the warp. Q8_0: the 16-byte pieces
//   at 16·l and 512 + 16·l of the stretch's 1024 code bytes (two coalesced
//   loads: halves of blocks l/2 and 16 + l/2); the halves' integer sums
//   meet by one shuffle, and even lanes own blocks 0..15, odd lanes 16..31.
// - The blocks of a chunk sit in lanes head + step·u (u = 0..3; step 1 for
//   MXFP4, 2 for Q8_0); the chunk's fmaf chain passes up from lane to lane,
//   the last stores the chunk's part in shared memory, and a lane a row adds
//   the parts to the total in chunk order (one_reduce).

#define ONE_STRETCHES 4                              // stretches of 32 blocks a unit holds
#define ONE_MAX_COLS (ONE_STRETCHES * 32 * 32)       // 4096 elements
#define ONE_WARPS 4                                  // warps a block (128 threads)

template <int F>
struct OnePieces {
    static constexpr int n = F == F_Q8_0 ? 2 : 1;   // 16-byte code loads a lane, a stretch
    static constexpr int step = F == F_Q8_0 ? 2 : 1; // lanes between a chunk's blocks
};

// The weight loads of a unit (R rows' codes and raw scales), issued a
// unit ahead; the token's codes and scales, read when the unit's sums are
// formed (shared by every row, so from the L1 or L2), are not held across.
template <int F, int R>
struct OneLoads {
    uint4 w[ONE_STRETCHES][R][OnePieces<F>::n];
    u32 sw[ONE_STRETCHES][R];
    const signed char* xq;
    const float* xd;
};

// The block lane `lane` owns in stretch s.
template <int F>
__device__ __forceinline__ int one_block(int s, int lane) {
    return F == F_Q8_0 ? s * 32 + (lane & 1) * 16 + (lane >> 1) : s * 32 + lane;
}

// The lane holding chunk c (0..7) of a stretch's first block.
template <int F>
__device__ __forceinline__ int one_head(int c) {
    return F == F_Q8_0 ? (c < 4 ? 8 * c : 8 * (c - 4) + 1) : 4 * c;
}

template <int F, int R>
__device__ __forceinline__ void one_load(const u8* const* rows, int cols,
                                         const signed char* __restrict__ xq,
                                         const float* __restrict__ xd, OneLoads<F, R>& L) {
    int lane = threadIdx.x & 31, nb = cols / 32;
    const uint4 z4 = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int s = 0; s < ONE_STRETCHES; s++) {
        if (s * 32 >= nb) break;  // uniform over the warp
        int ob = one_block<F>(s, lane);
        bool own = ob < nb;
        if (F == F_Q8_0) {
            // Q8_0 codes are 32 bytes a block, the token's too (natural
            // order): piece A is half lane & 1 of block s·32 + lane / 2,
            // piece B the same half of the block 16 further.
            int ba = s * 32 + (lane >> 1);
            bool va = ba < nb, vb = ba + 16 < nb;
            i64 off = (i64)s * 1024 + 16 * lane;
#pragma unroll
            for (int r = 0; r < R; r++) {
                L.w[s][r][0] = va ? ld_stream_u4(rows[r] + off) : z4;
                L.w[s][r][OnePieces<F>::n - 1] = vb ? ld_stream_u4(rows[r] + off + 512) : z4;
            }
        } else {
#pragma unroll
            for (int r = 0; r < R; r++)
                L.w[s][r][0] = own ? ld_stream_u4(split_codes<F>(rows[r], ob)) : z4;
        }
#pragma unroll
        for (int r = 0; r < R; r++) L.sw[s][r] = own ? q8_load_scale<F>(rows[r], cols, ob) : 0u;
    }
    L.xq = xq;
    L.xd = xd;
}

// A unit's per-block values: (float)Σ c·q of the lane's own block and
// dw · dx, for each stretch and row.
template <int R>
struct OneSums {
    float s[ONE_STRETCHES][R];
    float f[ONE_STRETCHES][R];
};

template <int F, int R>
__device__ __forceinline__ void one_sums(const OneLoads<F, R>& L, int cols, Mxfp4Tables tables,
                                         OneSums<R>& S) {
    int lane = threadIdx.x & 31, nb = cols / 32;
    const int4 zi = make_int4(0, 0, 0, 0);
    // The token's codes matching the lane's pieces, and its block's scale,
    // every stretch's issued before any is used.
    int4 x[ONE_STRETCHES][2];
    float dx[ONE_STRETCHES];
#pragma unroll
    for (int s = 0; s < ONE_STRETCHES; s++) {
        if (s * 32 >= nb) break;
        int ob = one_block<F>(s, lane);
        bool own = ob < nb;
        if (F == F_Q8_0) {
            int ba = s * 32 + (lane >> 1);
            i64 off = (i64)s * 1024 + 16 * lane;
            x[s][0] = ba < nb ? *(const int4*)(L.xq + off) : zi;
            x[s][1] = ba + 16 < nb ? *(const int4*)(L.xq + off + 512) : zi;
        } else {
            const int4* xp = (const int4*)(L.xq + (i64)ob * 32);
            x[s][0] = own ? xp[0] : zi;
            x[s][1] = own ? xp[1] : zi;
        }
        dx[s] = own ? L.xd[ob] : 0.0f;
    }
#pragma unroll
    for (int s = 0; s < ONE_STRETCHES; s++) {
        if (s * 32 >= nb) break;
#pragma unroll
        for (int r = 0; r < R; r++) {
            int v;
            if (F == F_Q8_0) {
                Q8Act<F> xa{x[s][0], zi}, xb{x[s][1], zi};
                int a = q8_piece_dot<F>(L.w[s][r][0], xa);
                int b = q8_piece_dot<F>(L.w[s][r][OnePieces<F>::n - 1], xb);
                a += __shfl_xor_sync(FULL_MASK, a, 1);
                b += __shfl_xor_sync(FULL_MASK, b, 1);
                v = (lane & 1) ? b : a;
            } else {
                Q8Act<F> xa{x[s][0], x[s][1]};
                v = q8_piece_dot<F>(L.w[s][r][0], xa, tables);
            }
            S.s[s][r] = (float)v;
            S.f[s][r] = q8_weight_scale<F>(L.sw[s][r]) * dx[s];
        }
    }
}

// The rows' totals in the canonical order; every lane ends with them.
// As q8_rows_dot1 (q8dot.cu) forms them: a chunk's fmaf chain passed from
// block to block (q8_chunk_part, STEP lanes apart), ending in the lane of
// its last block, which stores the chunk's part in shared memory in chunk
// order; lane r then adds row r's parts (q8_add_parts).
template <int F, int R>
__device__ __forceinline__ void one_reduce(const OneSums<R>& S, int cols, float* acc) {
    constexpr int STEP = OnePieces<F>::step;
    constexpr int CHUNKS = 32 / Q8_CHUNK;              // chunks a stretch covers
    constexpr int SLOTS = ONE_STRETCHES * CHUNKS;      // a row's chunks
    __shared__ __align__(16) float parts_of_warp[ONE_WARPS][R][SLOTS];
    float(*parts)[SLOTS] = parts_of_warp[threadIdx.x >> 5];
    int lane = threadIdx.x & 31, nb = cols / 32;
    int pos = (lane / STEP) % Q8_CHUNK;                // the lane's block in its chunk
    int chunk = one_block<F>(0, lane) / Q8_CHUNK;      // its chunk in a stretch
#pragma unroll
    for (int s = 0; s < ONE_STRETCHES; s++) {
        if (s * 32 >= nb) {  // uniform: no blocks from here on
            q8_zero_parts<R, SLOTS>(parts, s * CHUNKS);
            break;
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            float p = q8_chunk_part(S.s[s][r], S.f[s][r], pos, STEP);
            if (pos == Q8_CHUNK - 1) parts[r][s * CHUNKS + chunk] = p;
        }
    }
    float total = q8_add_parts<R, SLOTS>(parts, 0.0f);
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = __shfl_sync(FULL_MASK, total, r);
}

// The units of a launch, one after another per warp (see the top). `Work`
// gives a unit's rows and token (`unit`, false: nothing to compute) and
// stores its totals (`write`, lane 0).
//
// EARLY (the kernel has not yet run KERNEL_ENTRY): the first unit's weight
// loads are issued before waiting for the kernel before this one, so they
// overlap its tail; then every thread of the block calls `before_wait`
// (work of the Work's own that reads nothing a kernel writes). Only for
// Work whose `unit` reads nothing a kernel writes (resident weights and
// the launch's own parameters): the token's codes and scales, which the
// previous kernel writes, are read after the wait (one_sums).
// WIDTH: the rows' width known when compiled (0: `cols`; see
// Q8_ONE_WIDE_MATMUL below).
template <int F, int R, bool EARLY, int WIDTH = 0, class Work>
__device__ __forceinline__ void one_token_units(const Work& wk, int units, int cols) {
    if (WIDTH) cols = WIDTH;
    int u = blockIdx.x * ONE_WARPS + (threadIdx.x >> 5);
    int stride = gridDim.x * ONE_WARPS;
    OneLoads<F, R> L;
    Mxfp4Tables tables = F == F_MXFP4 ? Mxfp4Tables::held() : Mxfp4Tables::constants();
    const u8* rows[R];
    const signed char* xq;
    const float* xd;
    bool live = false;
    if (EARLY) {
        live = u < units && wk.unit(u, rows, &xq, &xd);
        if (live) one_load<F, R>(rows, cols, xq, xd, L);
        wk.before_wait();  // every thread of the block
        KERNEL_ENTRY();  // every thread waits before any returns
        if (u >= units) return;  // uniform over the warp
    } else {
        if (u >= units) return;  // uniform over the warp
        live = wk.unit(u, rows, &xq, &xd);
        if (live) one_load<F, R>(rows, cols, xq, xd, L);
    }
    for (;;) {
        OneSums<R> S;
        if (live) one_sums<F, R>(L, cols, tables, S);
        int next = u + stride;
        bool next_live = next < units && wk.unit(next, rows, &xq, &xd);
        if (next_live) one_load<F, R>(rows, cols, xq, xd, L);
        if (live) {
            float acc[R];
            one_reduce<F, R>(S, cols, acc);
            if ((threadIdx.x & 31) == 0) wk.write(u, acc);
        }
        if (next >= units) break;
        u = next;
        live = next_live;
    }
}

// A MatGroup's rows (q, k and v one after another).
struct OneMat {
    const MatGroup& g;
    int cols;
    const signed char* xq;
    const float* xd;
    __device__ __forceinline__ int pick(int u, int* row) const {
        int r0 = g.rows[0], r1 = g.count > 1 ? g.rows[1] : 0;
        int m = u >= r0 + r1 ? 2 : u >= r0 ? 1 : 0;
        *row = u - (m == 2 ? r0 + r1 : m == 1 ? r0 : 0);
        return m;
    }
    __device__ __forceinline__ bool unit(int u, const u8** rows, const signed char** q,
                                         const float** d) const {
        int row, m = pick(u, &row);
        const u8* w = m == 2 ? g.w[2] : m == 1 ? g.w[1] : g.w[0];
        i64 rb = m == 2 ? g.row_bytes[2] : m == 1 ? g.row_bytes[1] : g.row_bytes[0];
        rows[0] = w + (i64)row * rb;
        *q = xq;
        *d = xd;
        return true;
    }
    __device__ __forceinline__ void before_wait() const {}
    __device__ __forceinline__ void write(int u, const float* acc) const {
        int row, m = pick(u, &row);
        float* out = m == 2 ? g.out[2] : m == 1 ? g.out[1] : g.out[0];
        const float* bias = m == 2 ? g.bias[2] : m == 1 ? g.bias[1] : g.bias[0];
        out[row] = bias ? acc[0] + bias[row] : acc[0];
    }
};

// Routed experts' gate and up rows (unit = route i, row), with the GLU.
struct OneGateUp {
    const signed char* xq;
    const float* xd;
    const RouteOut* routes;
    int k;
    const SlotMask& only;
    const BankView& b;
    const MoeAct& a;
    float* act;
    __device__ __forceinline__ bool unit(int u, const u8** rows, const signed char** q,
                                         const float** d) const {
        int i = u / b.inter, row = u - i * b.inter;
        u32 slot = routes[i].slot;
        if (!slot_computed(only, slot, b.slots)) return false;
        i64 r = (i64)slot * b.inter + row;
        rows[0] = b.gate + r * b.gate_row_bytes;
        rows[1] = b.up + r * b.up_row_bytes;
        int t = i / k;
        *q = xq + (i64)t * b.hidden;
        *d = xd + (i64)t * (b.hidden / 32);
        return true;
    }
    __device__ __forceinline__ void before_wait() const {}
    __device__ __forceinline__ void write(int u, const float* acc) const {
        int i = u / b.inter, row = u - i * b.inter;
        i64 r = (i64)routes[i].slot * b.inter + row;
        act[(i64)i * b.inter + row] = moe_act_value(b, a, r, acc[0], acc[1]);
    }
};

// Routed experts' down rows (unit = route i, row) over the routes'
// quantized activations.
struct OneDown {
    const signed char* aq;
    const float* ad;
    const RouteOut* routes;
    const SlotMask& only;
    const BankView& b;
    float* y;
    __device__ __forceinline__ bool unit(int u, const u8** rows, const signed char** q,
                                         const float** d) const {
        int i = u / b.hidden, row = u - i * b.hidden;
        u32 slot = routes[i].slot;
        if (!slot_computed(only, slot, b.slots)) return false;
        rows[0] = b.down + ((i64)slot * b.hidden + row) * b.down_row_bytes;
        *q = aq + (i64)i * b.inter;
        *d = ad + (i64)i * (b.inter / 32);
        return true;
    }
    __device__ __forceinline__ void before_wait() const {}
    __device__ __forceinline__ void write(int u, const float* acc) const {
        int i = u / b.hidden, row = u - i * b.hidden;
        i64 r = (i64)routes[i].slot * b.hidden + row;
        y[(i64)i * b.hidden + row] = moe_down_value(b, r, acc[0]);
    }
};

// One token's products of format F, named with TAIL after the format's
// name; W: the rows' width when compiled for one (Q8_ONE_WIDE_MATMUL
// below), else 0 (the `cols` argument).
#define Q8_ONE_MATMUL(fmt, F, TAIL, W)                                                           \
    KERNEL void __launch_bounds__(ONE_WARPS * 32)                                                \
        matmul1_q8x_##fmt##TAIL(MatGroup g, int cols, const signed char* xq, const float* xd) {  \
        int units = g.rows[0] + (g.count > 1 ? g.rows[1] : 0) + (g.count > 2 ? g.rows[2] : 0);   \
        one_token_units<F, 1, true, W>(OneMat{g, W ? W : cols, xq, xd}, units, W ? W : cols);    \
    }
#define Q8_ONE_KERNELS(fmt, F)                                                                   \
    Q8_ONE_MATMUL(fmt, F, , 0)                                                                   \
    KERNEL void __launch_bounds__(ONE_WARPS * 32) moe_gate_up1_q8x_##fmt(                        \
        const signed char* xq, const float* xd, const RouteOut* routes, int k, int n_routes,    \
        SlotMask only, BankView b, MoeAct a, float* act) {                                       \
        KERNEL_ENTRY();                                                                          \
        one_token_units<F, 2, false>(OneGateUp{xq, xd, routes, k, only, b, a, act}, n_routes * b.inter, \
                              b.hidden);                                                         \
    }                                                                                            \
    KERNEL void __launch_bounds__(ONE_WARPS * 32)                                                \
        moe_down1_q8x_##fmt(const signed char* aq, const float* ad, const RouteOut* routes,      \
                            int n_routes, SlotMask only, BankView b, float* y) {                 \
        KERNEL_ENTRY();                                                                          \
        one_token_units<F, 1, false>(OneDown{aq, ad, routes, only, b, y}, n_routes * b.hidden, b.inter); \
    }

Q8_ONE_KERNELS(q8_0, F_Q8_0)
Q8_ONE_KERNELS(mxfp4, F_MXFP4)

// One token's products over rows of a width known when compiled
// (kernels.rs `OneSet::matmul_for`): gpt-oss's q/k/v and router rows and
// output head (2880 wide) and its o projection (4096). The same
// instructions with the width a constant, so the same bits, and ptxas
// folds the stretch count, the bounds checks and the address arithmetic
// (as q8dot.cu's Q8_WIDE_KERNELS).
#define Q8_ONE_WIDE_MATMUL(fmt, F, W) Q8_ONE_MATMUL(fmt, F, _w##W, W)

Q8_ONE_WIDE_MATMUL(q8_0, F_Q8_0, 2880)
Q8_ONE_WIDE_MATMUL(q8_0, F_Q8_0, 4096)

// One token's q, k and v products with the rope of q and k and the cache
// writes of k and v that follow them in a decode step, in one launch
// (fusion.rs `Pending::QkvRope`, instead of matmul1_q8x_q8_0 then
// rope_kv; opt-in, TURBOSPARK_CUDA_QKV_ROPE=1: on an H200 it decoded at
// the separate launches' speed, BENCHMARKS.md, thirty-ninth session). A
// unit is two rows whose totals meet in one warp: for q and k, the rows
// of a rotated pair — dimensions a and b of head h (NeoX: j
// and j + pairs; interleaved: 2j and 2j + 1) — and for v, rows 2i and
// 2i + 1. Lane 0 adds each row's bias to its total as matmul1's write
// does, rotates the pair as rope_kv does (ra = xa·c − xb·s, rb = xb·c +
// xa·s, each product and sum rounded alone), stores the roped values in
// place of the products and, for k, in its cache row, and stores v's
// values and their cache copies as kv_write does: the same values as the
// separate launches, element for element. Every pair is rotated (the
// launch is taken only when the rope spans the whole head). The
// rotations at the step's position, (cos, sin) in f32 from the f64
// formula of rope_cos_sin, are formed by the block into shared memory
// while the first weights are in flight, before the wait (`before_wait`).
struct QkvRope {
    void* cache[2];  // k's cache, v's
    int f16[2];
    int capacity[2];
    int first_pos;   // the position when no recorded step gives it
    int heads[2];    // q's heads, k's
    int head_dim;
};

struct OneQkvRope {
    const MatGroup& g;
    const QkvRope& r;
    const RopeParams& p;
    const signed char* xq;
    const float* xd;
    int pos;
    float2* rot;  // shared: pair j's (cos, sin) at `pos`
    int units_q, units_k;
    // Pair j of head h of q (m = 0) or k (m = 1) for unit u < units_q + units_k.
    __device__ __forceinline__ void pair(int u, int* m, int* h, int* j, int* a, int* b) const {
        *m = u >= units_q;
        int i = *m ? u - units_q : u;
        *h = i / p.pairs;
        *j = i - *h * p.pairs;
        *a = p.kind == ROPE_NEOX ? *j : 2 * *j;
        *b = p.kind == ROPE_NEOX ? *j + p.pairs : 2 * *j + 1;
    }
    __device__ __forceinline__ bool unit(int u, const u8** rows, const signed char** q,
                                         const float** d) const {
        if (u < units_q + units_k) {
            int m, h, j, a, b;
            pair(u, &m, &h, &j, &a, &b);
            const u8* w = m ? g.w[1] : g.w[0];
            i64 rb = m ? g.row_bytes[1] : g.row_bytes[0];
            rows[0] = w + (i64)(h * r.head_dim + a) * rb;
            rows[1] = w + (i64)(h * r.head_dim + b) * rb;
        } else {
            int i = u - units_q - units_k;
            rows[0] = g.w[2] + (i64)(2 * i) * g.row_bytes[2];
            rows[1] = rows[0] + g.row_bytes[2];
        }
        *q = xq;
        *d = xd;
        return true;
    }
    __device__ __forceinline__ void before_wait() const {
        for (int j = threadIdx.x; j < p.pairs; j += blockDim.x) {
            float c, s;
            rope_cos_sin(p, pos, j, &c, &s);
            rot[j] = make_float2(c, s);
        }
        __syncthreads();
    }
    __device__ __forceinline__ void write(int u, const float* acc) const {
        if (u < units_q + units_k) {
            int m, h, j, a, b;
            pair(u, &m, &h, &j, &a, &b);
            float* out = m ? g.out[1] : g.out[0];
            const float* bias = m ? g.bias[1] : g.bias[0];
            int at = h * r.head_dim;
            float xa = bias ? acc[0] + bias[at + a] : acc[0];
            float xb = bias ? acc[1] + bias[at + b] : acc[1];
            float2 cs = rot[j];
            float ra = __fsub_rn(__fmul_rn(xa, cs.x), __fmul_rn(xb, cs.y));
            float rb = __fadd_rn(__fmul_rn(xb, cs.x), __fmul_rn(xa, cs.y));
            out[at + a] = ra;
            out[at + b] = rb;
            if (m) {
                i64 row = (i64)(pos % r.capacity[0]) * g.rows[1] + at;
                cache_store(r.cache[0], r.f16[0], row + a, ra);
                cache_store(r.cache[0], r.f16[0], row + b, rb);
            }
        } else {
            int i = 2 * (u - units_q - units_k);
            const float* bias = g.bias[2];
            float v0 = bias ? acc[0] + bias[i] : acc[0];
            float v1 = bias ? acc[1] + bias[i + 1] : acc[1];
            g.out[2][i] = v0;
            g.out[2][i + 1] = v1;
            i64 row = (i64)(pos % r.capacity[1]) * g.rows[2];
            cache_store(r.cache[1], r.f16[1], row + i, v0);
            cache_store(r.cache[1], r.f16[1], row + i + 1, v1);
        }
    }
};

// W: the rows' width when compiled for one, else 0 (the `cols` argument).
// `step`, when set, holds a recorded decode step's {token, position}; it is
// written before the step's first kernel, so it is read before the wait.
#define Q8_ONE_QKV_ROPE(TAIL, W)                                                                 \
    KERNEL void __launch_bounds__(ONE_WARPS * 32)                                                \
        matmul1_q8x_q8_0_rope##TAIL(MatGroup g, int cols, const signed char* xq, const float* xd, \
                                    QkvRope r, RopeParams p, const int* step) {                  \
        __shared__ float2 rot[ROPE_MAX_PAIRS];                                                   \
        OneQkvRope wk{g, r, p, xq, xd, step ? step[1] : r.first_pos, rot,                       \
                      r.heads[0] * p.pairs, r.heads[1] * p.pairs};                               \
        int units = wk.units_q + wk.units_k + g.rows[2] / 2;                                     \
        one_token_units<F_Q8_0, 2, true, W>(wk, units, W ? W : cols);                            \
    }

Q8_ONE_QKV_ROPE(, 0)
Q8_ONE_QKV_ROPE(_w2880, 2880)

// One token's router product and its routes in one launch (fusion of
// matmul1_q8x_q8_0, its bias and `route`; stream/moe.rs `route`, opt-in with
// TURBOSPARK_CUDA_FUSE=1: the separate launches were faster on an H200,
// BENCHMARKS.md, twelfth session): the product
// as matmul1's (g holds the router matrix alone, with its bias), then the
// last block to finish — a ticket counted with atomicAdd after a
// __threadfence, the pattern of CUDA's threadFenceReduction sample, reset to
// 0 by that block for the next launch — routes the token from the logits
// the launch wrote, with route_token (route.cu), as `route` would. With
// `mq` set, the launch's warps also quantize the product's f32 input `x`
// (cols values) in MXFP4's code order into (mq, md), as quantize_q8_mxfp4
// does, for the routed experts that read it next. Same values as the
// separate launches, in the same order: only launches are saved.
// The launch's part after its product (every thread of every block calls
// it once the block's logits are written): the quantization of `x` when
// `mq` is set (warp w of the grid takes blocks w, w + warps, …), then the
// ticket, and the routing by the last block. Shared with q8cta.cu's
// router1c_q8x_q8_0.
__device__ __forceinline__ void router_finish(const MatGroup& g, int cols, const RouterParams& p,
                                              const float* correction,
                                              const float* expert_scale, RouteOut* out,
                                              u32* ticket, const float* x, signed char* mq,
                                              float* md) {
    if (mq) {
        int warps = blockDim.x >> 5, w = blockIdx.x * warps + (threadIdx.x >> 5);
        for (int b = w; b < cols / 32; b += gridDim.x * warps)
            quantize_q8_block<F_MXFP4>(x, b, mq, md);
    }
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (threadIdx.x < 32) {
        route_token(g.out[0], 0, p, correction, expert_scale, out);
        if (threadIdx.x == 0) *ticket = 0;
    }
}

KERNEL void __launch_bounds__(ONE_WARPS * 32)
    router1_q8x_q8_0(MatGroup g, int cols, const signed char* xq, const float* xd, RouterParams p,
                     const float* correction, const float* expert_scale, RouteOut* out,
                     u32* ticket, const float* x, signed char* mq, float* md) {
    one_token_units<F_Q8_0, 1, true>(OneMat{g, cols, xq, xd}, g.rows[0], cols);
    router_finish(g, cols, p, correction, expert_scale, out, ticket, x, mq, md);
}
