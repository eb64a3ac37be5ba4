// bf16 products on the tensor cores (tcmm.cu, fast numerics) run on the
// CPU through warp_emulator.h: a token's result must be the same bits
// whichever kernel computes it and however many tokens share the launch
// (a few tokens: a warp a segment, `matmul_tc1_bf16`, the same streamed
// through shared memory by a few blocks walking the tiles,
// `matmul_tc1s_bf16`, or a warp a 16 whole rows, `matmul_tc1r_bf16`;
// batches: `matmul_tc_bf16`; a router's with its routing,
// `router_tc1s_bf16`, against `route` after the product), and within f32
// rounding of the f64 sum of the bf16-rounded products. The emulated MMA's
// rounding is not the hardware's (see warp_emulator.h), so the bits are
// compared between the kernels, not with a reference; the GPU conformance
// suite checks the same on an H200 (`check_matmul`).
// Exit status 0 when every check passes.
//
// Built and run by tests/host_emulation.rs (`c++ -std=c++17 -O2`).

#include "kernel_sources.h"
#include "bit_checks.h"

#include <cmath>
#include <random>

namespace {

uint16_t bf16_bits(float f) { return (uint16_t)(bf16x2_rn(f, 0.0f) & 0xffff); }

struct Case {
    std::string name;
    int cols;
    std::vector<int> rows;  // a group's members (q, k, v)
    std::vector<bool> biases;
};

void run_case(const Case& c, std::mt19937& rng) {
    const int BATCH = 40, FEW = 5;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> bias(-1.0f, 1.0f);
    std::vector<std::vector<uint16_t>> w;
    std::vector<std::vector<float>> biases;
    for (size_t m = 0; m < c.rows.size(); m++) {
        w.emplace_back((size_t)c.rows[m] * c.cols);
        for (auto& v : w[m]) v = bf16_bits(normal(rng) * 0.05f);
        biases.emplace_back();
        if (c.biases[m])
            for (int r = 0; r < c.rows[m]; r++) biases[m].push_back(bias(rng));
    }
    std::vector<float> x((size_t)BATCH * c.cols);
    for (auto& v : x) v = normal(rng);

    const float SENTINEL = -12345.0f;
    std::vector<std::vector<float>> out;
    auto group = [&](int n, int rows_a_block) {
        out.clear();
        MatGroup g = {};
        g.count = (int)w.size();
        for (int m = 0; m < g.count; m++) {
            out.emplace_back((size_t)n * c.rows[m], SENTINEL);
            g.w[m] = (const u8*)w[m].data();
            g.out[m] = out[m].data();
            g.bias[m] = c.biases[m] ? biases[m].data() : nullptr;
            g.row_bytes[m] = (i64)c.cols * 2;
            g.rows[m] = c.rows[m];
            g.block_start[m + 1] = g.block_start[m] + (c.rows[m] + rows_a_block - 1) / rows_a_block;
        }
        return g;
    };
    // Each way's outputs, matrix by matrix, for its n tokens.
    auto few = [&](int n) {
        MatGroup g = group(n, 16);
        int chunks = c.cols / TC_CHUNK, per = std::max(TC_SEG, (chunks + TC_MAX_SEGS - 1) / TC_MAX_SEGS);
        unsigned segs = (unsigned)((chunks + per - 1) / per);
        emu::launch({(unsigned)g.block_start[g.count], 1, 1}, {32 * segs, 1, 1},
                    [&] { matmul_tc1_bf16(g, c.cols, x.data(), n); });
        return out;
    };
    auto rows = [&](int n) {
        MatGroup g = group(n, 16 * TC_ROW_WARPS);
        emu::launch({(unsigned)g.block_start[g.count], 1, 1}, {TC_ROW_WARPS * 32, 1, 1},
                    [&] { matmul_tc1r_bf16(g, c.cols, x.data(), n); });
        return out;
    };
    // Streamed through shared memory: `blocks` blocks walking the tiles
    // (fewer than the tiles, so that blocks take several, each warp's ring
    // wrapping across them).
    auto streamed = [&](int n, unsigned blocks) {
        MatGroup g = group(n, 16);
        int tiles = g.block_start[g.count];
        int chunks = c.cols / TC_CHUNK, per = std::max(TC_SEG, (chunks + TC_MAX_SEGS - 1) / TC_MAX_SEGS);
        unsigned segs = (unsigned)((chunks + per - 1) / per);
        emu::launch({std::min(blocks, (unsigned)tiles), 1, 1}, {32 * segs, 1, 1},
                    [&] { matmul_tc1s_bf16(g, c.cols, x.data(), n, tiles); });
        return out;
    };
    auto batch = [&](int n) {
        MatGroup g = group(n, TC_BATCH_ROWS);
        unsigned tiles = (unsigned)((n + TC_BATCH_TOKENS - 1) / TC_BATCH_TOKENS);
        emu::launch({(unsigned)g.block_start[g.count], tiles, 1}, {TC_BATCH_WARPS * 32, 1, 1},
                    [&] { matmul_tc_bf16(g, c.cols, x.data(), n); });
        return out;
    };
    auto all = batch(BATCH);
    // The batch against the f64 sum of the bf16-rounded products (+ bias):
    // within a few f32 roundings of the sum of |products|.
    {
        int bad = 0;
        double worst = 0.0;
        for (size_t m = 0; m < w.size(); m++)
            for (int t = 0; t < BATCH; t++)
                for (int r = 0; r < c.rows[m]; r++) {
                    double sum = 0.0, mag = 0.0;
                    for (int i = 0; i < c.cols; i++) {
                        double p = (double)emu::bf16_value(w[m][(size_t)r * c.cols + i]) *
                                   (double)emu::bf16_value(bf16_bits(x[(size_t)t * c.cols + i]));
                        sum += p;
                        mag += std::fabs(p);
                    }
                    if (c.biases[m]) sum += biases[m][r];
                    double err = std::fabs(all[m][(size_t)t * c.rows[m] + r] - sum) / (mag + 1e-30);
                    worst = std::max(worst, err);
                    if (err > 1e-5) bad++;
                }
        printf("%s %s: the batch within %.1e of the f64 sums of |products| (at most 1e-5)\n",
               bad ? "FAIL" : "ok  ", c.name.c_str(), worst);
        if (bad) bits::failures++;
    }
    // A token's bits alone or among a few, by segments or whole rows, are
    // its bits in the batch.
    auto same = [&](const std::string& what, const std::vector<std::vector<float>>& got, int n) {
        for (size_t m = 0; m < w.size(); m++) {
            std::vector<float> want(all[m].begin(), all[m].begin() + (size_t)n * c.rows[m]);
            bits::expect_same(c.name + ": " + what + ", matrix " + std::to_string(m), got[m], want);
        }
    };
    same("a token by segments", few(1), 1);
    same(std::to_string(FEW) + " tokens by segments", few(FEW), FEW);
    same("a token by whole rows", rows(1), 1);
    same(std::to_string(FEW) + " tokens by whole rows", rows(FEW), FEW);
    for (unsigned blocks : {1u, 2u, 3u, 132u}) {
        std::string by = " streamed, " + std::to_string(blocks) + " blocks";
        same("a token" + by, streamed(1, blocks), 1);
        same(std::to_string(FEW) + " tokens" + by, streamed(FEW, blocks), FEW);
    }
}

// A token's bf16 router product with its routing in one block
// (`router_tc1s_bf16`) against the streamed product and `route`'s launch:
// the same logits and routes, bit for bit (gpt-oss's router: 32 experts,
// top 4, softmax over the chosen).
void router_join(std::mt19937& rng) {
    const int EXPERTS = 32, COLS = 2880, TOP_K = 4;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> w((size_t)EXPERTS * COLS);
    for (auto& v : w) v = bf16_bits(normal(rng) * 0.05f);
    std::vector<float> bias(EXPERTS), x(COLS);
    for (auto& v : bias) v = normal(rng) * 0.5f;
    for (auto& v : x) v = normal(rng);
    RouterParams p = {1, EXPERTS, TOP_K, 0, 0, 0, 1.0f};  // R_TOPK_SOFTMAX
    auto run = [&](bool joined, std::vector<float>& logits, std::vector<RouteOut>& routes) {
        logits.assign(EXPERTS, -12345.0f);
        routes.assign(TOP_K, RouteOut{0xffffffffu, -1.0f});
        MatGroup g = {};
        g.count = 1;
        g.w[0] = (const u8*)w.data();
        g.out[0] = logits.data();
        g.bias[0] = bias.data();
        g.row_bytes[0] = (i64)COLS * 2;
        g.rows[0] = EXPERTS;
        g.block_start[1] = EXPERTS / 16;
        int tiles = EXPERTS / 16;
        unsigned threads = 32 * 23;  // 90 chunks: 23 segments
        if (joined) {
            emu::launch({1, 1, 1}, {threads, 1, 1}, [&] {
                router_tc1s_bf16(g, COLS, x.data(), tiles, p, nullptr, nullptr, routes.data());
            });
        } else {
            emu::launch({(unsigned)tiles, 1, 1}, {threads, 1, 1},
                        [&] { matmul_tc1s_bf16(g, COLS, x.data(), 1, tiles); });
            emu::launch({1, 1, 1}, {32, 1, 1},
                        [&] { route(logits.data(), 1, p, nullptr, nullptr, routes.data()); });
        }
    };
    std::vector<float> la, lb;
    std::vector<RouteOut> ra, rb;
    run(false, la, ra);
    run(true, lb, rb);
    bits::expect_same("router joined with its routing: logits", lb, la);
    std::vector<float> wa, wb;
    bool slots = true;
    for (int r = 0; r < TOP_K; r++) {
        slots = slots && ra[r].slot == rb[r].slot && ra[r].slot < (u32)EXPERTS;
        wa.push_back(ra[r].weight);
        wb.push_back(rb[r].weight);
    }
    printf("%s router joined with its routing: the same %d experts\n", slots ? "ok  " : "FAIL", TOP_K);
    if (!slots) bits::failures++;
    bits::expect_same("router joined with its routing: weights", wb, wa);
}

}  // namespace

int main() {
    std::mt19937 rng(20261206);
    std::vector<Case> cases = {
        // gpt-oss's q/k/v width (90 chunks: 23 segments of 4, the last 2),
        // a group with biases, rows not a multiple of 16.
        {"2880 wide, q/k/v", 2880, {40, 8, 24}, {true, true, false}},
        // The o projection's width (128 chunks: 22 segments of 6, the last 2).
        {"4096 wide", 4096, {37}, {false}},
        // A few chunks: one segment.
        {"96 wide", 96, {70}, {true}},
    };
    for (const Case& c : cases) run_case(c, rng);
    router_join(rng);
    return bits::verdict();
}
