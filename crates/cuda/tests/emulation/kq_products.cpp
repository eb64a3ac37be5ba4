// kq.cu's products against 8-bit activations (fast numerics with
// TURBOSPARK_CUDA_KQ=int8: Q4_K, Q6_K and the legacy Q4_0, Q4_1, Q5_0,
// Q5_1) run on the CPU through warp_emulator.h, against the scalar
// reference of kq_reference.h (kq.cu's documented order, the formats
// decoded from ggml's definitions, not from the kernels' helpers), then
// the bias. Every kernel must give the reference's bits for every token:
// the matrix-vector kernels (a decode step, a few tokens) and the batch
// kernel on the integer tensor cores, so a token's result is the same
// alone or in a batch. Rows of an odd number of Q4_0, Q5_0 or Q6_K blocks
// start every other row 2 bytes past a 4-byte boundary, as on the GPU;
// rows of legacy formats end in partial chunks. Exit status 0 when every
// output matches.
//
// Built and run by tests/host_emulation.rs (`c++ -std=c++17 -O2`).

#include "kq_reference.h"
#include "bit_checks.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

using kqref::Rows;
using kqref::random_rows;
using kqref::reference_dot;

struct Case {
    std::string name;
    int fmt;
    int cols;
    std::vector<int> rows;  // up to 3 matrices reading one input
    std::vector<bool> biases;
};

void run_case(const Case& c, std::mt19937& rng) {
    const int MAX_TOKENS = 70;  // two token tiles of the batch kernel
    int nb = c.cols / 32;
    std::vector<Rows> mats;
    std::vector<std::vector<float>> biases;
    std::uniform_real_distribution<float> bias(-1.0f, 1.0f), scale(0.001f, 0.05f);
    std::uniform_int_distribution<int> code(-127, 127);
    // 16-byte aligned activations, as the kernels load them.
    std::vector<int4> qstore((size_t)MAX_TOKENS * c.cols / 16 + 1);
    int8_t* q = (int8_t*)qstore.data();
    for (size_t i = 0; i < (size_t)MAX_TOKENS * c.cols; i++) q[i] = (int8_t)code(rng);
    std::vector<float> d((size_t)MAX_TOKENS * nb);
    for (auto& x : d) x = scale(rng);
    for (size_t m = 0; m < c.rows.size(); m++) {
        mats.push_back(random_rows(rng, c.fmt, c.rows[m], c.cols));
        biases.emplace_back();
        if (c.biases[m])
            for (int r = 0; r < c.rows[m]; r++) biases[m].push_back(bias(rng));
    }
    auto want = [&](size_t m, int n) {
        std::vector<float> w;
        for (int t = 0; t < n; t++)
            for (int r = 0; r < mats[m].count; r++) {
                float v = reference_dot(mats[m], r, q + (size_t)t * c.cols, d.data() + (size_t)t * nb);
                w.push_back(c.biases[m] ? v + biases[m][r] : v);
            }
        return w;
    };
    const float SENTINEL = -12345.0f;
    const signed char* xq = (const signed char*)q;
    int cols = c.cols;
    // The matrix-vector kernel: all matrices in one group.
    for (int n : {1, 3, 6}) {
        std::vector<std::vector<float>> out;
        for (auto& m : mats) out.emplace_back((size_t)n * m.count, SENTINEL);
        MatGroup g = {};
        g.count = (int)mats.size();
        for (int m = 0; m < g.count; m++) {
            g.w[m] = mats[m].bytes();
            g.out[m] = out[m].data();
            g.bias[m] = c.biases[m] ? biases[m].data() : nullptr;
            g.row_bytes[m] = (i64)mats[m].row_bytes;
            g.rows[m] = mats[m].count;
            g.block_start[m + 1] = g.block_start[m] + (mats[m].count + Q8_WARPS - 1) / Q8_WARPS;
        }
        // One token: both kernels (kq_matmul1 is a decode step's).
        for (int one = 0; one < (n == 1 ? 2 : 1); one++) {
            unsigned ty = (unsigned)(one ? n : (n + MM_TOKENS - 1) / MM_TOKENS);
            for (size_t m = 0; m < mats.size(); m++) std::fill(out[m].begin(), out[m].end(), SENTINEL);
            emu::launch({(unsigned)g.block_start[g.count], ty, 1}, {Q8_WARPS * 32, 1, 1}, [&] {
                kqref::Kernels k = kqref::kernels_of(c.fmt);
                (one ? k.matmul1 : k.matmul)(g, cols, xq, d.data(), n);
            });
            for (size_t m = 0; m < mats.size(); m++)
                bits::expect_same(c.name + (one ? ": kq_matmul1, " : ": kq_matmul, ") +
                                      std::to_string(n) + " tokens, matrix " + std::to_string(m),
                                  out[m], want(m, n));
        }
    }
    // The batch kernel: each matrix on its own.
    for (int n : {1, MAX_TOKENS}) {
        for (size_t m = 0; m < mats.size(); m++) {
            std::vector<float> out((size_t)n * mats[m].count, SENTINEL);
            int rows = mats[m].count;
            dim3 grid = {(unsigned)((rows + MQ_BM - 1) / MQ_BM), (unsigned)((n + MQ_BN - 1) / MQ_BN), 1};
            const float* b = c.biases[m] ? biases[m].data() : nullptr;
            emu::launch(grid, {MQ_THREADS, 1, 1}, [&] {
                kqref::kernels_of(c.fmt).tile(mats[m].bytes(), rows, cols, (i64)mats[m].row_bytes, xq,
                                              d.data(), n, out.data(), b);
            });
            bits::expect_same(c.name + ": kq_tile, " + std::to_string(n) + " tokens, matrix " +
                                  std::to_string(m),
                              out, want(m, n));
        }
    }
}

}  // namespace

int main() {
    std::mt19937 rng(20261205);
    std::vector<Case> cases;
    for (int fmt : {F_Q4_K, F_Q6_K}) {
        std::string f = kqref::format_name(fmt);
        // One super-block a row (a stretch mostly idle), a q/k/v-like
        // group with biases, rows not multiples of a block's.
        cases.push_back({f + ", 256 wide, q/k/v", fmt, 256, {13, 5, 6}, {true, true, true}});
        // 11 super-blocks: three stretches, the last partial; rows past a
        // batch tile's 64 (Q6_K: every other row 2 bytes off a word).
        cases.push_back({f + ", 2816 wide", fmt, 2816, {70}, {false}});
        // 16 super-blocks (an 8B model's 4096): one round of loads, two
        // matrices.
        cases.push_back({f + ", 4096 wide", fmt, 4096, {9, 4}, {false, true}});
        // 17 super-blocks: a second round of loads.
        cases.push_back({f + ", 4352 wide", fmt, 4352, {5}, {true}});
    }
    for (int fmt : {F_Q4_0, F_Q4_1, F_Q5_0, F_Q5_1}) {
        std::string f = kqref::format_name(fmt);
        // 5 blocks: one chunk and a partial one (odd rows of Q4_0 and Q5_0
        // 2 bytes off a word), a q/k/v-like group.
        cases.push_back({f + ", 160 wide, q/k/v", fmt, 160, {13, 5, 6}, {true, false, true}});
        // 33 blocks: a second stretch of one block; rows past a tile's 64.
        cases.push_back({f + ", 1056 wide", fmt, 1056, {67}, {true}});
        // 129 blocks: a second round of loads.
        cases.push_back({f + ", 4128 wide", fmt, 4128, {6, 3}, {false, true}});
    }
    for (const Case& c : cases) run_case(c, rng);
    return bits::verdict();
}
