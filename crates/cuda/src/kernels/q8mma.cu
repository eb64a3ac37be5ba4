// One token's products on the integer tensor cores (mma.sync m16n8k32
// s8 · s8 → s32; sm_80 and later): the routed experts' MXFP4 rows, opt-in
// with TURBOSPARK_CUDA_MXFP4=mma (kernels.rs `mxfp4_tensor_cores`), and
// Q8_0 products (below, TURBOSPARK_CUDA_Q8=mma). The sums
// are q8dot.cu's, in its canonical order: per 32-element block b the exact
// integer v_b = Σ_j c[32b + j] · q[32b + j], per chunk of Q8_CHUNK blocks
//   part = fmaf((float)v_b, dw_b · dx_b, part)   from 0, block by block,
// and the row's total, from 0, the chunks' parts added in order. An
// integer sum is exact however it is formed, so a token's result has the
// bits q8dot.cu's and mmq.cu's kernels give it.
//
// Why: one token's MXFP4 products are bound by instructions, not by HBM
// (BENCHMARKS.md, seventeenth session: ~820 warp instructions a gate/up
// warp, ~264 of them nibble decoding and dp4a). Here an MMA forms the
// integer sums of 16 rows × 4 blocks × 8 codes at once.
//
// The integer sums. MXFP4 codes are not integers an MMA can take, so each
// 4-nibble half word h of the codes gives the two int8 words of q8dot.cu's
// `mxfp4_dot_word`, P = prmt(T1, h) and N = prmt(T2, h ^ 0x8888), whose
// bytes add up to the code values (doubled e2m1); Σ P·q + Σ N·q is the
// block's integer sum, from two MMAs into one accumulator.
//
// Fragments (PTX m16n8k32 .row.col, lane = 4g + q, as mmq.cu uses them):
// A a0 = (row g, k 4q..4q+3), a1 = (row g + 8, same k), a2 = (row g,
// k 16+4q..16+4q+3), a3 = (row g + 8, same); B b0 = (k 4q..4q+3, column
// g), b1 = (k 16+4q.., column g); C c0, c1 = (row g; columns 2q, 2q + 1),
// c2, c3 = (row g + 8; same). The k index is read as "block q of the
// chunk": MMA m (m = 0..3, the 4-byte code word m of a block) puts in
// lane (g, q) the P (or N) bytes of word m of block q of rows g and g + 8,
// low half in a0/a1, high half in a2/a3. Columns 2n and 2n + 1 of B hold
// block n's codes at the k positions of those halves, zeros elsewhere:
// lane (2n, n) has b0 = the token's code word 2m of block n, lane
// (2n + 1, n) b1 = word 2m + 1 (the words the halves of weight word m
// pair with, as in `mxfp4_dot_word`), every other lane zeros. So
// C[row, 2n] + C[row, 2n + 1] is block n's integer sum, and lane (g, q)
// ends with block q's of rows g and g + 8. Every weight load is 16 bytes
// of one row's block.
//
// The f32 sums: the chunk's fmaf chain passes from lane (g, 0) to lane
// (g, 3) by shuffles (q8dot.cu `q8_chunk_part`), which stores the chunk's
// part in shared memory. The warps of a block split a row's chunks; when
// all have stored their parts a thread a row adds them in chunk order.
//
// Work: a down block takes 16 rows of one route (MMA_WARPS warps), a
// gate/up block 32 gate rows and the same up rows (MMA_GU_WARPS warps,
// two a tile and matrix) and quantizes their 32 activations for the down
// products. The block first copies the token's codes and scales into
// shared memory, laid out as the lanes take B (zeros past the row's end),
// so they read their B registers with no bounds checks and no branches.
// A warp keeps the next MMA_ROUND chunks' weight loads in flight while it
// computes a round (two buffers of registers).
//
// Instructions (ptxas 13.0, sm_90 SASS, the 2880-wide gate/up kernels):
// ~150 a chunk of 16 rows × 4 blocks in the loop, ~2.8 a row's block with
// a warp's set-up and the final sums, against ~4.7 for q8dot.cu's (840,
// no loop, for a warp's two rows of 90 blocks). Measured on an H200
// (BENCHMARKS.md, twenty-seventh session): the same bits as q8dot.cu's and
// q8one.cu's kernels, but the gpt-oss-shaped model decoded ~21 % slower
// with these MXFP4 experts and at the same speed with these Q8_0
// products, so both stay opt-in.

#define MMA_ROWS 16     // rows a tile (an MMA's)
#define MMA_WARPS 4     // warps of a down block: one tile
#define MMA_GU_WARPS 8  // warps of a gate/up block: two tiles, one 32-code block of activations
#define MMA_GU_ROWS (2 * MMA_ROWS)
#define MMA_ROUND 1                           // (2: 4 chunks in registers, spills)
#define MMA_MAX_CHUNKS 64                     // rows up to 8192 wide
#define MMA_MAX_COLS (MMA_MAX_CHUNKS * Q8_CHUNK * 32)
#define MMA_PART_STRIDE (MMA_MAX_CHUNKS + 1)  // a row's parts; +1 spreads the banks

// What a lane loads for one chunk: its block's 16 code bytes of rows g and
// g + 8 and the chunk's 4 scale bytes of each.
struct MmaWeights {
    uint4 w0, w1;
    u32 s0, s1;
};

// The chunk's weights (r0, r1: rows g and g + 8). A block past the row's
// end (in its last chunk) reads the row's last block again: its column of
// B is zeros and its token scale 0 (MmaStage), so its sum is 0 and
// fmaf(0, 0, p) = p. The scale word of a chunk is 4 bytes at a multiple
// of 4 from the row's 16-byte aligned start, inside the row's padding
// past its last scale (layout.rs `device_row_bytes`: rows are 17·nb bytes
// rounded up to 16).
__device__ __forceinline__ MmaWeights mma_load_weights(const u8* r0, const u8* r1, int nb, int c,
                                                       int q) {
    MmaWeights m;
    int b = min(c * Q8_CHUNK + q, nb - 1);
    m.w0 = ld_stream_u4(split_codes<F_MXFP4>(r0, b));
    m.w1 = ld_stream_u4(split_codes<F_MXFP4>(r1, b));
    m.s0 = ld_stream_u32(r0 + (i64)nb * 16 + c * Q8_CHUNK);
    m.s1 = ld_stream_u32(r1 + (i64)nb * 16 + c * Q8_CHUNK);
    return m;
}

// The token of a block in shared memory, as the lanes take it for B: for
// each 32-code block the pairs (even word, 0) and then (0, odd word) for
// the four MMAs (code words 2m and 2m + 1 pair with the low and high
// halves of weight word m), each pair the two registers of one MMA's B;
// and the block scales. Zeros past the row's end up to whole chunks, and
// 32 zero bytes that the lanes holding no part of B read instead.
struct MmaStage {
    int4 x[MMA_MAX_CHUNKS * Q8_CHUNK * 4];
    float d[MMA_MAX_CHUNKS * Q8_CHUNK];
    int4 zero[2];
};

// By every thread of the block (THREADS of them), after the wait (the
// kernel before wrote the token); the block synchronizes before reading it.
template <int THREADS>
__device__ __forceinline__ void mma_stage_token(MmaStage& s, const signed char* xq,
                                                const float* xd, int nb, int chunks) {
    for (int b = threadIdx.x; b < chunks * Q8_CHUNK; b += THREADS) {
        int4 lo = make_int4(0, 0, 0, 0), hi = make_int4(0, 0, 0, 0);
        float d = 0.0f;
        if (b < nb) {
            lo = ld_i4_after_wait((const int4*)xq + 2 * b);
            hi = ld_i4_after_wait((const int4*)xq + 2 * b + 1);
            d = ld_f32_after_wait(xd + b);
        }
        s.x[4 * b] = make_int4(lo.x, 0, lo.z, 0);
        s.x[4 * b + 1] = make_int4(hi.x, 0, hi.z, 0);
        s.x[4 * b + 2] = make_int4(0, lo.y, 0, lo.w);
        s.x[4 * b + 3] = make_int4(0, hi.y, 0, hi.w);
        s.d[b] = d;
    }
    if (threadIdx.x < 2) s.zero[threadIdx.x] = make_int4(0, 0, 0, 0);
}

// The chunk's part of rows g (part[0]) and g + 8 (part[1]), in lane (g, 3).
// Column 2n + h of B holds block n's code words of half h (those the
// weight words' halves h pair with) at block n's k positions of that
// half: lane (2q, q) holds b0 = block q's even words, lane (2q + 1, q)
// b1 = its odd words, every other lane zeros (tb: the lane's 8 registers
// of B, two an MMA, from MmaStage). So C[row, 2n] + C[row, 2n + 1] is
// block n's integer sum, and lane (g, q) ends with block q's of rows g
// and g + 8. d: the token scale of block q.
__device__ __forceinline__ void mma_chunk_parts(const MmaWeights& m, const int4* tb, float d,
                                                int q, Mxfp4Tables tab, float* part) {
    int4 lo = tb[0], hi = tb[1];
    u32 r0[4] = {m.w0.x, m.w0.y, m.w0.z, m.w0.w};
    u32 r1[4] = {m.w1.x, m.w1.y, m.w1.z, m.w1.w};
    u32 x[8] = {(u32)lo.x, (u32)lo.y, (u32)lo.z, (u32)lo.w,
                (u32)hi.x, (u32)hi.y, (u32)hi.z, (u32)hi.w};
    int v[4] = {0, 0, 0, 0};
#pragma unroll
    for (int w = 0; w < 4; w++) {
        u32 f0 = r0[w] ^ 0x88888888u, f1 = r1[w] ^ 0x88888888u;
        u32 p[4] = {prmt_signed(tab.p0, MXFP4_P1, r0[w]), prmt_signed(tab.p0, MXFP4_P1, r1[w]),
                    prmt_signed(tab.p0, MXFP4_P1, r0[w] >> 16),
                    prmt_signed(tab.p0, MXFP4_P1, r1[w] >> 16)};
        mma_s8_acc(v, p, x[2 * w], x[2 * w + 1]);
        u32 n[4] = {prmt_signed(tab.n0, MXFP4_HI1, f0), prmt_signed(tab.n0, MXFP4_HI1, f1),
                    prmt_signed(tab.n0, MXFP4_HI1, f0 >> 16),
                    prmt_signed(tab.n0, MXFP4_HI1, f1 >> 16)};
        mma_s8_acc(v, n, x[2 * w], x[2 * w + 1]);
    }
    // Block q's sums of rows g and g + 8, and their weight scales (byte q
    // of each row's scale word) times the token's.
    int sh = 8 * q;
    float g0 = e8m0_half((u8)(m.s0 >> sh)) * d;
    float g1 = e8m0_half((u8)(m.s1 >> sh)) * d;
    // The chunk's chain, block by block from lane (g, 0) to lane (g, 3).
    part[0] = q8_chunk_part((float)(v[0] + v[1]), g0, q, 1);
    part[1] = q8_chunk_part((float)(v[2] + v[3]), g1, q, 1);
}

// Chunks [c0, c1) of rows r0, r1 against the token: each chunk's part of
// rows g and g + 8 into parts[g][c], parts[g + 8][c] (by lane (g, 3)).
// Called by every thread of the block (THREADS; it stages the token,
// `chunks` of them, and synchronizes), each warp with its own rows and
// chunks (maybe none). The weights of the next MMA_ROUND chunks are in
// flight while a round is computed. EARLY: the first round's weight
// loads are issued, then the kernel waits (KERNEL_ENTRY) for the one
// before it, which wrote the token.
template <bool EARLY, int THREADS>
__device__ __forceinline__ void mma_rows_parts(const u8* r0, const u8* r1, int nb, int chunks,
                                               int c0, int c1, const signed char* xq,
                                               const float* xd, MmaStage& s,
                                               float (*parts)[MMA_PART_STRIDE]) {
    int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    Mxfp4Tables tab = Mxfp4Tables::held();
    // The lane's part of B, each chunk's 16 int4s on (or 0: zeros): block
    // q's even words in lane (2q, q), its odd words in lane (2q + 1, q).
    bool holds_b = g >> 1 == q;
    const int4* tb = holds_b ? s.x + 4 * q + 2 * (g & 1) : s.zero;
    int tb_step = holds_b ? Q8_CHUNK * 4 : 0;
    const float* td = s.d + q;
    MmaWeights a[MMA_ROUND], b[MMA_ROUND];
#pragma unroll
    for (int i = 0; i < MMA_ROUND; i++)
        if (c0 + i < c1) a[i] = mma_load_weights(r0, r1, nb, c0 + i, q);
    if (EARLY) KERNEL_ENTRY();
    mma_stage_token<THREADS>(s, xq, xd, nb, chunks);
    __syncthreads();
    // Round `from` of buffer w: its chunks' parts (uniform over the warp).
    auto round = [&](const MmaWeights* w, int from) {
#pragma unroll
        for (int i = 0; i < MMA_ROUND; i++) {
            int c = from + i;
            if (c >= c1) break;
            float part[2];
            mma_chunk_parts(w[i], tb + c * tb_step, td[c * Q8_CHUNK], q, tab, part);
            if (q == 3) {
                parts[g][c] = part[0];
                parts[g + 8][c] = part[1];
            }
        }
    };
    for (int c = c0; c < c1; c += 2 * MMA_ROUND) {
#pragma unroll
        for (int i = 0; i < MMA_ROUND; i++)
            if (c + MMA_ROUND + i < c1) b[i] = mma_load_weights(r0, r1, nb, c + MMA_ROUND + i, q);
        round(a, c);
#pragma unroll
        for (int i = 0; i < MMA_ROUND; i++)
            if (c + 2 * MMA_ROUND + i < c1)
                a[i] = mma_load_weights(r0, r1, nb, c + 2 * MMA_ROUND + i, q);
        round(b, c + MMA_ROUND);
    }
}

// The chunks warp `part` of `parts` warps takes of a row's `chunks`.
__device__ __forceinline__ void mma_chunk_range(int chunks, int part, int parts, int* c0, int* c1) {
    int per = (chunks + parts - 1) / parts;
    *c0 = min(chunks, part * per);
    *c1 = min(chunks, *c0 + per);
}

// A row's total from its parts, in chunk order.
__device__ __forceinline__ float mma_row_total(const float* parts, int chunks) {
    float total = 0.0f;
    for (int c = 0; c < chunks; c++) total += parts[c];
    return total;
}

// Gate/up: grid (inter / MMA_GU_ROWS, routes), MMA_GU_WARPS warps a block:
// warp w the gate (w / 2 even) or up rows of tile w / 4, half w % 2 of
// their chunks. The block's 32 activations are one 32-code block of the
// down products' input, so its first warp also quantizes them into
// (aq, ad) as quantize_q8_mxfp4 does (q8dot.cu `quantize_q8_block`: the
// same function of the same values, so the same bits), and no launch
// between the gate/up and the down products is needed. `inter` must be a
// multiple of 32 (the down rows' width, MXFP4 blocks). WIDTH: the rows'
// width (`hidden`) when compiled for one, else 0.
template <int WIDTH>
__device__ void moe_gate_up_mma_impl(const signed char* __restrict__ xq,
                                     const float* __restrict__ xd,
                                     const RouteOut* __restrict__ routes, int k, SlotMask only,
                                     BankView b, MoeAct a, float* __restrict__ act,
                                     signed char* __restrict__ aq, float* __restrict__ ad) {
    __shared__ float parts[2][2][MMA_ROWS][MMA_PART_STRIDE];  // [tile][gate, up]
    __shared__ MmaStage stage;
    if (WIDTH) b.hidden = WIDTH;
    int i = blockIdx.y, row0 = blockIdx.x * MMA_GU_ROWS;
    u32 slot = routes[i].slot;
    if (!slot_computed(only, slot, b.slots)) return;  // uniform over the block
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    int tile = warp >> 2, up = (warp >> 1) & 1;
    int t = i < k ? 0 : i / k, nb = b.hidden / 32, chunks = (nb + Q8_CHUNK - 1) / Q8_CHUNK;
    const u8* base = up ? b.up : b.gate;
    i64 rb = up ? b.up_row_bytes : b.gate_row_bytes;
    i64 first = (i64)slot * b.inter;
    int tile0 = row0 + tile * MMA_ROWS;
    const u8* r0 = base + (first + min(tile0 + g, b.inter - 1)) * rb;
    const u8* r1 = base + (first + min(tile0 + g + 8, b.inter - 1)) * rb;
    int c0, c1;
    mma_chunk_range(chunks, warp & 1, 2, &c0, &c1);
    mma_rows_parts<false, MMA_GU_WARPS * 32>(r0, r1, nb, chunks, c0, c1, xq + (i64)t * b.hidden,
                                             xd + (i64)t * nb, stage, parts[tile][up]);
    __syncthreads();
    if (warp == 0) {  // lane r: row row0 + r
        int row = row0 + lane;
        float gate = mma_row_total(parts[lane / MMA_ROWS][0][lane % MMA_ROWS], chunks);
        float upv = mma_row_total(parts[lane / MMA_ROWS][1][lane % MMA_ROWS], chunks);
        float v = moe_act_value(b, a, first + row, gate, upv);
        act[(i64)i * b.inter + row] = v;
        i64 blk = (i64)i * (b.inter / 32) + blockIdx.x;
        float scale;
        int code = q8_lane_code(v, &scale);
        aq[blk * 32 + q8_pos<F_MXFP4>(lane)] = (signed char)code;
        if (lane == 0) ad[blk] = scale;
    }
}

// Down: grid (ceil(hidden / MMA_ROWS), routes). Before the wait (every
// thread waits, on every path) the route's slot is read and the first
// round's weight loads issued, as q8dot.cu's `moe_down_q8_impl` does: the
// routing finished before the gate/up launch between it and this one
// passed its own wait. WIDTH: the rows' width (`inter`) when compiled for
// one, else 0.
template <int WIDTH>
__device__ void moe_down_mma_impl(const signed char* __restrict__ aq, const float* __restrict__ ad,
                                  const RouteOut* __restrict__ routes, SlotMask only, BankView b,
                                  float* __restrict__ y) {
    __shared__ float parts[MMA_ROWS][MMA_PART_STRIDE];
    __shared__ MmaStage stage;
    if (WIDTH) b.inter = WIDTH;
    int i = blockIdx.y, row0 = blockIdx.x * MMA_ROWS;
    u32 slot;
    if (!route_slot<true>(routes, i, only, b.slots, slot)) return;
    int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
    int nb = b.inter / 32, chunks = (nb + Q8_CHUNK - 1) / Q8_CHUNK;
    i64 first = (i64)slot * b.hidden;
    const u8* r0 = b.down + (first + min(row0 + g, b.hidden - 1)) * b.down_row_bytes;
    const u8* r1 = b.down + (first + min(row0 + g + 8, b.hidden - 1)) * b.down_row_bytes;
    int c0, c1;
    mma_chunk_range(chunks, warp, MMA_WARPS, &c0, &c1);
    mma_rows_parts<true, MMA_WARPS * 32>(r0, r1, nb, chunks, c0, c1, aq + (i64)i * b.inter,
                                         ad + (i64)i * nb, stage, parts);
    __syncthreads();
    int r = threadIdx.x, row = row0 + r;
    if (r < MMA_ROWS && row < b.hidden) {
        float total = mma_row_total(parts[r], chunks);
        y[(i64)i * b.hidden + row] = moe_down_value(b, first + row, total);
    }
}

// Registers: gate/up under 85 (3 blocks an SM: gpt-oss's 4 routes × 90
// blocks of 32 rows = 360 in one wave of an H200's 132 SMs), down at most
// 72 (7 blocks an SM: 4 × 180 = 720 in one wave); ptxas 13.0 for sm_90
// fits them without spills (72–80 registers; 34 and 21 KB of shared
// memory a block).
#define MMA_KERNELS(TAIL, W)                                                                     \
    KERNEL void __launch_bounds__(MMA_GU_WARPS * 32, 3)                                          \
        moe_gate_up_mma_mxfp4##TAIL(const signed char* xq, const float* xd,                      \
                                    const RouteOut* routes, int k, SlotMask only, BankView b,   \
                                    MoeAct a, float* act, signed char* aq, float* ad) {          \
        KERNEL_ENTRY();                                                                          \
        moe_gate_up_mma_impl<W>(xq, xd, routes, k, only, b, a, act, aq, ad);                     \
    }                                                                                            \
    KERNEL void __launch_bounds__(MMA_WARPS * 32, 7)                                             \
        moe_down_mma_mxfp4##TAIL(const signed char* aq, const float* ad, const RouteOut* routes, \
                                 SlotMask only, BankView b, float* y) {                         \
        moe_down_mma_impl<W>(aq, ad, routes, only, b, y);                                        \
    }

MMA_KERNELS(, 0)
// gpt-oss's experts, 2880 wide both ways (kernels.rs `MmaSet::gate_up_for`):
// the same instructions with the width a constant, so the same bits.
MMA_KERNELS(_w2880, 2880)

// ---------------------------------------------------------------------
// One token's Q8_0 products (a decode step's attention projections and
// router; `matmul1_mma_q8_0_c{CPW}`), opt-in with TURBOSPARK_CUDA_Q8=mma
// (kernels.rs `q8_tensor_cores`): out[o] = Σ_b (dw · dx) · Σ_j c · q in
// q8dot.cu's canonical order, so the bits of q8one.cu's and q8dot.cu's
// kernels. The same MMA layout as above without the P/N split, the codes
// being int8 already: MMA m puts code words 2m (a0/a1) and 2m + 1 (a2/a3)
// of block q of rows g and g + 8 in lane (g, q), against the token's
// words 2m and 2m + 1 of block n in columns 2n and 2n + 1 (MmaStage, the
// same staging: Q8_0's codes and the token's are both in natural order,
// word j against word j). Four MMAs a chunk.
//
// Work: a block of MMA_Q8_WARPS warps takes a 16-row tile of a MatGroup
// member (block_start in tiles: fusion.rs `in_blocks_of(16)`), warp w its
// chunks w·CPW .. w·CPW + CPW - 1. Nothing writes the weights, so a warp
// issues every one of its loads before it waits for the kernel before
// (KERNEL_ENTRY): the whole tile is in flight during that kernel's tail.
// Rows up to MMA_Q8_WARPS · 4 chunks (4096) wide; wider rows, and an
// output head (many tiles, which q8one.cu streams at ~4 TB/s), keep
// q8one.cu's kernels. By SASS count (ptxas 13.0, sm_90) it issues about
// as many instructions a row's block as q8one.cu's kernels compiled for
// 2880 (~3.4 against ~3); what it may gain is latency: q8one.cu's warps
// take two rows of gpt-oss's q/k/v one after the other, the second's
// loads issued only once the first's have arrived. Not yet run on a GPU.

#define MMA_Q8_WARPS 8
#define MMA_Q8_MAX_CPW 4

// A lane's loads for one chunk: block q of rows g (a) and g + 8 (b), 32
// code bytes each, and their raw f16 scales. A block past the row's end
// reads the row's last block again (its B is zeros, its token scale 0).
struct MmaQ8Weights {
    uint4 a0, a1, b0, b1;
    u32 sa, sb;
};

__device__ __forceinline__ MmaQ8Weights mma_q8_load(const u8* ra, const u8* rb, int nb, int c,
                                                    int q) {
    MmaQ8Weights m;
    int b = min(c * Q8_CHUNK + q, nb - 1);
    const u8* pa = split_codes<F_Q8_0>(ra, b);
    const u8* pb = split_codes<F_Q8_0>(rb, b);
    m.a0 = ld_stream_u4(pa);
    m.a1 = ld_stream_u4(pa + 16);
    m.b0 = ld_stream_u4(pb);
    m.b1 = ld_stream_u4(pb + 16);
    m.sa = ld_stream_u16(split_scale<F_Q8_0>(ra, nb * 32, b));
    m.sb = ld_stream_u16(split_scale<F_Q8_0>(rb, nb * 32, b));
    return m;
}

// The chunk's part of rows g (part[0]) and g + 8 (part[1]), in lane (g, 3)
// (tb, d: as mma_chunk_parts takes them).
__device__ __forceinline__ void mma_q8_chunk_parts(const MmaQ8Weights& m, const int4* tb, float d,
                                                   int q, float* part) {
    int4 lo = tb[0], hi = tb[1];
    u32 x[8] = {(u32)lo.x, (u32)lo.y, (u32)lo.z, (u32)lo.w,
                (u32)hi.x, (u32)hi.y, (u32)hi.z, (u32)hi.w};
    u32 wa[8] = {m.a0.x, m.a0.y, m.a0.z, m.a0.w, m.a1.x, m.a1.y, m.a1.z, m.a1.w};
    u32 wb[8] = {m.b0.x, m.b0.y, m.b0.z, m.b0.w, m.b1.x, m.b1.y, m.b1.z, m.b1.w};
    int v[4] = {0, 0, 0, 0};
#pragma unroll
    for (int w = 0; w < 4; w++) {
        u32 a[4] = {wa[2 * w], wb[2 * w], wa[2 * w + 1], wb[2 * w + 1]};
        mma_s8_acc(v, a, x[2 * w], x[2 * w + 1]);
    }
    float g0 = f16_to_f32((u16)m.sa) * d;
    float g1 = f16_to_f32((u16)m.sb) * d;
    part[0] = q8_chunk_part((float)(v[0] + v[1]), g0, q, 1);
    part[1] = q8_chunk_part((float)(v[2] + v[3]), g1, q, 1);
}

// out[m][o] (+ bias[m][o]) for one token: grid (the group's tiles),
// MMA_Q8_WARPS warps a block; CPW = ceil(chunks / MMA_Q8_WARPS).
template <int CPW>
__device__ void matmul1_mma_q8_0_impl(const MatGroup& g, int cols,
                                      const signed char* __restrict__ xq,
                                      const float* __restrict__ xd) {
    __shared__ float parts[MMA_ROWS][MMA_PART_STRIDE];
    __shared__ MmaStage stage;
    TcMember mem = tc_member(g, blockIdx.x);
    int r0 = (blockIdx.x - mem.first_block) * MMA_ROWS;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, q = lane & 3;
    int nb = cols / 32, chunks = (nb + Q8_CHUNK - 1) / Q8_CHUNK, c0 = warp * CPW;
    const u8* ra = mem.w + (i64)min(r0 + gr, mem.rows - 1) * mem.row_bytes;
    const u8* rb = mem.w + (i64)min(r0 + gr + 8, mem.rows - 1) * mem.row_bytes;
    MmaQ8Weights w[CPW];
#pragma unroll
    for (int i = 0; i < CPW; i++)
        if (c0 + i < chunks) w[i] = mma_q8_load(ra, rb, nb, c0 + i, q);
    KERNEL_ENTRY();
    mma_stage_token<MMA_Q8_WARPS * 32>(stage, xq, xd, nb, chunks);
    __syncthreads();
    bool holds_b = gr >> 1 == q;
    const int4* tb = holds_b ? stage.x + 4 * q + 2 * (gr & 1) : stage.zero;
    int tb_step = holds_b ? Q8_CHUNK * 4 : 0;
#pragma unroll
    for (int i = 0; i < CPW; i++) {
        int c = c0 + i;
        if (c >= chunks) break;  // uniform over the warp
        float part[2];
        mma_q8_chunk_parts(w[i], tb + c * tb_step, stage.d[c * Q8_CHUNK + q], q, part);
        if (q == 3) {
            parts[gr][c] = part[0];
            parts[gr + 8][c] = part[1];
        }
    }
    __syncthreads();
    int r = threadIdx.x, row = r0 + r;
    if (r < MMA_ROWS && row < mem.rows) {
        float total = mma_row_total(parts[r], chunks);
        mem.out[row] = mem.bias ? total + mem.bias[row] : total;
    }
}

// Registers (ptxas 13.0, sm_90, no spills): 48, 74, 80 and 118 for 1-4
// chunks a warp, so 3 blocks an SM at 3 (gpt-oss's q/k/v, 320 tiles, in
// one wave of 132 SMs) and 2 at 4 (its o projection, 180 tiles).
#define MMA_Q8_KERNEL(CPW)                                                                      \
    KERNEL void __launch_bounds__(MMA_Q8_WARPS * 32)                                             \
        matmul1_mma_q8_0_c##CPW(MatGroup g, int cols, const signed char* xq, const float* xd) { \
        matmul1_mma_q8_0_impl<CPW>(g, cols, xq, xd);                                            \
    }
MMA_Q8_KERNEL(1)
MMA_Q8_KERNEL(2)
MMA_Q8_KERNEL(3)
MMA_Q8_KERNEL(4)
