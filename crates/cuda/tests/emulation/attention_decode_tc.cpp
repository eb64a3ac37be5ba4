// attention_dec.cu's one-token attention on the tensor cores, run on the
// CPU through warp_emulator.h against an f64 reference of the formula it
// documents (HF eager attention with sinks, sliding windows, soft-cap,
// grouped query heads, key j at cache row j % capacity), and beside it
// attention.cu's split kernel (attention_decode_*, which the GPU
// conformance suite has passed) on the same inputs. The tensor-core
// kernel rounds the queries and the softmax weights to f16 for its MMAs,
// so the check is a tolerance: every output within 4e-3 of the largest
// |value| of its head's reference row (as attention_tc.cpp). The cases
// cover more splits than the finishing block adds at once (its rescaled
// groups), splits and warps with no keys (a position far below the
// capacity), one split (the block finishes alone), partial last tiles,
// a wrapped sliding ring, heads 64 and 128 wide and groups of 1 to 8
// query heads. After each launch every ticket must be back at 0. The
// split kernel's staged form (attention_decode_staged_*: each warp's key
// rows copied through shared memory) must give the split kernel's
// outputs bit for bit: the same values in the same order. In every
// launch the newest key's row (what the rope before the attention writes)
// holds NaNs until the block's threads reach their wait (warp_emulator.h
// grid_dependency_wait), so a kernel that read it early would fail.
// Exit status 0 when every case holds; failures are printed.
//
// Built and run by tests/host_emulation.rs (`c++ -std=c++17 -O2`).

#include "warp_emulator.h"
#include "../../src/kernels/common.cuh"
#include "../../src/kernels/elementwise.cu"
#include "../../src/kernels/attention.cu"
#include "../../src/kernels/attention_tc.cu"
#include "../../src/kernels/attention_dec.cu"
#include "bit_checks.h"
#include "attention_reference.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

struct Case {
    std::string name;
    int hd, n_heads, n_kv_heads, capacity, pos, window, splits;
    bool sinks;
    float softcap;
};

int failures = 0;

void run_case(const Case& c, std::mt19937& rng) {
    const int hd = c.hd;
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    int G = c.n_heads / c.n_kv_heads;
    std::vector<float> q((size_t)c.n_heads * hd);
    for (auto& x : q) x = 2.0f * uni(rng);
    // The caches: every row filled (rows the token does not read too), f16.
    std::vector<u16> kc((size_t)c.capacity * c.n_kv_heads * hd), vc(kc.size());
    for (auto& x : kc) x = f32_to_f16(uni(rng));
    for (auto& x : vc) x = f32_to_f16(uni(rng));
    // A few keys near the query of their head, so that the softmax has
    // peaks for the splits' maxima to differ by.
    int lo = c.window > 0 ? std::max(0, c.pos + 1 - c.window) : 0;
    for (int kvh = 0; kvh < c.n_kv_heads; kvh++)
        for (int n = 0; n < 3; n++) {
            int j = lo + (int)((c.pos - lo) * (0.1 + 0.4 * n));
            const float* qh = &q[(size_t)(kvh * G) * hd];
            u16* kr = &kc[((size_t)(j % c.capacity) * c.n_kv_heads + kvh) * hd];
            for (int d = 0; d < hd; d++) kr[d] = f32_to_f16(0.5f * qh[d]);
        }
    // And the strongest key in the first tile of the tensor-core kernel's
    // last split (tile 8·(S - 1): DT_WARPS warps a split), so that its
    // maximum is the largest, past the finishing block's first group.
    int strong = lo + DT_KEYS * DT_WARPS * (c.splits - 1) + 5;
    if (c.splits > 1 && strong <= c.pos)
        for (int kvh = 0; kvh < c.n_kv_heads; kvh++) {
            const float* qh = &q[(size_t)(kvh * G) * hd];
            u16* kr = &kc[((size_t)(strong % c.capacity) * c.n_kv_heads + kvh) * hd];
            for (int d = 0; d < hd; d++) kr[d] = f32_to_f16(qh[d]);
        }
    std::vector<float> sinks(c.n_heads);
    for (auto& x : sinks) x = 2.0f * uni(rng);
    float scale = 1.0f / std::sqrt((float)hd);

    std::vector<double> want(q.size());
    attn_ref::F16Cache cache = {kc.data(), vc.data(), c.n_kv_heads, hd, c.capacity};
    for (int h = 0; h < c.n_heads; h++)
        attn_ref::head(&q[(size_t)h * hd], h / G, c.pos, c.window, scale, c.softcap,
                       c.sinks ? &sinks[h] : nullptr, cache, &want[(size_t)h * hd]);

    AttnParams p = {c.pos,    c.n_heads, c.n_kv_heads, hd,       c.capacity,
                    c.window, scale,     c.softcap,    c.sinks ? 1 : 0};
    double t0 = bits::seconds();
    int bad = 0;
    std::vector<float> split_out;
    // The newest key's rows (every KV head's), hidden from each block
    // until its wait.
    size_t newest = (size_t)(c.pos % c.capacity) * c.n_kv_heads * hd, width = (size_t)c.n_kv_heads * hd;
    std::vector<u16> k_new(kc.begin() + newest, kc.begin() + newest + width),
        v_new(vc.begin() + newest, vc.begin() + newest + width);
    emu::state().at_block_start = [&] {
        std::fill(kc.begin() + newest, kc.begin() + newest + width, (u16)0x7E00);
        std::fill(vc.begin() + newest, vc.begin() + newest + width, (u16)0x7E00);
    };
    emu::state().at_wait = [&] {
        std::copy(k_new.begin(), k_new.end(), kc.begin() + newest);
        std::copy(v_new.begin(), v_new.end(), vc.begin() + newest);
    };
    for (int kernel = 0; kernel < 3; kernel++) {
        // The tensor-core kernel with the case's splits; the split kernel
        // with at most its DEC_MAX_SPLITS, then its staged form.
        bool tc = kernel == 0, staged = kernel == 2;
        int S = tc ? c.splits : std::min(c.splits, DEC_MAX_SPLITS);
        std::vector<float> out(q.size(), -12345.0f);
        std::vector<float> part((size_t)S * c.n_heads * (hd + 2), -777.0f);
        std::vector<u32> tickets(c.n_kv_heads, 0u);
        emu::launch({(unsigned)c.n_kv_heads, (unsigned)S, 1}, {tc ? 256u : 512u, 1, 1}, [&] {
            if (tc) {
                auto f = hd == 64 ? attention_decode_tc_f16_64 : attention_decode_tc_f16_128;
                f(q.data(), kc.data(), vc.data(), p, sinks.data(), out.data(), nullptr, nullptr,
                  nullptr, part.data(), tickets.data());
            } else {
                auto f = staged ? (hd == 64 ? attention_decode_staged_f16_64
                                            : attention_decode_staged_f16_128)
                                : (hd == 64 ? attention_decode_f16_64 : attention_decode_f16_128);
                f(q.data(), kc.data(), vc.data(), p, sinks.data(), out.data(), nullptr, nullptr,
                  nullptr, part.data(), tickets.data());
            }
        });
        const char* name = tc ? "tensor cores" : staged ? "split kernel, staged" : "split kernel";
        if (kernel == 1) split_out = out;
        if (staged) {
            size_t differ = 0;
            for (size_t i = 0; i < out.size(); i++)
                differ += std::memcmp(&out[i], &split_out[i], sizeof(float)) != 0;
            if (differ) {
                std::printf("FAIL %s, %s: %zu of %zu outputs not the split kernel's bits\n",
                            c.name.c_str(), name, differ, out.size());
                bad++;
            }
        }
        std::string label = c.name + ", " + name;
        double worst;
        int off = attn_ref::compare(label.c_str(), out, want, c.n_heads, hd, 4e-3, worst);
        std::printf("%s %s: %zu values, %d off, worst %.2e of the row's largest\n",
                    off ? "FAIL" : "ok  ", label.c_str(), out.size(), off, worst);
        bad += off;
        for (int h = 0; h < c.n_kv_heads; h++)
            if (tickets[h] != 0) {
                std::printf("  %s, %s: KV head %d's ticket left at %u\n", c.name.c_str(), name, h,
                            tickets[h]);
                bad++;
            }
    }
    emu::state().at_block_start = nullptr;
    emu::state().at_wait = nullptr;
    std::printf("     (%.1f s)\n", bits::seconds() - t0);
    if (bad) failures++;
}

}  // namespace

int main() {
    std::mt19937 rng(20261206);
    std::vector<Case> cases = {
        // gpt-oss's group (8 query heads a KV head) with sinks, a full
        // layer: 20 splits (two groups for the finishing block), 188 tiles
        // over 160 warps, the last tile partial.
        {"gpt-oss full layer, 3001 keys, 20 splits", 64, 16, 2, 3100, 3000, 0, 20, true, 0.0f},
        // A position far below the capacity: most splits and warps empty.
        {"701 keys of 4096, 40 splits", 64, 8, 1, 4096, 700, 0, 40, true, 0.0f},
        // 36 splits, all holding keys (three groups for the finishing block).
        {"5000 keys, 36 splits", 64, 8, 1, 5000, 4999, 0, 36, true, 0.0f},
        // The most splits (DECODE_TC_MAX_SPLITS: four groups), all holding
        // keys, as one KV head over a long cache takes by default.
        {"9000 keys, 64 splits", 64, 8, 1, 9100, 8999, 0, 64, true, 0.0f},
        // A sliding layer whose ring wrapped (key j at row j % 320).
        {"window 300 over a ring of 320 at 1234", 64, 8, 1, 320, 1234, 300, 3, true, 0.0f},
        // No sinks, a soft-cap (Gemma), 4 query heads a KV head.
        {"soft-cap, 4 a KV head", 64, 8, 2, 600, 517, 0, 5, false, 5.0f},
        // One key; one query head a KV head.
        {"one key", 64, 8, 1, 64, 0, 0, 4, true, 0.0f},
        {"1 a KV head, 2 splits", 64, 2, 2, 40, 37, 0, 2, false, 0.0f},
        // Heads 128 wide (Qwen3-MoE, Mixtral): 8 and 6 a KV head, one
        // split (the block finishes alone), many splits.
        {"128 wide, 8 a KV head, 18 splits", 128, 16, 2, 1200, 1199, 0, 18, false, 0.0f},
        {"128 wide, 6 a KV head, window 100, one split", 128, 12, 2, 128, 900, 100, 1, true,
         0.0f},
    };
    for (const Case& c : cases) run_case(c, rng);
    return failures || bits::verdict() ? 1 : 0;
}
