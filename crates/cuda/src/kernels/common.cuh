// Shared helpers of every turbospark CUDA kernel: half-precision
// conversion, warp and block reductions, and the weight formats' decoders.
//
// The sources are concatenated in one translation unit (see nvrtc.rs;
// compiled as several programs, each emitting some files' kernels) and
// compiled by NVRTC without the toolkit's headers, so half-precision
// conversions are written with PTX `cvt` rather than <cuda_fp16.h>.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

// A kernel's definition opens with KERNEL where CUDA writes
// `extern "C" __global__` (any __launch_bounds__ still follow the return
// type): an entry point the driver finds by its unmangled name. nvrtc.rs compiles the sources as several programs at
// once, each emitting the kernels of some files only; before each file of
// a program it defines KERNEL as this, or, where that program does not
// emit the file's kernels, as `template <int> __global__`: a kernel
// template never instantiated, which the compiler checks and then drops
// without generating code.
#ifndef KERNEL
#define KERNEL extern "C" __global__
#endif

#define WARP 32
#define FULL_MASK 0xffffffffu
#define INFINITY __int_as_float(0x7f800000)

// Programmatic dependent launch (sm_90 and later; kernels.rs `launch`
// sets the launch attribute there). Every kernel starts with
// KERNEL_ENTRY: it first waits until the kernel launched before it on the
// stream has finished and its writes are visible (griddepcontrol.wait; a
// no-op for a launch without the attribute), so it reads nothing early,
// and only then lets the next kernel's blocks be scheduled
// (griddepcontrol.launch_dependents), which then wait in their own
// KERNEL_ENTRY. A kernel's launch and block set-up thus overlap the tail
// of the one before it, while the order of the work is unchanged: each
// kernel still runs after the whole of the one before it, which ran after
// the whole of its own predecessor (every kernel waits first, before any
// early return). The exceptions read, before waiting, only what no kernel
// still running can write — weights, a decode step's position (set before
// the step's first kernel), cache rows of earlier steps, and the routes of
// a routing that finished before the launch before this one began (the
// down products below): one token's Q8_0
// products (q8one.cu and q8cta.cu, EARLY) issue their first rows' weight
// loads, the RMS norm loads its weights (elementwise.cu), the rope with
// its cache writes reads the position and forms its first rotation
// (elementwise.cu `rope_kv`), and one token's split attention
// (attention.cu `attention_decode_impl`) fetches the older keys' and
// values' rows into the L2, and the routed experts' per-route down
// products (q8dot.cu `moe_down_q8_impl`, q8mma.cu `moe_down_mma_impl`)
// read their route's slot (the gate/up launch between the routing and
// them waited for it) and issue their first weight loads, as do, in their
// early form (`moe_gate_up_early_q8x_*`, launched only after the
// quantization of the experts' input, which waited for the routing), the
// per-route gate/up products, and the bf16
// products of a few tokens (tcmm.cu `matmul_bf16_tc1`), and one token's
// Q8_0 products on the tensor cores (q8mma.cu `matmul1_mma_q8_0_impl`)
// issue all of theirs, and one token's products on 8-bit activations in
// kq.cu's formats (`kq_rows_dot`, EARLY: `kq_matmul1_*`, and the routed
// experts' `kq_gate_up1_*` and `kq_down1_*`, which read their route's
// slot first: stream/moe.rs launches a quantization before each, so the
// routing finished before the launch before them began) their first
// round's; then they wait.
__device__ __forceinline__ void kernel_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#elif defined(TURBOSPARK_HOST_EMULATION)
    emu::grid_dependency_wait();  // (tests/emulation/warp_emulator.h)
#endif
}
#define KERNEL_ENTRY() kernel_entry()

// Loads kept after an earlier KERNEL_ENTRY's wait, of what the kernel
// before writes: `volatile`, so the compiler keeps them in order with the
// wait (a read through a `const __restrict__` pointer may be hoisted above
// it), and coherent `ld.global`, not the read-only `.nc` path, which ptxas
// schedules above the wait (seen with ptxas 13.0 for sm_90).
#ifndef TURBOSPARK_HOST_EMULATION  // tests/emulation defines these on the host
__device__ __forceinline__ int4 ld_i4_after_wait(const void* p) {
    int4 v;
    asm volatile("ld.global.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ float ld_f32_after_wait(const float* p) {
    float v;
    asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

// A kernel's dynamic shared memory as an array `name` of T (tests/emulation
// gives a block's fibers one buffer of its own instead).
#ifndef TURBOSPARK_HOST_EMULATION
#define DYNAMIC_SHARED(T, name) extern __shared__ __align__(16) T name[]
#endif

// Fetches the line holding p from memory into the L2 (nothing returned).
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Loads of a weight stream (the decode products' codes and scales):
// `ld.global.cs`, lines allocated evict-first in the L1 and the L2. A
// token reads each weight byte once, and a layer's ~80 MB would otherwise
// push out of the 50 MB L2 what is read again — the small kernels' code,
// the KV cache rows and the activations. `volatile` and the coherent path
// (not `.nc`, whose loads ptxas moves across griddepcontrol.wait, seen with
// ptxas 13.0 for sm_90) keep a load where it is written: the early ones
// before KERNEL_ENTRY's wait.
__device__ __forceinline__ uint4 ld_stream_u4(const void* p) {
    uint4 v;
    asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
__device__ __forceinline__ u32 ld_stream_u32(const void* p) {
    u32 v;
    asm volatile("ld.global.cs.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ u32 ld_stream_u16(const void* p) {
    u16 v;
    asm volatile("ld.global.cs.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ u32 ld_stream_u8(const void* p) {
    u32 v;
    asm volatile("ld.global.cs.u8 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
#endif

#ifndef TURBOSPARK_HOST_EMULATION  // tests/emulation defines it on the host
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
#endif

// Round to nearest even, as the CPU's `half::f16::from_f32` does.
#ifndef TURBOSPARK_HOST_EMULATION  // tests/emulation defines it on the host
__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif

__device__ __forceinline__ float bf16_to_f32(u16 h) {
    return __uint_as_float(((u32)h) << 16);
}

__device__ __forceinline__ u16 ld_u16(const u8* p) {
    return (u16)p[0] | ((u16)p[1] << 8);
}

__device__ __forceinline__ u32 ld_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

__device__ __forceinline__ float warp_sum(float v) {
    // A fixed butterfly: every lane ends with the same bits, whatever the launch.
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// The fast numerics' 8-bit quantization of one value of a 32-element
// block held a lane each (the whole warp calls it): scale = amax / 127
// over the block, code = v / scale rounded to nearest (ties to even), 0
// for an all-zero block. Returns the lane's code; *scale gets the block's.
// (quantize_q8_block, the decode attention's and rms_norm's quantized
// outputs: one definition, so their bits cannot drift apart.)
// (q8_scale and q8_code: the formula, shared with rms_norm's 8-value
// groups, elementwise.cu `norm_vec_codes`.)
__device__ __forceinline__ float q8_scale(float amax) { return amax / 127.0f; }
__device__ __forceinline__ int q8_code(float v, float amax, float scale) {
    return amax == 0.0f ? 0 : __float2int_rn(v / scale);
}
__device__ __forceinline__ int q8_lane_code(float v, float* scale) {
    float amax = warp_max(fabsf(v));
    *scale = q8_scale(amax);
    return q8_code(v, amax, *scale);
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); `red`
// holds 32 floats of shared memory. Every thread gets the result.
__device__ float block_sum(float v, float* red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : 0.0f;
    return warp_sum(t);
}

__device__ float block_max(float v, float* red) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : -INFINITY;
    return warp_max(t);
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// ---------------------------------------------------------------------
// Weight formats (ggml block layouts, `ggml-common.h`). Every format is
// read in units of 32 consecutive elements of a row: a whole block for
// Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/MXFP4, a 32-element sub-block of a 256-element
// super-block for Q4_K/Q5_K/Q6_K, and 32 plain values for F32/F16/BF16
// (the last unit of a float row may be partial: `cols` bounds it).
// The format ids are `QuantFormat`'s order (see formats.rs).

#define F_F32 0
#define F_F16 1
#define F_BF16 2
#define F_Q8_0 3
#define F_Q4_0 4
#define F_Q4_1 5
#define F_Q5_0 6
#define F_Q5_1 7
#define F_Q4_K 8
#define F_Q5_K 9
#define F_Q6_K 10
#define F_MXFP4 11

// The parameters of an attention launch (attention.cu's kernels and
// attention_tc.cu's; kernels.rs `AttnParams` mirrors it).
struct AttnParams {
    int first_pos;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int capacity;
    int window;  // 0: none
    float scale;
    float softcap;  // 0: none
    int has_sinks;
};

// `2^(e - 128)` from bits, as GGML_E8M0_TO_FP32_HALF.
__device__ __forceinline__ float e8m0_half(u8 e) {
    return e < 2 ? __uint_as_float(0x00200000u << e) : __uint_as_float(((u32)e - 1u) << 23);
}

__device__ __forceinline__ void k4_scale_min(const u8* sc, int j, int* s, int* m) {
    if (j < 4) {
        *s = sc[j] & 63;
        *m = sc[j + 4] & 63;
    } else {
        *s = (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4);
        *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

// Device row layout of the split formats (layout.rs): Q8_0 and MXFP4 rows
// hold their blocks' code bytes first (32 per Q8_0 block, 16 per MXFP4
// block), then the blocks' scales (an f16 or an e8m0 byte each), and rows
// start 16-byte aligned, so that a block's codes are one aligned load.
template <int F>
__device__ __forceinline__ const u8* split_codes(const u8* row, int b) {
    return row + (i64)b * (F == F_Q8_0 ? 32 : 16);
}
template <int F>
__device__ __forceinline__ const u8* split_scale(const u8* row, int cols, int b) {
    int nb = cols / 32;
    return F == F_Q8_0 ? row + (i64)nb * 32 + 2 * b : row + (i64)nb * 16 + b;
}

// Products and sums are rounded separately (no fused multiply-add), as the
// reference dequantization computes them, so `embed` is exact.
// Decodes unit `u` of `row` into w[0..32] (zeros past `cols` for float rows).
template <int F>
__device__ __forceinline__ void load_unit(const u8* row, int u, int cols, float* w) {
    if (F == F_F32 || F == F_F16 || F == F_BF16) {
        int base = u * 32;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            int i = base + j;
            float v = 0.0f;
            if (i < cols) {
                if (F == F_F32) v = ((const float*)row)[i];
                else if (F == F_F16) v = f16_to_f32(((const u16*)row)[i]);
                else v = bf16_to_f32(((const u16*)row)[i]);
            }
            w[j] = v;
        }
    } else if (F == F_Q8_0) {
        const signed char* q = (const signed char*)split_codes<F>(row, u);
        float d = f16_to_f32(*(const u16*)split_scale<F>(row, cols, u));
#pragma unroll
        for (int j = 0; j < 32; j++) w[j] = (float)q[j] * d;
    } else if (F == F_Q4_0) {
        const u8* b = row + (i64)u * 18;
        float d = f16_to_f32(ld_u16(b));
#pragma unroll
        for (int j = 0; j < 16; j++) {
            u8 q = b[2 + j];
            w[j] = (float)((int)(q & 15) - 8) * d;
            w[j + 16] = (float)((int)(q >> 4) - 8) * d;
        }
    } else if (F == F_Q4_1) {
        const u8* b = row + (i64)u * 20;
        float d = f16_to_f32(ld_u16(b)), m = f16_to_f32(ld_u16(b + 2));
#pragma unroll
        for (int j = 0; j < 16; j++) {
            u8 q = b[4 + j];
            w[j] = __fadd_rn(__fmul_rn((float)(q & 15), d), m);
            w[j + 16] = __fadd_rn(__fmul_rn((float)(q >> 4), d), m);
        }
    } else if (F == F_Q5_0) {
        const u8* b = row + (i64)u * 22;
        float d = f16_to_f32(ld_u16(b));
        u32 qh = ld_u32(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            u8 q = b[6 + j];
            int lo = (q & 15) | (((qh >> j) & 1) << 4);
            int hi = (q >> 4) | (((qh >> (j + 16)) & 1) << 4);
            w[j] = (float)(lo - 16) * d;
            w[j + 16] = (float)(hi - 16) * d;
        }
    } else if (F == F_Q5_1) {
        const u8* b = row + (i64)u * 24;
        float d = f16_to_f32(ld_u16(b)), m = f16_to_f32(ld_u16(b + 2));
        u32 qh = ld_u32(b + 4);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            u8 q = b[8 + j];
            int lo = (q & 15) | (((qh >> j) & 1) << 4);
            int hi = (q >> 4) | (((qh >> (j + 16)) & 1) << 4);
            w[j] = __fadd_rn(__fmul_rn((float)lo, d), m);
            w[j + 16] = __fadd_rn(__fmul_rn((float)hi, d), m);
        }
    } else if (F == F_Q4_K || F == F_Q5_K) {
        const int bytes = F == F_Q4_K ? 144 : 176;
        const u8* b = row + (i64)(u >> 3) * bytes;
        int s = u & 7;
        float d = f16_to_f32(ld_u16(b)), dmin = f16_to_f32(ld_u16(b + 2));
        int sc, mn;
        k4_scale_min(b + 4, s, &sc, &mn);
        float d1 = d * (float)sc, m1 = dmin * (float)mn;
        const u8* qs = b + (F == F_Q4_K ? 16 : 48) + 32 * (s >> 1);
        int shift = 4 * (s & 1);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int q = (qs[l] >> shift) & 15;
            if (F == F_Q5_K) q |= ((b[16 + l] >> s) & 1) << 4;
            w[l] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
        }
    } else if (F == F_Q6_K) {
        const u8* b = row + (i64)(u >> 3) * 210;
        int s = u & 7;  // 32-element quarter: h = s / 4, k = s % 4
        int h = s >> 2, k = s & 3;
        float d = f16_to_f32(ld_u16(b + 208));
        const signed char* scales = (const signed char*)(b + 192);
        float d0 = d * (float)scales[2 * s], d1 = d * (float)scales[2 * s + 1];
        const u8* ql = b + 64 * h + 32 * (k & 1);
        const u8* qh = b + 128 + 32 * h;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int lo = k < 2 ? (ql[l] & 15) : (ql[l] >> 4);
            int hi = (qh[l] >> (2 * k)) & 3;
            int q = (lo | (hi << 4)) - 32;
            w[l] = (l < 16 ? d0 : d1) * (float)q;
        }
    } else if (F == F_MXFP4) {
        const u8* q = split_codes<F>(row, u);
        float d = e8m0_half(*split_scale<F>(row, cols, u));
        const signed char kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
#pragma unroll
        for (int j = 0; j < 16; j++) {
            u8 c = q[j];
            w[j] = (float)kv[c & 15] * d;
            w[j + 16] = (float)kv[c >> 4] * d;
        }
    }
}

// ---------------------------------------------------------------------
// Lane-cooperative decoding for the formats whose blocks are 32 elements
// with one scale (Q8_0, MXFP4): a warp reads 8 consecutive blocks per step,
// lane l taking a quarter of block l / 4, so the warp's loads cover one
// contiguous run of bytes. A quarter is 8 elements: for Q8_0 elements
// 8q..8q+7; for MXFP4 the low nibbles of bytes 4q..4q+3 (elements
// 4q..4q+3) and their high nibbles (elements 16+4q..16+4q+3).
// Per quarter, Σ code·x is formed first and the block scale applied to it.

// Quarters a lane loads before using any (memory-level parallelism).
#define QUNROLL 4

// MXFP4 codes doubled (KVALUES), as bytes of two words per half.
#define MXFP4_LO0 0x03020100u
#define MXFP4_LO1 0x0C080604u
#define MXFP4_HI0 0xFDFEFF00u
#define MXFP4_HI1 0xF4F8FAFCu

__device__ __forceinline__ float mxfp4_code(u32 c) {
    u32 b = c < 8 ? __byte_perm(MXFP4_LO0, MXFP4_LO1, c) : __byte_perm(MXFP4_HI0, MXFP4_HI1, c - 8);
    return (float)(signed char)(b & 0xFF);
}

// The raw bytes of quarter q of block b: its 8 code bytes (Q8_0) or 4
// code bytes (MXFP4, in lo), loaded before any is decoded so that a lane
// has several loads in flight.
struct QuarterRaw {
    u32 lo, hi;
    u32 scale;
};

template <int F>
__device__ __forceinline__ QuarterRaw quarter_load(const u8* row, int cols, int b, int q) {
    QuarterRaw r;
    if (F == F_Q8_0) {
        uint2 c = *(const uint2*)(split_codes<F>(row, b) + 8 * q);
        r.lo = c.x;
        r.hi = c.y;
        r.scale = *(const u16*)split_scale<F>(row, cols, b);
    } else {
        r.lo = *(const u32*)(split_codes<F>(row, b) + 4 * q);
        r.hi = 0;
        r.scale = *split_scale<F>(row, cols, b);
    }
    return r;
}

template <int F>
__device__ __forceinline__ float quarter_d(const QuarterRaw& r) {
    if (F == F_Q8_0) return f16_to_f32((u16)r.scale);
    return e8m0_half((u8)r.scale);
}

// The 8 codes of a loaded quarter, in the order quarter_x lays out x.
template <int F>
__device__ __forceinline__ void quarter_decode(const QuarterRaw& r, float* c) {
    if (F == F_Q8_0) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            c[j] = (float)(signed char)((r.lo >> (8 * j)) & 0xFF);
            c[4 + j] = (float)(signed char)((r.hi >> (8 * j)) & 0xFF);
        }
    } else {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            u32 v = (r.lo >> (8 * j)) & 0xFF;
            c[j] = mxfp4_code(v & 15);
            c[4 + j] = mxfp4_code(v >> 4);
        }
    }
}

// The x offsets (within the block) of a quarter's two runs of 4.
template <int F>
__device__ __forceinline__ void quarter_x(int q, int* a, int* b) {
    if (F == F_Q8_0) {
        *a = 8 * q;
        *b = 8 * q + 4;
    } else {
        *a = 4 * q;
        *b = 16 + 4 * q;
    }
}

__device__ __forceinline__ float dot8(const float* c, const float* x, int a, int b) {
    float4 u = *(const float4*)(x + a), v = *(const float4*)(x + b);
    float s = c[0] * u.x;
    s = fmaf(c[1], u.y, s);
    s = fmaf(c[2], u.z, s);
    s = fmaf(c[3], u.w, s);
    s = fmaf(c[4], v.x, s);
    s = fmaf(c[5], v.y, s);
    s = fmaf(c[6], v.z, s);
    s = fmaf(c[7], v.w, s);
    return s;
}

// One row's dot with the activations of up to T tokens whose rows start at
// xs[0..nt] (any addresses): per token the same instructions, in the same
// order whatever the other tokens, so a token's value does not depend on
// them. Every lane ends with the sums.
template <int F, int T>
__device__ __forceinline__ void rows_dot(const u8* row, int cols, const float* const* xs, int nt,
                                         float* acc) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    if (F == F_Q8_0 || F == F_MXFP4) {
        // Each lane takes quarters lane, lane + 32, ... in that order,
        // QUNROLL at a time: all their bytes are loaded, then used.
        int quarters = cols / 8;
        for (int s0 = lane; s0 < quarters; s0 += 32 * QUNROLL) {
            QuarterRaw raw[QUNROLL];
#pragma unroll
            for (int u = 0; u < QUNROLL; u++) {
                int s = s0 + 32 * u;
                if (s < quarters) raw[u] = quarter_load<F>(row, cols, s >> 2, s & 3);
            }
#pragma unroll
            for (int u = 0; u < QUNROLL; u++) {
                int s = s0 + 32 * u;
                if (s < quarters) {
                    int b = s >> 2, q = s & 3;
                    float c[8];
                    quarter_decode<F>(raw[u], c);
                    float d = quarter_d<F>(raw[u]);
                    int xa, xb;
                    quarter_x<F>(q, &xa, &xb);
#pragma unroll
                    for (int t = 0; t < T; t++)
                        if (t < nt) acc[t] = fmaf(dot8(c, xs[t] + b * 32, xa, xb), d, acc[t]);
                }
            }
        }
    } else {
        int units = (cols + 31) / 32;
        for (int u = lane; u < units; u += 32) {
            float w[32];
            load_unit<F>(row, u, cols, w);
            int base = u * 32;
            int len = min(32, cols - base);
#pragma unroll
            for (int t = 0; t < T; t++) {
                if (t < nt) {
                    const float* xp = xs[t] + base;
                    float s = 0.0f;
                    if (len == 32) {
#pragma unroll
                        for (int j = 0; j < 32; j++) s = fmaf(w[j], xp[j], s);
                    } else {
                        for (int j = 0; j < len; j++) s = fmaf(w[j], xp[j], s);
                    }
                    acc[t] += s;
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = warp_sum(acc[t]);
}
