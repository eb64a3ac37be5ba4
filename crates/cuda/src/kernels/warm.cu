// L2 warm-up of weights a decode step reads next (stream/warm.rs): launched
// on a second stream of the recorded step beside the latency-bound kernels
// (norms, rope, attention, routing), which leave the HBM idle, so that the
// product after them finds its weights in the L2. The kernels only ask the
// L2 for lines (nothing is returned or written), so no result depends on
// them. Without programmatic launch (stream/warm.rs launches them plainly)
// KERNEL_ENTRY's wait is a no-op.
//
// `chunk` > 0 (sm_90): a thread asks for `chunk` bytes at a time with one
// bulk prefetch (`cp.async.bulk.prefetch.L2`, sizes a multiple of 16);
// otherwise a 128-byte line a thread per `prefetch.global.L2`.

// Asks the L2 for bytes [begin, end) of `p`, the block's threads in turn.
__device__ __forceinline__ void warm_range(const u8* p, i64 begin, i64 end, int chunk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (chunk > 0) {
        for (i64 at = begin + (i64)threadIdx.x * chunk; at < end; at += (i64)blockDim.x * chunk) {
            u32 n = (u32)min((i64)chunk, end - at) & ~15u;
            if (n) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + at), "r"(n) : "memory");
        }
        return;
    }
#endif
    for (i64 at = begin + (i64)threadIdx.x * 128; at < end; at += (i64)blockDim.x * 128)
        prefetch_l2(p + at);
}

// A block's share of `bytes` at `p` (whole 128-byte lines, the blocks in
// order; `p` first rounded down to 16 bytes, as the bulk form needs).
__device__ __forceinline__ void warm_share(const u8* p, i64 bytes, int chunk) {
    i64 skew = (i64)((unsigned long long)p & 15);
    p -= skew;
    bytes += skew;
    i64 share = ((bytes + gridDim.x - 1) / gridDim.x + 127) & ~(i64)127;
    i64 begin = (i64)blockIdx.x * share;
    warm_range(p, begin, min(begin + share, bytes), chunk);
}

// grid (blocks): `bytes` at `p`, split over the blocks.
extern "C" __global__ void l2_warm(const u8* __restrict__ p, i64 bytes, int chunk) {
    KERNEL_ENTRY();
    warm_share(p, bytes, chunk);
}

// grid (blocks, routes): route r's slot of a bank of `slot_bytes` a slot at
// `base` (the routed experts' down rows while their gate/up products run).
// Launched after the routing (a full dependency), so the routes are written.
extern "C" __global__ void l2_warm_routes(const RouteOut* __restrict__ routes, int slots,
                                          const u8* __restrict__ base, i64 slot_bytes, int chunk) {
    KERNEL_ENTRY();
    u32 slot = routes[blockIdx.y].slot;
    if (slot >= (u32)slots) return;
    warm_share(base + (i64)slot * slot_bytes, slot_bytes, chunk);
}
