// Q4_K and Q6_K products against 8-bit activations (kq.cu, fast numerics
// with TURBOSPARK_CUDA_KQ=int8) run on the CPU through warp_emulator.h,
// against a scalar reference of kq.cu's documented order, written here
// from ggml's definitions (dequantize_row_q4_K, get_scale_min_k4,
// dequantize_row_q6_K), not from the kernels' helpers. Per 32-element
// block (sub-block s of its super-block), with a the token's codes and dx
// their scale:
//   Q4_K: v = (float)(sc · Σ c a), vm = (float)(m · Σ a);
//         p = fmaf(v, d · dx, p), then p = fmaf(-vm, dmin · dx, p);
//   Q6_K: v = (float)(sc_0 · Σ_{i<16} (q − 32) a + sc_1 · Σ_{i≥16} (q − 32) a);
//         p = fmaf(v, d · dx, p);
// p from 0 per chunk of 4 blocks, the row's total the chunks' parts added
// in order from 0, then the bias. Every kernel must give the reference's
// bits for every token: the matrix-vector kernels (a decode step, a few
// tokens) and the batch kernel on the integer tensor cores, so a token's
// result is the same alone or in a batch. Q6_K rows of an odd number of
// super-blocks start every other row 2 bytes past a 4-byte boundary, as
// on the GPU. Exit status 0 when every output matches.
//
// Built and run by tests/host_emulation.rs (`c++ -std=c++17 -O2`).

#include "kernel_sources.h"
#include "bit_checks.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

// An IEEE half's value (independent of the kernels' conversion).
float half_value(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? std::ldexp((float)m, -24) : std::ldexp((float)(1024 + m), e - 25);
    return (h & 0x8000) ? -v : v;
}

// Rows of F_Q4_K or F_Q6_K in ggml's layout, 144 · cols / 256 or
// 210 · cols / 256 bytes apart:
//   Q4_K super-block: d, dmin (f16); 12 scale bytes; 128 code bytes;
//   Q6_K super-block: ql[128], qh[64], scales[16] (int8), d (f16).
struct Rows {
    int fmt = F_Q4_K, count = 0, cols = 0;
    size_t row_bytes = 0;
    std::vector<uint64_t> storage;  // 8-byte aligned bytes
    static int sb_bytes(int fmt) { return fmt == F_Q4_K ? 144 : 210; }
    uint8_t* bytes() { return (uint8_t*)storage.data(); }
    const uint8_t* bytes() const { return (const uint8_t*)storage.data(); }
    const uint8_t* block(size_t r, int sb) const {
        return bytes() + r * row_bytes + (size_t)sb_bytes(fmt) * sb;
    }

    // ggml get_scale_min_k4 for sub-block j of q (the 12 scale bytes).
    static void scale_min(const uint8_t* q, int j, int* sc, int* m) {
        if (j < 4) {
            *sc = q[j] & 63;
            *m = q[j + 4] & 63;
        } else {
            *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
            *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
    // Q4_K: the 4-bit code of element e (0..255) of super-block sb: ggml
    // stores sub-blocks 2k and 2k + 1 in the low and high nibbles of the
    // same 32 bytes, element l of each at byte l.
    int code4(size_t r, int sb, int e) const {
        const uint8_t* qs = block(r, sb) + 16;
        int s = e / 32, l = e % 32;
        uint8_t byte = qs[32 * (s / 2) + l];
        return s % 2 ? byte >> 4 : byte & 15;
    }
    // Q6_K: element e's q − 32 and its scale, as dequantize_row_q6_K's
    // loop over halves of 128 (ql += 64, qh += 32, sc += 8 a half) reads
    // them: y[l + 32k] takes ql[l + 32(k % 2)] (low nibble for k < 2, high
    // else), bits 2k, 2k + 1 of qh[l], and sc[l / 16 + 2k].
    void code6(size_t r, int sb, int e, int* q, int* scale) const {
        const uint8_t* b = block(r, sb);
        int half = e / 128, k = e % 128 / 32, l = e % 32;
        const uint8_t* ql = b + 64 * half;
        const uint8_t* qh = b + 128 + 32 * half;
        const int8_t* sc = (const int8_t*)(b + 192 + 8 * half);
        uint8_t lb = ql[l + 32 * (k % 2)];
        int low = k < 2 ? lb & 15 : lb >> 4;
        *q = (low | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
        *scale = sc[l / 16 + 2 * k];
    }
};

Rows random_rows(std::mt19937& rng, int fmt, int count, int cols) {
    Rows m;
    m.fmt = fmt;
    m.count = count;
    m.cols = cols;
    int sbb = Rows::sb_bytes(fmt);
    m.row_bytes = (size_t)sbb * (cols / 256);
    m.storage.assign((m.row_bytes * count + 7) / 8 + 2, 0);
    std::uniform_int_distribution<int> byte(0, 255);
    // d and dmin: positive halves of magnitude 2^-12 .. 2^-5.
    std::uniform_int_distribution<int> exp(3, 10), mant(0, 1023);
    uint8_t* p = m.bytes();
    for (int r = 0; r < count; r++)
        for (int sb = 0; sb < cols / 256; sb++) {
            uint8_t* b = p + r * m.row_bytes + (size_t)sbb * sb;
            for (int i = 0; i < sbb; i++) b[i] = (uint8_t)byte(rng);
            for (int k = 0; k < (fmt == F_Q4_K ? 2 : 1); k++) {
                uint16_t h = (uint16_t)((exp(rng) << 10) | mant(rng));
                int at = fmt == F_Q4_K ? 2 * k : 208;
                b[at] = (uint8_t)h;
                b[at + 1] = (uint8_t)(h >> 8);
            }
        }
    return m;
}

// Row r against a token's codes q and scales d, in the documented order.
float reference_dot(const Rows& m, size_t r, const int8_t* q, const float* d) {
    int nb = m.cols / 32;
    float total = 0.0f;
    for (int c = 0; c * 4 < nb; c++) {
        float p = 0.0f;
        for (int u = 0; u < 4; u++) {
            int b = 4 * c + u, sb = b / 8, s = b % 8;
            const uint8_t* blk = m.block(r, sb);
            if (m.fmt == F_Q4_K) {
                float dd = half_value((uint16_t)(blk[0] | (blk[1] << 8)));
                float dmin = half_value((uint16_t)(blk[2] | (blk[3] << 8)));
                int sc, mn;
                Rows::scale_min(blk + 4, s, &sc, &mn);
                int dot = 0, sum = 0;
                for (int e = 0; e < 32; e++) {
                    dot += m.code4(r, sb, 32 * s + e) * q[32 * b + e];
                    sum += q[32 * b + e];
                }
                p = std::fmaf((float)(sc * dot), dd * d[b], p);
                p = std::fmaf(-(float)(mn * sum), dmin * d[b], p);
            } else {
                float dd = half_value((uint16_t)(blk[208] | (blk[209] << 8)));
                int v = 0;
                for (int h = 0; h < 2; h++) {
                    int sum = 0, scale = 0;
                    for (int e = 16 * h; e < 16 * h + 16; e++) {
                        int code;
                        m.code6(r, sb, 32 * s + e, &code, &scale);
                        sum += code * q[32 * b + e];
                    }
                    v += scale * sum;
                }
                p = std::fmaf((float)v, dd * d[b], p);
            }
        }
        total += p;
    }
    return total;
}

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
                bool q4 = c.fmt == F_Q4_K;
                auto kernel = one ? (q4 ? kq_matmul1_q4_k : kq_matmul1_q6_k)
                                  : (q4 ? kq_matmul_q4_k : kq_matmul_q6_k);
                kernel(g, cols, xq, d.data(), n);
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
                auto kernel = c.fmt == F_Q4_K ? kq_tile_q4_k : kq_tile_q6_k;
                kernel(mats[m].bytes(), rows, cols, (i64)mats[m].row_bytes, xq, d.data(), n,
                       out.data(), b);
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
        std::string f = fmt == F_Q4_K ? "Q4_K" : "Q6_K";
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
    for (const Case& c : cases) run_case(c, rng);
    return bits::verdict();
}
