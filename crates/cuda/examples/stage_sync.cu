// The stage-boundary experiment of examples/stage_sync.rs: what one step
// of a chain of dependent matrix-vector products costs when each step is
// its own kernel launched as a programmatic dependent of the one before
// (how a decode step runs today: `griddepcontrol`, a CUDA graph), against
// one persistent kernel whose blocks meet at a grid-wide barrier between
// steps, with and without each warp issuing its next step's weight loads
// before it arrives at the barrier (what a decode "megakernel" would do);
// and (at the end) with the weights through a shared-memory ring fed by
// the bulk copy engine.
//
// The product is an 8-bit one of Q8_0's arithmetic, simplified for the
// experiment (not the engine's kernels or their summation order): a row is
// COLS int8 codes and one f32 scale a 32-code block; a warp takes a row, lane
// l the 16-byte pieces l, l + 32, ... (PER_LANE of them), dots each with the
// token's codes (dp4a), scales it by dw · dx, and the warp adds its lanes'
// sums by shuffles. y[row] = Σ_b dw_b · dx_b · Σ_{i in b} w_i x_i.
//
// Compiled at run time by NVRTC after the engine's common.cuh, whose
// KERNEL_ENTRY (`griddepcontrol` on sm_90; on older GPUs the chain runs
// without dependence) and weight-stream loads it uses.

#define COLS 2880
#define BLOCKS_A_ROW (COLS / 32)
#define PIECES (COLS / 16)
#define PER_LANE ((PIECES + 31) / 32)
#define WARPS 4

// One row's weights as a lane holds them.
struct RowLoads {
    uint4 w[PER_LANE];
    float d[PER_LANE];
};

__device__ __forceinline__ void load_row(const signed char* w, const float* d, int row,
                                         RowLoads& r) {
    int lane = threadIdx.x & 31;
    const signed char* codes = w + (i64)row * COLS;
    const float* scales = d + (i64)row * BLOCKS_A_ROW;
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) {
        int p = lane + 32 * j;
        bool in = p < PIECES;
        r.w[j] = in ? ld_stream_u4(codes + 16 * p) : make_uint4(0, 0, 0, 0);
        r.d[j] = in ? __uint_as_float(ld_stream_u32(scales + p / 2)) : 0.0f;
    }
}

__device__ __forceinline__ int dp4a(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// The integer dot of a piece's 16 weight codes with the token's.
__device__ __forceinline__ int piece_dot(uint4 w, int4 x) {
    int s = dp4a((int)w.x, x.x, 0);
    s = dp4a((int)w.y, x.y, s);
    s = dp4a((int)w.z, x.z, s);
    return dp4a((int)w.w, x.w, s);
}

// The sum of v over the warp (every lane returns it).
__device__ __forceinline__ float warp_total(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// The row's product with the token (every lane returns it).
__device__ __forceinline__ float row_dot(const RowLoads& r, const signed char* xq,
                                         const float* xd) {
    int lane = threadIdx.x & 31;
    float v = 0.0f;
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) {
        int p = lane + 32 * j;
        if (p < PIECES) {
            int s = piece_dot(r.w[j], *(const int4*)(xq + 16 * p));
            v = fmaf((float)s, r.d[j] * xd[p / 2], v);
        }
    }
    return warp_total(v);
}

// One step as its own launch: grid ceil(rows / WARPS) blocks of WARPS
// warps, a row a warp. The row's weights are loaded before the wait for
// the launch before (weights are written by no kernel), the token after.
extern "C" __global__ void __launch_bounds__(WARPS * 32, 8)
    chain_step(const signed char* w, const float* d, int rows, const signed char* xq,
               const float* xd, float* y) {
    int row = blockIdx.x * WARPS + (threadIdx.x >> 5);
    RowLoads r;
    load_row(w, d, min(row, rows - 1), r);
    KERNEL_ENTRY();
    float v = row_dot(r, xq, xd);
    if (row < rows && (threadIdx.x & 31) == 0) y[row] = v;
}

// A small step, as a decode layer's norms and routing are between its
// products: one block of WARPS warps sums a step's `rows` outputs (thread
// t the outputs t, t + WARPS·32, ... in order, then the warps' sums by
// shuffles and in warp order) into *sum.
__device__ __forceinline__ void tiny_sum(const float* y, int rows, float* sum) {
    __shared__ float part[WARPS];
    float v = 0.0f;
    // (From the L2: other SMs wrote them in this launch.)
    for (int i = threadIdx.x; i < rows; i += WARPS * 32) v += __ldcg(y + i);
    v = warp_total(v);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int w = 0; w < WARPS; w++) t += part[w];
        *sum = t;
    }
}

// The small step as its own launch (one block), after the product step.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
    chain_tiny(const float* y, int rows, float* sum) {
    KERNEL_ENTRY();
    tiny_sum(y, rows, sum);
}

// A launch that does nothing but wait for the one before: the floor of a
// dependent launch.
extern "C" __global__ void chain_empty() { KERNEL_ENTRY(); }

// Every block of the grid arrives, then waits until all have: `arrived`
// counts arrivals over the whole launch (zeroed before it), so the n-th
// barrier (from 1) waits for n · gridDim.x. A wait longer than ~2 s
// (the blocks were not all resident: cooperative launch should have
// refused) sets *stuck and gives up, as does every later wait that sees
// it set, so the launch ends instead of hanging.
__device__ __forceinline__ void grid_barrier(u32* arrived, u32 target, u32* stuck) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(arrived, 1u);
        long long start = clock64();
        while (true) {
            u32 seen;
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(arrived) : "memory");
            if (seen >= target) break;
            if (clock64() - start > 4000000000ll) {
                atomicExch(stuck, 1u);
                break;
            }
            if (*(volatile u32*)stuck) break;  // another block gave up: so do the rest
        }
    }
    __syncthreads();
}

// The matrices of the steps (device arrays of `mats` pointers, step k
// taking matrix k % mats and writing its rows of y); with `tiny` set, a
// small step after each product step writes sums[k % mats].
struct Steps {
    const signed char* const* w;
    const float* const* d;
    float* sums;
    int steps;
    int rows;
    int tiny;
    int mats;
};

// All steps in one cooperative launch: the grid's warps take a step's rows
// grid-stride, write them, and meet at the barrier; with `tiny`, block 0
// then sums them (tiny_sum) while the others wait at a second barrier.
// PREFETCH: before arriving, each warp loads its first row of the next
// step (weights depend on nothing a step writes), and uses those
// registers after the barrier(s). y: [steps, rows].
template <bool PREFETCH>
__device__ void persistent_steps(Steps s, const signed char* xq, const float* xd, float* y,
                                 u32* arrived, u32* stuck) {
    int warps = gridDim.x * WARPS;
    int first = blockIdx.x * WARPS + (threadIdx.x >> 5);
    // The warp's first row of a step (loaded before the barrier when
    // PREFETCH), then its others.
    RowLoads head;
    bool held = false;
    u32 barriers = 0;
    for (int k = 0; k < s.steps; k++) {
        int m = k % s.mats;
        const signed char* w = s.w[m];
        const float* d = s.d[m];
        float* out = y + (i64)m * s.rows;
        if (first < s.rows) {
            if (!held) load_row(w, d, first, head);
            float v = row_dot(head, xq, xd);
            if ((threadIdx.x & 31) == 0) out[first] = v;
        }
        for (int row = first + warps; row < s.rows; row += warps) {
            RowLoads r;
            load_row(w, d, row, r);
            float v = row_dot(r, xq, xd);
            if ((threadIdx.x & 31) == 0) out[row] = v;
        }
        held = PREFETCH && k + 1 < s.steps && first < s.rows;
        if (held) load_row(s.w[(k + 1) % s.mats], s.d[(k + 1) % s.mats], first, head);
        if (s.tiny) {
            grid_barrier(arrived, ++barriers * gridDim.x, stuck);
            if (blockIdx.x == 0) tiny_sum(out, s.rows, s.sums + m);
        }
        if (k + 1 < s.steps) grid_barrier(arrived, ++barriers * gridDim.x, stuck);
    }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32, 8)
    persistent_plain(Steps s, const signed char* xq, const float* xd, float* y, u32* arrived,
                     u32* stuck) {
    persistent_steps<false>(s, xq, xd, y, arrived, stuck);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    persistent_prefetch(Steps s, const signed char* xq, const float* xd, float* y,
                        u32* arrived, u32* stuck) {
    persistent_steps<true>(s, xq, xd, y, arrived, stuck);
}

// `steps` barriers and nothing else: the cost of one.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
    persistent_barriers(int steps, u32* arrived, u32* stuck) {
    for (int k = 0; k < steps; k++) grid_barrier(arrived, (u32)(k + 1) * gridDim.x, stuck);
}

// ---------------------------------------------------------------------
// Weights through a ring of shared-memory slots (thirty-fifth session).
// A block an SM; one producer thread copies the block's rows into the
// slots with the SM's bulk copy engine (`cp.async.bulk`, sm_90), as fast
// as slots come free, and never waits for anything else: it runs ahead
// across steps (weights depend on no step). Eight consumer warps dot a
// slot's rows (a warp a row) and give the slot back. A slot's "full"
// mbarrier completes when its bytes have landed (the producer's
// expect_tx, the copies' complete_tx), its "empty" one when every
// consumer warp has given it back. A block takes a contiguous range of
// each step's rows (an even count, so every copy is a multiple of 16
// bytes at a 16-byte boundary), slots of RING_ROWS rows.
//
// persistent_ring*: all steps in one cooperative launch, the consumers
// meeting the other blocks' at a grid barrier after each step (and with
// `tiny`, block 0 summing the step's outputs between two barriers), then
// reading the token (written by the step before, in an engine) from the
// L2 into shared memory. Variants: _idle, the consumers give each slot
// back unread (the copies' own rate under the same barriers); _free, no
// barrier (the ring's streaming rate with nothing between steps; the
// token read once); _unordered, the barrier's arrival a relaxed add and
// its wait relaxed loads (no ordering of the outputs: a timing probe for
// runs whose outputs no step reads); _bulk, the outputs written by a bulk
// copy whose completion the arriving thread waits for, no fence (see
// ring_grid_barrier). chain_ring: one step a launch, as
// chain_step, with a ring of 4 slots (two blocks' rings fit an SM).

typedef unsigned long long u64;

// Bulk copies and transaction-counting mbarriers are sm_90's: on older
// GPUs the ring kernels compile to a trap and the example skips them.
#if __CUDA_ARCH__ >= 900

#define RING_CONSUMERS 8
#define RING_ROWS 8

// The shared memory of a ring of SLOTS slots: the barriers first (full,
// then empty), then the slots, each RING_ROWS rows' codes then their
// scales.
template <int SLOTS>
struct Ring {
    static constexpr int codes = RING_ROWS * COLS;
    static constexpr int slot = codes + RING_ROWS * BLOCKS_A_ROW * 4;
    static constexpr int barriers = 2 * SLOTS * 8;
};

__device__ __forceinline__ u32 smem_u32(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init(u64* bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)
                 : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(u64* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Waits until the phase of parity `parity` of `bar` has completed; gives
// up (setting *stuck) after ~2 s, as the grid barrier does.
__device__ __forceinline__ void mbar_wait(u64* bar, u32 parity, u32* stuck) {
    long long start = clock64();
    while (true) {
        u32 done;
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
            "selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(smem_u32(bar)), "r"(parity)
            : "memory");
        if (done) return;
        if (clock64() - start > 4000000000ll) {
            atomicExch(stuck, 1u);
            return;
        }
    }
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global
// to shared memory by the bulk copy engine, completing on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, u32 bytes, u64* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
}

// The slots and their barriers, initialized by thread 0 (the caller then
// syncs the block).
template <int SLOTS>
struct RingSlots {
    u64* full;
    u64* empty;
    unsigned char* slots;

    __device__ __forceinline__ static RingSlots init(unsigned char* smem) {
        RingSlots r{(u64*)smem, (u64*)smem + SLOTS, smem + Ring<SLOTS>::barriers};
        if (threadIdx.x == 0) {
            for (int i = 0; i < SLOTS; i++) {
                mbar_init(r.full + i, 1);
                mbar_init(r.empty + i, RING_CONSUMERS);
            }
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        return r;
    }

    __device__ __forceinline__ unsigned char* slot(int i) const {
        return slots + i * Ring<SLOTS>::slot;
    }
};

// A position in the ring: the slot and the parity of its current use.
template <int SLOTS>
struct RingCursor {
    int slot = 0;
    u32 phase = 0;
    __device__ __forceinline__ void next() {
        if (++slot == SLOTS) {
            slot = 0;
            phase ^= 1;
        }
    }
};

// The producer's copies of rows [first, end) of one matrix, slot by slot
// as they come free.
template <int SLOTS>
__device__ __forceinline__ void ring_produce(const RingSlots<SLOTS>& r, RingCursor<SLOTS>& at,
                                             const signed char* w, const float* d, int first,
                                             int end, u32* stuck) {
    for (int row = first; row < end; row += RING_ROWS) {
        int n = min(RING_ROWS, end - row);
        unsigned char* dst = r.slot(at.slot);
        mbar_wait(r.empty + at.slot, at.phase ^ 1, stuck);
        mbar_expect_tx(r.full + at.slot, n * (COLS + BLOCKS_A_ROW * 4));
        bulk_copy(dst, w + (i64)row * COLS, n * COLS, r.full + at.slot);
        bulk_copy(dst + Ring<SLOTS>::codes, d + (i64)row * BLOCKS_A_ROW, n * BLOCKS_A_ROW * 4,
                  r.full + at.slot);
        at.next();
    }
}

// A row's product from its codes and scales in shared memory and the
// token's codes and scales in shared memory (every lane returns it).
__device__ __forceinline__ float ring_row_dot(const signed char* codes, const float* scales,
                                              const int4* xq, const float* xd) {
    int lane = threadIdx.x & 31;
    float v = 0.0f;
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) {
        int p = lane + 32 * j;
        if (p < PIECES) {
            uint4 w = *(const uint4*)(codes + 16 * p);
            int s = piece_dot(w, xq[p]);
            v = fmaf((float)s, scales[p / 2] * xd[p / 2], v);
        }
    }
    return warp_total(v);
}

// The consumers' use of rows [first, end): each slot awaited, its rows
// dotted into y (row i at y[i - base]; unless !COMPUTE), and given back.
template <int SLOTS, bool COMPUTE = true>
__device__ __forceinline__ void ring_consume(const RingSlots<SLOTS>& r, RingCursor<SLOTS>& at,
                                             int first, int end, const int4* token_q,
                                             const float* token_d, float* y, int base,
                                             u32* stuck) {
    int c = (threadIdx.x >> 5) - 1, lane = threadIdx.x & 31;
    for (int row = first; row < end; row += RING_ROWS) {
        int n = min(RING_ROWS, end - row);
        const unsigned char* src = r.slot(at.slot);
        mbar_wait(r.full + at.slot, at.phase, stuck);
        for (int i = c; COMPUTE && i < n; i += RING_CONSUMERS) {
            float v = ring_row_dot((const signed char*)src + i * COLS,
                                   (const float*)(src + Ring<SLOTS>::codes) + i * BLOCKS_A_ROW,
                                   token_q, token_d);
            if (lane == 0) y[row + i - base] = v;
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(r.empty + at.slot);
        at.next();
    }
}

// The consumers' own barrier (named barrier 1; warp 0, the producer,
// never joins it).
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(RING_CONSUMERS * 32) : "memory");
}

// The token into shared memory, from the L2 (by the consumers).
__device__ __forceinline__ void ring_token(const signed char* xq, const float* xd, int4* token_q,
                                           float* token_d) {
    int t = threadIdx.x - 32;
    for (int i = t; i < PIECES; i += RING_CONSUMERS * 32) token_q[i] = __ldcg((const int4*)xq + i);
    for (int i = t; i < BLOCKS_A_ROW; i += RING_CONSUMERS * 32) token_d[i] = __ldcg(xd + i);
    consumers_sync();
}

// How a step's outputs reach the next step (SYNC): FENCED, written by
// the consumers, the arrival after a `__threadfence()` and the wait by
// acquire loads (as grid_barrier); UNORDERED, a relaxed add and relaxed
// loads (a probe: nothing orders the block's writes before its arrival);
// BULK, the outputs gathered in shared memory and written by one bulk
// copy (`cp.async.bulk` to global), whose completion the arriving thread
// waits for (`cp.async.bulk.wait_group 0`) before a relaxed add, the wait
// by relaxed loads with a short sleep between them (the protocol of
// Hazy Research's Llama-1B megakernel: no fence).
#define FENCED 0
#define UNORDERED 1
#define BULK 2

template <int SYNC>
__device__ __forceinline__ void ring_grid_barrier(u32* arrived, u32 target, u32* stuck) {
    consumers_sync();
    if (threadIdx.x == 32) {
        if (SYNC == FENCED) __threadfence();
        atomicAdd(arrived, 1u);
        long long start = clock64();
        while (true) {
            u32 seen;
            if (SYNC == FENCED)
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                             : "=r"(seen)
                             : "l"(arrived)
                             : "memory");
            else
                asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];"
                             : "=r"(seen)
                             : "l"(arrived)
                             : "memory");
            if (seen >= target) break;
            if (clock64() - start > 4000000000ll) {
                atomicExch(stuck, 1u);
                break;
            }
            if (*(volatile u32*)stuck) break;
            if (SYNC == BULK) __nanosleep(32);
        }
    }
    consumers_sync();
}

// BULK: the block's outputs of a step (gathered in shared memory) written
// to global memory by one bulk copy, waited for to completion, by the
// thread that then arrives at the barrier (after the consumers' sync).
__device__ __forceinline__ void ring_store_outputs(const float* staged, float* out, int n) {
    consumers_sync();
    if (threadIdx.x == 32 && n > 0) {
        // The consumers' writes to `staged` made visible to the copy.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(out),
                     "r"(smem_u32(staged)), "r"(n * 4)
                     : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
    }
}

// This block's rows of a step: [first, end), a multiple of GRAIN rows
// (even: every weight copy a multiple of 16 bytes at a 16-byte boundary;
// 4 for BULK's output copies too), the blocks' ranges in order and within
// GRAIN rows of each other.
template <int GRAIN = 2>
__device__ __forceinline__ void ring_rows(int rows, int& first, int& end) {
    int grains = rows / GRAIN;
    first = GRAIN * (int)((i64)grains * blockIdx.x / gridDim.x);
    end = GRAIN * (int)((i64)grains * (blockIdx.x + 1) / gridDim.x);
}

#define RING_SLOTS 8

template <bool COMPUTE, bool BARRIER, int SYNC>
__device__ void ring_steps(Steps s, const signed char* xq, const float* xd, float* y,
                           u32* arrived, u32* stuck) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int4 token_q[PIECES];
    __shared__ float token_d[BLOCKS_A_ROW];
    __shared__ float part[RING_CONSUMERS];
    __shared__ __align__(16) float staged[64];  // BULK: a step's outputs (at most 40 rows)
    RingSlots<RING_SLOTS> r = RingSlots<RING_SLOTS>::init(smem);
    __syncthreads();
    int first, end;
    ring_rows<SYNC == BULK ? 4 : 2>(s.rows, first, end);
    RingCursor<RING_SLOTS> at;
    int lane = threadIdx.x & 31, t = threadIdx.x - 32;
    if (threadIdx.x < 32) {
        if (lane == 0)
            for (int k = 0; k < s.steps; k++)
                ring_produce(r, at, s.w[k % s.mats], s.d[k % s.mats], first, end, stuck);
        return;
    }
    u32 barriers = 0;
    for (int k = 0; k < s.steps; k++) {
        if (BARRIER || k == 0) ring_token(xq, xd, token_q, token_d);
        float* out = y + (i64)(k % s.mats) * s.rows;
        // (BULK: into `staged`, row first at its start.)
        float* written = SYNC == BULK ? staged : out;
        int base = SYNC == BULK ? first : 0;
        ring_consume<RING_SLOTS, COMPUTE>(r, at, first, end, token_q, token_d, written, base,
                                          stuck);
        if (SYNC == BULK) ring_store_outputs(staged, out + first, end - first);
        if (!BARRIER) continue;
        if (s.tiny) {
            ring_grid_barrier<SYNC>(arrived, ++barriers * gridDim.x, stuck);
            if (blockIdx.x == 0) {
                float v = 0.0f;
                for (int i = t; i < s.rows; i += RING_CONSUMERS * 32) v += __ldcg(out + i);
                v = warp_total(v);
                if (lane == 0) part[t >> 5] = v;
                consumers_sync();
                if (t == 0) {
                    float sum = 0.0f;
                    for (int i = 0; i < RING_CONSUMERS; i++) sum += part[i];
                    s.sums[k % s.mats] = sum;
                }
            }
        }
        if (k + 1 < s.steps) ring_grid_barrier<SYNC>(arrived, ++barriers * gridDim.x, stuck);
    }
}

#define CHAIN_RING_SLOTS 4

__device__ void chain_ring_step(const signed char* w, const float* d, int rows,
                                const signed char* xq, const float* xd, float* y, u32* stuck) {
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int4 token_q[PIECES];
    __shared__ float token_d[BLOCKS_A_ROW];
    RingSlots<CHAIN_RING_SLOTS> r = RingSlots<CHAIN_RING_SLOTS>::init(smem);
    __syncthreads();
    // Every thread lets the next launch in at once: its blocks, where
    // shared memory allows, start their copies while this one runs.
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    int first, end;
    ring_rows(rows, first, end);
    RingCursor<CHAIN_RING_SLOTS> at;
    if (threadIdx.x < 32) {
        // Weights: copied without waiting for the launch before.
        if (threadIdx.x == 0) ring_produce(r, at, w, d, first, end, stuck);
        return;
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    ring_token(xq, xd, token_q, token_d);
    ring_consume(r, at, first, end, token_q, token_d, y, 0, stuck);
}

#define RING_BODY(...) ring_steps<__VA_ARGS__>(s, xq, xd, y, arrived, stuck)
#define CHAIN_RING_BODY chain_ring_step(w, d, rows, xq, xd, y, stuck)
#else
#define RING_BODY(...) __trap()
#define CHAIN_RING_BODY __trap()
#endif

// Blocks of a producer warp and RING_CONSUMERS (8) consumer warps.
#define RING_KERNEL(NAME, ...)                                                          \
    extern "C" __global__ void __launch_bounds__(9 * 32, 1)                             \
        NAME(Steps s, const signed char* xq, const float* xd, float* y, u32* arrived,     \
             u32* stuck) {                                                              \
        RING_BODY(__VA_ARGS__);                                                         \
    }
RING_KERNEL(persistent_ring, true, true, FENCED)
RING_KERNEL(persistent_ring_idle, false, true, FENCED)
RING_KERNEL(persistent_ring_free, true, false, FENCED)
RING_KERNEL(persistent_ring_idle_free, false, false, FENCED)
RING_KERNEL(persistent_ring_unordered, true, true, UNORDERED)
RING_KERNEL(persistent_ring_bulk, true, true, BULK)

extern "C" __global__ void __launch_bounds__(9 * 32)
    chain_ring(const signed char* w, const float* d, int rows, const signed char* xq,
               const float* xd, float* y, u32* stuck) {
    CHAIN_RING_BODY;
}
