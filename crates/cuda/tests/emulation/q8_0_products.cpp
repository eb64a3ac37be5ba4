// One token's Q8_0 products (fast numerics; a decode step's attention
// projections and router) run on the CPU through warp_emulator.h, against
// a scalar reference of the canonical sum order (q8dot.cu): per 32-element
// block the integer Σ c · q, per chunk of 4 blocks p = fmaf((float)Σ,
// dw · dx, p) from 0, the row's total the chunks' parts added in order
// from 0, then the bias. Every kernel must give the reference's bits:
//   - q8mma.cu's tensor-core kernels (opt-in TURBOSPARK_CUDA_Q8=mma), the
//     kernels this test is for, not yet run on a GPU when written;
//   - q8one.cu's one-token kernels (the default) and q8dot.cu's per-row
//     kernel, which the GPU conformance suite has checked on an H200;
//   - q8one.cu's q/k/v kernel with the ropes and cache writes after the
//     products (run_rope_case below);
//   - mmq.cu's tensor-core tiles of a batch (prefill; run_batch_case).
// Exit status 0 when every output matches; mismatches are printed.
//
// Built and run by tests/host_emulation.rs (`c++ -std=c++17 -O2`).

#include "kernel_sources.h"
#include "bit_checks.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

// An IEEE half's value, for the reference (independent of the kernels').
float half_value(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? std::ldexp((float)m, -24) : std::ldexp((float)(1024 + m), e - 25);
    return (h & 0x8000) ? -v : v;
}

// Q8_0 rows in the device layout (layout.rs): a row's nb blocks of 32 code
// bytes, then its nb f16 scales, rounded up to 16 bytes.
struct Rows {
    int count = 0, cols = 0;
    size_t row_bytes = 0;
    std::vector<uint8_t> bytes;
    int nb() const { return cols / 32; }
    const uint8_t* row(size_t r) const { return bytes.data() + r * row_bytes; }
    int8_t code(size_t r, int e) const { return (int8_t)row(r)[e]; }
    uint16_t scale(size_t r, int b) const {
        const uint8_t* p = row(r) + 32 * nb() + 2 * b;
        return (uint16_t)(p[0] | (p[1] << 8));
    }
};

Rows random_rows(std::mt19937& rng, int count, int cols) {
    Rows m;
    m.count = count;
    m.cols = cols;
    int nb = cols / 32;
    m.row_bytes = (size_t)(34 * nb + 15) / 16 * 16;
    m.bytes.assign(m.row_bytes * count, 0);
    std::uniform_int_distribution<int> byte(0, 255), code(-127, 127);
    // Scales: halves of magnitude 2^-12 .. 2^-4, either sign.
    std::uniform_int_distribution<int> exp(3, 11), mant(0, 1023), sign(0, 1);
    for (int r = 0; r < count; r++) {
        uint8_t* p = m.bytes.data() + (size_t)r * m.row_bytes;
        for (int i = 0; i < 32 * nb; i++) p[i] = (uint8_t)(int8_t)code(rng);
        for (int b = 0; b < nb; b++) {
            uint16_t h = (uint16_t)((sign(rng) << 15) | (exp(rng) << 10) | mant(rng));
            p[32 * nb + 2 * b] = (uint8_t)h;
            p[32 * nb + 2 * b + 1] = (uint8_t)(h >> 8);
        }
        for (size_t i = 34 * nb; i < m.row_bytes; i++) p[i] = (uint8_t)byte(rng);
    }
    return m;
}

float reference_dot(const Rows& m, size_t r, const std::vector<int8_t>& q,
                    const std::vector<float>& d) {
    int nb = m.nb();
    float total = 0.0f;
    for (int c = 0; c * 4 < nb; c++) {
        float p = 0.0f;
        for (int u = 0; u < 4 && 4 * c + u < nb; u++) {
            int b = 4 * c + u, v = 0;
            for (int e = 0; e < 32; e++) v += m.code(r, 32 * b + e) * q[32 * b + e];
            p = std::fmaf((float)v, half_value(m.scale(r, b)) * d[b], p);
        }
        total += p;
    }
    return total;
}


// A group of up to 3 matrices of one width reading one token (q, k, v),
// each with or without a bias.
struct Case {
    std::string name;
    int cols;
    std::vector<int> rows;
    std::vector<bool> biases;
};

void run_case(const Case& c, std::mt19937& rng) {
    int nb = c.cols / 32, chunks = (nb + 3) / 4;
    std::vector<Rows> mats;
    std::vector<std::vector<float>> biases, want;
    std::uniform_real_distribution<float> bias(-1.0f, 1.0f), scale(0.001f, 0.05f);
    std::uniform_int_distribution<int> code(-127, 127);
    std::vector<int8_t> q(c.cols);
    for (auto& x : q) x = (int8_t)code(rng);
    std::vector<float> d(nb);
    for (auto& x : d) x = scale(rng);
    for (size_t m = 0; m < c.rows.size(); m++) {
        mats.push_back(random_rows(rng, c.rows[m], c.cols));
        biases.emplace_back();
        if (c.biases[m])
            for (int r = 0; r < c.rows[m]; r++) biases[m].push_back(bias(rng));
        want.emplace_back();
        for (int r = 0; r < c.rows[m]; r++) {
            float v = reference_dot(mats[m], r, q, d);
            want[m].push_back(c.biases[m] ? v + biases[m][r] : v);
        }
    }
    const float SENTINEL = -12345.0f;
    std::vector<std::vector<float>> out;
    // The group, block_start counted in blocks of `rows_a_block` rows.
    auto group = [&](int rows_a_block) {
        MatGroup g = {};
        g.count = (int)mats.size();
        for (int m = 0; m < g.count; m++) {
            g.w[m] = mats[m].bytes.data();
            g.out[m] = out[m].data();
            g.bias[m] = c.biases[m] ? biases[m].data() : nullptr;
            g.row_bytes[m] = (i64)mats[m].row_bytes;
            g.rows[m] = mats[m].count;
            g.block_start[m + 1] = g.block_start[m] + (mats[m].count + rows_a_block - 1) / rows_a_block;
        }
        return g;
    };
    auto fresh = [&] {
        out.clear();
        for (auto& m : mats) out.emplace_back(m.count, SENTINEL);
    };
    auto check = [&](const std::string& what) {
        for (size_t m = 0; m < mats.size(); m++)
            bits::expect_same(c.name + ": " + what + ", matrix " + std::to_string(m), out[m], want[m]);
    };
    const signed char* xq = (const signed char*)q.data();
    int cols = c.cols;

    {  // q8mma.cu
        fresh();
        MatGroup g = group(MMA_ROWS);
        int cpw = (chunks + MMA_Q8_WARPS - 1) / MMA_Q8_WARPS;
        auto kernel = cpw == 1   ? matmul1_mma_q8_0_c1
                      : cpw == 2 ? matmul1_mma_q8_0_c2
                      : cpw == 3 ? matmul1_mma_q8_0_c3
                                 : matmul1_mma_q8_0_c4;
        emu::launch({(unsigned)g.block_start[g.count], 1, 1}, {MMA_Q8_WARPS * 32, 1, 1},
                    [&] { kernel(g, cols, xq, d.data()); });
        check("q8mma.cu (" + std::to_string(cpw) + " chunks a warp)");
    }
    {  // q8one.cu: a warp a row (the grid strides; any grid covers them)
        fresh();
        MatGroup g = group(Q8_BLOCK_ROWS);
        int units = 0;
        for (auto& m : mats) units += m.count;
        emu::launch({(unsigned)(units + ONE_WARPS - 1) / ONE_WARPS, 1, 1}, {ONE_WARPS * 32, 1, 1},
                    [&] { matmul1_q8x_q8_0(g, cols, xq, d.data()); });
        check("q8one.cu");
    }
    {  // q8dot.cu, one token
        fresh();
        MatGroup g = group(Q8_BLOCK_ROWS);
        emu::launch({(unsigned)g.block_start[g.count], 1, 1}, {Q8_WARPS * 32, 1, 1},
                    [&] { matmul_q8x_q8_0(g, cols, xq, d.data(), 1); });
        check("q8dot.cu");
    }
}

// mmq.cu's batch tiles (mq_matmul_q8_0): n tokens, each its own codes and
// scales, against the same reference token by token; rows and tokens not
// multiples of the 64 × 64 tile, with and without a bias.
void run_batch_case(std::mt19937& rng, int cols, int rows, int n, bool with_bias) {
    int nb = cols / 32;
    Rows m = random_rows(rng, rows, cols);
    std::uniform_real_distribution<float> bias(-1.0f, 1.0f), scale(0.001f, 0.05f);
    std::uniform_int_distribution<int> code(-127, 127);
    std::vector<int8_t> q((size_t)n * cols);
    for (auto& x : q) x = (int8_t)code(rng);
    std::vector<float> d((size_t)n * nb), b;
    for (auto& x : d) x = scale(rng);
    if (with_bias)
        for (int r = 0; r < rows; r++) b.push_back(bias(rng));
    std::vector<float> want((size_t)n * rows), out((size_t)n * rows, -12345.0f);
    for (int t = 0; t < n; t++) {
        std::vector<int8_t> qt(q.begin() + (size_t)t * cols, q.begin() + (size_t)(t + 1) * cols);
        std::vector<float> dt(d.begin() + (size_t)t * nb, d.begin() + (size_t)(t + 1) * nb);
        for (int r = 0; r < rows; r++) {
            float v = reference_dot(m, r, qt, dt);
            want[(size_t)t * rows + r] = with_bias ? v + b[r] : v;
        }
    }
    emu::launch({(unsigned)((rows + MQ_BM - 1) / MQ_BM), (unsigned)((n + MQ_BN - 1) / MQ_BN), 1},
                {MQ_THREADS, 1, 1}, [&] {
                    mq_matmul_q8_0(m.bytes.data(), rows, cols, (i64)m.row_bytes,
                                   (const signed char*)q.data(), d.data(), n, out.data(),
                                   with_bias ? b.data() : nullptr);
                });
    bits::expect_same("mmq.cu, " + std::to_string(cols) + " wide, " + std::to_string(rows) +
                          " rows, " + std::to_string(n) + " tokens",
                      out, want);
}

// q8one.cu's q/k/v products with the ropes of q and k and the cache
// writes of k and v in their launch (matmul1_q8x_q8_0_rope, and its
// 2880-wide form): the products as the reference above forms them, plus
// the bias, then each pair rotated as rope_kv does — the angle pos ·
// inv_freq in f32, its cosine and sine in f64 times the attention factor
// rounded to f32, ra = xa·c − xb·s and rb = xb·c + xa·s with every product
// and sum rounded alone — into q and k, k's rotated row and v's row into
// their (f32) caches at row pos % capacity. Rows of the caches the launch
// must not write keep their sentinel.
void run_rope_case(std::mt19937& rng, int cols, int heads_q, int heads_k, int hd, int kind,
                   bool biased, int pos, int capacity) {
    int nb = cols / 32, pairs = hd / 2;
    std::uniform_real_distribution<float> bias(-1.0f, 1.0f), scale(0.001f, 0.05f);
    std::uniform_int_distribution<int> code(-127, 127);
    std::vector<int8_t> q(cols);
    for (auto& x : q) x = (int8_t)code(rng);
    std::vector<float> d(nb);
    for (auto& x : d) x = scale(rng);
    int rows[3] = {heads_q * hd, heads_k * hd, heads_k * hd};
    std::vector<Rows> mats;
    std::vector<std::vector<float>> biases(3), product(3);
    for (int m = 0; m < 3; m++) {
        mats.push_back(random_rows(rng, rows[m], cols));
        for (int r = 0; r < rows[m]; r++) {
            if (biased) biases[m].push_back(bias(rng));
            float v = reference_dot(mats[m], r, q, d);
            product[m].push_back(biased ? v + biases[m][r] : v);
        }
    }
    RopeParams p = {};
    p.pairs = pairs;
    p.kind = kind;
    p.attention_factor = 1.25f;
    for (int j = 0; j < pairs; j++) p.inv_freq[j] = (float)std::pow(10000.0, -2.0 * j / hd);
    // The reference rotation.
    std::vector<std::vector<float>> want = product;
    const float SENTINEL = -12345.0f;
    std::vector<float> want_k(capacity * rows[1], SENTINEL), want_v(capacity * rows[2], SENTINEL);
    for (int m = 0; m < 2; m++) {
        for (int h = 0; h < (m ? heads_k : heads_q); h++) {
            for (int j = 0; j < pairs; j++) {
                int a = kind == ROPE_NEOX ? j : 2 * j, b = kind == ROPE_NEOX ? j + pairs : 2 * j + 1;
                float angle = (float)pos * p.inv_freq[j];
                float c = (float)(std::cos((double)angle) * (double)p.attention_factor);
                float s = (float)(std::sin((double)angle) * (double)p.attention_factor);
                float xa = product[m][h * hd + a], xb = product[m][h * hd + b];
                float ac = xa * c, bs = xb * s, bc = xb * c, as = xa * s;
                want[m][h * hd + a] = ac - bs;
                want[m][h * hd + b] = bc + as;
            }
        }
    }
    int slot = pos % capacity;
    for (int i = 0; i < rows[1]; i++) want_k[slot * rows[1] + i] = want[1][i];
    for (int i = 0; i < rows[2]; i++) want_v[slot * rows[2] + i] = want[2][i];

    std::string name = std::to_string(cols) + " wide, " + std::to_string(heads_q) + "/" +
                       std::to_string(heads_k) + " heads of " + std::to_string(hd) +
                       (kind == ROPE_NEOX ? ", NeoX" : ", interleaved") + ", position " +
                       std::to_string(pos);
    auto run = [&](const std::string& which, auto kernel) {
        std::vector<std::vector<float>> out;
        for (int m = 0; m < 3; m++) out.emplace_back(rows[m], SENTINEL);
        std::vector<float> kc(capacity * rows[1], SENTINEL), vc(capacity * rows[2], SENTINEL);
        MatGroup g = {};
        g.count = 3;
        for (int m = 0; m < 3; m++) {
            g.w[m] = mats[m].bytes.data();
            g.out[m] = out[m].data();
            g.bias[m] = biased ? biases[m].data() : nullptr;
            g.row_bytes[m] = (i64)mats[m].row_bytes;
            g.rows[m] = rows[m];
        }
        QkvRope r = {};
        r.cache[0] = kc.data();
        r.cache[1] = vc.data();
        r.capacity[0] = r.capacity[1] = capacity;
        r.first_pos = pos;
        r.heads[0] = heads_q;
        r.heads[1] = heads_k;
        r.head_dim = hd;
        int units = (rows[0] + rows[1] + rows[2]) / 2;
        // Fewer warps than units: the grid strides.
        emu::launch({(unsigned)(units + 2 * ONE_WARPS - 1) / (2 * ONE_WARPS), 1, 1},
                    {ONE_WARPS * 32, 1, 1},
                    [&] { kernel(g, cols, (const signed char*)q.data(), d.data(), r, p, nullptr); });
        for (int m = 0; m < 3; m++)
            bits::expect_same(name + ": " + which + ", " + "qkv"[m] + (m < 2 ? " roped" : ""),
                              out[m], want[m]);
        bits::expect_same(name + ": " + which + ", k cache", kc, want_k);
        bits::expect_same(name + ": " + which + ", v cache", vc, want_v);
    };
    run("matmul1_q8x_q8_0_rope", matmul1_q8x_q8_0_rope);
    if (cols == 2880) run("matmul1_q8x_q8_0_rope_w2880", matmul1_q8x_q8_0_rope_w2880);
}

}  // namespace

int main() {
    std::mt19937 rng(20261205);
    std::vector<Case> cases = {
        // gpt-oss's q/k/v shape, fewer rows (23 chunks: 3 a warp, the
        // last 2 blocks), biases on all three.
        {"2880 wide, q/k/v", 2880, {96, 24, 40}, {true, true, true}},
        // The o projection's width (32 chunks: 4 a warp), rows not a
        // multiple of 16, no bias.
        {"4096 wide", 4096, {40}, {false}},
        // 12 chunks (2 a warp, warps 6 and 7 idle), two matrices.
        {"1536 wide", 1536, {16, 33}, {false, true}},
        // 3 blocks (one chunk of 3; 1 a warp), a router's few rows.
        {"96 wide", 96, {5}, {true}},
    };
    for (const Case& c : cases) run_case(c, rng);
    // gpt-oss's width and rope kind, fewer heads; another width,
    // interleaved pairs, no biases, a position past the ring's capacity.
    run_rope_case(rng, 2880, 4, 2, 64, ROPE_NEOX, true, 37, 64);
    run_rope_case(rng, 256, 4, 1, 32, ROPE_INTERLEAVED, false, 9, 4);
    // A prefill's batch on the tensor cores: gpt-oss's width (23 steps of
    // 4 blocks, the last of 2), two token tiles, the second partial; the o
    // projection's width; a width of one partial step.
    run_batch_case(rng, 2880, 80, 70, true);
    run_batch_case(rng, 4096, 64, 17, false);
    run_batch_case(rng, 96, 21, 3, true);
    return bits::verdict();
}
