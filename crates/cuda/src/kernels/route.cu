// Routing on the device: one warp per token, the router math of
// `turbospark_backend::routing::route_token` (its docs give the formulas of
// each router kind). The token's logits and every per-expert array live in
// shared memory; the top-k choices are warp-wide argmaxes (the largest
// value, ties to the lower expert index, as there), and sums over experts
// run serially in expert order on lane 0, as there.

#define ROUTE_MAX_EXPERTS 512
#define ROUTE_MAX_K 32
#define R_SOFTMAX_TOPK 0
#define R_TOPK_SOFTMAX 1
#define R_SIGMOID_GROUPED 2
#define R_GEMMA4 3

struct RouterParams {
    int kind;
    int num_experts;
    int top_k;
    int renormalize;
    int n_group;
    int topk_group;
    float scaling;
};

struct RouteOut {
    u32 slot;
    float weight;
};

// Route j's weight (for elementwise.cu, which comes before this file).
__device__ float route_weight(const RouteOut* routes, int j) { return routes[j].weight; }

// Index of the largest eligible value not yet taken; -1 when none (a
// serial scan, for the short group list).
__device__ int best_of(const float* v, int e, const int* taken, int nt, const u8* eligible) {
    int best = -1;
    for (int i = 0; i < e; i++) {
        if (eligible && !eligible[i]) continue;
        bool t = false;
        for (int a = 0; a < nt; a++) t |= taken[a] == i;
        if (t) continue;
        if (best < 0 || v[i] > v[best]) best = i;
    }
    return best;
}

// The same over the warp: lane l scans experts l, l + 32, ...; every lane
// gets the index. `taken` and `eligible` are per-expert flags (eligible may
// be null).
__device__ int warp_best(const float* v, int e, const u8* taken, const u8* eligible) {
    int lane = threadIdx.x & 31;
    int bi = -1;
    float bv = 0.0f;
    for (int i = lane; i < e; i += 32) {
        if (taken[i] || (eligible && !eligible[i])) continue;
        if (bi < 0 || v[i] > bv) {
            bi = i;
            bv = v[i];
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        int oi = __shfl_xor_sync(FULL_MASK, bi, o);
        float ov = __shfl_xor_sync(FULL_MASK, bv, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
            bi = oi;
            bv = ov;
        }
    }
    return bi;
}

// Picks k experts into chosen[] (every lane holds them), marking them taken.
__device__ void warp_top_k(const float* v, int e, int k, u8* taken, const u8* eligible,
                           int* chosen) {
    for (int r = 0; r < k; r++) {
        int c = warp_best(v, e, taken, eligible);
        chosen[r] = c;
        if ((threadIdx.x & 31) == 0 && c >= 0) taken[c] = 1;
        __syncwarp();
    }
}

// Largest of the warp's u32s (every lane gets it).
__device__ __forceinline__ u32 warp_max_u32(u32 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_max_sync(FULL_MASK, v);
#else
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
#endif
}

// Order-preserving key of a float for an unsigned comparison: larger
// floats give larger keys, -0 the key of +0 (they compare equal as
// floats), -inf the smallest key of any non-NaN value (0x007fffff), so 0
// can stand for "no candidate".
__device__ __forceinline__ u32 route_key(float v) {
    u32 b = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// route_token for a softmax router (R_SOFTMAX_TOPK, R_GEMMA4,
// R_TOPK_SOFTMAX) of at most 32 experts, with every value in registers:
// lane i holds expert i. The same operations in the same order as the
// general path below, so the same bits: the softmax's sum runs over the
// experts in order (each lane adds every lane's value, gathered by
// shuffle), a rank's choice is the largest value not yet taken with ties
// to the lower expert (a warp max of route_key, then the lowest lane
// holding it), and the rank sums run in rank order. Lane r then holds
// rank r and writes its route. Returns false, having written nothing,
// when a value to rank is NaN: the general path's comparisons decide
// those.
__device__ bool route_token_lanes(const float* logits, int t, const RouterParams& p,
                                  const float* expert_scale, RouteOut* out) {
    int lane = threadIdx.x & 31;
    int e = p.num_experts, k = p.top_k;
    bool live = lane < e;
    float z = live ? __ldcg(logits + (i64)t * e + lane) : -INFINITY;
    float v = z;
    if (p.kind != R_TOPK_SOFTMAX) {
        float m = warp_max(z);
        float x = live ? expf(z - m) : 0.0f;
        float sum = 0.0f;
        for (int i = 0; i < e; i++) sum += __shfl_sync(FULL_MASK, x, i);
        v = x / sum;
    }
    if (__any_sync(FULL_MASK, live && isnan(v))) return false;
    bool open = live;
    int mine = -1;  // lane r: the expert of rank r
    for (int r = 0; r < k; r++) {
        u32 key = open ? route_key(v) : 0u;
        u32 best = warp_max_u32(key);
        u32 at = __ballot_sync(FULL_MASK, open && key == best);
        int c = at ? __ffs(at) - 1 : -1;
        if (lane == c) open = false;
        if (lane == r) mine = c;
    }
    // Lane r's chosen value and logit (rank r < k; the rest unused).
    float cv = __shfl_sync(FULL_MASK, v, mine < 0 ? 0 : mine);
    float cz = __shfl_sync(FULL_MASK, z, mine < 0 ? 0 : mine);
    RouteOut* o = out + (i64)t * k;
    if (p.kind == R_TOPK_SOFTMAX) {
        float m = __shfl_sync(FULL_MASK, cz, 0);
        float ex = expf(cz - m);
        float sum = 0.0f;
        for (int r = 0; r < k; r++) sum += __shfl_sync(FULL_MASK, ex, r);
        if (lane < k) {
            o[lane].slot = (u32)mine;
            o[lane].weight = ex / sum;
        }
        return true;
    }
    float total = 0.0f;
    for (int r = 0; r < k; r++) total += __shfl_sync(FULL_MASK, cv, r);
    if (lane < k) {
        float w = cv;
        if (p.kind == R_GEMMA4) w = w / total * (expert_scale ? expert_scale[mine] : 1.0f);
        else if (p.renormalize) w = w / total;
        o[lane].slot = (u32)mine;
        o[lane].weight = w;
    }
    return true;
}

// Token t's routes from its logits, by one warp (the block's first). The
// logits are read through the L2 (ld.global.cg): router1_q8x_q8_0 reads what
// other blocks of its own launch wrote.
__device__ void route_token(const float* logits, int t, RouterParams p, const float* correction,
                            const float* expert_scale, RouteOut* out) {
    if (p.num_experts <= 32 && p.kind != R_SIGMOID_GROUPED &&
        route_token_lanes(logits, t, p, expert_scale, out))
        return;
    __shared__ float z[ROUTE_MAX_EXPERTS];
    __shared__ float values[ROUTE_MAX_EXPERTS];
    __shared__ float scores[ROUTE_MAX_EXPERTS];
    __shared__ u8 eligible[ROUTE_MAX_EXPERTS];
    __shared__ u8 taken[ROUTE_MAX_EXPERTS];
    __shared__ float total_s;
    int lane = threadIdx.x & 31;
    int e = p.num_experts, k = p.top_k;
    for (int i = lane; i < e; i += 32) {
        z[i] = __ldcg(logits + (i64)t * e + i);
        taken[i] = 0;
    }
    __syncwarp();
    int chosen[ROUTE_MAX_K];
    RouteOut* o = out + (i64)t * k;
    if (p.kind == R_SOFTMAX_TOPK || p.kind == R_GEMMA4) {
        float m = -INFINITY;
        for (int i = lane; i < e; i += 32) m = fmaxf(m, z[i]);
        m = warp_max(m);
        for (int i = lane; i < e; i += 32) values[i] = expf(z[i] - m);
        __syncwarp();
        if (lane == 0) {
            float sum = 0.0f;
            for (int i = 0; i < e; i++) sum += values[i];
            total_s = sum;
        }
        __syncwarp();
        float sum = total_s;
        for (int i = lane; i < e; i += 32) values[i] /= sum;
        __syncwarp();
        warp_top_k(values, e, k, taken, 0, chosen);
        if (lane != 0) return;
        float total = 0.0f;
        for (int r = 0; r < k; r++) total += values[chosen[r]];
        for (int r = 0; r < k; r++) {
            int i = chosen[r];
            float w = values[i];
            if (p.kind == R_GEMMA4) w = w / total * (expert_scale ? expert_scale[i] : 1.0f);
            else if (p.renormalize) w = w / total;
            o[r].slot = (u32)i;
            o[r].weight = w;
        }
    } else if (p.kind == R_TOPK_SOFTMAX) {
        warp_top_k(z, e, k, taken, 0, chosen);
        if (lane != 0) return;
        float m = z[chosen[0]];
        float sum = 0.0f;
        for (int r = 0; r < k; r++) sum += expf(z[chosen[r]] - m);
        for (int r = 0; r < k; r++) {
            o[r].slot = (u32)chosen[r];
            o[r].weight = expf(z[chosen[r]] - m) / sum;
        }
    } else {
        int per = e / p.n_group;
        for (int i = lane; i < e; i += 32) {
            scores[i] = sigmoidf_(z[i]);
            values[i] = scores[i] + (correction ? correction[i] : 0.0f);
        }
        __syncwarp();
        if (lane == 0) {
            float groups[ROUTE_MAX_K * 2];
            for (int g = 0; g < p.n_group; g++) {
                float a = -INFINITY, b = -INFINITY;
                for (int i = g * per; i < (g + 1) * per; i++) {
                    float v = values[i];
                    if (v > a) { b = a; a = v; }
                    else if (v > b) b = v;
                }
                groups[g] = per >= 2 ? a + b : a;
            }
            int kept[ROUTE_MAX_K * 2];
            for (int r = 0; r < p.topk_group; r++) kept[r] = best_of(groups, p.n_group, kept, r, 0);
            for (int i = 0; i < e; i++) {
                bool in = false;
                for (int r = 0; r < p.topk_group; r++) in |= kept[r] == i / per;
                eligible[i] = in;
            }
        }
        __syncwarp();
        warp_top_k(values, e, k, taken, eligible, chosen);
        if (lane != 0) return;
        float total = 0.0f;
        for (int r = 0; r < k; r++) total += scores[chosen[r]];
        total += 1e-20f;
        for (int r = 0; r < k; r++) {
            float w = scores[chosen[r]];
            if (p.renormalize) w = w / total;
            o[r].slot = (u32)chosen[r];
            o[r].weight = w * p.scaling;
        }
    }
}

KERNEL void route(const float* logits, int n_tokens, RouterParams p,
                                 const float* correction, const float* expert_scale,
                                 RouteOut* out) {
    KERNEL_ENTRY();
    if ((int)blockIdx.x >= n_tokens) return;
    route_token(logits, blockIdx.x, p, correction, expert_scale, out);
}
