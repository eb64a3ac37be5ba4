// One token's routed-expert products for MXFP4 rows up to ONE_MAX_COLS
// wide with a lane per chunk: the sums of q8_rows_dot (q8dot.cu) in its
// canonical order — per block the exact integer Σ c·q, per chunk of
// Q8_CHUNK blocks part = fmaf((float)Σ, dw · dx, part) from 0 block by
// block, the row's total the chunks' parts added in order from 0 — so the
// same bits as the per-row, one-token and tensor-core kernels, with fewer
// instructions a byte (MXFP4's per-row kernels are bound by instructions:
// BENCHMARKS.md, "Why MXFP4 is bound by instructions"):
//
// - A warp takes tiles of CHUNK_TILE units (a gate row and an up row; a
//   down row) one after another, grid-stride. The tile's (unit, chunk)
//   pairs are dealt to the lanes in order, so neighbouring lanes read
//   neighbouring 64-byte chunks of a row. A lane forms a whole chunk's part
//   alone — its 4 blocks' codes (four 16-byte loads), their 4 scale bytes
//   (one 32-bit load), the token's codes and scales of those blocks — with
//   no shuffle: the per-row kernels spend five shuffles a block moving
//   values to each chunk's head and eight a stretch gathering the parts.
// - The parts go to shared memory; lane u of the warp then adds unit u's
//   parts in chunk order and writes its result (`Work::write`).
//
// Chosen with TURBOSPARK_CUDA_ONE=chunk (kernels.rs `one_token_kernels`).

#define CHUNK_TILE 8                               // units a warp takes at a time
#define CHUNK_MAX (ONE_MAX_COLS / 32 / Q8_CHUNK)   // chunks of the widest row (32)

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

// The parts of chunk c of R rows (one format, `cols` wide) against one
// token's quantized activations. FULL: the chunk has all Q8_CHUNK blocks
// (every chunk of a row but perhaps its last), so no block is tested.
template <int R, bool FULL>
__device__ __forceinline__ void chunk_parts(const u8* const* rows, int cols, int c,
                                            const signed char* __restrict__ xq,
                                            const float* __restrict__ xd, float* part) {
    int nb = cols / 32, b0 = c * Q8_CHUNK;
    const uint4 z4 = make_uint4(0, 0, 0, 0);
    const int4 zi = make_int4(0, 0, 0, 0);
    uint4 w[R][Q8_CHUNK];
    u32 sc[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const uint4* wp = (const uint4*)split_codes<F_MXFP4>(rows[r], b0);
#pragma unroll
        for (int u = 0; u < Q8_CHUNK; u++) w[r][u] = FULL || b0 + u < nb ? wp[u] : z4;
        // The chunk's 4 scale bytes (aligned: rows start 16-byte aligned and
        // b0 is a multiple of 4). Past the row's last block they are the
        // row's padding (device rows are padded to 16 bytes, at least as
        // many bytes as the last chunk lacks) and are not used.
        sc[r] = *(const u32*)split_scale<F_MXFP4>(rows[r], cols, b0);
    }
    const int4* xp = (const int4*)(xq + (i64)b0 * 32);
    int4 x[Q8_CHUNK][2];
    float dx[Q8_CHUNK];
#pragma unroll
    for (int u = 0; u < Q8_CHUNK; u++) {
        bool in = FULL || b0 + u < nb;
        x[u][0] = in ? xp[2 * u] : zi;
        x[u][1] = in ? xp[2 * u + 1] : zi;
        dx[u] = in ? xd[b0 + u] : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < R; r++) part[r] = 0.0f;
#pragma unroll
    for (int u = 0; u < Q8_CHUNK; u++) {
        if (!FULL && b0 + u >= nb) break;
#pragma unroll
        for (int r = 0; r < R; r++) {
            int s = mxfp4_block_dot(w[r][u], x[u][0], x[u][1]);
            float dw = e8m0_half((u8)(sc[r] >> (8 * u)));
            part[r] = fmaf((float)s, dw * dx[u], part[r]);
        }
    }
}

// The units of a launch in tiles (see the top). `Work` is q8one.cu's:
// a unit's rows and token (`unit`; false: nothing to compute) and its
// totals' store (`write`).
template <int R, class Work>
__device__ __forceinline__ void chunk_units(const Work& wk, int units, int cols) {
    __shared__ float parts[ONE_WARPS][R][CHUNK_TILE][CHUNK_MAX + 1];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int nc = (cols / 32 + Q8_CHUNK - 1) / Q8_CHUNK, full = cols / 32 / Q8_CHUNK;
    int tiles = (units + CHUNK_TILE - 1) / CHUNK_TILE;
    for (int tile = blockIdx.x * ONE_WARPS + warp; tile < tiles; tile += gridDim.x * ONE_WARPS) {
        int u0 = tile * CHUNK_TILE;
        int items = min(CHUNK_TILE, units - u0) * nc;
        for (int it = lane; it < items; it += 32) {
            int ul = it / nc, c = it - ul * nc;
            const u8* rows[R];
            const signed char* xq;
            const float* xd;
            float part[R];
            if (wk.unit(u0 + ul, rows, &xq, &xd)) {
                if (c < full)
                    chunk_parts<R, true>(rows, cols, c, xq, xd, part);
                else
                    chunk_parts<R, false>(rows, cols, c, xq, xd, part);
            } else {
#pragma unroll
                for (int r = 0; r < R; r++) part[r] = 0.0f;
            }
#pragma unroll
            for (int r = 0; r < R; r++) parts[warp][r][ul][c] = part[r];
        }
        __syncwarp();
        if (lane < CHUNK_TILE && u0 + lane < units) {
            const u8* rows[R];
            const signed char* xq;
            const float* xd;
            if (wk.unit(u0 + lane, rows, &xq, &xd)) {
                float acc[R];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    acc[r] = 0.0f;
                    for (int c = 0; c < nc; c++) acc[r] += parts[warp][r][lane][c];
                }
                wk.write(u0 + lane, acc);
            }
        }
        __syncwarp();
    }
}

extern "C" __global__ void __launch_bounds__(ONE_WARPS * 32)
    moe_gate_up1c_q8x_mxfp4(const signed char* xq, const float* xd, const RouteOut* routes, int k,
                            int n_routes, SlotMask only, BankView b, MoeAct a, float* act) {
    KERNEL_ENTRY();
    chunk_units<2>(OneGateUp{xq, xd, routes, k, only, b, a, act}, n_routes * b.inter, b.hidden);
}

extern "C" __global__ void __launch_bounds__(ONE_WARPS * 32)
    moe_down1c_q8x_mxfp4(const signed char* aq, const float* ad, const RouteOut* routes,
                         int n_routes, SlotMask only, BankView b, float* y) {
    KERNEL_ENTRY();
    chunk_units<1>(OneDown{aq, ad, routes, only, b, y}, n_routes * b.hidden, b.inter);
}
