// A CPU emulation of the CUDA execution model, enough to run turbospark's
// warp-synchronous kernels as host C++ (tests/host_emulation.rs): every
// thread of a block is a fiber on one OS thread, blocks run one
// after another, and the warp-wide operations the kernels use (shuffles,
// votes, __syncwarp, the integer MMA) and __syncthreads are barriers at
// which the fibers exchange their values. `__shared__` variables become
// function statics (one block at a time shares them).
//
// The kernel sources are included after this header (kernel_sources.h)
// with TURBOSPARK_HOST_EMULATION defined: their PTX helpers (loads with
// cache hints, `prmt`, `dp4a`, `cvt.f32.f16`, `mma.sync`) are left out
// there and defined here from the PTX ISA's definitions:
//   - `dp4a.s32.s32`: c plus the four products of signed bytes;
//   - `prmt.b32` (default mode): result byte i is byte (s & 7) of the
//     8-byte value {b, a} (a the low word), s = selector nibble i; when
//     s & 8 the selected byte's sign bit fills the byte.
//   - `cvt.rn.bf16x2.f32` and `mma.sync.aligned.m16n8k16.row.col.f32.bf16`
//     and `.f16` (see mma_m16n8k16 for what is and is not the
//     hardware's);
//   - `mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32`: D = A·B + C,
//     A 16 × 32, B 32 × 8, C and D 16 × 8, in the fragments of the PTX
//     ISA's "Matrix Fragments for mma.m16n8k32" (lane = 4g + q):
//     A reg 0 = row g, k 4q..4q+3; reg 1 = row g + 8, same k; reg 2 =
//     row g, k 16+4q..16+4q+3; reg 3 = row g + 8, same k (byte j of a
//     register the j-th k); B reg 0 = k 4q..4q+3 of column g, reg 1 = k
//     16+4q.. of column g; C/D reg i = row g + 8·(i / 2), column 2q + i % 2.
//
// Only what warp-synchronous code needs: every lane of a warp reaches each
// warp-wide operation (the kernels pass FULL_MASK), and every thread of a
// block each __syncthreads.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <ucontext.h>
#include <vector>

#define TURBOSPARK_HOST_EMULATION 1

#define __device__
#define __global__ inline
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct alignas(8) int2 {
    int x, y;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

using std::isnan;
using std::isinf;
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }

namespace emu {

constexpr size_t STACK_BYTES = 128 * 1024;

// A fiber's saved execution context, and the switch between two. On
// x86-64 a few instructions save the callee-saved registers and the stack
// pointer (glibc's swapcontext also saves the signal mask, a system call
// per switch, which made the emulation several times slower); elsewhere
// ucontext.
#if defined(__x86_64__)
struct Context {
    void* sp = nullptr;
};
extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");
inline void context_switch(Context& from, Context& to) { emu_switch(&from.sp, to.sp); }
// A context whose first switch enters `fn` (which must never return) on
// the given stack, aligned as a call would leave it.
inline void context_start(Context& c, char* stack, size_t bytes, void (*fn)()) {
    uintptr_t top = ((uintptr_t)(stack + bytes)) & ~(uintptr_t)15;
    void** sp = (void**)top;
    *--sp = nullptr;        // fn's return address slot
    *--sp = (void*)fn;      // where emu_switch's `ret` goes
    for (int i = 0; i < 6; i++) *--sp = nullptr;  // rbp, rbx, r12..r15
    c.sp = sp;
}
#else
struct Context {
    ucontext_t ctx;
};
inline void context_switch(Context& from, Context& to) { swapcontext(&from.ctx, &to.ctx); }
inline void context_start(Context& c, char* stack, size_t bytes, void (*fn)()) {
    getcontext(&c.ctx);
    c.ctx.uc_stack.ss_sp = stack;
    c.ctx.uc_stack.ss_size = bytes;
    c.ctx.uc_link = nullptr;
    makecontext(&c.ctx, fn, 0);
}
#endif

struct Barrier {
    int arrived = 0;
    unsigned generation = 0;
};

struct Fiber {
    Context ctx;
    dim3 thread;
    bool done = false;
    // The barrier it waits at, and that barrier's generation then: the
    // scheduler resumes it once the generation has moved on.
    const Barrier* waiting = nullptr;
    unsigned waiting_generation = 0;
};

struct State {
    Context scheduler;
    std::vector<Fiber> fibers;
    std::vector<std::unique_ptr<char[]>> stacks;  // one a thread, reused block to block
    Fiber* current = nullptr;
    dim3 block, grid, block_dim;
    std::vector<Barrier> warp_barriers;
    Barrier block_barrier;
    // Per warp: each lane's deposit for the operation in progress.
    std::vector<uint64_t> deposits;      // [warps][32][4]
    std::vector<uint32_t> mma_deposits;  // [warps][32][10]
    std::vector<int32_t> mma_results;    // [warps][32][4]
    const std::function<void()>* body = nullptr;
    // The kernel before, where a test stands one in (grid_dependency_wait):
    // at_block_start runs before each block's threads start (e.g. hiding
    // what the kernel before writes), at_wait once all of them have
    // reached the block's wait (that kernel finishing: writing it).
    std::function<void()> at_block_start, at_wait;
};

inline State& state() {
    static State s;
    return s;
}

inline unsigned linear_thread() {
    const State& s = state();
    const dim3& t = s.current->thread;
    return t.x + s.block_dim.x * (t.y + s.block_dim.y * t.z);
}
inline unsigned lane_id() { return linear_thread() & 31; }
inline unsigned warp_id() { return linear_thread() >> 5; }

inline void yield() {
    State& s = state();
    context_switch(s.current->ctx, s.scheduler);
}

inline void wait(Barrier& b, int expected) {
    unsigned gen = b.generation;
    if (++b.arrived == expected) {
        b.arrived = 0;
        b.generation++;
        return;
    }
    Fiber* f = state().current;
    f->waiting = &b;
    f->waiting_generation = gen;
    yield();
    f->waiting = nullptr;
}

inline int warp_size_of(unsigned warp) {
    const State& s = state();
    int threads = (int)(s.block_dim.x * s.block_dim.y * s.block_dim.z);
    int left = threads - (int)warp * 32;
    return left < 32 ? left : 32;
}

inline void warp_sync() {
    unsigned w = warp_id();
    wait(state().warp_barriers[w], warp_size_of(w));
}

inline void block_sync() {
    State& s = state();
    wait(s.block_barrier, (int)s.fibers.size());
}

inline void entry() {
    State& s = state();
    (*s.body)();
    s.current->done = true;
    context_switch(s.current->ctx, s.scheduler);
    abort();  // a finished fiber is never resumed
}

// griddepcontrol.wait (common.cuh kernel_entry): nothing unless a test
// set State::at_wait; then the block's threads meet, one runs at_wait, and
// they go on together — so that whatever a thread read before its wait
// is what at_block_start left, in every block (blocks run one after
// another). Every thread of the block must reach it (kernels wait before
// any early return).
inline void grid_dependency_wait() {
    State& s = state();
    if (!s.at_wait) return;
    block_sync();
    if (linear_thread() == 0) s.at_wait();
    block_sync();
}

// Runs `body` as every thread of every block of the grid.
inline void launch(dim3 grid, dim3 block, const std::function<void()>& body) {
    State& s = state();
    unsigned threads = block.x * block.y * block.z;
    unsigned warps = (threads + 31) / 32;
    s.grid = grid;
    s.block_dim = block;
    s.body = &body;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                s.block = {bx, by, bz};
                if (s.at_block_start) s.at_block_start();
                s.fibers.assign(threads, Fiber{});
                s.warp_barriers.assign(warps, Barrier{});
                s.block_barrier = Barrier{};
                s.deposits.assign((size_t)warps * 32 * 4, 0);
                s.mma_deposits.assign((size_t)warps * 32 * 10, 0);
                s.mma_results.assign((size_t)warps * 32 * 4, 0);
                while (s.stacks.size() < threads) s.stacks.emplace_back(new char[STACK_BYTES]);
                for (unsigned t = 0; t < threads; t++) {
                    Fiber& f = s.fibers[t];
                    f.thread = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                    context_start(f.ctx, s.stacks[t].get(), STACK_BYTES, entry);
                }
                for (;;) {
                    bool any = false;
                    for (Fiber& f : s.fibers) {
                        if (f.done) continue;
                        any = true;
                        if (f.waiting && f.waiting->generation == f.waiting_generation) continue;
                        s.current = &f;
                        context_switch(s.scheduler, f.ctx);
                    }
                    if (!any) break;
                }
            }
}

// Every lane deposits `v`, then reads lane `src(lane)`'s deposit.
template <typename T, typename Src>
inline T exchange(T v, Src src) {
    static_assert(sizeof(T) <= 8, "one 64-bit deposit a lane");
    State& s = state();
    unsigned w = warp_id(), l = lane_id();
    uint64_t* mine = &s.deposits[((size_t)w * 32) * 4];
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    mine[l * 4] = bits;
    warp_sync();
    unsigned from = src(l);
    T r;
    uint64_t got = mine[from * 4];
    memcpy(&r, &got, sizeof(T));
    warp_sync();
    return r;
}

}  // namespace emu

#define threadIdx (emu::state().current->thread)
#define blockIdx (emu::state().block)
#define blockDim (emu::state().block_dim)
#define gridDim (emu::state().grid)

inline void __syncthreads() { emu::block_sync(); }
// Fibers take turns on one OS thread: every write is seen by the next reader.
inline void __threadfence() {}
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_sync(); }

template <typename T>
inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    return emu::exchange(
        v, [&](unsigned l) { return (l & ~(unsigned)(width - 1)) + ((unsigned)src % width); });
}
template <typename T>
inline T __shfl_up_sync(unsigned, T v, unsigned d, int width = 32) {
    return emu::exchange(v, [&](unsigned l) { return (l % width) >= d ? l - d : l; });
}
template <typename T>
inline T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
    return emu::exchange(
        v, [&](unsigned l) { return (l % width) + d < (unsigned)width ? l + d : l; });
}
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int m, int width = 32) {
    // A lane past the caller's group of `width` reads the caller's own value.
    return emu::exchange(v, [&](unsigned l) {
        unsigned to = l ^ (unsigned)m, end = (l / width + 1) * width;
        return to < end ? to : l;
    });
}
inline unsigned __ballot_sync(unsigned, int p) {
    unsigned r = 0;
    for (unsigned i = 0; i < 32; i++) {
        int v = __shfl_sync(0xffffffffu, p, (int)i);
        if (v) r |= 1u << i;
    }
    return r;
}
inline int __any_sync(unsigned m, int p) { return __ballot_sync(m, p) != 0; }

inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline float __int_as_float(int u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
inline int __float_as_int(float f) {
    int u;
    memcpy(&u, &f, 4);
    return u;
}
inline int __float2int_rn(float f) { return (int)std::nearbyint(f); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
// Fibers take turns on one OS thread, so a plain read-modify-write is atomic.
template <typename T>
inline T atomicAdd(T* p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
template <typename T>
inline T __ldcg(const T* p) {
    return *p;
}
// CUDA's __byte_perm: the low 3 bits of each selector nibble (no sign mode).
inline unsigned __byte_perm(unsigned a, unsigned b, unsigned s) {
    uint64_t v = (uint64_t)a | ((uint64_t)b << 32);
    unsigned r = 0;
    for (int i = 0; i < 4; i++) {
        unsigned byte = (unsigned)(v >> (8 * ((s >> (4 * i)) & 7))) & 0xff;
        r |= byte << (8 * i);
    }
    return r;
}

// The PTX helpers the kernel sources leave out under TURBOSPARK_HOST_EMULATION.
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

// A load at an address its width does not divide faults on the GPU (a
// misaligned address error); here it stops the test.
inline void expect_aligned(const void* p, size_t width) {
    if ((uintptr_t)p % width) {
        fprintf(stderr, "a %zu-byte load at %p: misaligned\n", width, p);
        abort();
    }
}
template <typename T>
inline T ld_aligned(const void* p) {
    expect_aligned(p, sizeof(T));
    T v;
    memcpy(&v, p, sizeof(T));
    return v;
}

inline uint4 ld_stream_u4(const void* p) { return ld_aligned<uint4>(p); }
inline u32 tc_ld16(const u8* p) { return ld_aligned<u16>(p); }
inline u32 tc_ld32(const u8* p) { return ld_aligned<u32>(p); }
inline uint2 tc_ld64(const u8* p) { return ld_aligned<uint2>(p); }
inline u32 ld_stream_u32(const void* p) { return ld_aligned<u32>(p); }
inline u32 ld_stream_u16(const void* p) { return ld_aligned<u16>(p); }
inline u32 ld_stream_u8(const void* p) { return *(const u8*)p; }
inline int4 ld_i4_after_wait(const void* p) { return *(const int4*)p; }
inline float ld_f32_after_wait(const float* p) { return *p; }
inline void prefetch_l2(const void*) {}
inline float ld_cg(const float* p) { return *p; }

// A block's dynamic shared memory (common.cuh DYNAMIC_SHARED): one buffer,
// as blocks run one after another; 256 KiB, past any GPU's.
namespace emu {
inline void* dynamic_shared() {
    alignas(16) static unsigned char buffer[256 * 1024];
    return buffer;
}
}  // namespace emu
#define DYNAMIC_SHARED(T, name) T* name = (T*)emu::dynamic_shared()

// PTX `cp.async` (16 bytes, global to shared), `cp.async.commit_group`
// and `cp.async.wait_group N`: a thread's copies land only when a wait
// leaves at most N of its groups pending, so a kernel that reads its
// shared memory before waiting for the group that fills it reads what was
// there before.
namespace emu {
struct CpGroups {
    std::vector<std::pair<void*, const void*>> open;
    std::deque<std::vector<std::pair<void*, const void*>>> pending;
};
inline CpGroups& cp_groups() {
    static std::map<unsigned, CpGroups> groups;
    return groups[threadIdx.x];
}
}  // namespace emu
inline void tc_cp16(void* dst, const void* src) {
    expect_aligned(dst, 16);
    expect_aligned(src, 16);
    emu::cp_groups().open.push_back({dst, src});
}
inline void tc_cp_commit() {
    emu::CpGroups& g = emu::cp_groups();
    g.pending.push_back(std::move(g.open));
    g.open.clear();
}
template <int N>
inline void tc_cp_wait() {
    emu::CpGroups& g = emu::cp_groups();
    while (g.pending.size() > (size_t)N) {
        for (auto& c : g.pending.front()) memcpy(c.first, c.second, 16);
        g.pending.pop_front();
    }
}

// PTX `cvt.f32.f16`: an IEEE half's value (every half is a float exactly).
inline float f16_to_f32(u16 h) {
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? std::ldexp((float)m, -24)
              : e == 31 ? (m ? NAN : INFINITY)
                        : std::ldexp((float)(1024 + m), e - 25);
    return (h & 0x8000) ? -v : v;
}

// PTX `cvt.rn.f16.f32`: the nearest half, ties to even; past the largest
// half, infinity; NaN stays NaN.
inline u16 f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    u16 sign = (u16)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffff;
    if (ax >= 0x7f800000) return sign | 0x7c00 | (ax > 0x7f800000 ? 0x200 : 0);
    if (ax >= 0x477ff000) return sign | 0x7c00;  // 65520 and up round to infinity
    if (ax < 0x38800000) {  // below 2^-14: a subnormal half, in units of 2^-24
        float a;
        memcpy(&a, &ax, 4);
        return sign | (u16)std::nearbyint(std::ldexp(a, 24));
    }
    uint32_t mant = ax & 0x7fffff, rest = mant & 0x1fff;
    uint32_t h = ((((ax >> 23) - 127 + 15) << 10) | (mant >> 13));
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;  // a carry moves the exponent
    return sign | (u16)h;
}

// PTX `dp4a.s32.s32 d, a, b, c`: c plus the four signed byte products.
inline int dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}

// PTX `prmt.b32 d, a, b, c` in its default mode.
inline u32 prmt_signed(u32 a, u32 b, u32 sel) {
    uint64_t v = (uint64_t)a | ((uint64_t)b << 32);
    u32 r = 0;
    for (int i = 0; i < 4; i++) {
        u32 s = (sel >> (4 * i)) & 15;
        u32 byte = (u32)(v >> (8 * (s & 7))) & 0xff;
        if (s & 8) byte = (byte & 0x80) ? 0xff : 0x00;
        r |= byte << (8 * i);
    }
    return r;
}

namespace emu {
// One m16n8k32 s8 MMA of the warp: D = A·B + C (see the header). Every
// lane deposits its fragments; once all have, lane 0 forms the warp's D
// and each lane then takes its own four values.
inline void mma_m16n8k32_s8(int* d, const u32* a, u32 b0, u32 b1, const int* c) {
    State& s = state();
    unsigned w = warp_id(), l = lane_id();
    uint32_t* dep = &s.mma_deposits[(size_t)w * 32 * 10];
    int32_t* result = &s.mma_results[(size_t)w * 32 * 4];
    uint32_t* mine = dep + l * 10;
    for (int i = 0; i < 4; i++) mine[i] = a[i];
    mine[4] = b0;
    mine[5] = b1;
    for (int i = 0; i < 4; i++) mine[6 + i] = (uint32_t)c[i];
    warp_sync();
    if (l == 0) {
        auto byte = [](uint32_t r, int j) { return (int)(int8_t)((r >> (8 * j)) & 0xff); };
        int A[16][32], B[32][8];
        for (int lane = 0; lane < 32; lane++) {
            int g = lane / 4, q = lane % 4;
            const uint32_t* f = dep + lane * 10;
            for (int j = 0; j < 4; j++) {
                A[g][4 * q + j] = byte(f[0], j);
                A[g + 8][4 * q + j] = byte(f[1], j);
                A[g][16 + 4 * q + j] = byte(f[2], j);
                A[g + 8][16 + 4 * q + j] = byte(f[3], j);
                B[4 * q + j][g] = byte(f[4], j);
                B[16 + 4 * q + j][g] = byte(f[5], j);
            }
        }
        for (int lane = 0; lane < 32; lane++) {
            int g = lane / 4, q = lane % 4;
            for (int i = 0; i < 4; i++) {
                int m = g + 8 * (i / 2), n = 2 * q + i % 2;
                int64_t sum = (int32_t)dep[lane * 10 + 6 + i];
                for (int k = 0; k < 32; k++) sum += (int64_t)A[m][k] * B[k][n];
                result[lane * 4 + i] = (int32_t)sum;
            }
        }
    }
    warp_sync();
    // (The next MMA's lane 0 writes the results only after every lane has
    // deposited again, i.e. has read these.)
    for (int i = 0; i < 4; i++) d[i] = result[l * 4 + i];
}
}  // namespace emu

namespace emu {
// f32 of a bf16 (the upper half of the f32's bits).
inline float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// One m16n8k16 MMA of halves (bf16 or f16, read by half_value) of the
// warp with f32 sums: D = A·B + C, its
// fragments as the PTX ISA defines them for .bf16 (lane = 4g + q; a
// register's lower half the lower k): A reg 0 = row g, k 2q, 2q + 1;
// reg 1 = row g + 8, same k; reg 2 = row g, k 2q + 8, 2q + 9; reg 3 =
// row g + 8, same k; B reg 0 = k 2q, 2q + 1 of column g, reg 1 = k
// 2q + 8, 2q + 9; C/D as for m16n8k32. The hardware's order and rounding
// of the sum are its own; here each D is C plus the 16 exact products
// summed in f64, then rounded to f32: a function of its row of A, its
// column of B and its C alone, as the hardware's is, which is all the
// kernels' claims of equal bits rest on.
template <class Half>
inline void mma_m16n8k16(float* d, const u32* a, u32 b0, u32 b1, const float* c, Half half_value) {
    State& s = state();
    unsigned w = warp_id(), l = lane_id();
    uint32_t* dep = &s.mma_deposits[(size_t)w * 32 * 10];
    int32_t* result = &s.mma_results[(size_t)w * 32 * 4];  // f32 bits
    uint32_t* mine = dep + l * 10;
    for (int i = 0; i < 4; i++) mine[i] = a[i];
    mine[4] = b0;
    mine[5] = b1;
    for (int i = 0; i < 4; i++) memcpy(&mine[6 + i], &c[i], 4);
    warp_sync();
    if (l == 0) {
        auto half = [&](uint32_t r, int j) { return half_value((uint16_t)(r >> (16 * j))); };
        float A[16][16], B[16][8];
        for (int lane = 0; lane < 32; lane++) {
            int g = lane / 4, q = lane % 4;
            const uint32_t* f = dep + lane * 10;
            for (int j = 0; j < 2; j++) {
                A[g][2 * q + j] = half(f[0], j);
                A[g + 8][2 * q + j] = half(f[1], j);
                A[g][2 * q + 8 + j] = half(f[2], j);
                A[g + 8][2 * q + 8 + j] = half(f[3], j);
                B[2 * q + j][g] = half(f[4], j);
                B[2 * q + 8 + j][g] = half(f[5], j);
            }
        }
        for (int lane = 0; lane < 32; lane++) {
            int g = lane / 4, q = lane % 4;
            for (int i = 0; i < 4; i++) {
                int m = g + 8 * (i / 2), n = 2 * q + i % 2;
                float ci;
                memcpy(&ci, &dep[lane * 10 + 6 + i], 4);
                double sum = ci;
                for (int k = 0; k < 16; k++) sum += (double)A[m][k] * (double)B[k][n];
                float r = (float)sum;
                memcpy(&result[lane * 4 + i], &r, 4);
            }
        }
    }
    warp_sync();
    for (int i = 0; i < 4; i++) memcpy(&d[i], &result[l * 4 + i], 4);
}
inline void mma_m16n8k16_bf16(float* d, const u32* a, u32 b0, u32 b1, const float* c) {
    mma_m16n8k16(d, a, b0, b1, c, bf16_value);
}
// The same for .f16 operands (PTX `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`:
// the fragments as for .bf16, each half an IEEE half, f16_to_f32 above).
inline void mma_m16n8k16_f16(float* d, const u32* a, u32 b0, u32 b1, const float* c) {
    mma_m16n8k16(d, a, b0, b1, c, [](uint16_t h) { return ::f16_to_f32(h); });
}
}  // namespace emu

inline void mma_bf16(float* c, const u32* a, u32 b0, u32 b1) {
    float in[4] = {c[0], c[1], c[2], c[3]};
    emu::mma_m16n8k16_bf16(c, a, b0, b1, in);
}
inline void mma_f16(float* c, const u32* a, u32 b0, u32 b1) {
    float in[4] = {c[0], c[1], c[2], c[3]};
    emu::mma_m16n8k16_f16(c, a, b0, b1, in);
}

// PTX `cvt.rn.bf16x2.f32`: each f32 rounded to the nearest bf16, ties to
// even (NaN kept a NaN); `lo` in the lower half.
inline u32 bf16x2_rn(float lo, float hi) {
    auto rn = [](float f) -> uint32_t {
        uint32_t u;
        memcpy(&u, &f, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
        return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    };
    return rn(lo) | (rn(hi) << 16);
}

// PTX `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: lane l names row l % 8
// of matrix l / 8 (8 rows of 16 bytes); register i of lane l is 32-bit
// word l % 4 of row l / 4 of matrix i. The rows' addresses are exchanged
// as the hardware gathers them.
inline void ldmatrix_x4(u32* r, const void* row) {
    if ((uintptr_t)row % 16 != 0) {
        fprintf(stderr, "ldmatrix: a row address not 16-byte aligned\n");
        abort();
    }
    unsigned l = emu::lane_id();
    for (unsigned i = 0; i < 4; i++) {
        const void* p = emu::exchange(row, [&](unsigned lane) { return 8 * i + lane / 4; });
        memcpy(&r[i], (const unsigned char*)p + 4 * (l % 4), 4);
    }
}

inline void mma_s8(int* c, const u32* a, const u32* b) {
    int zero[4] = {0, 0, 0, 0};
    emu::mma_m16n8k32_s8(c, a, b[0], b[1], zero);
}
inline void mma_s8_acc(int* c, const u32* a, u32 b0, u32 b1) {
    int in[4] = {c[0], c[1], c[2], c[3]};
    emu::mma_m16n8k32_s8(c, a, b0, b1, in);
}
