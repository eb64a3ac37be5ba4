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

// The matrices of the steps (device arrays of `steps` pointers); with
// `tiny` set, a small step after each product step writes sums[k].
struct Steps {
    const signed char* const* w;
    const float* const* d;
    float* sums;
    int steps;
    int rows;
    int tiny;
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
        const signed char* w = s.w[k];
        const float* d = s.d[k];
        float* out = y + (i64)k * s.rows;
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
        if (held) load_row(s.w[k + 1], s.d[k + 1], first, head);
        if (s.tiny) {
            grid_barrier(arrived, ++barriers * gridDim.x, stuck);
            if (blockIdx.x == 0) tiny_sum(out, s.rows, s.sums + k);
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
