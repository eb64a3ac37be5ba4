// One token's routed-expert products for MXFP4 rows up to ONE_MAX_COLS
// wide with a lane per chunk: the sums of q8_rows_dot (q8dot.cu) in its
// canonical order — per block the exact integer Σ c·q, per chunk of
// Q8_CHUNK blocks part = fmaf((float)Σ, dw · dx, part) from 0 block by
// block, the row's total the chunks' parts added in order from 0 — so the
// same bits as the per-row, one-token and tensor-core kernels, with fewer
// instructions a byte (MXFP4's per-row kernels are bound by instructions:
// BENCHMARKS.md, "Why MXFP4 is bound by instructions"):
//
// - A warp takes units (a gate row and an up row; a down row) one after
//   another, grid-stride; lane c owns chunk c of the unit's rows (a row up
//   to 4096 wide has at most 32 chunks). A lane forms its chunk's part
//   alone — the 4 blocks' codes (four 16-byte loads), their 4 scale bytes
//   (one 32-bit load), the token's codes and scales of those blocks — with
//   no shuffle: the per-row kernels spend five shuffles a block moving
//   values to each chunk's head and eight a stretch gathering the parts.
// - Once its parts are formed, the warp issues its next unit's weight
//   loads (into the same registers), then adds the parts in chunk order
//   (each broadcast by a shuffle) and stores the unit's result while those
//   bytes are in flight.
//
// Chosen with TURBOSPARK_CUDA_ONE=chunk (kernels.rs `one_token_kernels`).
// (An earlier version gave a warp tiles of 8 units, a lane several chunks
// one after another: 360 blocks for gpt-oss's gate/up rows, 16 %
// occupancy, slower than the per-row kernels; BENCHMARKS.md.)

#define CHUNK_MAX (ONE_MAX_COLS / 32 / Q8_CHUNK)   // chunks of the widest row (32, a lane each)

// prmt.b32 as is: `__byte_perm` masks each selector nibble to 3 bits (the
// 4th asks prmt to replicate a sign) unless the compiler proves them
// clear, which it does not for the selectors below (their nibbles are 0..7
// by construction): raw, the 8 codes of a word take about 12 instructions
// in NVRTC's SASS for sm_90 instead of about 15 through `__byte_perm`.
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

// The eight MXFP4 nibbles of a code word as two words of four int8 values
// (`lo` from its low 16 bits, `hi` from its high 16), the same values as
// mxfp4_word (q8dot.cu) on each half, with the selectors of both halves
// formed at once (scripts/gpu/mxfp4_chunk_emulation.py checks every half).
__device__ __forceinline__ void mxfp4_words(u32 w, int* lo, int* hi) {
    u32 sel = w & 0x77777777u;                          // magnitudes' table indices, 0..7
    u32 sgn = ((w >> 1) & 0x44444444u) | 0x32103210u;   // byte n, or n + 4 (negative) when signed
    *lo = (int)prmt(prmt(MXFP4_LO0, MXFP4_LO1, sel), prmt(MXFP4_HI0, MXFP4_HI1, sel), sgn);
    u32 selh = sel >> 16, sgnh = sgn >> 16;
    *hi = (int)prmt(prmt(MXFP4_LO0, MXFP4_LO1, selh), prmt(MXFP4_HI0, MXFP4_HI1, selh), sgnh);
}

// Σ code · q of one MXFP4 block's 16 code bytes against its 32 quantized
// activations (stored in decode order, q8dot.cu): q8_piece_dot's integer
// sum, through mxfp4_words.
__device__ __forceinline__ int mxfp4_block_dot(uint4 w, int4 xlo, int4 xhi) {
    int a, b, s = 0;
    mxfp4_words(w.x, &a, &b);
    s = dp4a(a, xlo.x, s);
    s = dp4a(b, xlo.y, s);
    mxfp4_words(w.y, &a, &b);
    s = dp4a(a, xlo.z, s);
    s = dp4a(b, xlo.w, s);
    mxfp4_words(w.z, &a, &b);
    s = dp4a(a, xhi.x, s);
    s = dp4a(b, xhi.y, s);
    mxfp4_words(w.w, &a, &b);
    s = dp4a(a, xhi.z, s);
    s = dp4a(b, xhi.w, s);
    return s;
}

// The weight loads of chunk c of R rows (codes and raw scales), zeros
// past the row's last block; issued a unit ahead (see the top).
template <int R>
struct ChunkLoads {
    uint4 w[R][Q8_CHUNK];
    u32 sc[R];
};

template <int R>
__device__ __forceinline__ void chunk_load(const u8* const* rows, int cols, int c,
                                           ChunkLoads<R>& L) {
    int nb = cols / 32, b0 = c * Q8_CHUNK;
    const uint4 z4 = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint4* wp = (const uint4*)split_codes<F_MXFP4>(rows[r], b0);
#pragma unroll
        for (int u = 0; u < Q8_CHUNK; u++) L.w[r][u] = b0 + u < nb ? wp[u] : z4;
        // The chunk's 4 scale bytes (aligned: rows start 16-byte aligned and
        // b0 is a multiple of 4). Past the row's last block they are the
        // row's padding (device rows are padded to 16 bytes, at least as
        // many bytes as the last chunk lacks) and are not used.
        L.sc[r] = b0 < nb ? *(const u32*)split_scale<F_MXFP4>(rows[r], cols, b0) : 0u;
    }
}

// The parts of chunk c of the loaded rows against one token's quantized
// activations (read here: shared by every unit, so from the L1 or L2);
// 0 for a chunk past the row.
template <int R>
__device__ __forceinline__ void chunk_parts(const ChunkLoads<R>& L, int cols, int c,
                                            const signed char* __restrict__ xq,
                                            const float* __restrict__ xd, float* part) {
    int nb = cols / 32, b0 = c * Q8_CHUNK;
    const int4 zi = make_int4(0, 0, 0, 0);
    const int4* xp = (const int4*)(xq + (i64)b0 * 32);
    int4 x[Q8_CHUNK][2];
    float dx[Q8_CHUNK];
#pragma unroll
    for (int u = 0; u < Q8_CHUNK; u++) {
        bool in = b0 + u < nb;
        x[u][0] = in ? xp[2 * u] : zi;
        x[u][1] = in ? xp[2 * u + 1] : zi;
        dx[u] = in ? xd[b0 + u] : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < R; r++) part[r] = 0.0f;
#pragma unroll
    for (int u = 0; u < Q8_CHUNK; u++) {
        bool in = b0 + u < nb;
#pragma unroll
        for (int r = 0; r < R; r++) {
            int s = mxfp4_block_dot(L.w[r][u], x[u][0], x[u][1]);
            float dw = e8m0_half((u8)(L.sc[r] >> (8 * u)));
            if (in) part[r] = fmaf((float)s, dw * dx[u], part[r]);
        }
    }
}

// Where a warp stands in a launch's units: route i, its row, and what the
// route reads (kept while the route does not change: a division, the slot
// test and the token's pointers once a route, not once a unit).
struct ChunkAt {
    int i, row;
    int ci;         // the route the cached values below are for (-1: none)
    bool live;      // the route's slot exists and this call computes it
    u32 slot;
    const signed char* xq;
    const float* xd;
};

// Steps `at` to the unit `by` further (rows of `per` a route), refreshing
// the route's values when the route changes. `Src` gives a route's token
// codes and scales (`xq`/`xd`).
template <class Src>
__device__ __forceinline__ void chunk_step(ChunkAt& at, int by, int per, const RouteOut* routes,
                                           const SlotMask& only, int slots, const Src& src) {
    at.row += by;
    while (at.row >= per) {
        at.row -= per;
        at.i++;
    }
    if (at.i != at.ci) {
        at.ci = at.i;
        at.slot = routes[at.i].slot;
        at.live = at.slot < (u32)slots && !skipped(only, at.slot);
        src.token(at.i, &at.xq, &at.xd);
    }
}

// Lane 0's in-order sum of the warp's parts (each lane's part[r] stored
// first): acc = 0 + part of chunk 0 + part of chunk 1 + …, q8_rows_dot's
// order. Lanes past the row's chunks hold +0, which leaves the sum as it is
// (it is never −0: it starts at +0, and x + (−x) is +0), so the loop takes
// them in fours without a test.
template <int R>
__device__ __forceinline__ void chunk_total(float (*red)[32], const float* part, int nc,
                                            float* acc) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; r++) red[r][lane] = part[r];
    __syncwarp();
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            acc[r] = 0.0f;
            for (int c = 0; c < nc; c += 4) {
                float4 q = *(const float4*)&red[r][c];
                acc[r] += q.x;
                acc[r] += q.y;
                acc[r] += q.z;
                acc[r] += q.w;
            }
        }
    }
    __syncwarp();
}

// The token a gate/up route reads (route i of token i / k) and the
// activations a down route reads (its own).
struct GateUpSrc {
    const signed char* xq;
    const float* xd;
    int k, hidden;
    __device__ __forceinline__ void token(int i, const signed char** q, const float** d) const {
        int t = i / k;
        *q = xq + (i64)t * hidden;
        *d = xd + (i64)t * (hidden / 32);
    }
};
struct DownSrc {
    const signed char* aq;
    const float* ad;
    int inter;
    __device__ __forceinline__ void token(int i, const signed char** q, const float** d) const {
        *q = aq + (i64)i * inter;
        *d = ad + (i64)i * (inter / 32);
    }
};

// The routes' rows (gate and up: R = 2, `per` = inter rows a route, `cols`
// = hidden; down: R = 1, per = hidden, cols = inter), a warp a unit in
// turn, grid-stride (see the top); `store` gets a unit's totals (lane 0).
template <int R, class Src, class Store>
__device__ __forceinline__ void chunk_routes(int n_routes, int per, int cols,
                                             const RouteOut* routes, const SlotMask& only,
                                             const BankView& b, const Src& src,
                                             const Store& store) {
    __shared__ __align__(16) float red[ONE_WARPS][R][32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int nc = (cols / 32 + Q8_CHUNK - 1) / Q8_CHUNK;
    int units = n_routes * per;
    int u = blockIdx.x * ONE_WARPS + w;
    int stride = gridDim.x * ONE_WARPS;
    if (u >= units) return;  // uniform over the warp
    ChunkAt at{0, 0, -1, false, 0u, nullptr, nullptr};
    chunk_step(at, u, per, routes, only, b.slots, src);
    ChunkLoads<R> L;
    auto rows_of = [&](const ChunkAt& a, const u8** rows) {
        i64 r = (i64)a.slot * per + a.row;
        if (R == 2) {
            rows[0] = b.gate + r * b.gate_row_bytes;
            rows[R - 1] = b.up + r * b.up_row_bytes;
        } else {
            rows[0] = b.down + r * b.down_row_bytes;
        }
    };
    const u8* rows[R];
    if (at.live) {
        rows_of(at, rows);
        chunk_load<R>(rows, cols, lane, L);
    }
    for (;;) {
        float part[R];
        bool live = at.live;
        int i = at.i, row = at.row;
        u32 slot = at.slot;
        if (live) chunk_parts<R>(L, cols, lane, at.xq, at.xd, part);
        u += stride;
        bool more = u < units;
        if (more) {
            chunk_step(at, stride, per, routes, only, b.slots, src);
            if (at.live) {
                rows_of(at, rows);
                chunk_load<R>(rows, cols, lane, L);
            }
        }
        if (live) {
            float acc[R];
            chunk_total<R>(red[w], part, nc, acc);
            if (lane == 0) store(i, row, slot, acc);
        }
        if (!more) break;
    }
}

struct GateUpStore {
    const BankView& b;
    const MoeAct& a;
    float* act;
    __device__ __forceinline__ void operator()(int i, int row, u32 slot, const float* acc) const {
        i64 r = (i64)slot * b.inter + row;
        float g = acc[0], v = acc[1];
        if (b.gate_bias) g += b.gate_bias[r];
        if (b.up_bias) v += b.up_bias[r];
        act[(i64)i * b.inter + row] = glu_one(g, v, a.act, a.alpha, a.limit);
    }
};
struct DownStore {
    const BankView& b;
    float* y;
    __device__ __forceinline__ void operator()(int i, int row, u32 slot, const float* acc) const {
        i64 r = (i64)slot * b.hidden + row;
        y[(i64)i * b.hidden + row] = b.down_bias ? acc[0] + b.down_bias[r] : acc[0];
    }
};

extern "C" __global__ void __launch_bounds__(ONE_WARPS * 32)
    moe_gate_up1c_q8x_mxfp4(const signed char* xq, const float* xd, const RouteOut* routes, int k,
                            int n_routes, SlotMask only, BankView b, MoeAct a, float* act) {
    KERNEL_ENTRY();
    chunk_routes<2>(n_routes, b.inter, b.hidden, routes, only, b, GateUpSrc{xq, xd, k, b.hidden},
                    GateUpStore{b, a, act});
}

extern "C" __global__ void __launch_bounds__(ONE_WARPS * 32)
    moe_down1c_q8x_mxfp4(const signed char* aq, const float* ad, const RouteOut* routes,
                         int n_routes, SlotMask only, BankView b, float* y) {
    KERNEL_ENTRY();
    chunk_routes<1>(n_routes, b.hidden, b.inter, routes, only, b, DownSrc{aq, ad, b.inter},
                    DownStore{b, y});
}
