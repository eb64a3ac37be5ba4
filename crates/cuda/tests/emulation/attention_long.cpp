// attention.cu's long form (attention_long_*: the scalar attention past
// the shared memory of its scores, the keys a chunk at a time, each score
// formed again where a pass needs it) run on the CPU through
// warp_emulator.h against the one-pass kernels (attention_f32 /
// attention_f16, every score kept), bit for bit: the output, and its 8-bit
// quantization where asked. Chunks here are a few hundred keys, so that a
// case of ~1000 keys crosses several; the GPU takes 8192 (kernels.rs
// ATTN_LONG_CHUNK). Cases: grouped query heads over a ring that wraps, a
// sliding window and a soft-cap, heads 40 wide (3 sets of threads a
// dimension, 8 threads idle), 128 (one set) and 256 (two dimensions a
// thread), f32 and f16 caches, sinks, several tokens. (Exit status 0 when
// every case holds; failures are printed.)
//
// Built and run by tests/host_emulation.rs (`c++ -std=c++17 -O2`).

#include "warp_emulator.h"
#include "../../src/kernels/common.cuh"
#include "../../src/kernels/elementwise.cu"
#include "../../src/kernels/attention.cu"
#include "bit_checks.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

struct Case {
    std::string name;
    int hd, n_heads, n_kv_heads, n_tokens, first_pos, capacity, window, chunk;
    bool half, sinks, quantize;
    float softcap;
};

void run_case(const Case& c, std::mt19937& rng) {
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    const int hd = c.hd;
    size_t row = (size_t)c.n_kv_heads * hd;
    std::vector<float> q((size_t)c.n_tokens * c.n_heads * hd);
    for (auto& x : q) x = 2.0f * uni(rng);
    std::vector<float> kf(c.capacity * row), vf(kf.size());
    for (auto& x : kf) x = uni(rng);
    for (auto& x : vf) x = uni(rng);
    std::vector<u16> kh(kf.size()), vh(vf.size());
    for (size_t i = 0; i < kf.size(); i++) {
        kh[i] = f32_to_f16(kf[i]);
        vh[i] = f32_to_f16(vf[i]);
    }
    std::vector<float> sinks(c.n_heads);
    for (auto& x : sinks) x = 2.0f * uni(rng);
    AttnParams p = {c.first_pos, c.n_heads, c.n_kv_heads, hd, c.capacity, c.window,
                    1.0f / std::sqrt((float)hd), c.softcap, c.sinks ? 1 : 0};
    const float* sp = c.sinks ? sinks.data() : nullptr;

    struct Out {
        std::vector<float> y, d;
        std::vector<float> codes;  // the 8-bit codes, as floats for bits::expect_same
    };
    auto run = [&](bool long_form) {
        Out o;
        o.y.assign(q.size(), -12345.0f);
        std::vector<signed char> qc(c.quantize ? q.size() : 0);
        o.d.assign(c.quantize ? q.size() / 32 : 0, 0.0f);
        signed char* oq = c.quantize ? qc.data() : nullptr;
        float* oqd = c.quantize ? o.d.data() : nullptr;
        emu::launch({(unsigned)c.n_heads, (unsigned)c.n_tokens, 1}, {ATTN_THREADS, 1, 1}, [&] {
            if (long_form && c.half)
                attention_long_f16(q.data(), kh.data(), vh.data(), p, c.chunk, sp, o.y.data(),
                                   nullptr, oq, oqd);
            else if (long_form)
                attention_long_f32(q.data(), kf.data(), vf.data(), p, c.chunk, sp, o.y.data(),
                                   nullptr, oq, oqd);
            else if (c.half)
                attention_f16(q.data(), kh.data(), vh.data(), p, sp, o.y.data(), nullptr, oq, oqd);
            else
                attention_f32(q.data(), kf.data(), vf.data(), p, sp, o.y.data(), nullptr, oq, oqd);
        });
        for (signed char x : qc) o.codes.push_back((float)x);
        return o;
    };
    Out one = run(false), chunked = run(true);
    bits::expect_same(c.name + ": output", chunked.y, one.y);
    if (c.quantize) {
        bits::expect_same(c.name + ": quantized codes", chunked.codes, one.codes);
        bits::expect_same(c.name + ": quantized scales", chunked.d, one.d);
    }
}

}  // namespace

int main() {
    std::mt19937 rng(20261206);
    std::vector<Case> cases = {
        // Width 64 (2 sets of threads a dimension), grouped heads, f16,
        // sinks, a window of 600 over a ring of 650 that has wrapped: 3
        // tokens, chunks of 256.
        {"64 wide, 4 heads / 2 kv, f16, window over a ring", 64, 4, 2, 3, 1290, 650, 600, 256, true,
         true, true, 0.0f},
        // A window over the ring, a soft-cap, f32, width 40 (3 sets of
        // threads, 8 idle), chunks of 256: not a multiple of the 3 sets, so
        // a set's first key in a chunk moves from chunk to chunk.
        {"40 wide, window 700, softcap, f32", 40, 2, 1, 2, 2000, 900, 700, 256, false, false,
         false, 5.0f},
        // Width 128 (one set), f16, quantized output, chunks of 128.
        {"128 wide, f16, quantized", 128, 2, 2, 2, 700, 800, 0, 128, true, true, true, 0.0f},
        // Width 256 (two dimensions a thread), f32, a chunk past the keys.
        {"256 wide, f32", 256, 2, 1, 2, 500, 600, 0, 1024, false, true, false, 0.0f},
    };
    for (const Case& c : cases) run_case(c, rng);
    return bits::verdict();
}
