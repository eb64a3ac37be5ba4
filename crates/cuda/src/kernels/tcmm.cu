// Tensor-core products of bf16 weights in fast numerics:
//   out[t, o] = Σ_i W[o, i] · bf16(x[t, i])   (+ bias[o])
// W bf16 [rows, cols] (row stride row_bytes), x f32 [n, cols] rounded to
// bf16 (round to nearest even, PTX `cvt.rn.bf16x2.f32`) as it is read,
// products summed in f32 by the tensor cores (mma.sync m16n8k16, bf16 ·
// bf16 + f32; sm_80 and later). Columns must be a multiple of 32, rows
// and x 16-byte aligned (stream.rs `bf16_tc_fits`); other products keep
// matmul.cu's kernel.
//
// The order of the sums, which every kernel below follows so that a
// token's result has the same bits alone (a decode step) or in a batch
// (prefill), the fast numerics' batch invariance:
//   - the columns are taken in chunks of 32; a chunk is two MMAs, first
//     columns 8q..8q+3 of each group q = 0..3 of 8, then 8q+4..8q+7
//     (lane 4g + q of a warp holds row g's and g + 8's 16 bytes at
//     8q..8q+7, one 16-byte load each, and the token's 8 values there:
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
#define TC_ROUND 4       // chunks whose weights a decode warp loads at once
#define TC_ROW_WARPS 4   // warps of a row-streaming block, 16 rows each
#define TC_BATCH_WARPS 8 // warps of a batch block, 16 rows each
#define TC_BATCH_ROWS (TC_BATCH_WARPS * 16)
#define TC_BATCH_NT 8    // 8-token tiles of a batch block
#define TC_BATCH_TOKENS (TC_BATCH_NT * 8)

// Chunks a segment holds for rows `cols` wide (stream.rs mirrors it).
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
    // Lane group q's 16 bytes of chunk 0 of row r (the last row past the
    // end: its values are computed, never written).
    __device__ __forceinline__ const u8* row(int r, int q) const {
        return w + (i64)min(r, rows - 1) * row_bytes + q * 16;
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

// Up to 8 tokens (a decode step, small batches): a block per 16 rows of a
// member (block_start counts these blocks), a warp per segment of the
// row's chunks (blockDim.x = 32 · segments); the segments' sums meet in
// shared memory and are added in order. Weights are loaded before
// KERNEL_ENTRY's wait (nothing writes them), the tokens after it.
extern "C" __global__ void __launch_bounds__(TC_MAX_SEGS * 32)
    matmul_bf16_tc1(MatGroup g, int cols, const float* __restrict__ x, int n) {
    __shared__ float parts[TC_MAX_SEGS][16][8];
    TcMember m = tc_member(g, blockIdx.x);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int gr = lane >> 2, q = lane & 3;
    int r0 = (blockIdx.x - m.first_block) * 16;
    int chunks = cols / TC_CHUNK, per = tc_seg_chunks(cols);
    int c0 = warp * per, c1 = min(c0 + per, chunks);
    const u8* row_a = m.row(r0 + gr, q);
    const u8* row_b = m.row(r0 + gr + 8, q);
    const float* xt = x + (i64)min(gr, n - 1) * cols + q * 8;
    bool token = gr < n;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    bool waited = false;
    for (int r = c0; r < c1; r += TC_ROUND) {
        uint4 ra[TC_ROUND], rb[TC_ROUND], xv[TC_ROUND];
#pragma unroll
        for (int i = 0; i < TC_ROUND; i++) {
            if (r + i < c1) {
                ra[i] = ld_stream_u4(row_a + (i64)(r + i) * (TC_CHUNK * 2));
                rb[i] = ld_stream_u4(row_b + (i64)(r + i) * (TC_CHUNK * 2));
            }
        }
        if (!waited) {
            KERNEL_ENTRY();
            waited = true;
        }
#pragma unroll
        for (int i = 0; i < TC_ROUND; i++)
            if (r + i < c1)
                xv[i] = token ? tc_load_x8(xt + (r + i) * TC_CHUNK) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < TC_ROUND; i++)
            if (r + i < c1) tc_chunk(c, ra[i], rb[i], xv[i]);
    }
    if (!waited) KERNEL_ENTRY();  // (a warp past the last chunk)
    parts[warp][gr][2 * q] = c[0];
    parts[warp][gr][2 * q + 1] = c[1];
    parts[warp][gr + 8][2 * q] = c[2];
    parts[warp][gr + 8][2 * q + 1] = c[3];
    __syncthreads();
    // The 16 rows × 8 tokens of the tile, whatever the block's threads
    // (a row of 12 chunks or fewer is 1-3 segments: 32-96 threads).
    int segs = (chunks + per - 1) / per;
    for (int i = threadIdx.x; i < 16 * 8; i += blockDim.x) {
        int row = i >> 3, t = i & 7;
        float total = 0.0f;
        for (int s = 0; s < segs; s++) total += parts[s][row][t];
        int o = r0 + row;
        if (o < m.rows && t < n) m.out[(i64)t * m.rows + o] = m.bias ? total + m.bias[o] : total;
    }
}

// Up to 8 tokens through many rows (an output head): a warp per 16 rows,
// walking all their chunks TC_ROUND at a time, the next round's weights
// loaded while this one's MMAs run, and closing a segment every
// tc_seg_chunks — the sums of matmul_bf16_tc1 in the same order, without
// the meeting in shared memory, for matrices with rows enough to keep
// every SM busy with whole rows (fusion.rs `launch_bf16_tc` picks; the
// bits are the same).
// Blocks of TC_ROW_WARPS warps (block_start counts these blocks).
extern "C" __global__ void __launch_bounds__(TC_ROW_WARPS * 32)
    matmul_bf16_tc1r(MatGroup g, int cols, const float* __restrict__ x, int n) {
    TcMember m = tc_member(g, blockIdx.x);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int gr = lane >> 2, q = lane & 3;
    int r0 = (blockIdx.x - m.first_block) * (TC_ROW_WARPS * 16) + warp * 16;
    int chunks = cols / TC_CHUNK, per = tc_seg_chunks(cols);
    const u8* row_a = m.row(r0 + gr, q);
    const u8* row_b = m.row(r0 + gr + 8, q);
    const float* xt = x + (i64)min(gr, n - 1) * cols + q * 8;
    bool token = gr < n;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, total[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint4 ra[TC_ROUND], rb[TC_ROUND];
#pragma unroll
    for (int i = 0; i < TC_ROUND; i++) {
        if (i < chunks) {
            ra[i] = ld_stream_u4(row_a + (i64)i * (TC_CHUNK * 2));
            rb[i] = ld_stream_u4(row_b + (i64)i * (TC_CHUNK * 2));
        }
    }
    KERNEL_ENTRY();
    for (int k0 = 0; k0 < chunks; k0 += TC_ROUND) {
        uint4 na[TC_ROUND], nb[TC_ROUND], xv[TC_ROUND];
#pragma unroll
        for (int i = 0; i < TC_ROUND; i++) {
            int k = k0 + TC_ROUND + i;
            if (k < chunks) {
                na[i] = ld_stream_u4(row_a + (i64)k * (TC_CHUNK * 2));
                nb[i] = ld_stream_u4(row_b + (i64)k * (TC_CHUNK * 2));
            }
        }
#pragma unroll
        for (int i = 0; i < TC_ROUND; i++)
            if (k0 + i < chunks)
                xv[i] = token ? tc_load_x8(xt + (k0 + i) * TC_CHUNK) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < TC_ROUND; i++) {
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
        for (int i = 0; i < TC_ROUND; i++) {
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

// Batches: a block per TC_BATCH_ROWS rows of a member (block_start counts
// these blocks) × TC_BATCH_TOKENS tokens (grid.y); warp w takes rows 16w
// .. 16w + 15 of the block for every token tile, walking all the chunks
// and closing a segment every tc_seg_chunks. A chunk of the block's
// tokens is rounded to bf16 once, into shared memory (double-buffered:
// the next chunk's values are loaded while this one's MMAs run), and each
// warp's next chunk of weights is loaded likewise.
extern "C" __global__ void __launch_bounds__(TC_BATCH_WARPS * 32)
    matmul_bf16_tc(MatGroup g, int cols, const float* __restrict__ x, int n) {
    KERNEL_ENTRY();
    __shared__ __align__(16) uint4 xs[2][TC_BATCH_TOKENS][TC_CHUNK / 8];
    TcMember m = tc_member(g, blockIdx.x);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int gr = lane >> 2, q = lane & 3;
    int r0 = (blockIdx.x - m.first_block) * TC_BATCH_ROWS + warp * 16;
    int t0 = blockIdx.y * TC_BATCH_TOKENS;
    int chunks = cols / TC_CHUNK, per = tc_seg_chunks(cols);
    const u8* row_a = m.row(r0 + gr, q);
    const u8* row_b = m.row(r0 + gr + 8, q);
    // This thread's share of the staging: token st_t, 8 values at st_q.
    int st_t = threadIdx.x >> 2, st_q = threadIdx.x & 3;
    const float* xt = x + (i64)min(t0 + st_t, n - 1) * cols + st_q * 8;
    float c[TC_BATCH_NT][4], total[TC_BATCH_NT][4];
#pragma unroll
    for (int j = 0; j < TC_BATCH_NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) c[j][e] = total[j][e] = 0.0f;
    xs[0][st_t][st_q] = tc_load_x8(xt);
    uint4 ra = ld_stream_u4(row_a), rb = ld_stream_u4(row_b);
    __syncthreads();
    for (int k = 0; k < chunks; k++) {
        bool more = k + 1 < chunks;
        uint4 xn, na, nb;
        if (more) {
            xn = tc_load_x8(xt + (k + 1) * TC_CHUNK);
            na = ld_stream_u4(row_a + (i64)(k + 1) * (TC_CHUNK * 2));
            nb = ld_stream_u4(row_b + (i64)(k + 1) * (TC_CHUNK * 2));
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
