// Tensor-core products in fast numerics, of weights in any format but
// the two that take 8-bit activations (Q8_0 and MXFP4, q8dot.cu):
//   out[t, o] = Σ_i bf16(W[o, i]) · bf16(x[t, i])   (+ bias[o])
// W [rows, cols] in its storage format (row stride row_bytes), each weight
// decoded as load_unit (common.cuh) decodes it, the same f32 arithmetic,
// then rounded to bf16 (bf16 weights are taken as they are); x f32
// [n, cols] rounded to bf16 as it is read. Both roundings are to nearest
// even (PTX `cvt.rn.bf16x2.f32`); products are summed in f32 by the tensor
// cores (mma.sync m16n8k16, bf16 · bf16 + f32; sm_80 and later). Columns
// must be a multiple of 32, rows and x aligned as stream/products.rs
// `tc_fits` checks; other products keep matmul.cu's kernel.
//
// A weight is decoded twice over in the kernels: load_unit reads a block
// byte by byte (any alignment) for matmul.cu and the embedding; tc_w8
// below reads the lane's 8 values with the widest loads the block layout
// aligns. tests/emulation (`tc_products`) checks that they give the same
// values, bit for bit, for every format.
//
// The order of the sums, which every kernel below follows so that a
// token's result has the same bits alone (a decode step) or in a batch
// (prefill), the fast numerics' batch invariance:
//   - the columns are taken in chunks of 32; a chunk is two MMAs, first
//     columns 8q..8q+3 of each group q = 0..3 of 8, then 8q+4..8q+7
//     (lane 4g + q of a warp holds row g's and g + 8's 8 weights at
//     8q..8q+7 as bf16, and the token's 8 values there:
//     the MMA's k index 2q, 2q+1, 2q+8, 2q+9 are those columns, the same
//     for every row and token, so the sum is over the same products);
//   - chunks form segments of `tc_seg_chunks(cols)` (at least TC_SEG,
//     at most TC_MAX_SEGS segments a row); a segment's MMAs accumulate
//     from 0, in chunk order;
//   - the row's total, from 0, adds the segments' sums in order.
// An MMA's element D[m][n] depends only on row m of A and column n of B
// (and C[m][n]), so the other tokens of a tile do not change a token's
// bits; the conformance suite checks it (`check_matmul`).
//
// Fragments (PTX m16n8k16 .row.col, lane = 4g + q): A a0 = (row g, k 2q,
// 2q+1), a1 = (row g+8, k 2q..), a2 = (row g, k 2q+8, 2q+9), a3 = (row
// g+8, k 2q+8..); B b0 = (k 2q, 2q+1; token g), b1 = (k 2q+8, 2q+9; token
// g); C c0, c1 = (row g; tokens 2q, 2q+1), c2, c3 = (row g+8; same). A
// register's lower half holds the lower k.

#define TC_CHUNK 32      // columns a chunk
#define TC_SEG 4         // chunks a segment, at least
#define TC_MAX_SEGS 24   // segments a row, at most (warps of a decode block)
#define TC_ROW_WARPS 4   // warps of a row-streaming block, 16 rows each
#define TC_BATCH_WARPS 8 // warps of a batch block, 16 rows each
#define TC_BATCH_ROWS (TC_BATCH_WARPS * 16)
#define TC_BATCH_NT 8    // 8-token tiles of a batch block
#define TC_BATCH_TOKENS (TC_BATCH_NT * 8)

// Chunks a segment holds for rows `cols` wide (kernels.rs `tc_segments`
// mirrors it).
__device__ __forceinline__ int tc_seg_chunks(int cols) {
    int chunks = cols / TC_CHUNK;
    return max(TC_SEG, (chunks + TC_MAX_SEGS - 1) / TC_MAX_SEGS);
}

#ifndef TURBOSPARK_HOST_EMULATION  // tests/emulation defines these on the host
__device__ __forceinline__ void mma_bf16(float* c, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two f32 as bf16 pair: lo in the lower half.
__device__ __forceinline__ u32 bf16x2_rn(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#endif

// 8 consecutive f32 of x (16-byte aligned) as 4 bf16 pairs; kept after
// an earlier KERNEL_ENTRY (the kernel before writes x).
__device__ __forceinline__ uint4 tc_load_x8(const float* p) {
    int4 a = ld_i4_after_wait(p), b = ld_i4_after_wait(p + 4);
    return make_uint4(bf16x2_rn(__int_as_float(a.x), __int_as_float(a.y)),
                      bf16x2_rn(__int_as_float(a.z), __int_as_float(a.w)),
                      bf16x2_rn(__int_as_float(b.x), __int_as_float(b.y)),
                      bf16x2_rn(__int_as_float(b.z), __int_as_float(b.w)));
}

// Loads of a block's bytes at the alignment its layout gives them when
// the row starts at a multiple of 16 bytes (f32, f16, bf16), 8 (Q5_1,
// Q4_K, Q5_K), 4 (Q4_1) or 2 (Q4_0, Q5_0, Q6_K): kernels/tc.rs `tc_align`,
// which `tc_fits` checks for the matrix and its row stride.
#ifndef TURBOSPARK_HOST_EMULATION  // tests/emulation checks the alignment
__device__ __forceinline__ u32 tc_ld16(const u8* p) { return *(const u16*)p; }
__device__ __forceinline__ u32 tc_ld32(const u8* p) { return *(const u32*)p; }
__device__ __forceinline__ uint2 tc_ld64(const u8* p) { return *(const uint2*)p; }
#endif
// 8 bytes at a 2-byte aligned address, as two words.
__device__ __forceinline__ uint2 tc_ld64_by16(const u8* p) {
    return make_uint2(tc_ld16(p) | (tc_ld16(p + 2) << 16), tc_ld16(p + 4) | (tc_ld16(p + 6) << 16));
}

// A lane's 8 codes are assembled a word at a time, one code a byte, and
// each byte turned into an f32 with a byte permute and a subtraction: put
// under 0x4B, the exponent of 2^23, byte c reads 2^23 + c, and
// 2^23 + c - (2^23 + bias) is c - bias exactly. The values are those of
// load_unit's integer-to-float conversions (the emulation test checks).

// The nibbles at bit `shift` (0 or 4) of each byte, one a byte.
__device__ __forceinline__ uint2 tc_nibbles(uint2 v, int shift) {
    return make_uint2((v.x >> shift) & 0x0F0F0F0Fu, (v.y >> shift) & 0x0F0F0F0Fu);
}
// Codes with `bits` (below the byte's top) shifted to bit `at` of each byte.
__device__ __forceinline__ uint2 tc_with_bits(uint2 c, uint2 bits, int at) {
    return make_uint2(c.x | (bits.x << at), c.y | (bits.y << at));
}
// Bits 0..7 of v, bit j at the bottom of byte j (a multiply sends bit j
// of each half to bit 8j: 0x00204081 = 1 + 2^7 + 2^14 + 2^21).
__device__ __forceinline__ uint2 tc_spread_bits(u32 v) {
    return make_uint2(((v & 15u) * 0x00204081u) & 0x01010101u,
                      (((v >> 4) & 15u) * 0x00204081u) & 0x01010101u);
}
// Byte j (0..7) of two words minus `bias`, as an f32.
__device__ __forceinline__ float tc_code_f32(uint2 c, int j, int bias) {
    u32 word = j < 4 ? c.x : c.y;
    float v = __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7540u | (u32)(j & 3)));
    return __fsub_rn(v, 8388608.0f + (float)bias);
}

// Values 8q..8q+7 of unit u (columns 32u..32u+31) of a row in format F,
// in f32: load_unit's arithmetic (common.cuh) for those elements.
template <int F>
__device__ __forceinline__ void tc_decode8(const u8* row, int u, int q, float* w) {
    if (F == F_F32) {
        const u8* p = row + (i64)u * 128 + q * 32;
        uint4 a = ld_stream_u4(p), b = ld_stream_u4(p + 16);
        u32 v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = __uint_as_float(v[j]);
    } else if (F == F_F16) {
        uint4 a = ld_stream_u4(row + (i64)u * 64 + q * 16);
        u32 v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            w[2 * j] = f16_to_f32((u16)(v[j] & 0xFFFF));
            w[2 * j + 1] = f16_to_f32((u16)(v[j] >> 16));
        }
    } else if (F == F_Q4_0 || F == F_Q5_0) {
        // Element e < 16: the low nibble of byte e; e ≥ 16: the high
        // nibble of byte e - 16 (Q5_0: bit e of qh above either).
        const u8* b = row + (i64)u * (F == F_Q4_0 ? 18 : 22);
        float d = f16_to_f32((u16)tc_ld16(b));
        uint2 qs = tc_ld64_by16(b + (F == F_Q4_0 ? 2 : 6) + 8 * (q & 1));
        uint2 c = tc_nibbles(qs, q < 2 ? 0 : 4);
        if (F == F_Q5_0) {
            u32 qh = tc_ld16(b + 2) | (tc_ld16(b + 4) << 16);
            c = tc_with_bits(c, tc_spread_bits(qh >> (8 * q)), 4);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = tc_code_f32(c, j, F == F_Q4_0 ? 8 : 16) * d;
    } else if (F == F_Q4_1 || F == F_Q5_1) {
        const u8* b = row + (i64)u * (F == F_Q4_1 ? 20 : 24);
        u32 dm = tc_ld32(b);
        float d = f16_to_f32((u16)(dm & 0xFFFF)), m = f16_to_f32((u16)(dm >> 16));
        const u8* p = b + (F == F_Q4_1 ? 4 : 8) + 8 * (q & 1);
        uint2 qs = F == F_Q4_1 ? make_uint2(tc_ld32(p), tc_ld32(p + 4)) : tc_ld64(p);
        uint2 c = tc_nibbles(qs, q < 2 ? 0 : 4);
        if (F == F_Q5_1) c = tc_with_bits(c, tc_spread_bits(tc_ld32(b + 4) >> (8 * q)), 4);
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = __fadd_rn(__fmul_rn(tc_code_f32(c, j, 0), d), m);
    } else if (F == F_Q4_K || F == F_Q5_K) {
        const u8* b = row + (i64)(u >> 3) * (F == F_Q4_K ? 144 : 176);
        int s = u & 7;
        u32 dd = tc_ld32(b);
        float d = f16_to_f32((u16)(dd & 0xFFFF)), dmin = f16_to_f32((u16)(dd >> 16));
        int sc, mn;
        k4_scale_min(b + 4, s, &sc, &mn);
        float d1 = d * (float)sc, m1 = dmin * (float)mn;
        // Sub-block s: the low nibbles of its pair's bytes when s is even,
        // the high ones when odd (Q5_K: bit s of qh[l] above).
        uint2 c = tc_nibbles(tc_ld64(b + (F == F_Q4_K ? 16 : 48) + 32 * (s >> 1) + 8 * q), 4 * (s & 1));
        if (F == F_Q5_K) {
            uint2 qh = tc_ld64(b + 16 + 8 * q);
            c = tc_with_bits(c, make_uint2((qh.x >> s) & 0x01010101u, (qh.y >> s) & 0x01010101u), 4);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = __fsub_rn(__fmul_rn(d1, tc_code_f32(c, j, 0)), m1);
    } else if (F == F_Q6_K) {
        const u8* b = row + (i64)(u >> 3) * 210;
        int s = u & 7, h = s >> 2, k = s & 3;
        float d = f16_to_f32((u16)tc_ld16(b + 208));
        // Elements 0..15 of the quarter take scale 2s, 16..31 scale 2s + 1.
        float dq = d * (float)(signed char)b[192 + 2 * s + (q >> 1)];
        // Quarter k: the low nibbles of ql for k < 2, the high ones else,
        // and bits 2k, 2k + 1 of qh above them.
        uint2 c = tc_nibbles(tc_ld64_by16(b + 64 * h + 32 * (k & 1) + 8 * q), k < 2 ? 0 : 4);
        uint2 qh = tc_ld64_by16(b + 128 + 32 * h + 8 * q);
        c = tc_with_bits(c, make_uint2((qh.x >> (2 * k)) & 0x03030303u, (qh.y >> (2 * k)) & 0x03030303u), 4);
#pragma unroll
        for (int j = 0; j < 8; j++) w[j] = dq * tc_code_f32(c, j, 32);
    }
}

// Chunks whose weights a few tokens' warp loads at once (and decodes:
// fewer for the block formats, whose decoding holds more registers).
__device__ constexpr int tc_round(int F) {
    return F == F_F32 || F == F_F16 || F == F_BF16 ? 4 : 2;
}

// Where lane group q reads row `row`: bf16 rows at its 16 bytes of the
// first chunk (the address tc_w8 steps from), other formats' at the row.
template <int F>
__device__ __forceinline__ const u8* tc_lane_row(const u8* row, int q) {
    return F == F_BF16 ? row + q * 16 : row;
}

// Columns 32k + 8q .. 32k + 8q + 7 of a row as 4 bf16 pairs, the lower
// column in the lower half: bf16 weights as they are, others decoded and
// rounded. `lane_row`: tc_lane_row's.
template <int F>
__device__ __forceinline__ uint4 tc_w8(const u8* lane_row, int k, int q) {
    if (F == F_BF16) return ld_stream_u4(lane_row + (i64)k * (TC_CHUNK * 2));
    float w[8];
    tc_decode8<F>(lane_row, k, q, w);
    return make_uint4(bf16x2_rn(w[0], w[1]), bf16x2_rn(w[2], w[3]), bf16x2_rn(w[4], w[5]),
                      bf16x2_rn(w[6], w[7]));
}

// One chunk of one 8-token tile: rows g and g + 8's 8 values (ra, rb)
// against the token's 8 (x), in the order of the module docs.
__device__ __forceinline__ void tc_chunk(float* c, uint4 ra, uint4 rb, uint4 x) {
    u32 a0[4] = {ra.x, rb.x, ra.y, rb.y};
    mma_bf16(c, a0, x.x, x.y);
    u32 a1[4] = {ra.z, rb.z, ra.w, rb.w};
    mma_bf16(c, a1, x.z, x.w);
}

// The group member block `bx` falls in (block_start in this kernel's
// blocks), its first row there, and its fields.
struct TcMember {
    const u8* w;
    float* out;
    const float* bias;
    i64 row_bytes;
    int rows;
    int first_block;
    // Row r (the last row past the end: its values are computed, never
    // written).
    __device__ __forceinline__ const u8* row(int r) const {
        return w + (i64)min(r, rows - 1) * row_bytes;
    }
};

__device__ __forceinline__ TcMember tc_member(const MatGroup& g, int bx) {
    // Picked field by field (a dynamic index into the parameter would copy
    // it to local memory).
    bool m1 = g.count > 1 && bx >= g.block_start[1], m2 = g.count > 2 && bx >= g.block_start[2];
    TcMember m;
    m.w = m2 ? g.w[2] : m1 ? g.w[1] : g.w[0];
    m.out = m2 ? g.out[2] : m1 ? g.out[1] : g.out[0];
    m.bias = m2 ? g.bias[2] : m1 ? g.bias[1] : g.bias[0];
    m.row_bytes = m2 ? g.row_bytes[2] : m1 ? g.row_bytes[1] : g.row_bytes[0];
    m.rows = m2 ? g.rows[2] : m1 ? g.rows[1] : g.rows[0];
    m.first_block = m2 ? g.block_start[2] : m1 ? g.block_start[1] : 0;
    return m;
}

// A 16-row tile's segment sums meeting in shared memory (`parts`, a warp
// a segment: c is this warp's MMA accumulator) and the rows' totals: from
// 0, the segments added in order, then the bias; written for the tile's
// rows (from r0 of member m) and n tokens, whatever the block's threads.
__device__ __forceinline__ void tc_tile_totals(float (*parts)[16][8], const float* c, int segs,
                                               const TcMember& m, int r0, int n) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int gr = lane >> 2, q = lane & 3;
    parts[warp][gr][2 * q] = c[0];
    parts[warp][gr][2 * q + 1] = c[1];
    parts[warp][gr + 8][2 * q] = c[2];
    parts[warp][gr + 8][2 * q + 1] = c[3];
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * 8; i += blockDim.x) {
        int row = i >> 3, t = i & 7;
        float total = 0.0f;
        for (int s = 0; s < segs; s++) total += parts[s][row][t];
        int o = r0 + row;
        if (o < m.rows && t < n) m.out[(i64)t * m.rows + o] = m.bias ? total + m.bias[o] : total;
    }
}

// Up to 8 tokens (a decode step, small batches): a block per 16 rows of a
// member (block_start counts these blocks), a warp per segment of the
// row's chunks (blockDim.x = 32 · segments); the segments' sums meet in
// shared memory and are added in order. Weights are loaded before
// KERNEL_ENTRY's wait (nothing writes them), the tokens after it.
template <int F>
__device__ __forceinline__ void matmul_tc1_impl(const MatGroup& g, int cols,
                                                const float* __restrict__ x, int n) {
    __shared__ float parts[TC_MAX_SEGS][16][8];
    TcMember m = tc_member(g, blockIdx.x);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int gr = lane >> 2, q = lane & 3;
    int r0 = (blockIdx.x - m.first_block) * 16;
    int chunks = cols / TC_CHUNK, per = tc_seg_chunks(cols);
    int c0 = warp * per, c1 = min(c0 + per, chunks);
    constexpr int ROUND = tc_round(F);
    const u8* row_a = tc_lane_row<F>(m.row(r0 + gr), q);
    const u8* row_b = tc_lane_row<F>(m.row(r0 + gr + 8), q);
    const float* xt = x + (i64)min(gr, n - 1) * cols + q * 8;
    bool token = gr < n;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    bool waited = false;
    for (int r = c0; r < c1; r += ROUND) {
        uint4 ra[ROUND], rb[ROUND], xv[ROUND];
#pragma unroll
        for (int i = 0; i < ROUND; i++) {
            if (r + i < c1) {
                ra[i] = tc_w8<F>(row_a, r + i, q);
                rb[i] = tc_w8<F>(row_b, r + i, q);
            }
        }
        if (!waited) {
            KERNEL_ENTRY();
            waited = true;
        }
#pragma unroll
        for (int i = 0; i < ROUND; i++)
            if (r + i < c1)
                xv[i] = token ? tc_load_x8(xt + (r + i) * TC_CHUNK) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < ROUND; i++)
            if (r + i < c1) tc_chunk(c, ra[i], rb[i], xv[i]);
    }
    if (!waited) KERNEL_ENTRY();  // (a warp past the last chunk)
    // (A row of 12 chunks or fewer is 1-3 segments: 32-96 threads.)
    tc_tile_totals(parts, c, (chunks + per - 1) / per, m, r0, n);
}

// Up to 8 tokens through many rows (an output head): a warp per 16 rows,
// walking all their chunks tc_round at a time, the next round's weights
// loaded while this one's MMAs run, and closing a segment every
// tc_seg_chunks — the sums of matmul_tc1_impl in the same order, without
// the meeting in shared memory, for matrices with rows enough to keep
// every SM busy with whole rows (fusion.rs `launch_tc` picks; the bits are
// the same).
// Blocks of TC_ROW_WARPS warps (block_start counts these blocks).
template <int F>
__device__ __forceinline__ void matmul_tc1r_impl(const MatGroup& g, int cols,
                                                 const float* __restrict__ x, int n) {
    TcMember m = tc_member(g, blockIdx.x);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int gr = lane >> 2, q = lane & 3;
    int r0 = (blockIdx.x - m.first_block) * (TC_ROW_WARPS * 16) + warp * 16;
    int chunks = cols / TC_CHUNK, per = tc_seg_chunks(cols);
    const u8* row_a = tc_lane_row<F>(m.row(r0 + gr), q);
    const u8* row_b = tc_lane_row<F>(m.row(r0 + gr + 8), q);
    const float* xt = x + (i64)min(gr, n - 1) * cols + q * 8;
    bool token = gr < n;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, total[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    constexpr int ROUND = tc_round(F);
    uint4 ra[ROUND], rb[ROUND];
#pragma unroll
    for (int i = 0; i < ROUND; i++) {
        if (i < chunks) {
            ra[i] = tc_w8<F>(row_a, i, q);
            rb[i] = tc_w8<F>(row_b, i, q);
        }
    }
    KERNEL_ENTRY();
    for (int k0 = 0; k0 < chunks; k0 += ROUND) {
        uint4 na[ROUND], nb[ROUND], xv[ROUND];
#pragma unroll
        for (int i = 0; i < ROUND; i++) {
            int k = k0 + ROUND + i;
            if (k < chunks) {
                na[i] = tc_w8<F>(row_a, k, q);
                nb[i] = tc_w8<F>(row_b, k, q);
            }
        }
#pragma unroll
        for (int i = 0; i < ROUND; i++)
            if (k0 + i < chunks)
                xv[i] = token ? tc_load_x8(xt + (k0 + i) * TC_CHUNK) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < ROUND; i++) {
            int k = k0 + i;
            if (k < chunks) {
                tc_chunk(c, ra[i], rb[i], xv[i]);
                if ((k + 1) % per == 0 || k + 1 == chunks) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        total[e] += c[e];
                        c[e] = 0.0f;
                    }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < ROUND; i++) {
            ra[i] = na[i];
            rb[i] = nb[i];
        }
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int o = r0 + gr + (e >> 1) * 8, t = 2 * q + (e & 1);
        if (o < m.rows && t < n) m.out[(i64)t * m.rows + o] = m.bias ? total[e] + m.bias[o] : total[e];
    }
}

// Up to 8 tokens through a layer's bf16 projections (q/k/v, o, a
// router: fewer rows than an output head), streamed through shared
// memory: the sums of matmul_tc1_impl in the same order (a warp a
// segment, the segments meeting in shared memory and added in order), but
// a block per SM walks the tiles blockIdx.x, blockIdx.x + gridDim.x, …,
// and each warp keeps TC_RING chunks of its segment's weights in flight
// (`cp.async`, 16 bytes a lane a row, into its own ring of shared memory
// that only it reads), across tiles. matmul_tc1 holds a tile's weights in
// registers, one block an SM (80 registers × 23 warps), so ~2.4 waves of
// blocks each wait a memory round trip before their first MMA; here every
// SM has ~184 KB of weights requested from the start (before the wait for
// the kernel before: nothing writes weights) and asks for the next as
// each chunk is consumed. The token's values of the warp's segment are
// the same for every tile: read once, after the wait.
// Dynamic shared memory: blockDim.x / 32 warps × TC_RING × 1 KB
// (kernels/tc.rs `tc_stream_smem`). Taken under TURBOSPARK_CUDA_BF16=stream.
#define TC_RING 8          // chunks in flight a warp
#define TC_STREAM_PMAX 8   // chunks a segment at most (tc.rs TC_STREAM_MAX_PER)

#ifndef TURBOSPARK_HOST_EMULATION
// 16 bytes from global to shared memory, asynchronously, past the L1.
// (With an evict-first `.L2::cache_hint`, ptxas 13.0 for sm_90 encoded the
// policy in an odd uniform register and the H100 stopped at the first
// copy with an illegal instruction: BENCHMARKS.md, thirtieth session.)
__device__ __forceinline__ void tc_cp16(void* dst, const void* src) {
    u32 s = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void tc_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's groups are pending: every group
// but the last N committed has landed.
template <int N>
__device__ __forceinline__ void tc_cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#endif

// Where unit u of a warp's stream (tile u / cnt of the block's, chunk
// c0 + u % cnt) is read from, for lane group (gr, q): rows gr and gr + 8.
template <int F>
__device__ __forceinline__ void tc_stream_issue(const MatGroup& g, int u, int units, int cnt,
                                                int c0, int gr, int q, uint4* ring, int lane) {
    if (u < units) {
        int tile = blockIdx.x + (u / cnt) * gridDim.x, k = c0 + u % cnt;
        TcMember m = tc_member(g, tile);
        int r0 = (tile - m.first_block) * 16;
        uint4* slot = ring + (u % TC_RING) * 64;
        tc_cp16(slot + lane, tc_lane_row<F>(m.row(r0 + gr), q) + (i64)k * (TC_CHUNK * 2));
        tc_cp16(slot + 32 + lane, tc_lane_row<F>(m.row(r0 + gr + 8), q) + (i64)k * (TC_CHUNK * 2));
    }
    tc_cp_commit();  // (an empty group past the last unit keeps the count)
}

template <int F>
__device__ __forceinline__ void matmul_tc1s_impl(const MatGroup& g, int cols,
                                                 const float* __restrict__ x, int n, int tiles) {
#ifndef TURBOSPARK_HOST_EMULATION
    extern __shared__ __align__(16) uint4 tc_rings[];
#else  // (the emulator's shared memory: a block's statics, the most any launch takes)
    __shared__ uint4 tc_rings[TC_MAX_SEGS * TC_RING * 64];
#endif
    __shared__ float parts[TC_MAX_SEGS][16][8];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int gr = lane >> 2, q = lane & 3;
    int chunks = cols / TC_CHUNK, per = tc_seg_chunks(cols);
    int c0 = warp * per, cnt = min(c0 + per, chunks) - c0;
    int my_tiles = (int)blockIdx.x < tiles ? (tiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    int units = my_tiles * cnt;
    uint4* ring = tc_rings + warp * (TC_RING * 64);
#pragma unroll
    for (int u = 0; u < TC_RING; u++) tc_stream_issue<F>(g, u, units, cnt, c0, gr, q, ring, lane);
    KERNEL_ENTRY();
    const float* xt = x + (i64)min(gr, n - 1) * cols + q * 8;
    bool token = gr < n;
    uint4 xv[TC_STREAM_PMAX];
#pragma unroll
    for (int i = 0; i < TC_STREAM_PMAX; i++)
        if (i < cnt) xv[i] = token ? tc_load_x8(xt + (c0 + i) * TC_CHUNK) : make_uint4(0, 0, 0, 0);
    int segs = (chunks + per - 1) / per;
    int u = 0;
    for (int t = 0; t < my_tiles; t++) {
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < TC_STREAM_PMAX; i++) {
            if (i < cnt) {
                tc_cp_wait<TC_RING - 1>();  // unit u has landed (this lane's own copies)
                const uint4* slot = ring + (u % TC_RING) * 64;
                tc_chunk(c, slot[lane], slot[32 + lane], xv[i]);
                // The MMA has taken the slot's values: refill it.
                tc_stream_issue<F>(g, u + TC_RING, units, cnt, c0, gr, q, ring, lane);
                u++;
            }
        }
        int tile = blockIdx.x + t * gridDim.x;
        TcMember m = tc_member(g, tile);
        tc_tile_totals(parts, c, segs, m, (tile - m.first_block) * 16, n);
        __syncthreads();  // (parts is the next tile's)
    }
}

// Batches: a block per TC_BATCH_ROWS rows of a member (block_start counts
// these blocks) × TC_BATCH_TOKENS tokens (grid.y); warp w takes rows 16w
// .. 16w + 15 of the block for every token tile, walking all the chunks
// and closing a segment every tc_seg_chunks. A chunk of the block's
// tokens is rounded to bf16 once, into shared memory (double-buffered:
// the next chunk's values are loaded while this one's MMAs run), and each
// warp's next chunk of weights is loaded likewise.
template <int F>
__device__ __forceinline__ void matmul_tc_impl(const MatGroup& g, int cols,
                                               const float* __restrict__ x, int n) {
    KERNEL_ENTRY();
    __shared__ __align__(16) uint4 xs[2][TC_BATCH_TOKENS][TC_CHUNK / 8];
    TcMember m = tc_member(g, blockIdx.x);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int gr = lane >> 2, q = lane & 3;
    int r0 = (blockIdx.x - m.first_block) * TC_BATCH_ROWS + warp * 16;
    int t0 = blockIdx.y * TC_BATCH_TOKENS;
    int chunks = cols / TC_CHUNK, per = tc_seg_chunks(cols);
    const u8* row_a = tc_lane_row<F>(m.row(r0 + gr), q);
    const u8* row_b = tc_lane_row<F>(m.row(r0 + gr + 8), q);
    // This thread's share of the staging: token st_t, 8 values at st_q.
    int st_t = threadIdx.x >> 2, st_q = threadIdx.x & 3;
    const float* xt = x + (i64)min(t0 + st_t, n - 1) * cols + st_q * 8;
    float c[TC_BATCH_NT][4], total[TC_BATCH_NT][4];
#pragma unroll
    for (int j = 0; j < TC_BATCH_NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) c[j][e] = total[j][e] = 0.0f;
    xs[0][st_t][st_q] = tc_load_x8(xt);
    uint4 ra = tc_w8<F>(row_a, 0, q), rb = tc_w8<F>(row_b, 0, q);
    __syncthreads();
    for (int k = 0; k < chunks; k++) {
        bool more = k + 1 < chunks;
        uint4 xn, na, nb;
        if (more) {
            xn = tc_load_x8(xt + (k + 1) * TC_CHUNK);
            na = tc_w8<F>(row_a, k + 1, q);
            nb = tc_w8<F>(row_b, k + 1, q);
        }
#pragma unroll
        for (int j = 0; j < TC_BATCH_NT; j++) tc_chunk(c[j], ra, rb, xs[k & 1][j * 8 + gr][q]);
        if ((k + 1) % per == 0 || !more) {
#pragma unroll
            for (int j = 0; j < TC_BATCH_NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    total[j][e] += c[j][e];
                    c[j][e] = 0.0f;
                }
        }
        if (more) {
            xs[(k + 1) & 1][st_t][st_q] = xn;
            ra = na;
            rb = nb;
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < TC_BATCH_NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int o = r0 + gr + (e >> 1) * 8, t = t0 + j * 8 + 2 * q + (e & 1);
            if (o < m.rows && t < n) {
                float v = total[j][e];
                m.out[(i64)t * m.rows + o] = m.bias ? v + m.bias[o] : v;
            }
        }
}

// The kernels of weight format F, named after the format.
#define TC_KERNELS(fmt, F)                                                                       \
    KERNEL void __launch_bounds__(TC_MAX_SEGS * 32)                                              \
        matmul_tc1_##fmt(MatGroup g, int cols, const float* __restrict__ x, int n) {             \
        matmul_tc1_impl<F>(g, cols, x, n);                                                       \
    }                                                                                            \
    KERNEL void __launch_bounds__(TC_ROW_WARPS * 32)                                             \
        matmul_tc1r_##fmt(MatGroup g, int cols, const float* __restrict__ x, int n) {            \
        matmul_tc1r_impl<F>(g, cols, x, n);                                                      \
    }                                                                                            \
    KERNEL void __launch_bounds__(TC_BATCH_WARPS * 32)                                           \
        matmul_tc_##fmt(MatGroup g, int cols, const float* __restrict__ x, int n) {              \
        matmul_tc_impl<F>(g, cols, x, n);                                                        \
    }

// bf16 weights' streamed few-token kernel (matmul_tc1s_impl: the
// weights are copied to shared memory as they are, so only the formats
// whose bytes are their bf16 values).
KERNEL void __launch_bounds__(TC_MAX_SEGS * 32, 1)
    matmul_tc1s_bf16(MatGroup g, int cols, const float* __restrict__ x, int n, int tiles) {
    matmul_tc1s_impl<F_BF16>(g, cols, x, n, tiles);
}

// A token's bf16 router product and its routing in one launch of one
// block: the block walks every tile of the router's rows as
// matmul_tc1s_impl does (the same sums, its bias added), then its first
// warp routes the token from the logits it wrote, as `route` does
// (route.cu route_token) — no ticket, the block is the launch. (Taken
// under TURBOSPARK_CUDA_BF16=stream+route: stream/moe.rs.)
KERNEL void __launch_bounds__(TC_MAX_SEGS * 32, 1)
    router_tc1s_bf16(MatGroup g, int cols, const float* __restrict__ x, int tiles, RouterParams p,
                     const float* correction, const float* expert_scale, RouteOut* out) {
    matmul_tc1s_impl<F_BF16>(g, cols, x, 1, tiles);
    // (Its last barrier follows the logits' stores: visible to the block.)
    if (threadIdx.x < 32) route_token(g.out[0], 0, p, correction, expert_scale, out);
}

TC_KERNELS(f32, F_F32)
TC_KERNELS(f16, F_F16)
TC_KERNELS(bf16, F_BF16)
TC_KERNELS(q4_0, F_Q4_0)
TC_KERNELS(q4_1, F_Q4_1)
TC_KERNELS(q5_0, F_Q5_0)
TC_KERNELS(q5_1, F_Q5_1)
TC_KERNELS(q4_k, F_Q4_K)
TC_KERNELS(q5_k, F_Q5_K)
TC_KERNELS(q6_k, F_Q6_K)
