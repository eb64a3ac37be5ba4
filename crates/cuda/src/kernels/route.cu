// Routing on the device: one block of ROUTE_THREADS per token loads the
// token's router logits into shared memory, then one thread runs the router
// math of `turbospark_backend::routing::route_token` on them (its docs give
// the formulas of each router kind); ties go to the lower expert index and
// sums run in expert order, as there. Keeping every array in shared memory
// spares the serial loops global- and local-memory latency.

#define ROUTE_THREADS 32

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

// Index of the largest eligible value not yet taken; -1 when none.
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

extern "C" __global__ void route(const float* logits, int n_tokens, RouterParams p,
                                 const float* correction, const float* expert_scale,
                                 RouteOut* out) {
    __shared__ float z[ROUTE_MAX_EXPERTS];
    __shared__ float values[ROUTE_MAX_EXPERTS];
    __shared__ float scores[ROUTE_MAX_EXPERTS];
    __shared__ u8 eligible[ROUTE_MAX_EXPERTS];
    int t = blockIdx.x;
    if (t >= n_tokens) return;
    int e = p.num_experts, k = p.top_k;
    for (int i = threadIdx.x; i < e; i += blockDim.x) z[i] = logits[(i64)t * e + i];
    __syncthreads();
    if (threadIdx.x != 0) return;
    int chosen[ROUTE_MAX_K];
    RouteOut* o = out + (i64)t * k;
    if (p.kind == R_SOFTMAX_TOPK || p.kind == R_GEMMA4) {
        float m = -INFINITY;
        for (int i = 0; i < e; i++) m = fmaxf(m, z[i]);
        float sum = 0.0f;
        for (int i = 0; i < e; i++) {
            values[i] = expf(z[i] - m);
            sum += values[i];
        }
        for (int i = 0; i < e; i++) values[i] /= sum;
        for (int r = 0; r < k; r++) chosen[r] = best_of(values, e, chosen, r, 0);
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
        for (int r = 0; r < k; r++) chosen[r] = best_of(z, e, chosen, r, 0);
        float m = z[chosen[0]];
        float sum = 0.0f;
        for (int r = 0; r < k; r++) sum += expf(z[chosen[r]] - m);
        for (int r = 0; r < k; r++) {
            o[r].slot = (u32)chosen[r];
            o[r].weight = expf(z[chosen[r]] - m) / sum;
        }
    } else {
        int per = e / p.n_group;
        for (int i = 0; i < e; i++) {
            scores[i] = sigmoidf_(z[i]);
            values[i] = scores[i] + (correction ? correction[i] : 0.0f);
        }
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
        for (int r = 0; r < k; r++) chosen[r] = best_of(values, e, chosen, r, eligible);
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
