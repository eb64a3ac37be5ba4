// The stage-boundary experiment of examples/stage_sync.rs: what one step
// of a chain of dependent matrix-vector products costs when each step is
// its own kernel launched as a programmatic dependent of the one before
// (how a decode step runs today: `griddepcontrol`, a CUDA graph), against
// one persistent kernel whose blocks meet at a grid-wide barrier between
// steps, with and without each warp issuing its next step's weight loads
// before it arrives at the barrier (what a decode "megakernel" would do).
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

// The row's product with the token (every lane returns it).
__device__ __forceinline__ float row_dot(const RowLoads& r, const signed char* xq,
                                         const float* xd) {
    int lane = threadIdx.x & 31;
    float v = 0.0f;
#pragma unroll
    for (int j = 0; j < PER_LANE; j++) {
        int p = lane + 32 * j;
        if (p < PIECES) {
            int4 x = *(const int4*)(xq + 16 * p);
            int s = dp4a((int)r.w[j].x, x.x, 0);
            s = dp4a((int)r.w[j].y, x.y, s);
            s = dp4a((int)r.w[j].z, x.z, s);
            s = dp4a((int)r.w[j].w, x.w, s);
            v = fmaf((float)s, r.d[j] * xd[p / 2], v);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
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
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
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
    u32 epoch;  // the launch's number (the tagged ring's tags)
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
// The ring variant: one block an SM, persistent, whose weights arrive by
// the copy engine of the SM (`cp.async.bulk`, the Hopper bulk copy) into
// a ring of shared-memory slots, issued by one producer thread that never
// waits at the grid barrier: it runs ahead across steps as far as the
// ring's free slots let it, so HBM keeps streaming while the consumer
// warps wait at the barrier or run a small step (what a decode
// "megakernel" with a load pipeline does). A block takes a contiguous
// range of each step's rows (an even number, so every copy is a multiple
// of 16 bytes at a 16-byte boundary), in slots of RING_ROWS rows; the
// consumer warps take a slot's rows a warp a row, then give the slot back.
// A slot's "full" barrier completes when its bytes have landed (the
// producer's expect_tx and the copy's complete_tx), its "empty" barrier
// when every consumer warp has given it back. The consumers meet the
// other blocks' consumers at a grid barrier a step (a named barrier for
// the block's part, so the producer never joins it), and read the token
// (written by the step before, in the engine) from the L2 into shared
// memory once a step.

typedef unsigned long long u64;

// Bulk copies and transaction-counting mbarriers are sm_90's: on older
// GPUs the ring kernels compile to a trap and the example skips them.
#if __CUDA_ARCH__ >= 900

// The shared memory of a ring of SLOTS slots of ROWS rows: the barriers
// first (full, then empty), then the slots, each a row's codes then their
// scales.
template <int SLOTS, int ROWS>
struct Ring {
    static constexpr int codes = ROWS * COLS;
    static constexpr int slot = codes + ROWS * BLOCKS_A_ROW * 4;
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

// The consumers' own barrier (named barrier 1; warp 0, the producer,
// never joins it).
template <int CONSUMERS>
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(CONSUMERS * 32) : "memory");
}

// FENCE: how the block's arrival is ordered after its consumers' writes:
// 0 `__threadfence()` then a relaxed add (as grid_barrier), 1 a relaxed add
// alone (not ordered: a timing probe, for runs whose outputs no step
// reads), 2 an add with release semantics (`atom.release.gpu`, ordered
// after the block's writes by the named barrier before it). The wait
// polls with acquire loads, except: 3 relaxed add and relaxed polls (no
// ordering at all, a probe), 4 release add, relaxed polls and one
// acquire-release fence once the count is reached.
template <int CONSUMERS, int FENCE = 0>
__device__ __forceinline__ void ring_grid_barrier(u32* arrived, u32 target, u32* stuck) {
    consumers_sync<CONSUMERS>();
    if (threadIdx.x == 32) {
        if (FENCE == 0) {
            __threadfence();
            atomicAdd(arrived, 1u);
        } else if (FENCE == 1) {
            atomicAdd(arrived, 1u);
        } else if (FENCE == 3) {
            atomicAdd(arrived, 1u);
        } else {
            u32 old;
            asm volatile("atom.add.release.gpu.global.u32 %0, [%1], 1;"
                         : "=r"(old)
                         : "l"(arrived)
                         : "memory");
        }
        long long start = clock64();
        while (true) {
            u32 seen;
            if (FENCE >= 3)
                asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];"
                             : "=r"(seen)
                             : "l"(arrived)
                             : "memory");
            else
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                             : "=r"(seen)
                             : "l"(arrived)
                             : "memory");
            if (seen >= target) {
                if (FENCE == 4) asm volatile("fence.acq_rel.gpu;" ::: "memory");
                break;
            }
            if (clock64() - start > 4000000000ll) {
                atomicExch(stuck, 1u);
                break;
            }
            if (*(volatile u32*)stuck) break;
        }
    }
    consumers_sync<CONSUMERS>();
}

// This block's rows of a step: [first, end), an even count, the blocks'
// ranges in order and within 2 rows of each other.
__device__ __forceinline__ void ring_rows(int rows, int& first, int& end) {
    int pairs = rows / 2;
    first = 2 * (int)((i64)pairs * blockIdx.x / gridDim.x);
    end = 2 * (int)((i64)pairs * (blockIdx.x + 1) / gridDim.x);
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
            int4 x = xq[p];
            int s = dp4a((int)w.x, x.x, 0);
            s = dp4a((int)w.y, x.y, s);
            s = dp4a((int)w.z, x.z, s);
            s = dp4a((int)w.w, x.w, s);
            v = fmaf((float)s, scales[p / 2] * xd[p / 2], v);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// COMPUTE false: the consumers give every slot back unread (the copy
// engine's own rate with the same barriers). BARRIER false: no grid
// barrier and no small step (the token read once): the ring's streaming
// rate with nothing between the steps.
// LL (with COMPUTE and BARRIER): no grid barrier. Each output is stored
// with its step's tag in one 8-byte store ({value, tag}: the flag travels
// with the data, as NCCL's LL protocol does, so no fence orders it), `y`
// then being [mats][rows] such pairs. Before the next step every block's
// consumers read the whole step's outputs, each thread polling its pairs
// until their tags are the step's, and (with `tiny`) every block sums them
// itself (block 0 writes the sum): the small step done redundantly in each
// block instead of by one block between two barriers.
template <int CONSUMERS, int RING_SLOTS, int RING_ROWS, bool COMPUTE, bool BARRIER = true,
          int FENCE = 0, bool LL = false>
__device__ void ring_steps(Steps s, const signed char* xq, const float* xd, float* y,
                           u32* arrived, u32* stuck) {
    typedef Ring<RING_SLOTS, RING_ROWS> R;
    constexpr int RING_BARRIER_BYTES = R::barriers, RING_SLOT_BYTES = R::slot,
                  RING_CODES = R::codes;
    extern __shared__ __align__(128) unsigned char ring[];
    __shared__ int4 token_q[PIECES];
    __shared__ float token_d[BLOCKS_A_ROW];
    __shared__ float part[CONSUMERS];
    u64* full = (u64*)ring;
    u64* empty = full + RING_SLOTS;
    unsigned char* slots = ring + RING_BARRIER_BYTES;
    if (threadIdx.x == 0) {
        for (int i = 0; i < RING_SLOTS; i++) {
            mbar_init(full + i, 1);
            mbar_init(empty + i, CONSUMERS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    int first, end;
    ring_rows(s.rows, first, end);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp == 0) {
        // The producer: every step's slots in order, as slots come free.
        if (lane == 0) {
            int slot = 0;
            u32 phase = 0;
            for (int k = 0; k < s.steps; k++) {
                const signed char* w = s.w[k % s.mats];
                const float* d = s.d[k % s.mats];
                for (int r = first; r < end; r += RING_ROWS) {
                    int n = min(RING_ROWS, end - r);
                    unsigned char* dst = slots + slot * RING_SLOT_BYTES;
                    mbar_wait(empty + slot, phase ^ 1, stuck);
                    mbar_expect_tx(full + slot, n * (COLS + BLOCKS_A_ROW * 4));
                    bulk_copy(dst, w + (i64)r * COLS, n * COLS, full + slot);
                    bulk_copy(dst + RING_CODES, d + (i64)r * BLOCKS_A_ROW, n * BLOCKS_A_ROW * 4,
                              full + slot);
                    if (++slot == RING_SLOTS) {
                        slot = 0;
                        phase ^= 1;
                    }
                }
            }
        }
        return;
    }
    // The consumers.
    int c = warp - 1, t = threadIdx.x - 32;
    int slot = 0;
    u32 phase = 0;
    u32 barriers = 0;
    for (int k = 0; k < s.steps; k++) {
        // The token, from the L2 (the step before wrote it, in the engine).
        if ((BARRIER && !LL) || k == 0) {
            for (int i = t; i < PIECES; i += CONSUMERS * 32)
                token_q[i] = __ldcg((const int4*)xq + i);
            for (int i = t; i < BLOCKS_A_ROW; i += CONSUMERS * 32) token_d[i] = __ldcg(xd + i);
            consumers_sync<CONSUMERS>();
        }
        float* out = y + (i64)(k % s.mats) * s.rows;
        u64* tagged = (u64*)y + (i64)(k % s.mats) * s.rows;
        u32 tag = s.epoch * (u32)s.steps + (u32)k + 1u;
        for (int r = first; r < end; r += RING_ROWS) {
            int n = min(RING_ROWS, end - r);
            const unsigned char* src = slots + slot * RING_SLOT_BYTES;
            mbar_wait(full + slot, phase, stuck);
            for (int i = c; COMPUTE && i < n; i += CONSUMERS) {
                float v = ring_row_dot((const signed char*)src + i * COLS,
                                       (const float*)(src + RING_CODES) + i * BLOCKS_A_ROW,
                                       token_q, token_d);
                if (lane == 0) {
                    if (LL)
                        asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(tagged + r + i),
                                     "l"(((u64)tag << 32) | __float_as_uint(v))
                                     : "memory");
                    else
                        out[r + i] = v;
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(empty + slot);
            if (++slot == RING_SLOTS) {
                slot = 0;
                phase ^= 1;
            }
        }
        if (!BARRIER) continue;
        if (LL) {
            if (k + 1 == s.steps && !s.tiny) continue;
            // The whole step's outputs: a thread's pairs loaded together,
            // then each polled again until tagged.
            constexpr int PER = (5120 + CONSUMERS * 32 - 1) / (CONSUMERS * 32);
            u64 pairs[PER];
#pragma unroll
            for (int j = 0; j < PER; j++) {
                int i = t + j * CONSUMERS * 32;
                if (i < s.rows)
                    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];"
                                 : "=l"(pairs[j])
                                 : "l"(tagged + i)
                                 : "memory");
            }
            float v = 0.0f;
            long long start = clock64();
#pragma unroll
            for (int j = 0; j < PER; j++) {
                int i = t + j * CONSUMERS * 32;
                if (i >= s.rows) break;
                while ((u32)(pairs[j] >> 32) != tag) {
                    if (clock64() - start > 4000000000ll) {
                        atomicExch(stuck, 1u);
                        break;
                    }
                    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];"
                                 : "=l"(pairs[j])
                                 : "l"(tagged + i)
                                 : "memory");
                }
                v += __uint_as_float((u32)pairs[j]);
            }
            if (s.tiny) {
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
                if (lane == 0) part[c] = v;
            }
            consumers_sync<CONSUMERS>();
            if (s.tiny && blockIdx.x == 0 && t == 0) {
                float sum = 0.0f;
                for (int i = 0; i < CONSUMERS; i++) sum += part[i];
                s.sums[k % s.mats] = sum;
            }
            if (s.tiny) consumers_sync<CONSUMERS>();  // part[] read before the next step's
            continue;
        }
        if (s.tiny) {
            ring_grid_barrier<CONSUMERS, FENCE>(arrived, ++barriers * gridDim.x, stuck);
            if (blockIdx.x == 0) {
                float v = 0.0f;
                for (int i = t; i < s.rows; i += CONSUMERS * 32) v += __ldcg(out + i);
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
                if (lane == 0) part[c] = v;
                consumers_sync<CONSUMERS>();
                if (t == 0) {
                    float sum = 0.0f;
                    for (int i = 0; i < CONSUMERS; i++) sum += part[i];
                    s.sums[k % s.mats] = sum;
                }
            }
        }
        if (k + 1 < s.steps)
            ring_grid_barrier<CONSUMERS, FENCE>(arrived, ++barriers * gridDim.x, stuck);
    }
}

// The dynamic ring: as ring_steps, but no block owns rows. A step's
// chunks (RING_ROWS rows each) are claimed by the blocks' producers from a
// per-step counter, so faster SMs take more of them, and a producer claims
// the next step's chunks while other SMs still finish this one (weights
// depend on nothing). A step ends for a block's consumers at a slot the
// producer marks -1 (an arrival without bytes); the consumers then add the
// chunks they computed to the step's done count, and wait, before the
// next step, until every chunk of the step before is done (and, with
// `tiny`, until block 0 has summed it). counters: claims[steps],
// done[steps], summed[steps], zeroed before the launch.
template <int CONSUMERS, int RING_SLOTS, int RING_ROWS>
__device__ void ring_dyn_steps(Steps s, const signed char* xq, const float* xd, float* y,
                               u32* counters, u32* stuck) {
    typedef Ring<RING_SLOTS, RING_ROWS> R;
    constexpr int RING_BARRIER_BYTES = R::barriers, RING_SLOT_BYTES = R::slot,
                  RING_CODES = R::codes;
    extern __shared__ __align__(128) unsigned char ring[];
    __shared__ int4 token_q[PIECES];
    __shared__ float token_d[BLOCKS_A_ROW];
    __shared__ float part[CONSUMERS];
    __shared__ int slot_chunk[RING_SLOTS];
    __shared__ int step_chunks;
    u64* full = (u64*)ring;
    u64* empty = full + RING_SLOTS;
    unsigned char* slots = ring + RING_BARRIER_BYTES;
    u32* claims = counters;
    u32* done = counters + s.steps;
    u32* summed = counters + 2 * s.steps;
    if (threadIdx.x == 0) {
        for (int i = 0; i < RING_SLOTS; i++) {
            mbar_init(full + i, 1);
            mbar_init(empty + i, CONSUMERS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    int chunks = s.rows / RING_ROWS;  // (every run's rows are a multiple)
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp == 0) {
        if (lane == 0) {
            int slot = 0;
            u32 phase = 0;
            for (int k = 0; k < s.steps; k++) {
                const signed char* w = s.w[k % s.mats];
                const float* d = s.d[k % s.mats];
                while (true) {
                    // Claimed before the wait for a free slot, so that the
                    // atomic's round trip overlaps it.
                    int c = (int)atomicAdd(claims + k, 1u);
                    mbar_wait(empty + slot, phase ^ 1, stuck);
                    slot_chunk[slot] = c < chunks ? c : -1;
                    if (c >= chunks) {
                        // The step's end for this block: an arrival, no bytes.
                        mbar_arrive(full + slot);
                    } else {
                        unsigned char* dst = slots + slot * RING_SLOT_BYTES;
                        int r = c * RING_ROWS;
                        mbar_expect_tx(full + slot, RING_ROWS * (COLS + BLOCKS_A_ROW * 4));
                        bulk_copy(dst, w + (i64)r * COLS, RING_ROWS * COLS, full + slot);
                        bulk_copy(dst + RING_CODES, d + (i64)r * BLOCKS_A_ROW,
                                  RING_ROWS * BLOCKS_A_ROW * 4, full + slot);
                    }
                    if (++slot == RING_SLOTS) {
                        slot = 0;
                        phase ^= 1;
                    }
                    if (c >= chunks) break;
                }
            }
        }
        return;
    }
    int c = warp - 1, t = threadIdx.x - 32;
    int slot = 0;
    u32 phase = 0;
    for (int k = 0; k < s.steps; k++) {
        if (k > 0) {
            // The step before (and its small step) done everywhere.
            if (t == 0) {
                u32* flag = s.tiny ? summed + k - 1 : done + k - 1;
                u32 target = s.tiny ? 1u : (u32)chunks;
                long long start = clock64();
                while (true) {
                    u32 seen;
                    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                                 : "=r"(seen)
                                 : "l"(flag)
                                 : "memory");
                    if (seen >= target) break;
                    if (clock64() - start > 4000000000ll) {
                        atomicExch(stuck, 1u);
                        break;
                    }
                }
            }
            consumers_sync<CONSUMERS>();
        }
        for (int i = t; i < PIECES; i += CONSUMERS * 32) token_q[i] = __ldcg((const int4*)xq + i);
        for (int i = t; i < BLOCKS_A_ROW; i += CONSUMERS * 32) token_d[i] = __ldcg(xd + i);
        consumers_sync<CONSUMERS>();
        float* out = y + (i64)(k % s.mats) * s.rows;
        int mine = 0;
        while (true) {
            const unsigned char* src = slots + slot * RING_SLOT_BYTES;
            mbar_wait(full + slot, phase, stuck);
            int chunk = slot_chunk[slot];
            if (chunk >= 0) {
                int r = chunk * RING_ROWS;
                for (int i = c; i < RING_ROWS; i += CONSUMERS) {
                    float v = ring_row_dot((const signed char*)src + i * COLS,
                                           (const float*)(src + RING_CODES) + i * BLOCKS_A_ROW,
                                           token_q, token_d);
                    if (lane == 0) out[r + i] = v;
                }
                mine++;
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(empty + slot);
            if (++slot == RING_SLOTS) {
                slot = 0;
                phase ^= 1;
            }
            if (chunk < 0) break;
        }
        // Every consumer warp's rows written, then the block's chunks counted.
        consumers_sync<CONSUMERS>();
        if (t == 0 && mine > 0) {
            __threadfence();
            atomicAdd(done + k, (u32)mine);
        }
        if (s.tiny && blockIdx.x == 0) {
            if (t == 0) {
                long long start = clock64();
                while (true) {
                    u32 seen;
                    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                                 : "=r"(seen)
                                 : "l"(done + k)
                                 : "memory");
                    if (seen >= (u32)chunks) break;
                    if (clock64() - start > 4000000000ll) {
                        atomicExch(stuck, 1u);
                        break;
                    }
                }
            }
            consumers_sync<CONSUMERS>();
            float v = 0.0f;
            for (int i = t; i < s.rows; i += CONSUMERS * 32) v += __ldcg(out + i);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
            if (lane == 0) part[c] = v;
            consumers_sync<CONSUMERS>();
            if (t == 0) {
                float sum = 0.0f;
                for (int i = 0; i < CONSUMERS; i++) sum += part[i];
                s.sums[k % s.mats] = sum;
                __threadfence();
                atomicExch(summed + k, 1u);
            }
        }
    }
}

#define RING_DYN_BODY(...) ring_dyn_steps<__VA_ARGS__>(s, xq, xd, y, arrived, stuck)
// One step as its own launch (a programmatic dependent, like chain_step),
// its weights through a ring of RING_SLOTS slots of 8 rows: one block an SM,
// each its contiguous rows (ring_rows). Every thread lets the next launch
// in at once (so its blocks, where shared memory allows two, start
// copying their weights while this one runs); the producer thread copies
// this block's rows without waiting (weights depend on no kernel); the
// consumers wait for the launch before (griddepcontrol.wait), read the
// token, and dot the slots' rows.
template <int RING_SLOTS>
__device__ void chain_ring_step(const signed char* w, const float* d, int rows,
                                const signed char* xq, const float* xd, float* y, u32* stuck) {
    constexpr int CONSUMERS = 8, RING_ROWS = 8;
    typedef Ring<RING_SLOTS, RING_ROWS> R;
    extern __shared__ __align__(128) unsigned char ring[];
    __shared__ int4 token_q[PIECES];
    __shared__ float token_d[BLOCKS_A_ROW];
    u64* full = (u64*)ring;
    u64* empty = full + RING_SLOTS;
    unsigned char* slots = ring + R::barriers;
    if (threadIdx.x == 0) {
        for (int i = 0; i < RING_SLOTS; i++) {
            mbar_init(full + i, 1);
            mbar_init(empty + i, CONSUMERS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    int first, end;
    ring_rows(rows, first, end);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp == 0) {
        if (lane == 0) {
            int slot = 0;
            u32 phase = 0;
            for (int r = first; r < end; r += RING_ROWS) {
                int n = min(RING_ROWS, end - r);
                unsigned char* dst = slots + slot * R::slot;
                mbar_wait(empty + slot, phase ^ 1, stuck);
                mbar_expect_tx(full + slot, n * (COLS + BLOCKS_A_ROW * 4));
                bulk_copy(dst, w + (i64)r * COLS, n * COLS, full + slot);
                bulk_copy(dst + R::codes, d + (i64)r * BLOCKS_A_ROW, n * BLOCKS_A_ROW * 4,
                          full + slot);
                if (++slot == RING_SLOTS) {
                    slot = 0;
                    phase ^= 1;
                }
            }
        }
        return;
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    int c = warp - 1, t = threadIdx.x - 32;
    for (int i = t; i < PIECES; i += CONSUMERS * 32) token_q[i] = __ldcg((const int4*)xq + i);
    for (int i = t; i < BLOCKS_A_ROW; i += CONSUMERS * 32) token_d[i] = __ldcg(xd + i);
    consumers_sync<CONSUMERS>();
    int slot = 0;
    u32 phase = 0;
    for (int r = first; r < end; r += RING_ROWS) {
        int n = min(RING_ROWS, end - r);
        const unsigned char* src = slots + slot * R::slot;
        mbar_wait(full + slot, phase, stuck);
        for (int i = c; i < n; i += CONSUMERS) {
            float v = ring_row_dot((const signed char*)src + i * COLS,
                                   (const float*)(src + R::codes) + i * BLOCKS_A_ROW, token_q,
                                   token_d);
            if (lane == 0) y[r + i] = v;
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty + slot);
        if (++slot == RING_SLOTS) {
            slot = 0;
            phase ^= 1;
        }
    }
}

#define CHAIN_RING_BODY(SLOTS) chain_ring_step<SLOTS>(w, d, rows, xq, xd, y, stuck)
#define RING_BODY(...) ring_steps<__VA_ARGS__>(s, xq, xd, y, arrived, stuck)
#else
#define RING_BODY(...) __trap()
#define RING_DYN_BODY(...) __trap()
#define CHAIN_RING_BODY(SLOTS) __trap()
#endif

// chain_ring_S: chain_ring_step with S slots (4: two blocks' rings fit an
// SM; 8: one).
#define CHAIN_RING_KERNEL(NAME, SLOTS)                                                    \
    extern "C" __global__ void __launch_bounds__(9 * 32)                                  \
        NAME(const signed char* w, const float* d, int rows, const signed char* xq,       \
             const float* xd, float* y, u32* stuck) {                                     \
        CHAIN_RING_BODY(SLOTS);                                                           \
    }
CHAIN_RING_KERNEL(chain_ring_4, 4)
CHAIN_RING_KERNEL(chain_ring_8, 8)

// persistent_ring_C_S_R: C consumer warps, S slots of R rows; _idle: the
// consumers compute nothing; _free: no barrier between steps.
#define RING_KERNEL(NAME, C, ...)                                                   \
    extern "C" __global__ void __launch_bounds__((C + 1) * 32, 1)                   \
        NAME(Steps s, const signed char* xq, const float* xd, float* y, u32* arrived, \
             u32* stuck) {                                                          \
        RING_BODY(C, __VA_ARGS__);                                                  \
    }
RING_KERNEL(persistent_ring_8_8_8, 8, 8, 8, true)
RING_KERNEL(persistent_ring_16_8_8, 16, 8, 8, true)
RING_KERNEL(persistent_ring_8_4_16, 8, 4, 16, true)
RING_KERNEL(persistent_ring_8_16_4, 8, 16, 4, true)
RING_KERNEL(persistent_ring_8_8_8_idle, 8, 8, 8, false)
RING_KERNEL(persistent_ring_8_8_8_free, 8, 8, 8, true, false)
RING_KERNEL(persistent_ring_8_8_8_idle_free, 8, 8, 8, false, false)
RING_KERNEL(persistent_ring_8_8_8_relaxed, 8, 8, 8, true, true, 1)
RING_KERNEL(persistent_ring_8_8_8_idle_relaxed, 8, 8, 8, false, true, 1)
RING_KERNEL(persistent_ring_8_8_8_release, 8, 8, 8, true, true, 2)
RING_KERNEL(persistent_ring_8_8_8_unordered, 8, 8, 8, true, true, 3)
RING_KERNEL(persistent_ring_8_8_8_fenced, 8, 8, 8, true, true, 4)
RING_KERNEL(persistent_ring_8_8_8_ll, 8, 8, 8, true, true, 0, true)
RING_KERNEL(persistent_ring_8_16_4_ll, 8, 16, 4, true, true, 0, true)

// persistent_ring_dyn_C_S_R: the dynamic ring (counters in `arrived`).
#define RING_DYN_KERNEL(NAME, C, ...)                                               \
    extern "C" __global__ void __launch_bounds__((C + 1) * 32, 1)                   \
        NAME(Steps s, const signed char* xq, const float* xd, float* y, u32* arrived, \
             u32* stuck) {                                                          \
        RING_DYN_BODY(C, __VA_ARGS__);                                              \
    }
RING_DYN_KERNEL(persistent_ring_dyn_8_8_8, 8, 8, 8)
RING_DYN_KERNEL(persistent_ring_dyn_8_16_4, 8, 16, 4)
