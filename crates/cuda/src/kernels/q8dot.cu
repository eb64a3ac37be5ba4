// Fast numerics (turbospark_backend::Numerics::Fast) for Q8_0 and MXFP4
// weights: activations are quantized to 8 bits per 32-element block,
//   d = max|x| / 127,   q_j = round(x_j / d)   (q = 0 when max|x| = 0),
// and each weight block is dotted with them in integers (dp4a), the scales
// applied once per block, f32 across blocks:
//   out[t, o] = Σ_b (dw[o, b] · dx[t, b]) · Σ_j c[o, 32b + j] · q[t, 32b + j]
// where c are the weight codes (Q8_0: the int8 codes, scale d; MXFP4: the
// doubled e2m1 values 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12 with half the e8m0
// scale, as load_unit reads them). The integer sums are exact, so a token's
// result depends only on its own activations and the weights.
//
// Layout of the quantized activations: codes `[n, cols]` int8, then (at
// the caller's offset) scales `[n, cols / 32]` f32. For MXFP4 the codes of
// each block are stored in the order the weight nibbles decode (q8_pos), so
// no byte shuffling is needed at dot time: code word w of a weight block
// (bytes 4i..4i+3, i = w / 2, half h = w % 2) packs the low and high nibbles
// of bytes 4i + 2h and 4i + 2h + 1, i.e. elements 4i+2h, 16+4i+2h,
// 4i+2h+1, 17+4i+2h.

// Byte position of element e (0..31) of a block in the order used for F.
template <int F>
__device__ __forceinline__ int q8_pos(int e) {
    return q8_pos_order(F == F_MXFP4 ? Q8_ORDER_MXFP4 : Q8_ORDER_NATURAL, e);
}

// Block b (32 elements) of x, by one warp.
template <int F>
__device__ __forceinline__ void quantize_q8_block(const float* __restrict__ x, i64 b,
                                                  signed char* __restrict__ q,
                                                  float* __restrict__ d) {
    int lane = threadIdx.x & 31;
    float scale;
    int c = q8_lane_code(x[b * 32 + lane], &scale);
    q[b * 32 + q8_pos<F>(lane)] = (signed char)c;
    if (lane == 0) d[b] = scale;
}

// One warp per 32-element block of x [n, cols] (cols a multiple of 32).
template <int F>
__device__ void quantize_q8_impl(const float* __restrict__ x, i64 blocks, signed char* __restrict__ q,
                                 float* __restrict__ d) {
    i64 b = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (b >= blocks) return;
    quantize_q8_block<F>(x, b, q, d);
}

KERNEL void quantize_q8_natural(const float* x, i64 blocks, signed char* q, float* d) {
    KERNEL_ENTRY();
    quantize_q8_impl<F_Q8_0>(x, blocks, q, d);
}
KERNEL void quantize_q8_mxfp4(const float* x, i64 blocks, signed char* q, float* d) {
    KERNEL_ENTRY();
    quantize_q8_impl<F_MXFP4>(x, blocks, q, d);
}

#ifndef TURBOSPARK_HOST_EMULATION  // tests/emulation defines it on the host
__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
#endif

// Four MXFP4 nibbles (a 16-bit half of a code word) as four int8 values
// (the tensor-core tiles of mmq.cu, which need the values themselves).
__device__ __forceinline__ int mxfp4_word(u32 h) {
    u32 sel = h & 0x7777u;
    u32 pos = __byte_perm(MXFP4_LO0, MXFP4_LO1, sel);
    u32 neg = __byte_perm(MXFP4_HI0, MXFP4_HI1, sel);
    return (int)__byte_perm(pos, neg, ((h & 0x8888u) >> 1) | 0x3210u);
}

// Σ code · q of the 8 MXFP4 nibbles of code word w (nibbles 0-3 against
// the 4 codes of xa, 4-7 against xb), without forming the nibbles' values:
// each half takes two byte permutes whose selector nibble's top bit picks
// copy (0) or the selected byte's sign spread over the byte (1), as PTX
// `prmt` (default mode) defines it. P = prmt(T1, c) and N = prmt(T2, c ^ 8),
// with T1 = {0, 2, 3, 4, 5, 7, 9, 13} and T2 = {0, -1, -2, -3, -4, -6, -8,
// -12} (the negated doubled e2m1 magnitudes):
//   c < 8:  P = T1[c], N = sign(T2[c]) = -1 (0 for c = 0): P + N = KVALUES[c]
//   c >= 8: P = sign(T1[c - 8]) = 0, N = T2[c - 8]:          P + N = KVALUES[c]
// so dp4a(P, x) + dp4a(N, x) is the integer sum mxfp4_word's values give
// (exactly: integer sums), in 4 permutes, 2 shifts and 1 logic op a word
// against mxfp4_word's 6 permutes and ~7 logic and shift ops. (Checked by
// emulating `prmt` over all 65536 half words in both positions, then by the
// GPU conformance suite; every one-token and batched MXFP4 product dots
// through it.)
#define MXFP4_P0 0x04030200u
#define MXFP4_P1 0x0D090705u
#ifndef TURBOSPARK_HOST_EMULATION  // tests/emulation defines these on the host
__device__ __forceinline__ u32 prmt_signed(u32 a, u32 b, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}
#endif

// The first word of each permute table, in a register (`prmt`'s first
// operand must be one; the second goes as an immediate). Mxfp4Tables::held()
// loads them lane by lane from a device variable (a copy a lane), values
// ptxas can neither know nor prove uniform over the warp, so it keeps them
// in two registers. With the constants (or one shared load, which it
// keeps in a uniform register) it copies the word into a register before
// every permute: an extra instruction each, 96 in the one-token gate/up
// kernel's 3 stretches × 2 rows (ptxas 13.0, sm_90 SASS).
#define MXFP4_PERM_P0 \
    MXFP4_P0, MXFP4_P0, MXFP4_P0, MXFP4_P0, MXFP4_P0, MXFP4_P0, MXFP4_P0, MXFP4_P0
#define MXFP4_PERM_N0 \
    MXFP4_HI0, MXFP4_HI0, MXFP4_HI0, MXFP4_HI0, MXFP4_HI0, MXFP4_HI0, MXFP4_HI0, MXFP4_HI0
__device__ u32 mxfp4_perm_tables[2][32] = {
    {MXFP4_PERM_P0, MXFP4_PERM_P0, MXFP4_PERM_P0, MXFP4_PERM_P0},
    {MXFP4_PERM_N0, MXFP4_PERM_N0, MXFP4_PERM_N0, MXFP4_PERM_N0}};
struct Mxfp4Tables {
    u32 p0, n0;
    __device__ __forceinline__ static Mxfp4Tables constants() { return {MXFP4_P0, MXFP4_HI0}; }
    __device__ __forceinline__ static Mxfp4Tables held() {
        int lane = threadIdx.x & 31;
        return {mxfp4_perm_tables[0][lane], mxfp4_perm_tables[1][lane]};
    }
};

__device__ __forceinline__ int mxfp4_dot_word(u32 w, int xa, int xb, int s,
                                              Mxfp4Tables t = Mxfp4Tables::constants()) {
    u32 f = w ^ 0x88888888u;
    s = dp4a((int)prmt_signed(t.p0, MXFP4_P1, w), xa, s);
    s = dp4a((int)prmt_signed(t.n0, MXFP4_HI1, f), xa, s);
    s = dp4a((int)prmt_signed(t.p0, MXFP4_P1, w >> 16), xb, s);
    s = dp4a((int)prmt_signed(t.n0, MXFP4_HI1, f >> 16), xb, s);
    return s;
}

// The order of the f32 sums, shared by the matrix-vector kernels below and
// the tensor-core kernels of mmq.cu so that a token's result has the same
// bits whichever computes it (the fast numerics' batch invariance): the
// blocks of a row are taken in chunks of Q8_CHUNK consecutive blocks;
// within a chunk, from 0, part = fmaf(Σ_block, dw · dx, part) block by
// block; the row's total, from 0, adds the chunks' parts in order.
#define Q8_CHUNK 4
// The matrix-vector kernels give each row (or pair of rows) a warp. Its
// lanes read the row's code bytes 16 at a time, lane l the l-th 16-byte
// piece of each 512-byte stretch (one coalesced load for the warp): a
// Q8_0 block is two pieces, an MXFP4 block one. A lane dots its piece with
// the tokens' codes in integers; the two halves of a Q8_0 block meet by a
// shuffle (integer sums are exact, so how they are split does not
// matter). The f32 part of each chunk is then formed block by block, and
// the row's total chunk by chunk, in the canonical order above, from
// values shuffled out of the lanes that hold them.
#define Q8_LANES 32
#define Q8_ROWS_PER_WARP 1
// Stretches of 32 pieces a lane loads before computing (all in flight):
// rows up to 4096 wide are one round of loads (8 stretches of Q8_0, 4 of
// MXFP4), except for Q8_0 with many tokens or rows, where 8 would crowd
// the registers, and for one token's MXFP4 rows, which take 3 (rows up to
// 3072 wide in one round: gpt-oss's 2880, which use 3 of 4 anyway; the
// registers of the 4th, unused there, held the gate/up kernel to 4
// blocks an SM at 120 registers and the down kernel to 6 at 80; with 3,
// 92 and 63 registers by ptxas for sm_90, 5 and 8). The stretches are
// taken in the same order however they are batched, so the bits are the
// same.
template <int F, int T, int R>
struct Q8Unroll {
    static constexpr int n = F == F_Q8_0 && T * R <= 4 ? 8 : F == F_MXFP4 && T == 1 ? 3 : 4;
};
// Warps of a matrix-vector block (few, so that short matrices still
// spread over the GPU).
#define Q8_WARPS 4

// Pieces of 16 code bytes in a block of format F.
template <int F>
struct Q8Pieces {
    static constexpr int per_block = F == F_Q8_0 ? 2 : 1;
};

// The quantized activations a lane needs for one 16-byte piece of weight
// codes of block b: the matching 16 codes of a Q8_0 half-block (`half`),
// all 32 of an MXFP4 block (its piece holds the whole block).
template <int F>
struct Q8Act {
    int4 lo, hi;  // hi: MXFP4 only
};

// ORDERED: loads kept after an earlier KERNEL_ENTRY (common.cuh
// `ld_i4_after_wait`).
template <int F, bool ORDERED = false>
__device__ __forceinline__ Q8Act<F> q8_load_act(const signed char* xq, int b, int half) {
    Q8Act<F> a;
    const int4* xp = (const int4*)(xq + (i64)b * 32);
    if (F == F_Q8_0) {
        a.lo = ORDERED ? ld_i4_after_wait(xp + half) : xp[half];
        a.hi = make_int4(0, 0, 0, 0);
    } else {
        a.lo = ORDERED ? ld_i4_after_wait(xp) : xp[0];
        a.hi = ORDERED ? ld_i4_after_wait(xp + 1) : xp[1];
    }
    return a;
}

// Σ code · q of one 16-byte piece of weight codes against the matching
// quantized activations.
template <int F>
__device__ __forceinline__ int q8_piece_dot(uint4 w, const Q8Act<F>& x,
                                            Mxfp4Tables t = Mxfp4Tables::constants()) {
    int s = 0;
    if (F == F_Q8_0) {
        s = dp4a((int)w.x, x.lo.x, s);
        s = dp4a((int)w.y, x.lo.y, s);
        s = dp4a((int)w.z, x.lo.z, s);
        s = dp4a((int)w.w, x.lo.w, s);
    } else {
        s = mxfp4_dot_word(w.x, x.lo.x, x.lo.y, s, t);
        s = mxfp4_dot_word(w.y, x.lo.z, x.lo.w, s, t);
        s = mxfp4_dot_word(w.z, x.hi.x, x.hi.y, s, t);
        s = mxfp4_dot_word(w.w, x.hi.z, x.hi.w, s, t);
    }
    return s;
}

// The raw scale bits of block b (an f16 for Q8_0, an e8m0 byte for
// MXFP4), loaded with the codes and decoded when used.
template <int F>
__device__ __forceinline__ u32 q8_load_scale(const u8* row, int cols, int b) {
    if (F == F_Q8_0) return ld_stream_u16(split_scale<F>(row, cols, b));
    return ld_stream_u8(split_scale<F>(row, cols, b));
}

template <int F>
__device__ __forceinline__ float q8_weight_scale(u32 raw) {
    if (F == F_Q8_0) return f16_to_f32((u16)raw);
    return e8m0_half((u8)raw);
}

// Block b's weight codes (this lane's 16-byte piece `half`) and raw scale
// of each of R rows; zeros when the block is past the row's end.
template <int F, int R>
__device__ __forceinline__ void q8_load_weights(const u8* const* rows, int cols, int b, int half,
                                                bool valid, uint4* w, u32* sw) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        w[r] = valid ? ld_stream_u4(split_codes<F>(rows[r], b) + 16 * half) : make_uint4(0, 0, 0, 0);
        sw[r] = valid ? q8_load_scale<F>(rows[r], cols, b) : 0u;
    }
}

// One token's reduction in the canonical order (q8_rows_dot1 here,
// one_reduce in q8one.cu), in three steps:
//
// A chunk's part, the chain p = fmaf(v_0, g_0, 0); p = fmaf(v_u, g_u, p)
// for u = 1, 2, 3 over its blocks' lanes (`step` lanes apart; `pos` the
// lane's block in its chunk): every lane forms fmaf(v, g, 0), then 3 times
// takes p from the lane one block back (`shfl.up`) and the lane at that
// position re-forms fmaf(v, g, p). The lane at position 3 ends with the
// part. Every lane of the warp calls it.
__device__ __forceinline__ float q8_chunk_part(float v, float g, int pos, int step) {
    float p = fmaf(v, g, 0.0f);
#pragma unroll
    for (int u = 1; u < Q8_CHUNK; u++) {
        float back = __shfl_up_sync(FULL_MASK, p, step);
        if (pos == u) p = fmaf(v, g, back);
    }
    return p;
}

// Slots `from`.. of every row's parts set to 0 (chunks past the row's end;
// by the whole warp).
template <int R, int SLOTS>
__device__ __forceinline__ void q8_zero_parts(float (*parts)[SLOTS], int from) {
    for (int z = from + (threadIdx.x & 31); z < SLOTS; z += 32)
#pragma unroll
        for (int r = 0; r < R; r++) parts[r][z] = 0.0f;
}

// Lane r (< R) adds row r's parts to its total in slot order, after the
// warp has stored them; the parts may be overwritten once it returns.
// Adding a 0 slot leaves the total unchanged (it is never -0: it starts at
// +0, and no sum of finite floats rounds to -0 unless both are -0).
// `used` (uniform over the warp): the slots the round filled, read 4 at a
// time (a caller that leaves the rest unwritten passes it; q8_zero_parts
// zeroes them for the others).
template <int R, int SLOTS>
__device__ __forceinline__ float q8_add_parts(float (*parts)[SLOTS], float total,
                                              int used = SLOTS) {
    static_assert(SLOTS % 4 == 0, "a row's parts are read 4 at a time");
    int lane = threadIdx.x & 31;
    __syncwarp();
    if (lane < R) {
        const float4* mine = (const float4*)parts[lane];
#pragma unroll
        for (int c = 0; c < SLOTS / 4; c++) {
            if (4 * c >= used) break;
            float4 q = mine[c];
            total += q.x;
            total += q.y;
            total += q.z;
            total += q.w;
        }
    }
    __syncwarp();
    return total;
}

// R weight rows (same format and width) dotted with T > 1 tokens'
// quantized activations into acc[r][t] (nt of them live); every lane of
// the warp calls it (with the same cols and nt) and ends with the totals.
// One token takes q8_rows_dot1 below (the same sums in the same order).
//
// Latency: a round's weight loads (codes and scales) are all issued before
// any is used, so a warp waits for memory about once a round (a row up to
// 4096 wide is one round). The activations (shared by every row, so
// cached) are read where they are used, to spare registers.
template <int F, int T, int R>
__device__ __forceinline__ void q8_rows_dot(const u8* const* rows, int cols,
                                            const signed char* const* xq, const float* const* xd,
                                            int nt, float (*acc)[T]) {
    constexpr int P = Q8Pieces<F>::per_block;
    constexpr int BLOCKS = 32 / P;          // blocks a stretch covers
    constexpr int CHUNK_LANES = Q8_CHUNK * P;
    constexpr int CHUNKS = 32 / CHUNK_LANES;  // chunks a stretch covers
    int lane = threadIdx.x & 31, half = lane % P;
    int nb = cols / 32;
    int stretches = (nb + BLOCKS - 1) / BLOCKS;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[r][t] = 0.0f;
    constexpr int UNROLL = Q8Unroll<F, T, R>::n;
    for (int s0 = 0; s0 < stretches; s0 += UNROLL) {
        // Every weight load of UNROLL stretches is issued before any is used.
        uint4 w[UNROLL][R];
        u32 sw[UNROLL][R];
#pragma unroll
        for (int i = 0; i < UNROLL; i++) {
            int b = (s0 + i) * BLOCKS + lane / P;
            bool valid = b < nb;
            q8_load_weights<F, R>(rows, cols, b, half, valid, w[i], sw[i]);
        }
#pragma unroll
        for (int i = 0; i < UNROLL; i++) {
            int first = (s0 + i) * BLOCKS;
            if (first >= nb) break;  // uniform over the warp
            int b = first + lane / P;
            bool valid = b < nb;
            // This lane's block: its integer sums, weight and token scales.
            int sum[R][T];
            float dw[R], dx[T];
#pragma unroll
            for (int r = 0; r < R; r++) dw[r] = valid ? q8_weight_scale<F>(sw[i][r]) : 0.0f;
#pragma unroll
            for (int t = 0; t < T; t++) {
                if (t >= nt) break;
                Q8Act<F> xa;
                dx[t] = valid ? xd[t][b] : 0.0f;
                if (valid) xa = q8_load_act<F>(xq[t], b, half);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    int v = valid ? q8_piece_dot<F>(w[i][r], xa) : 0;
                    if (P == 2) v += __shfl_xor_sync(FULL_MASK, v, 1);
                    sum[r][t] = v;
                }
            }
            // Each chunk's part, block by block (every lane forms its own
            // chunk's), then the chunks of the stretch in order.
            float part[R][T];
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int t = 0; t < T; t++) part[r][t] = 0.0f;
            int base = lane & ~(CHUNK_LANES - 1);
#pragma unroll
            for (int u = 0; u < Q8_CHUNK; u++) {
                int src = base + u * P;
                bool in = first + src / P < nb;
                float dwu[R];
#pragma unroll
                for (int r = 0; r < R; r++) dwu[r] = __shfl_sync(FULL_MASK, dw[r], src);
#pragma unroll
                for (int t = 0; t < T; t++) {
                    if (t >= nt) break;
                    float dxu = __shfl_sync(FULL_MASK, dx[t], src);
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        int su = __shfl_sync(FULL_MASK, sum[r][t], src);
                        if (in) part[r][t] = fmaf((float)su, dwu[r] * dxu, part[r][t]);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < CHUNKS; j++) {
                if (first + j * Q8_CHUNK >= nb) break;  // uniform
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int t = 0; t < T; t++)
                        acc[r][t] += __shfl_sync(FULL_MASK, part[r][t], j * CHUNK_LANES);
            }
        }
    }
}

// R weight rows dotted with one token's quantized activations into
// acc[r], in the canonical order above (the same bits as q8_rows_dot), by
// every lane of a warp of a block of at most Q8_WARPS warps; every lane
// ends with the totals. A round's loads — weight codes and scales, the
// token's codes and scales — are all issued before any is used.
//
// Instructions (these kernels are bound by them, not by HBM, on an H200):
// lane l holds block l's integer sum v and g = dw · dx (the product the
// canonical order takes); a chunk's fmaf chain passes from lane to lane
// (q8_chunk_part: 3 shuffles a row, where gathering v, dw and dx of each
// block into every lane of its chunk took 4 × (2R + 1)); the chunks' parts
// go to shared memory in chunk order, and at the end of a round lane r
// adds row r's (q8_add_parts, the rows in parallel), where every lane added
// every chunk's part after a shuffle (2 instructions a chunk and row).
//
// EARLY (the kernel has not yet run KERNEL_ENTRY): the first round's
// weight loads are issued, then the kernel waits for the one before it,
// then the token's loads (which that kernel may have written) follow.
template <int F, int R, bool EARLY = false>
__device__ __forceinline__ void q8_rows_dot1(const u8* const* rows, int cols,
                                             const signed char* __restrict__ xq,
                                             const float* __restrict__ xd, float* acc) {
    constexpr int P = Q8Pieces<F>::per_block;
    constexpr int BLOCKS = 32 / P;             // blocks a stretch covers
    constexpr int CHUNK_LANES = Q8_CHUNK * P;
    constexpr int CHUNKS = 32 / CHUNK_LANES;   // chunks a stretch covers
    constexpr int UNROLL = Q8Unroll<F, 1, R>::n;
    constexpr int SLOTS = UNROLL * CHUNKS;     // chunk parts of a round, a row
    __shared__ __align__(16) float parts_of_warp[Q8_WARPS][R][SLOTS];
    float(*parts)[SLOTS] = parts_of_warp[threadIdx.x >> 5];
    int lane = threadIdx.x & 31, half = lane % P;
    int pos = (lane % CHUNK_LANES) / P;           // the lane's block in its chunk
    bool tail = lane % CHUNK_LANES == (Q8_CHUNK - 1) * P;  // ends with the chunk's part
    int chunk = lane / CHUNK_LANES;
    int nb = cols / 32;
    int stretches = (nb + BLOCKS - 1) / BLOCKS;
    Mxfp4Tables tables = F == F_MXFP4 ? Mxfp4Tables::held() : Mxfp4Tables::constants();
    float total = 0.0f;  // lane r < R: row r's
    if (EARLY && stretches == 0) KERNEL_ENTRY();  // (no round to wait in)
    for (int s0 = 0; s0 < stretches; s0 += UNROLL) {
        uint4 w[UNROLL][R];
        u32 sw[UNROLL][R];
        Q8Act<F> x[UNROLL];
        float dx[UNROLL];
#pragma unroll
        for (int i = 0; i < UNROLL; i++) {
            int b = (s0 + i) * BLOCKS + lane / P;
            q8_load_weights<F, R>(rows, cols, b, half, b < nb, w[i], sw[i]);
        }
        if (EARLY && s0 == 0) KERNEL_ENTRY();
        // (EARLY: the token's loads kept after the wait.)
#pragma unroll
        for (int i = 0; i < UNROLL; i++) {
            int b = (s0 + i) * BLOCKS + lane / P;
            bool valid = b < nb;
            x[i] = valid ? q8_load_act<F, EARLY>(xq, b, half)
                         : Q8Act<F>{make_int4(0, 0, 0, 0), make_int4(0, 0, 0, 0)};
            dx[i] = valid ? (EARLY ? ld_f32_after_wait(xd + b) : xd[b]) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < UNROLL; i++) {
            int first = (s0 + i) * BLOCKS;
            if (first >= nb) {  // uniform over the warp: no blocks from here on
                q8_zero_parts<R, SLOTS>(parts, i * CHUNKS);
                break;
            }
            bool valid = first + lane / P < nb;
#pragma unroll
            for (int r = 0; r < R; r++) {
                int v = valid ? q8_piece_dot<F>(w[i][r], x[i], tables) : 0;
                if (P == 2) v += __shfl_xor_sync(FULL_MASK, v, 1);
                float g = (valid ? q8_weight_scale<F>(sw[i][r]) : 0.0f) * dx[i];
                float p = q8_chunk_part((float)v, g, pos, P);
                if (tail) parts[r][i * CHUNKS + chunk] = p;
            }
        }
        total = q8_add_parts<R, SLOTS>(parts, total);
    }
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = __shfl_sync(FULL_MASK, total, r);
}

// The row a lane group of a matrix-vector kernel computes: grids are
// (ceil(rows / Q8_BLOCK_ROWS), ...) with blocks of Q8_WARPS warps.
#define Q8_BLOCK_ROWS (Q8_WARPS * Q8_ROWS_PER_WARP)
__device__ __forceinline__ int q8_row() {
    return blockIdx.x * Q8_BLOCK_ROWS + (threadIdx.x >> 5) * Q8_ROWS_PER_WARP +
           ((threadIdx.x & 31) / Q8_LANES);
}
// Whether this lane writes its group's result.
__device__ __forceinline__ bool q8_writer() { return (threadIdx.x & (Q8_LANES - 1)) == 0; }

// Up to MAT_GROUP matrices of one width that read the same quantized
// input, in one launch: matrix m takes row blocks block_start[m] ..
// block_start[m + 1] of the grid, writes out[m] and adds bias[m] (null:
// none) — the q, k and v projections of a token and their biases are one
// launch. Passed by value.
#define MAT_GROUP 3
struct MatGroup {
    const u8* w[MAT_GROUP];
    float* out[MAT_GROUP];
    const float* bias[MAT_GROUP];
    i64 row_bytes[MAT_GROUP];
    int rows[MAT_GROUP];
    int block_start[MAT_GROUP + 1];
    int count;
};

// out[m][t, o] (+ bias[m][o]) for quantized x: grid (block_start[count],
// ceil(n / MM_TOKENS)), blocks of Q8_WARPS warps.
template <int F>
__device__ void matmul_q8_impl(const MatGroup& g, int cols, const signed char* __restrict__ xq,
                               const float* __restrict__ xd, int n) {
    // The block's matrix, picked field by field (a dynamic index into the
    // parameter would copy it to local memory).
    int bx = blockIdx.x;
    bool m1 = g.count > 1 && bx >= g.block_start[1], m2 = g.count > 2 && bx >= g.block_start[2];
    const u8* w = m2 ? g.w[2] : m1 ? g.w[1] : g.w[0];
    float* out = m2 ? g.out[2] : m1 ? g.out[1] : g.out[0];
    const float* bias = m2 ? g.bias[2] : m1 ? g.bias[1] : g.bias[0];
    i64 row_bytes = m2 ? g.row_bytes[2] : m1 ? g.row_bytes[1] : g.row_bytes[0];
    int rows = m2 ? g.rows[2] : m1 ? g.rows[1] : g.rows[0];
    int start = m2 ? g.block_start[2] : m1 ? g.block_start[1] : 0;
    int row = (bx - start) * Q8_BLOCK_ROWS + (threadIdx.x >> 5) * Q8_ROWS_PER_WARP +
              ((threadIdx.x & 31) / Q8_LANES);
    int t0 = blockIdx.y * MM_TOKENS;
    bool live = row < rows;
    int nb = cols / 32;
    const u8* wr[1] = {w + (i64)min(row, rows - 1) * row_bytes};
    const signed char* qs[MM_TOKENS];
    const float* ds[MM_TOKENS];
#pragma unroll
    for (int t = 0; t < MM_TOKENS; t++) {
        qs[t] = xq + (i64)(t0 + t) * cols;
        ds[t] = xd + (i64)(t0 + t) * nb;
    }
    float acc[1][MM_TOKENS];
    if (n == 1) {
        // One token (decode): the same sums in the same order, with the
        // token's loads issued with the codes and a cheaper reduction.
        q8_rows_dot1<F, 1>(wr, cols, xq, xd, acc[0]);
    } else {
        q8_rows_dot<F, MM_TOKENS, 1>(wr, cols, qs, ds, min(n - t0, MM_TOKENS), acc);
    }
    if (live && q8_writer()) {
        float b = bias ? bias[row] : 0.0f;
#pragma unroll
        for (int t = 0; t < MM_TOKENS; t++)
            if (t0 + t < n) out[(i64)(t0 + t) * rows + row] = bias ? acc[0][t] + b : acc[0][t];
    }
}

// Routed experts with quantized activations, one route per (row, route):
// grid (ceil(inter / Q8_BLOCK_ROWS), routes) for gate/up (both rows of a
// lane group read together), (ceil(hidden / Q8_BLOCK_ROWS), routes) for
// down, whose input is the activations `act` quantized (aq, ad).
// WIDTH: the rows' width (`hidden`) known when compiled (0: read from the
// bank; see Q8_WIDE_KERNELS below).
//
// EARLY (called before KERNEL_ENTRY; every thread waits in it, on every
// path): as moe_down_q8_impl below, the route's slot and the first round
// of its gate and up rows' weights are read before the wait, the token's
// codes after it. The host launches it only where a launch stands between
// the routing and this one — the quantization of the experts' input
// (stream/moe.rs) — so the routes were written before that launch passed
// its own wait and let this one start.
template <int F, int WIDTH = 0, bool EARLY = false>
__device__ void moe_gate_up_q8_impl(const signed char* __restrict__ xq, const float* __restrict__ xd,
                                    const RouteOut* __restrict__ routes, int k, SlotMask only,
                                    BankView b, MoeAct a, float* __restrict__ act) {
    if (WIDTH) b.hidden = WIDTH;
    int i = blockIdx.y;
    int row = q8_row();
    bool live = row < b.inter;
    u32 slot;
    if (!route_slot<EARLY>(routes, i, only, b.slots, slot)) return;
    // The route's token (0 for a decode step's routes: no division there,
    // ~30 instructions of each warp's set-up).
    int t = i < k ? 0 : i / k, nb = b.hidden / 32;
    i64 r = (i64)slot * b.inter + min(row, b.inter - 1);
    const u8* wr[2] = {b.gate + r * b.gate_row_bytes, b.up + r * b.up_row_bytes};
    float acc[2];
    q8_rows_dot1<F, 2, EARLY>(wr, b.hidden, xq + (i64)t * b.hidden, xd + (i64)t * nb, acc);
    if (live && q8_writer()) {
        act[(i64)i * b.inter + row] = moe_act_value(b, a, r, acc[0], acc[1]);
    }
}

// Called before KERNEL_ENTRY (every thread waits in it, on every path):
// the route's slot and the first round of its down rows' weights are read
// before the wait, so that their loads overlap the launches before. The
// routes were written by the routing, which finished before the gate/up
// launch between it and this one passed its own wait (and only then let
// the launches after it start), and nothing writes them until this launch
// ends; they are read from the L2 (`ld.global.cg`), past any L1 line of
// an earlier layer's routes. Only the activations (the launch before
// writes them) are read after the wait.
template <int F, int WIDTH = 0>
__device__ void moe_down_q8_impl(const signed char* __restrict__ aq, const float* __restrict__ ad,
                                 const RouteOut* __restrict__ routes, SlotMask only, BankView b,
                                 float* __restrict__ y) {
    if (WIDTH) b.inter = WIDTH;
    int i = blockIdx.y;
    int row = q8_row();
    bool live = row < b.hidden;
    u32 slot;
    if (!route_slot<true>(routes, i, only, b.slots, slot)) return;
    i64 r = (i64)slot * b.hidden + min(row, b.hidden - 1);
    const u8* wr[1] = {b.down + r * b.down_row_bytes};
    float acc[1];
    q8_rows_dot1<F, 1, true>(wr, b.inter, aq + (i64)i * b.inter, ad + (i64)i * (b.inter / 32),
                             acc);
    if (live && q8_writer()) {
        y[(i64)i * b.hidden + row] = moe_down_value(b, r, acc[0]);
    }
}

// Batches grouped by slot (moe_group): grid (ceil(rows / Q8_BLOCK_ROWS), slots),
// MOE_GROUP routes of a slot at a time; each route's row is the same
// instructions as alone.
template <int F>
__device__ void moe_gate_up_grouped_q8_impl(const signed char* __restrict__ xq,
                                            const float* __restrict__ xd,
                                            const u32* __restrict__ order,
                                            const u32* __restrict__ offsets, int k, BankView b,
                                            MoeAct a, float* __restrict__ act) {
    int slot = blockIdx.y;
    int row = q8_row();
    bool live = row < b.inter;
    int nb = b.hidden / 32;
    i64 r = (i64)slot * b.inter + min(row, b.inter - 1);
    const u8* wr[2] = {b.gate + r * b.gate_row_bytes, b.up + r * b.up_row_bytes};
    u32 end = offsets[slot + 1];
    for (u32 c = offsets[slot]; c < end; c += MOE_GROUP) {
        int nt = (int)min((u32)MOE_GROUP, end - c);
        u32 ids[MOE_GROUP];
        const signed char* qs[MOE_GROUP];
        const float* ds[MOE_GROUP];
#pragma unroll
        for (int t = 0; t < MOE_GROUP; t++) {
            ids[t] = t < nt ? order[c + t] : 0;
            qs[t] = xq + (i64)(ids[t] / k) * b.hidden;
            ds[t] = xd + (i64)(ids[t] / k) * nb;
        }
        float acc[2][MOE_GROUP];
        q8_rows_dot<F, MOE_GROUP, 2>(wr, b.hidden, qs, ds, nt, acc);
        if (live && q8_writer()) {
#pragma unroll
            for (int t = 0; t < MOE_GROUP; t++) {
                if (t >= nt) break;
                act[(i64)ids[t] * b.inter + row] = moe_act_value(b, a, r, acc[0][t], acc[1][t]);
            }
        }
    }
}

template <int F>
__device__ void moe_down_grouped_q8_impl(const signed char* __restrict__ aq,
                                         const float* __restrict__ ad,
                                         const u32* __restrict__ order,
                                         const u32* __restrict__ offsets, BankView b,
                                         float* __restrict__ y) {
    int slot = blockIdx.y;
    int row = q8_row();
    bool live = row < b.hidden;
    int nb = b.inter / 32;
    i64 r = (i64)slot * b.hidden + min(row, b.hidden - 1);
    const u8* wr[1] = {b.down + r * b.down_row_bytes};
    u32 end = offsets[slot + 1];
    for (u32 c = offsets[slot]; c < end; c += MOE_GROUP) {
        int nt = (int)min((u32)MOE_GROUP, end - c);
        u32 ids[MOE_GROUP];
        const signed char* qs[MOE_GROUP];
        const float* ds[MOE_GROUP];
#pragma unroll
        for (int t = 0; t < MOE_GROUP; t++) {
            ids[t] = t < nt ? order[c + t] : 0;
            qs[t] = aq + (i64)ids[t] * b.inter;
            ds[t] = ad + (i64)ids[t] * nb;
        }
        float acc[1][MOE_GROUP];
        q8_rows_dot<F, MOE_GROUP, 1>(wr, b.inter, qs, ds, nt, acc);
        if (live && q8_writer()) {
#pragma unroll
            for (int t = 0; t < MOE_GROUP; t++) {
                if (t >= nt) break;
                y[(i64)ids[t] * b.hidden + row] = moe_down_value(b, r, acc[0][t]);
            }
        }
    }
}

// MXFP4's per-route kernels held to fewer registers, for more warps an SM
// (ptxas 13.0 for sm_90, no spills either way): down to 64 (8 blocks of
// Q8_WARPS warps; 70 without the bound), gate/up to 72 (7 blocks; 80
// without; at 64 it spilled). Q8_0's would spill.
#define Q8_DOWN_BOUNDS_mxfp4 __launch_bounds__(Q8_WARPS * 32, 8)
#define Q8_DOWN_BOUNDS_q8_0
#define Q8_GATE_UP_BOUNDS_mxfp4 __launch_bounds__(Q8_WARPS * 32, 7)
#define Q8_GATE_UP_BOUNDS_q8_0
#define Q8_GATE_UP_EARLY_BOUNDS_mxfp4 Q8_GATE_UP_BOUNDS_mxfp4
#define Q8_GATE_UP_EARLY_BOUNDS_mxfp4_w2880 __launch_bounds__(Q8_WARPS * 32, 8)
#define Q8_GATE_UP_EARLY_BOUNDS_q8_0
// The per-route kernels of format F, named with TAIL after the format's
// name (`moe_gate_up_early_q8x_*`: the gate/up's EARLY form, see
// moe_gate_up_q8_impl); W: the rows' width when compiled for one
// (Q8_WIDE_KERNELS below), else 0.
#define Q8_ROUTE_KERNELS(fmt, F, TAIL, W)                                                        \
    KERNEL void Q8_GATE_UP_BOUNDS_##fmt moe_gate_up_q8x_##fmt##TAIL(                             \
        const signed char* xq, const float* xd, const RouteOut* routes, int k, SlotMask only,   \
        BankView b, MoeAct a, float* act) {                                                      \
        KERNEL_ENTRY();                                                                          \
        moe_gate_up_q8_impl<F, W>(xq, xd, routes, k, only, b, a, act);                           \
    }                                                                                            \
    KERNEL void Q8_GATE_UP_EARLY_BOUNDS_##fmt##TAIL                                             \
        moe_gate_up_early_q8x_##fmt##TAIL(                                                       \
        const signed char* xq, const float* xd, const RouteOut* routes, int k, SlotMask only,   \
        BankView b, MoeAct a, float* act) {                                                      \
        moe_gate_up_q8_impl<F, W, true>(xq, xd, routes, k, only, b, a, act);                     \
    }                                                                                            \
    KERNEL void Q8_DOWN_BOUNDS_##fmt moe_down_q8x_##fmt##TAIL(                                  \
        const signed char* aq, const float* ad, const RouteOut* routes, SlotMask only, BankView b, \
        float* y) {                                                                              \
        moe_down_q8_impl<F, W>(aq, ad, routes, only, b, y);                                      \
    }
#define Q8_KERNELS(fmt, F)                                                                       \
    KERNEL void matmul_q8x_##fmt(MatGroup g, int cols, const signed char* xq,                    \
                                                const float* xd, int n) {                        \
        KERNEL_ENTRY();                                                                          \
        matmul_q8_impl<F>(g, cols, xq, xd, n);                                                   \
    }                                                                                            \
    Q8_ROUTE_KERNELS(fmt, F, , 0)                                                                \
    KERNEL void moe_gate_up_grouped_q8x_##fmt(                                                   \
        const signed char* xq, const float* xd, const u32* order, const u32* offsets, int k,     \
        BankView b, MoeAct a, float* act) {                                                      \
        KERNEL_ENTRY();                                                                          \
        moe_gate_up_grouped_q8_impl<F>(xq, xd, order, offsets, k, b, a, act);                    \
    }                                                                                            \
    KERNEL void moe_down_grouped_q8x_##fmt(const signed char* aq, const float* ad,                \
                                                          const u32* order, const u32* offsets,  \
                                                          BankView b, float* y) {                \
        KERNEL_ENTRY();                                                                          \
        moe_down_grouped_q8_impl<F>(aq, ad, order, offsets, b, y);                               \
    }

Q8_KERNELS(q8_0, F_Q8_0)
Q8_KERNELS(mxfp4, F_MXFP4)

// The per-route MXFP4 kernels for rows of one width known when compiled
// (kernels.rs `Q8Set::gate_up_for`): gpt-oss's experts, 2880 wide both
// ways. The same instructions with the width a constant, so the same
// bits; ptxas then folds the stretch count, the bounds checks of the last
// stretch and the address arithmetic (ptxas 13.0, sm_90: 1024 → 840
// instructions and 72 → 64 registers for gate/up).
#define Q8_WIDE_KERNELS(fmt, F, W) Q8_ROUTE_KERNELS(fmt, F, _w##W, W)

Q8_WIDE_KERNELS(mxfp4, F_MXFP4, 2880)
