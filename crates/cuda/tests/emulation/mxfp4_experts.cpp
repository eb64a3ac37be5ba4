// One token's MXFP4 routed-expert products (fast numerics) run on the CPU
// through warp_emulator.h, against a scalar reference of the canonical sum
// order (q8dot.cu): per 32-element block the integer Σ value(code) · q,
// per chunk of 4 blocks p = fmaf((float)Σ, dw · dx, p) from 0, the row's
// total the chunks' parts added in order from 0. Every kernel must give
// the reference's bits:
//   - q8mma.cu's tensor-core kernels (opt-in TURBOSPARK_CUDA_MXFP4=mma),
//     the kernels this test is for, not yet run on a GPU when written;
//   - q8dot.cu's per-route kernels (also those compiled for 2880-wide
//     rows, the default for gpt-oss) and mmq.cu's batch tiles, which the
//     GPU conformance suite has checked on an H200 — here they check the
//     emulator (its shuffles, its MMA fragments) and the reference.
// Exit status 0 when every output matches; mismatches are printed.
//
// Built and run by tests/host_emulation.rs (`c++ -std=c++17 -O2`).

#include "kernel_sources.h"
#include "bit_checks.h"
#include "expert_order.h"

#include <cstdint>
#include <ctime>
#include <random>
#include <string>
#include <vector>

namespace {

// Doubled e2m1 values of the 16 MXFP4 codes (GGML's kvalues_mxfp4).
const int KVALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Byte of element e (0..31) in an activation block stored in MXFP4's
// order (q8dot.cu's header): code word w = 2i + h holds elements 4i + 2h,
// 16 + 4i + 2h, 4i + 2h + 1, 17 + 4i + 2h.
int act_pos(int e) {
    int upper = e >= 16, j = e % 16, i = j / 4, h = (j % 4) / 2, s = j % 2;
    return 4 * (2 * i + h) + 2 * s + upper;
}

// 2^(e - 128), the e8m0 scale halved (the codes are doubled).
float e8m0_half_ref(uint8_t e) { return std::ldexp(1.0f, (int)e - 128); }

// A bank of MXFP4 rows in the device layout (layout.rs): a row's nb code
// blocks (16 bytes: byte j holds element j in its low nibble, j + 16 in
// its high one), then its nb e8m0 scales, rounded up to 16 bytes.
struct Rows {
    int count = 0, cols = 0;
    size_t row_bytes = 0;
    std::vector<uint8_t> bytes;
    int nb() const { return cols / 32; }
    const uint8_t* row(size_t r) const { return bytes.data() + r * row_bytes; }
    int code(size_t r, int b, int e) const {
        uint8_t byte = row(r)[16 * b + e % 16];
        return e < 16 ? byte & 15 : byte >> 4;
    }
    uint8_t scale(size_t r, int b) const { return row(r)[16 * nb() + b]; }
};

Rows random_rows(std::mt19937& rng, int count, int cols) {
    Rows m;
    m.count = count;
    m.cols = cols;
    int nb = cols / 32;
    m.row_bytes = (size_t)(17 * nb + 15) / 16 * 16;
    m.bytes.assign(m.row_bytes * count, 0);
    std::uniform_int_distribution<int> byte(0, 255), exp(112, 132);
    for (int r = 0; r < count; r++) {
        uint8_t* p = m.bytes.data() + (size_t)r * m.row_bytes;
        for (int i = 0; i < 16 * nb; i++) p[i] = (uint8_t)byte(rng);
        for (int b = 0; b < nb; b++) p[16 * nb + b] = (uint8_t)exp(rng);
        // The padding holds bytes too: a kernel that reads it as a scale
        // gives a wrong sum.
        for (size_t i = 17 * nb; i < m.row_bytes; i++) p[i] = (uint8_t)byte(rng);
    }
    return m;
}

// Quantized activations: codes in MXFP4's order, a scale a block.
struct Act {
    std::vector<int8_t> q;
    std::vector<float> d;
};

Act random_act(std::mt19937& rng, int rows, int cols) {
    Act a;
    std::uniform_int_distribution<int> code(-127, 127);
    std::uniform_real_distribution<float> scale(0.001f, 0.05f);
    a.q.resize((size_t)rows * cols);
    for (auto& c : a.q) c = (int8_t)code(rng);
    a.d.resize((size_t)rows * cols / 32);
    for (auto& d : a.d) d = scale(rng);
    return a;
}

// The canonical-order dot of row r with activation row t.
float reference_dot(const Rows& m, size_t r, const Act& x, size_t t) {
    int nb = m.nb();
    const int8_t* q = x.q.data() + t * m.cols;
    const float* d = x.d.data() + t * nb;
    float total = 0.0f;
    for (int c = 0; c * 4 < nb; c++) {
        float p = 0.0f;
        for (int u = 0; u < 4 && 4 * c + u < nb; u++) {
            int b = 4 * c + u;
            int v = 0;
            for (int e = 0; e < 32; e++) v += KVALUES[m.code(r, b, e)] * q[32 * b + act_pos(e)];
            p = std::fmaf((float)v, e8m0_half_ref(m.scale(r, b)) * d[b], p);
        }
        total += p;
    }
    return total;
}

struct Case {
    std::string name;
    int hidden, inter, slots, tokens, k;
    std::vector<uint32_t> route_slots;  // tokens · k
    std::vector<int> masked_out;        // slots a SlotMask leaves out
    bool biases;
    bool mma_only = false;  // the other kernels checked in the cases above
};


void run_case(const Case& c, std::mt19937& rng) {
    int nr = c.tokens * c.k;
    Rows gate = random_rows(rng, c.slots * c.inter, c.hidden);
    Rows up = random_rows(rng, c.slots * c.inter, c.hidden);
    Rows down = random_rows(rng, c.slots * c.hidden, c.inter);
    std::vector<float> gate_bias, up_bias, down_bias;
    std::uniform_real_distribution<float> bias(-0.5f, 0.5f);
    if (c.biases) {
        gate_bias.resize((size_t)c.slots * c.inter);
        up_bias.resize(gate_bias.size());
        down_bias.resize((size_t)c.slots * c.hidden);
        for (auto* v : {&gate_bias, &up_bias, &down_bias})
            for (auto& x : *v) x = bias(rng);
    }
    Act x = random_act(rng, c.tokens, c.hidden);
    Act a = random_act(rng, nr, c.inter);  // the down products' input, a route each
    BankView bank = {gate.bytes.data(),
                     up.bytes.data(),
                     down.bytes.data(),
                     c.biases ? gate_bias.data() : nullptr,
                     c.biases ? up_bias.data() : nullptr,
                     c.biases ? down_bias.data() : nullptr,
                     (i64)gate.row_bytes,
                     (i64)up.row_bytes,
                     (i64)down.row_bytes,
                     c.hidden,
                     c.inter,
                     c.slots};
    MoeAct act_fn = {ACT_CLAMPED_SWIGLU, 1.702f, 7.0f};
    SlotMask mask = {};
    if (!c.masked_out.empty()) {
        mask.on = 1;
        for (int s = 0; s < c.slots; s++) mask.bits[s / 32] |= 1u << (s % 32);
        for (int s : c.masked_out) mask.bits[s / 32] &= ~(1u << (s % 32));
    }
    std::vector<RouteOut> routes(nr);
    for (int i = 0; i < nr; i++) routes[i] = {c.route_slots[i], 0.25f};
    auto computed = [&](uint32_t slot) {
        if (slot >= (uint32_t)c.slots) return false;
        for (int s : c.masked_out)
            if ((uint32_t)s == slot) return false;
        return true;
    };

    // The reference; routes not computed keep the sentinel the outputs
    // start with.
    const float SENTINEL = -12345.0f;
    std::vector<float> want_act((size_t)nr * c.inter, SENTINEL);
    std::vector<float> want_y((size_t)nr * c.hidden, SENTINEL);
    for (int i = 0; i < nr; i++) {
        uint32_t slot = routes[i].slot;
        if (!computed(slot)) continue;
        int t = i / c.k;
        for (int row = 0; row < c.inter; row++) {
            size_t r = (size_t)slot * c.inter + row;
            float g = reference_dot(gate, r, x, t), u = reference_dot(up, r, x, t);
            if (c.biases) {
                g += gate_bias[r];
                u += up_bias[r];
            }
            want_act[(size_t)i * c.inter + row] =
                glu_one(g, u, act_fn.act, act_fn.alpha, act_fn.limit);
        }
        for (int row = 0; row < c.hidden; row++) {
            size_t r = (size_t)slot * c.hidden + row;
            float v = reference_dot(down, r, a, i);
            want_y[(size_t)i * c.hidden + row] = c.biases ? v + down_bias[r] : v;
        }
    }

    auto fresh = [&](size_t n) { return std::vector<float>(n, SENTINEL); };
    const signed char* xq = (const signed char*)x.q.data();
    const signed char* aq = (const signed char*)a.q.data();
    int k = c.k;
    unsigned routes_n = (unsigned)nr;

    {  // q8mma.cu
        auto act = fresh(want_act.size()), y = fresh(want_y.size());
        std::vector<int8_t> act_q(want_act.size(), 0x55);
        std::vector<float> act_d(want_act.size() / 32, SENTINEL);
        dim3 gate_grid = {(unsigned)c.inter / MMA_GU_ROWS, routes_n, 1};
        dim3 down_grid = {(unsigned)(c.hidden + MMA_ROWS - 1) / MMA_ROWS, routes_n, 1};
        dim3 gate_threads = {MMA_GU_WARPS * 32, 1, 1}, down_threads = {MMA_WARPS * 32, 1, 1};
        auto gate_up = [&](bool compiled_width) {
            emu::launch(gate_grid, gate_threads, [&] {
                auto f = compiled_width ? moe_gate_up_mma_mxfp4_w2880 : moe_gate_up_mma_mxfp4;
                f(xq, x.d.data(), routes.data(), k, mask, bank, act_fn, act.data(),
                  (signed char*)act_q.data(), act_d.data());
            });
        };
        gate_up(false);
        emu::launch(down_grid, down_threads, [&] {
            moe_down_mma_mxfp4(aq, a.d.data(), routes.data(), mask, bank, y.data());
        });
        bits::expect_same(c.name + ": q8mma.cu gate/up", act, want_act);
        bits::expect_same(c.name + ": q8mma.cu down", y, want_y);
        // Its 8-bit codes of the activations: quantize_q8_mxfp4's (q8dot.cu)
        // of the same values, for the routes computed.
        {
            std::vector<int8_t> want_q(act_q.size(), 0x55);
            std::vector<float> want_d(act_d.size(), SENTINEL);
            std::vector<float> values = want_act;
            i64 blocks = (i64)values.size() / 32;
            emu::launch({(unsigned)blocks, 1, 1}, {32, 1, 1}, [&] {
                quantize_q8_mxfp4(values.data(), blocks, (signed char*)want_q.data(),
                                  want_d.data());
            });
            std::vector<float> got_codes, want_codes, got_scales, want_scales;
            for (int i = 0; i < nr; i++) {
                if (!computed(routes[i].slot)) continue;
                for (int j = 0; j < c.inter; j++) {
                    got_codes.push_back(act_q[(size_t)i * c.inter + j]);
                    want_codes.push_back(want_q[(size_t)i * c.inter + j]);
                }
                for (int j = 0; j < c.inter / 32; j++) {
                    got_scales.push_back(act_d[(size_t)i * (c.inter / 32) + j]);
                    want_scales.push_back(want_d[(size_t)i * (c.inter / 32) + j]);
                }
            }
            bits::expect_same(c.name + ": q8mma.cu gate/up's 8-bit codes", got_codes, want_codes);
            bits::expect_same(c.name + ": q8mma.cu gate/up's code scales", got_scales, want_scales);
        }
        // The kernels compiled for gpt-oss's width, where the rows have it.
        if (c.hidden == 2880) {
            act = fresh(want_act.size());
            gate_up(true);
            bits::expect_same(c.name + ": q8mma.cu gate/up, 2880 when compiled", act, want_act);
        }
        if (c.inter == 2880) {
            auto y = fresh(want_y.size());
            emu::launch(down_grid, down_threads, [&] {
                moe_down_mma_mxfp4_w2880(aq, a.d.data(), routes.data(), mask, bank, y.data());
            });
            bits::expect_same(c.name + ": q8mma.cu down, 2880 when compiled", y, want_y);
        }
    }
    {  // q8dot.cu's per-route kernels compiled for 2880-wide rows (the default's)
        dim3 threads = {Q8_WARPS * 32, 1, 1};
        if (c.hidden == 2880) {
            auto act = fresh(want_act.size());
            emu::launch({(unsigned)c.inter / Q8_BLOCK_ROWS, routes_n, 1}, threads, [&] {
                moe_gate_up_q8x_mxfp4_w2880(xq, x.d.data(), routes.data(), k, mask, bank, act_fn,
                                            act.data());
            });
            bits::expect_same(c.name + ": q8dot.cu gate/up, 2880 when compiled", act, want_act);
            act = fresh(want_act.size());
            emu::launch({(unsigned)c.inter / Q8_BLOCK_ROWS, routes_n, 1}, threads, [&] {
                moe_gate_up_early_q8x_mxfp4_w2880(xq, x.d.data(), routes.data(), k, mask, bank,
                                                  act_fn, act.data());
            });
            bits::expect_same(c.name + ": q8dot.cu gate/up, early, 2880 when compiled", act,
                              want_act);
        }
        if (c.inter == 2880) {
            auto y = fresh(want_y.size());
            emu::launch({(unsigned)c.hidden / Q8_BLOCK_ROWS, routes_n, 1}, threads, [&] {
                moe_down_q8x_mxfp4_w2880(aq, a.d.data(), routes.data(), mask, bank, y.data());
            });
            bits::expect_same(c.name + ": q8dot.cu down, 2880 when compiled", y, want_y);
        }
    }
    if (!c.mma_only) {  // q8dot.cu, per route
        auto act = fresh(want_act.size()), y = fresh(want_y.size());
        dim3 threads = {Q8_WARPS * 32, 1, 1};
        emu::launch({(unsigned)(c.inter + Q8_BLOCK_ROWS - 1) / Q8_BLOCK_ROWS, routes_n, 1}, threads,
                    [&] {
                        moe_gate_up_q8x_mxfp4(xq, x.d.data(), routes.data(), k, mask, bank,
                                              act_fn, act.data());
                    });
        emu::launch({(unsigned)(c.hidden + Q8_BLOCK_ROWS - 1) / Q8_BLOCK_ROWS, routes_n, 1},
                    threads, [&] {
                        moe_down_q8x_mxfp4(aq, a.d.data(), routes.data(), mask, bank, y.data());
                    });
        bits::expect_same(c.name + ": q8dot.cu gate/up", act, want_act);
        bits::expect_same(c.name + ": q8dot.cu down", y, want_y);
        act = fresh(want_act.size());
        emu::launch({(unsigned)(c.inter + Q8_BLOCK_ROWS - 1) / Q8_BLOCK_ROWS, routes_n, 1}, threads,
                    [&] {
                        moe_gate_up_early_q8x_mxfp4(xq, x.d.data(), routes.data(), k, mask, bank,
                                                    act_fn, act.data());
                    });
        bits::expect_same(c.name + ": q8dot.cu gate/up, early", act, want_act);
    }
    // mmq.cu, the routes grouped by slot (every route valid).
    if (!c.mma_only && c.masked_out.empty()) {
        ExpertOrder g = expert_order(routes, c.slots);
        const std::vector<u32>& order = g.order;
        const std::vector<u32>& offsets = g.offsets;
        auto act = fresh(want_act.size()), y = fresh(want_y.size());
        dim3 threads = {MQ_THREADS, 1, 1};
        unsigned slots = (unsigned)c.slots;
        emu::launch({(unsigned)(c.inter + MQ_BM / 2 - 1) / (MQ_BM / 2), slots, 1}, threads, [&] {
            mq_gate_up_mxfp4(xq, x.d.data(), order.data(), offsets.data(), k, bank, act_fn,
                             act.data());
        });
        emu::launch({(unsigned)(c.hidden + MQ_BM - 1) / MQ_BM, slots, 1}, threads, [&] {
            mq_down_mxfp4(aq, a.d.data(), order.data(), offsets.data(), bank, y.data());
        });
        bits::expect_same(c.name + ": mmq.cu gate/up", act, want_act);
        bits::expect_same(c.name + ": mmq.cu down", y, want_y);
    }
}

}  // namespace

int main() {
    // The activation order the quantization kernels write (common.cuh).
    for (int e = 0; e < 32; e++)
        if (q8_pos_order(Q8_ORDER_MXFP4, e) != act_pos(e)) {
            printf("FAIL q8_pos_order(MXFP4, %d) = %d, the reference order %d\n", e,
                   q8_pos_order(Q8_ORDER_MXFP4, e), act_pos(e));
            bits::failures++;
        }
    std::mt19937 rng(20261204);
    std::vector<Case> cases = {
        // gpt-oss's width (90 blocks: the last chunk 2), 4 routes of one token.
        {"2880 wide, one token", 2880, 224, 5, 1, 4, {3, 0, 4, 1}, {}, true},
        // gpt-oss's shape both ways (fewer rows: 3 slots).
        {"2880 x 2880", 2880, 2880, 3, 1, 4, {2, 0, 1, 2}, {}, true, true},
        // Two tokens (routes past k take token i / k), no biases; rows
        // 800 and 96 wide (25 and 3 blocks: last chunks of 1 and 3).
        {"800 x 96, two tokens", 800, 96, 4, 2, 2, {2, 0, 0, 3}, {}, false},
        // A slot left out by the mask and one past the bank: not written.
        {"masked and bad slots", 640, 64, 4, 1, 4, {1, 2, 9, 3}, {2}, true},
        // The widest rows (64 chunks), one route.
        {"8192 wide", 8192, 64, 2, 1, 1, {1}, {}, true},
    };
    for (const Case& c : cases) run_case(c, rng);
    return bits::verdict();
}
