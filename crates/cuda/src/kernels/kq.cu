// Fast numerics (turbospark_backend::Numerics::Fast) for Q4_K weights
// against 8-bit activations: dense products in integers, opt-in
// (`TURBOSPARK_CUDA_KQ=int8`, kernels/kq.rs), where the default decodes
// the weights to bf16 for the tensor cores (tcmm.cu).
//
// Math. A Q4_K super-block covers 256 weights: d and dmin (f16), eight
// 6-bit (scale, min) pairs (sc_s, m_s) packed in 12 bytes, and 4-bit
// codes c; weight i of sub-block s (32 weights) is d·sc_s·c_i − dmin·m_s
// (ggml's dequantize_row_q4_K). The activations are q8dot.cu's, in natural
// order: per 32-element block b, x_i ≈ dx_b · a_i with a_i in [-127, 127].
// Block b of a row is sub-block s of its super-block, so
//   Σ_i w_i x_i ≈ dx · (d · sc · Σ c_i a_i − dmin · m · Σ a_i)
// where both integer sums are exact. The f32 order, which every kernel
// below follows so that a token's result has the same bits alone (a decode
// step) or in a batch (prefill) — the fast numerics' batch invariance:
//   - per block, v = (float)(sc · Σ c a) and vm = (float)(m · Σ a), both
//     exact (|v| ≤ 63 · 32 · 15 · 127 < 2^22, |vm| ≤ 63 · 32 · 127 < 2^18);
//   - per chunk of Q8_CHUNK consecutive blocks, from p = 0, block by block:
//       p = fmaf(v, d · dx, p);  p = fmaf(-vm, dmin · dx, p);
//   - the row's total, from 0, adds the chunks' parts in order; then the
//     bias, if any, is added.
// Rows are whole super-blocks (cols a multiple of 256), their bytes 16-byte
// aligned (kq.rs `kq_fits`): a super-block is 144 bytes, a 16-byte header
// (d, dmin, scales) and 8 pieces of 16 code bytes; piece p holds elements
// 16(p % 2) .. + 15 of sub-blocks 2(p / 2) (low nibbles) and 2(p / 2) + 1
// (high nibbles).
//
// tests/emulation (`kq_products`) runs both kernels on the CPU against a
// scalar reference of this order, bit for bit.

// Scale and min of sub-block s (0..7) from a header's scale words
// (bytes 0..3, 4..7, 8..11 of the 12 scale bytes): ggml's get_scale_min_k4.
__device__ __forceinline__ void kq_scale_min(uint4 hd, int s, int* sc, int* mn) {
    int sh = 8 * (s & 3);
    u32 a = (hd.y >> sh) & 0xFFu, b = (hd.z >> sh) & 0xFFu, c = (hd.w >> sh) & 0xFFu;
    if (s < 4) {
        *sc = (int)(a & 63u);
        *mn = (int)(b & 63u);
    } else {
        *sc = (int)((c & 0xFu) | ((a >> 6) << 4));
        *mn = (int)((c >> 4) | ((b >> 6) << 4));
    }
}

// Σ of the four signed bytes of each word of v plus s.
__device__ __forceinline__ int kq_byte_sum(int4 v, int s) {
    s = dp4a(v.x, 0x01010101, s);
    s = dp4a(v.y, 0x01010101, s);
    s = dp4a(v.z, 0x01010101, s);
    return dp4a(v.w, 0x01010101, s);
}

// Σ code · a of four words of codes (one code a byte) against four of a.
__device__ __forceinline__ int kq_dot4(u32 c0, u32 c1, u32 c2, u32 c3, int4 a) {
    int s = dp4a((int)c0, a.x, 0);
    s = dp4a((int)c1, a.y, s);
    s = dp4a((int)c2, a.z, s);
    return dp4a((int)c3, a.w, s);
}

// Super-blocks a stretch covers (8 lanes each) and stretches whose loads
// a warp issues before using any.
#define KQ_SB_A_STRETCH 4
#define KQ_UNROLL 4

// A Q4_K row dotted with T tokens' quantized activations (nt of them
// live) into acc[t], by every lane of a warp (each ends with the totals).
// Lane l takes piece l % 8 of super-block l / 8 of each stretch and ends
// up owning block l of it (sub-block l % 8): the two halves of a
// sub-block's integer sums meet by a shuffle; the chunk's fmaf chain
// passes from lane to lane (4 lanes a chunk); every lane adds the
// chunks' parts in order.
// EARLY (the kernel has not yet run KERNEL_ENTRY): the first round's
// weight loads are issued, then every lane waits for the kernel before
// (each row has a super-block, so every warp has a first round), then
// reads the tokens, which that kernel may have written.
template <int T, bool EARLY = false>
__device__ __forceinline__ void kq_row_dot(const u8* row, int cols, const signed char* const* xq,
                                           const float* const* xd, int nt, float* acc) {
    int lane = threadIdx.x & 31, piece = lane & 7, pair = piece >> 1, h = piece & 1;
    int pos = lane & 3;  // the lane's block in its chunk
    int nsb = cols / 256;
    int stretches = (nsb + KQ_SB_A_STRETCH - 1) / KQ_SB_A_STRETCH;
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (int s0 = 0; s0 < stretches; s0 += KQ_UNROLL) {
        uint4 qs[KQ_UNROLL], hd[KQ_UNROLL];
#pragma unroll
        for (int i = 0; i < KQ_UNROLL; i++) {
            int sb = (s0 + i) * KQ_SB_A_STRETCH + (lane >> 3);
            const u8* base = row + (i64)sb * 144;
            bool valid = sb < nsb;
            qs[i] = valid ? ld_stream_u4(base + 16 + 16 * piece) : make_uint4(0, 0, 0, 0);
            hd[i] = valid ? ld_stream_u4(base) : make_uint4(0, 0, 0, 0);
        }
        if (EARLY && s0 == 0) KERNEL_ENTRY();
#pragma unroll
        for (int i = 0; i < KQ_UNROLL; i++) {
            int first = (s0 + i) * KQ_SB_A_STRETCH;
            if (first >= nsb) break;  // uniform over the warp
            int sb = first + (lane >> 3);
            bool valid = sb < nsb;
            u32 lo[4] = {qs[i].x & 0x0F0F0F0Fu, qs[i].y & 0x0F0F0F0Fu, qs[i].z & 0x0F0F0F0Fu,
                         qs[i].w & 0x0F0F0F0Fu};
            u32 hi[4] = {(qs[i].x >> 4) & 0x0F0F0F0Fu, (qs[i].y >> 4) & 0x0F0F0F0Fu,
                         (qs[i].z >> 4) & 0x0F0F0F0Fu, (qs[i].w >> 4) & 0x0F0F0F0Fu};
            int sc, mn;
            kq_scale_min(hd[i], piece, &sc, &mn);
            float d = f16_to_f32((u16)(hd[i].x & 0xFFFFu)), dmin = f16_to_f32((u16)(hd[i].x >> 16));
            i64 b = (i64)sb * 8 + piece;  // the block this lane owns
#pragma unroll
            for (int t = 0; t < T; t++) {
                if (t >= nt) break;
                // Elements 16h .. 16h + 15 of sub-blocks 2·pair and 2·pair + 1.
                const signed char* xp = xq[t] + ((i64)sb * 8 + 2 * pair) * 32 + 16 * h;
                int4 xa = valid ? (EARLY ? ld_i4_after_wait(xp) : *(const int4*)xp)
                                : make_int4(0, 0, 0, 0);
                int4 xb = valid ? (EARLY ? ld_i4_after_wait(xp + 32) : *(const int4*)(xp + 32))
                                : make_int4(0, 0, 0, 0);
                float dx = valid ? (EARLY ? ld_f32_after_wait(xd[t] + b) : xd[t][b]) : 0.0f;
                int i_lo = kq_dot4(lo[0], lo[1], lo[2], lo[3], xa);
                int i_hi = kq_dot4(hi[0], hi[1], hi[2], hi[3], xb);
                int a_lo = kq_byte_sum(xa, 0), a_hi = kq_byte_sum(xb, 0);
                // Lane h = 0 owns sub-block 2·pair, h = 1 sub-block 2·pair + 1:
                // each sends its partner the half the partner owns.
                int gi = __shfl_xor_sync(FULL_MASK, h ? i_lo : i_hi, 1);
                int ga = __shfl_xor_sync(FULL_MASK, h ? a_lo : a_hi, 1);
                int isum = (h ? i_hi : i_lo) + gi, asum = (h ? a_hi : a_lo) + ga;
                float v = (float)(sc * isum), vm = (float)(mn * asum);
                float g = d * dx, gm = dmin * dx;
                // The chunk's chain, lane 4c + pos forming block pos's steps.
                float p = fmaf(-vm, gm, fmaf(v, g, 0.0f));
#pragma unroll
                for (int u = 1; u < Q8_CHUNK; u++) {
                    float back = __shfl_up_sync(FULL_MASK, p, 1);
                    if (pos == u) p = fmaf(-vm, gm, fmaf(v, g, back));
                }
                // Chunks c = 0 .. 7 of the stretch (two a super-block) in order.
#pragma unroll
                for (int c = 0; c < 32 / Q8_CHUNK; c++) {
                    float part = __shfl_sync(FULL_MASK, p, Q8_CHUNK * c + Q8_CHUNK - 1);
                    if (first + c / 2 < nsb) acc[t] += part;
                }
            }
        }
    }
}

// out[m][t, o] (+ bias[m][o]) for quantized x: grid (block_start[count],
// ceil(n / T)), blocks of Q8_WARPS warps, a warp a row (the q8dot.cu
// matmul_q8_impl's shape, so MatGroup counts blocks alike). T: tokens a
// block, MM_TOKENS, or 1 for a decode step (fewer registers). EARLY: as
// kq_row_dot's (the block's matrix and row are read from the parameters,
// not from memory the kernel before writes).
template <int T, bool EARLY>
__device__ void kq_matmul_impl(const MatGroup& g, int cols, const signed char* __restrict__ xq,
                               const float* __restrict__ xd, int n) {
    int bx = blockIdx.x;
    bool m1 = g.count > 1 && bx >= g.block_start[1], m2 = g.count > 2 && bx >= g.block_start[2];
    const u8* w = m2 ? g.w[2] : m1 ? g.w[1] : g.w[0];
    float* out = m2 ? g.out[2] : m1 ? g.out[1] : g.out[0];
    const float* bias = m2 ? g.bias[2] : m1 ? g.bias[1] : g.bias[0];
    i64 row_bytes = m2 ? g.row_bytes[2] : m1 ? g.row_bytes[1] : g.row_bytes[0];
    int rows = m2 ? g.rows[2] : m1 ? g.rows[1] : g.rows[0];
    int start = m2 ? g.block_start[2] : m1 ? g.block_start[1] : 0;
    int row = (bx - start) * Q8_WARPS + (threadIdx.x >> 5);
    int t0 = blockIdx.y * T;
    int nb = cols / 32;
    const signed char* qs[T];
    const float* ds[T];
#pragma unroll
    for (int t = 0; t < T; t++) {
        int tt = min(t0 + t, n - 1);
        qs[t] = xq + (i64)tt * cols;
        ds[t] = xd + (i64)tt * nb;
    }
    float acc[T];
    kq_row_dot<T, EARLY>(w + (i64)min(row, rows - 1) * row_bytes, cols, qs, ds, min(n - t0, T),
                         acc);
    if (row < rows && (threadIdx.x & 31) == 0) {
#pragma unroll
        for (int t = 0; t < T; t++)
            if (t0 + t < n) out[(i64)(t0 + t) * rows + row] = bias ? acc[t] + bias[row] : acc[t];
    }
}

// Batches on the integer tensor cores: mmq.cu's tiles (MQ_BM rows ×
// MQ_BN tokens a block of MQ_THREADS, a step of Q8_CHUNK blocks — half a
// super-block — staged in shared memory, the warps' fragments as there),
// with the codes unpacked to one a byte, and per (row, block) the scale
// and min, per (token, block) the activations' Σ a beside their scale.
struct __align__(16) KqTiles {
    u8 a[MQ_BM][MQ_LD];
    int sc[MQ_BM][Q8_CHUNK];
    int mn[MQ_BM][Q8_CHUNK];
    float d[MQ_BM];
    float dmin[MQ_BM];
    u8 b[MQ_BN][MQ_LD];
    float bs[MQ_BN][Q8_CHUNK];
    int bsum[MQ_BN][Q8_CHUNK];
};

// Stages blocks b0 .. b0 + Q8_CHUNK (half `b0 / 4 % 2` of super-block
// b0 / 8) of the tile's rows and tokens; every load is issued before any
// store.
__device__ __forceinline__ void kq_stage(KqTiles& s, const u8* const* arow,
                                         const signed char* const* xrow,
                                         const float* const* xsc, int b0) {
    static_assert(MQ_BM * 4 == MQ_THREADS, "a thread a 16-byte piece of the rows' codes");
    static_assert(MQ_BN * Q8_CHUNK * 2 == 2 * MQ_THREADS, "two pieces of tokens a thread");
    static_assert(MQ_BN * Q8_CHUNK == MQ_THREADS, "a token scale a thread");
    int sb = b0 / 8, half = (b0 / 4) & 1;
    // Codes: thread i takes piece 4·half + i % 4 of row i / 4.
    int ar = threadIdx.x / 4, ap = threadIdx.x % 4;
    uint4 qa = ld_stream_u4(arow[ar] + (i64)sb * 144 + 16 + 16 * (4 * half + ap));
    uint4 hd = make_uint4(0, 0, 0, 0);
    if (threadIdx.x < MQ_BM) hd = ld_stream_u4(arow[threadIdx.x] + (i64)sb * 144);
    uint4 rb[2];
    int bt[2], bp[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        int i = threadIdx.x + j * MQ_THREADS;
        bt[j] = i / (Q8_CHUNK * 2);
        bp[j] = i % (Q8_CHUNK * 2);
        rb[j] = ((const uint4*)(xrow[bt[j]] + (i64)(b0 + (bp[j] >> 1)) * 32))[bp[j] & 1];
    }
    int st = threadIdx.x / Q8_CHUNK, su = threadIdx.x % Q8_CHUNK;
    float rs = xsc[st][b0 + su];
    // Piece ap: elements 16(ap % 2) .. of local blocks 2(ap / 2) (low
    // nibbles) and 2(ap / 2) + 1 (high).
    u8* lo = &s.a[ar][(2 * (ap >> 1)) * 32 + 16 * (ap & 1)];
    ((uint4*)lo)[0] = make_uint4(qa.x & 0x0F0F0F0Fu, qa.y & 0x0F0F0F0Fu, qa.z & 0x0F0F0F0Fu,
                                 qa.w & 0x0F0F0F0Fu);
    ((uint4*)(lo + 32))[0] =
        make_uint4((qa.x >> 4) & 0x0F0F0F0Fu, (qa.y >> 4) & 0x0F0F0F0Fu,
                   (qa.z >> 4) & 0x0F0F0F0Fu, (qa.w >> 4) & 0x0F0F0F0Fu);
    if (threadIdx.x < MQ_BM) {
#pragma unroll
        for (int u = 0; u < Q8_CHUNK; u++)
            kq_scale_min(hd, 4 * half + u, &s.sc[threadIdx.x][u], &s.mn[threadIdx.x][u]);
        s.d[threadIdx.x] = f16_to_f32((u16)(hd.x & 0xFFFFu));
        s.dmin[threadIdx.x] = f16_to_f32((u16)(hd.x >> 16));
    }
#pragma unroll
    for (int j = 0; j < 2; j++) {
        ((uint4*)&s.b[bt[j]][0])[bp[j]] = rb[j];
        // The block's Σ a: this piece's half, and its partner's (the
        // neighbouring lane holds the other half of the same block).
        int4 v = make_int4((int)rb[j].x, (int)rb[j].y, (int)rb[j].z, (int)rb[j].w);
        int part = kq_byte_sum(v, 0);
        int sum = part + __shfl_xor_sync(FULL_MASK, part, 1);
        if ((bp[j] & 1) == 0) s.bsum[bt[j]][bp[j] >> 1] = sum;
    }
    s.bs[st][su] = rs;
}

// Dense: out[t, o] (+ bias[o], null: none); grid (ceil(rows / MQ_BM),
// ceil(n / MQ_BN)).
__device__ void kq_tile_impl(const u8* __restrict__ W, int rows, int cols, i64 row_bytes,
                             const signed char* __restrict__ xq, const float* __restrict__ xd,
                             int n, float* __restrict__ out, const float* __restrict__ bias) {
    __shared__ KqTiles s;
    __shared__ const u8* arow[MQ_BM];
    __shared__ const signed char* xrow[MQ_BN];
    __shared__ const float* xsc[MQ_BN];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int r0 = blockIdx.x * MQ_BM;
    MmqTokens tk = {nullptr, (u32)(blockIdx.y * MQ_BN), min(MQ_BN, n - (int)blockIdx.y * MQ_BN)};
    mq_token_rows(tk, xq, xd, cols, 1, xrow, xsc);
    for (int r = threadIdx.x; r < MQ_BM; r += MQ_THREADS)
        arow[r] = W + (i64)min(r0 + r, rows - 1) * row_bytes;
    int ra[MMQ_MT] = {32 * (warp & 1), 32 * (warp & 1) + 16};
    int tb = 8 * MMQ_NT * (warp >> 1);
    float acc[MMQ_MT][MMQ_NT][4];
#pragma unroll
    for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
        for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;
    int nb = cols / 32;
    for (int b0 = 0; b0 < nb; b0 += Q8_CHUNK) {
        __syncthreads();  // the row and token pointers are set; the last step's tiles read
        kq_stage(s, arow, xrow, xsc, b0);
        __syncthreads();
        float part[MMQ_MT][MMQ_NT][4];
#pragma unroll
        for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) part[mt][nt][i] = 0.0f;
#pragma unroll
        for (int u = 0; u < Q8_CHUNK; u++) {
            u32 a[MMQ_MT][4];
            int sc[MMQ_MT][2], mn[MMQ_MT][2];
            float d[MMQ_MT][2], dmin[MMQ_MT][2];
#pragma unroll
            for (int mt = 0; mt < MMQ_MT; mt++) {
                const u8* p0 = &s.a[ra[mt] + g][u * 32];
                const u8* p1 = &s.a[ra[mt] + g + 8][u * 32];
                a[mt][0] = *(const u32*)(p0 + 4 * q);
                a[mt][1] = *(const u32*)(p1 + 4 * q);
                a[mt][2] = *(const u32*)(p0 + 16 + 4 * q);
                a[mt][3] = *(const u32*)(p1 + 16 + 4 * q);
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int r = ra[mt] + g + 8 * e;
                    sc[mt][e] = s.sc[r][u];
                    mn[mt][e] = s.mn[r][u];
                    d[mt][e] = s.d[r];
                    dmin[mt][e] = s.dmin[r];
                }
            }
#pragma unroll
            for (int nt = 0; nt < MMQ_NT; nt++) {
                const u8* x = &s.b[tb + 8 * nt + g][u * 32];
                u32 bx[2] = {*(const u32*)(x + 4 * q), *(const u32*)(x + 16 + 4 * q)};
                float dx[2];
                int as[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    dx[e] = s.bs[tb + 8 * nt + 2 * q + e][u];
                    as[e] = s.bsum[tb + 8 * nt + 2 * q + e][u];
                }
#pragma unroll
                for (int mt = 0; mt < MMQ_MT; mt++) {
                    int c[4];
                    mma_s8(c, a[mt], bx);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        int r = i >> 1, t = i & 1;
                        float v = (float)(sc[mt][r] * c[i]), vm = (float)(mn[mt][r] * as[t]);
                        float p = fmaf(v, d[mt][r] * dx[t], part[mt][nt][i]);
                        part[mt][nt][i] = fmaf(-vm, dmin[mt][r] * dx[t], p);
                    }
                }
            }
        }
#pragma unroll
        for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[mt][nt][i] += part[mt][nt][i];
    }
#pragma unroll
    for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
        for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int row = r0 + ra[mt] + g + 8 * (i >> 1);
                int j = tb + 8 * nt + 2 * q + (i & 1);
                if (row < rows && j < tk.count)
                    out[(i64)(tk.first + j) * rows + row] =
                        bias ? acc[mt][nt][i] + bias[row] : acc[mt][nt][i];
            }
}

extern "C" __global__ void kq_matmul_q4_k(MatGroup g, int cols, const signed char* xq,
                                          const float* xd, int n) {
    KERNEL_ENTRY();
    kq_matmul_impl<MM_TOKENS, false>(g, cols, xq, xd, n);
}
// A decode step's: the first weights loaded before the wait.
extern "C" __global__ void kq_matmul1_q4_k(MatGroup g, int cols, const signed char* xq,
                                           const float* xd, int n) {
    kq_matmul_impl<1, true>(g, cols, xq, xd, n);
}

extern "C" __global__ void __launch_bounds__(MQ_THREADS, MQ_MIN_BLOCKS)
    kq_tile_q4_k(const u8* W, int rows, int cols, i64 row_bytes, const signed char* xq,
                 const float* xd, int n, float* out, const float* bias) {
    KERNEL_ENTRY();
    kq_tile_impl(W, rows, cols, row_bytes, xq, xd, n, out, bias);
}
