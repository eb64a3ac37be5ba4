// attention_tc.cu's prefill attention on the tensor cores, run on the CPU
// through warp_emulator.h against an f64 reference of the formula it
// documents (HF eager attention with sinks, sliding windows, soft-cap,
// grouped query heads, key j at cache row j % capacity). The kernel rounds
// the queries and the softmax weights to f16 for its MMAs, so the check
// is a tolerance: every output within 4e-3 of the largest |value| row of
// its head (the f16 roundings are 2^-11 relative; 4e-3 leaves room for
// their sums, and a wrong mask, key or rescaling is off by far more).
// Rows of the output the launch must not write keep their sentinel.
// Exit status 0 when every case holds; failures are printed.
//
// Built and run by tests/host_emulation.rs (`c++ -std=c++17 -O2`).

#include "warp_emulator.h"
#include "../../src/kernels/common.cuh"
#include "../../src/kernels/attention_tc.cu"
#include "bit_checks.h"
#include "attention_reference.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

struct Case {
    std::string name;
    int hd, n_tokens, first_pos, n_heads, n_kv_heads, capacity, window;
    bool sinks;
    float softcap;
};

int failures = 0;

void run_case(const Case& c, std::mt19937& rng) {
    const int hd = c.hd;
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    int G = c.n_heads / c.n_kv_heads;
    std::vector<float> q((size_t)c.n_tokens * c.n_heads * hd);
    for (auto& x : q) x = 2.0f * uni(rng);
    // The caches: every row filled (rows no token reads included), f16.
    std::vector<u16> kc((size_t)c.capacity * c.n_kv_heads * hd), vc(kc.size());
    for (auto& x : kc) x = f32_to_f16(uni(rng));
    for (auto& x : vc) x = f32_to_f16(uni(rng));
    std::vector<float> sinks(c.n_heads);
    for (auto& x : sinks) x = 2.0f * uni(rng);
    float scale = 1.0f / std::sqrt((float)hd);

    std::vector<double> want(q.size());
    attn_ref::F16Cache cache = {kc.data(), vc.data(), c.n_kv_heads, hd, c.capacity};
    for (int t = 0; t < c.n_tokens; t++)
        for (int h = 0; h < c.n_heads; h++) {
            size_t row = ((size_t)t * c.n_heads + h) * hd;
            attn_ref::head(&q[row], h / G, c.first_pos + t, c.window, scale, c.softcap,
                           c.sinks ? &sinks[h] : nullptr, cache, &want[row]);
        }

    const float SENTINEL = -12345.0f;
    std::vector<float> out(q.size(), SENTINEL);
    AttnParams p = {c.first_pos, c.n_heads, c.n_kv_heads, hd,       c.capacity,
                    c.window,    scale,     c.softcap,    c.sinks ? 1 : 0};
    double t0 = bits::seconds();
    emu::launch({(unsigned)c.n_kv_heads, (unsigned)((c.n_tokens + PA_TOKENS - 1) / PA_TOKENS), 1},
                {(unsigned)(32 * G), 1, 1}, [&] {
                    auto kernel = hd == 64 ? attention_prefill_tc_f16_64 : attention_prefill_tc_f16_128;
                    kernel(q.data(), kc.data(), vc.data(), p, c.n_tokens, sinks.data(), out.data());
                });
    double worst;
    int bad = attn_ref::compare(c.name.c_str(), out, want, c.n_heads, hd, 4e-3, worst);
    std::printf("%s %s: %zu values, %d off, worst %.2e of the row's largest (%.1f s)\n",
                bad ? "FAIL" : "ok  ", c.name.c_str(), out.size(), bad, worst,
                bits::seconds() - t0);
    if (bad) failures++;
}

}  // namespace

int main() {
    std::mt19937 rng(20261206);
    std::vector<Case> cases = {
        // gpt-oss's group (8 query heads a KV head), sinks, a full layer:
        // 37 tokens from position 0 (a partial last tile of tokens).
        {"full, from 0, sinks", 64, 37, 0, 16, 2, 64, 0, true, 0.0f},
        // A sliding layer (window 20) at depth, its ring smaller than the
        // positions (key j at row j % 56), tokens starting mid-tile.
        {"window 20 at depth 50, ring of 56", 64, 21, 50, 8, 1, 56, 20, true, 0.0f},
        // No sinks, a soft-cap (Gemma), 4 query heads a KV head.
        {"soft-cap, 4 a KV head", 64, 18, 7, 8, 2, 32, 0, false, 5.0f},
        // One token.
        {"one token at 9", 64, 1, 9, 8, 1, 16, 0, true, 0.0f},
        // Heads 128 wide (Qwen3-MoE, Mixtral): 8 and 4 a KV head, a window.
        {"128 wide, 8 a KV head", 128, 20, 3, 16, 2, 32, 0, false, 0.0f},
        {"128 wide, window 9, 4 a KV head", 128, 17, 11, 8, 2, 40, 9, true, 0.0f},
    };
    for (const Case& c : cases) run_case(c, rng);
    return failures || bits::verdict() ? 1 : 0;
}
