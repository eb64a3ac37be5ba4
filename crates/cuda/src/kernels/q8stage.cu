// One token's routed-expert products for MXFP4 (the decode step's gate/up
// and down; kernels.rs `OneKind::Staged`), with the weights staged in
// shared memory by the copy engine instead of loaded into registers: the
// sums of q8_rows_dot (q8dot.cu) in its canonical order — per block the
// exact integer Σ c·q, per chunk of Q8_CHUNK blocks part = fmaf((float)Σ,
// dw · dx, part) from 0 block by block, the row's total the chunks' parts
// added in order — so the same bits as every other MXFP4 kernel.
//
// Why: the per-row kernels hold a row's loads in registers, so a warp
// loads, waits, then computes; a wave of blocks does the same in step, and
// a launch takes about the sum of its memory time and its instruction
// time (Nsight Compute on an H200, gpt-oss-20b shapes: BENCHMARKS.md). Here
// the loads cost neither registers nor instructions:
//
// - A launch's work is tiles of STAGE_ROWS consecutive rows of one route
//   (gate/up: those rows of both matrices). A block takes a contiguous run
//   of tiles (the grid is no larger than the GPU holds at once).
// - Its producer warp (one lane) copies each tile's rows — contiguous in
//   the bank, split layout (layout.rs), 16-byte multiples — into one of
//   `stages` shared buffers with bulk asynchronous copies
//   (`cp.async.bulk`, sm_90), each completing a `full` barrier by its byte
//   count, and refills a buffer once its `empty` barrier says the
//   consumers are done with it: up to `stages` tiles in flight a block.
// - Consumer warp w computes row w of each tile exactly as q8_rows_dot1's
//   lane layout does (lane l owns block l of each 32-block stretch; a
//   chunk's fmaf chain passes from lane to lane; lane r adds row r's chunk
//   parts), reading the codes and scales from shared memory, and the
//   token's codes and scales from registers held across tiles (reloaded
//   only when a tile's route reads another token's).
//
// Every thread waits for the launch before (KERNEL_ENTRY) first: the
// routes, the token's codes and the activations are written by it.
// Compiled for sm_90 and later; on earlier devices the kernels trap
// (kernels.rs never selects them there).

typedef unsigned long long u64;

#define STAGE_ROWS 8                           // rows a tile; a consumer warp each
#define STAGE_THREADS ((STAGE_ROWS + 1) * 32)  // the consumers, then the producer warp
#define STAGE_MAX_STAGES 8
#define STAGE_STRETCHES 4                      // 32-block stretches: rows up to 4096 wide
#define STAGE_SLOTS (STAGE_STRETCHES * 32 / Q8_CHUNK)  // chunk parts a row

// Shared-memory address (the state space's own 32-bit form) of a generic
// pointer into shared memory.
__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// One arrival that also announces `bytes` of copies completing the phase.
__device__ __forceinline__ void mbar_expect_bytes(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
            "selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global
// memory into shared memory, completing on `bar`; lines evict-first in
// the L2 (a token reads each weight byte once: see ld_stream_u4).
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar, u64 policy) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
        "[%0], [%1], %2, [%3], %4;" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar), "l"(policy)
        : "memory");
}
__device__ __forceinline__ u64 evict_first_policy() {
    u64 p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}
#endif

// R = 2: gate/up (rows: inter, `cols`: hidden, route i's input: token
// i / k of xq, xd), R = 1: down (rows: hidden, cols: inter, route i's
// input: row i of xq, xd, the quantized activations).
// q8_piece_dot's integer sum for MXFP4 in two chains of dp4a instead of
// one (integer sums are exact, so the same value): half the dependent
// latency a piece, for the few warps a block holds.
__device__ __forceinline__ int stage_piece_dot(uint4 w, const Q8Act<F_MXFP4>& x, Mxfp4Tables t) {
    int s0 = mxfp4_dot_word(w.x, x.lo.x, x.lo.y, 0, t);
    int s1 = mxfp4_dot_word(w.y, x.lo.z, x.lo.w, 0, t);
    s0 = mxfp4_dot_word(w.z, x.hi.x, x.hi.y, s0, t);
    s1 = mxfp4_dot_word(w.w, x.hi.z, x.hi.w, s1, t);
    return s0 + s1;
}

template <int R>
__device__ __forceinline__ void staged_experts(const signed char* __restrict__ xq_all,
                                               const float* __restrict__ xd_all,
                                               const RouteOut* __restrict__ routes, int k,
                                               int n_routes, SlotMask only, BankView b, MoeAct a,
                                               float* __restrict__ out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) u8 stage_buf[];
    __shared__ __align__(8) u64 full[STAGE_MAX_STAGES], empty[STAGE_MAX_STAGES];
    __shared__ __align__(16) float parts_of_warp[STAGE_ROWS][R][STAGE_SLOTS];
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    const int rows_n = R == 2 ? b.inter : b.hidden, cols = R == 2 ? b.hidden : b.inter;
    const i64 row_bytes = R == 2 ? b.gate_row_bytes : b.down_row_bytes;
    const u32 tile_bytes = (u32)(R * STAGE_ROWS * row_bytes);
    const int stages = min((int)(dyn / tile_bytes), STAGE_MAX_STAGES);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; s++) {
            mbar_init(smem_u32(&full[s]), 1);
            mbar_init(smem_u32(&empty[s]), STAGE_ROWS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int per_route = (rows_n + STAGE_ROWS - 1) / STAGE_ROWS;
    const int tiles = n_routes * per_route;
    const int per_block = (tiles + gridDim.x - 1) / gridDim.x;
    const int first = blockIdx.x * per_block, last = min(tiles, first + per_block);
    const u32 base = smem_u32(stage_buf);

    if (warp == STAGE_ROWS) {  // the producer
        if (lane != 0) return;
        u64 policy = evict_first_policy();
        int j = 0;
        for (int t = first; t < last; t++) {
            int i = t / per_route, r0 = (t % per_route) * STAGE_ROWS;
            u32 slot = routes[i].slot;
            if (slot >= (u32)b.slots || skipped(only, slot)) continue;
            int s = j % stages, use = j / stages;
            if (use > 0) mbar_wait(smem_u32(&empty[s]), (use - 1) & 1);
            u32 n = (u32)min(STAGE_ROWS, rows_n - r0);
            u32 bytes = n * (u32)row_bytes;
            mbar_expect_bytes(smem_u32(&full[s]), R * bytes);
            u32 dst = base + s * tile_bytes;
#pragma unroll
            for (int m = 0; m < R; m++) {
                const u8* w = R == 1 ? b.down : m == 0 ? b.gate : b.up;
                const u8* src = w + ((i64)slot * rows_n + r0) * row_bytes;
                bulk_copy(dst + m * STAGE_ROWS * (u32)row_bytes, src, bytes, smem_u32(&full[s]),
                          policy);
            }
            j++;
        }
        return;
    }

    // A consumer: row `warp` of each tile.
    constexpr int F = F_MXFP4;
    constexpr int CHUNK_LANES = Q8_CHUNK;     // MXFP4: a block a lane
    constexpr int CHUNKS = 32 / CHUNK_LANES;  // chunks a stretch covers
    float(*parts)[STAGE_SLOTS] = parts_of_warp[warp];
    const int pos = lane % CHUNK_LANES;                 // the lane's block in its chunk
    const bool tail = pos == Q8_CHUNK - 1;              // ends with the chunk's part
    const int chunk = lane / CHUNK_LANES;
    const int nb = cols / 32;
    const Mxfp4Tables tables = Mxfp4Tables::held();
    Q8Act<F> x[STAGE_STRETCHES];
    float dx[STAGE_STRETCHES];
    i64 held = -1;  // the input row held in x, dx
    int j = 0;
    for (int t = first; t < last; t++) {  // uniform over the block
        int i = t / per_route, r0 = (t % per_route) * STAGE_ROWS;
        u32 slot = routes[i].slot;
        if (slot >= (u32)b.slots || skipped(only, slot)) continue;
        int s = j % stages, use = j / stages;
        j++;
        i64 xrow = R == 1 ? i : i / k;
        if (xrow != held) {  // uniform
            held = xrow;
            const signed char* xq = xq_all + xrow * cols;
            const float* xd = xd_all + xrow * (cols / 32);
#pragma unroll
            for (int u = 0; u < STAGE_STRETCHES; u++) {
                int b = u * 32 + lane;
                bool valid = b < nb;
                x[u] = valid ? q8_load_act<F, true>(xq, b, 0)
                             : Q8Act<F>{make_int4(0, 0, 0, 0), make_int4(0, 0, 0, 0)};
                dx[u] = valid ? ld_f32_after_wait(xd + b) : 0.0f;
            }
        }
        mbar_wait(smem_u32(&full[s]), use & 1);
        int row = r0 + warp;
        bool live = row < rows_n;  // uniform over the warp
        float acc[R];
        if (live) {
            const u8* rows[R];
#pragma unroll
            for (int m = 0; m < R; m++)
                rows[m] = stage_buf + s * tile_bytes + (m * STAGE_ROWS + warp) * row_bytes;
#pragma unroll
            for (int u = 0; u < STAGE_STRETCHES; u++) {
                int firstb = u * 32;
                if (firstb >= nb) {  // uniform: no blocks from here on
                    q8_zero_parts<R, STAGE_SLOTS>(parts, u * CHUNKS);
                    break;
                }
                int b = firstb + lane;
                bool valid = b < nb;
#pragma unroll
                for (int m = 0; m < R; m++) {
                    uint4 w = valid ? *(const uint4*)(rows[m] + 16 * b) : make_uint4(0, 0, 0, 0);
                    u32 sw = valid ? (u32)rows[m][nb * 16 + b] : 0u;
                    int v = valid ? stage_piece_dot(w, x[u], tables) : 0;
                    float g = (valid ? q8_weight_scale<F>(sw) : 0.0f) * dx[u];
                    float p = q8_chunk_part((float)v, g, pos, 1);
                    if (tail) parts[m][u * CHUNKS + chunk] = p;
                }
            }
        }
        // The tile's buffer is read: hand it back to the producer.
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_u32(&empty[s]));
        if (live) {
            float total = q8_add_parts<R, STAGE_SLOTS>(parts, 0.0f);
#pragma unroll
            for (int m = 0; m < R; m++) acc[m] = __shfl_sync(FULL_MASK, total, m);
            if (lane == 0) {
                if (R == 2)
                    out[(i64)i * b.inter + row] =
                        moe_act_value(b, a, (i64)slot * b.inter + row, acc[0], acc[1]);
                else
                    out[(i64)i * b.hidden + row] =
                        moe_down_value(b, (i64)slot * b.hidden + row, acc[0]);
            }
        }
    }
#else
    __trap();
#endif
}

extern "C" __global__ void __launch_bounds__(STAGE_THREADS)
    moe_gate_up1s_q8x_mxfp4(const signed char* xq, const float* xd, const RouteOut* routes, int k,
                            int n_routes, SlotMask only, BankView b, MoeAct a, float* act) {
    KERNEL_ENTRY();
    staged_experts<2>(xq, xd, routes, k, n_routes, only, b, a, act);
}

extern "C" __global__ void __launch_bounds__(STAGE_THREADS)
    moe_down1s_q8x_mxfp4(const signed char* aq, const float* ad, const RouteOut* routes,
                         int n_routes, SlotMask only, BankView b, float* y) {
    KERNEL_ENTRY();
    staged_experts<1>(aq, ad, routes, 1, n_routes, only, b, MoeAct{0, 0.0f, 0.0f}, y);
}
