// Routed experts of K-quant and legacy banks against 8-bit activations (kq.cu,
// fast numerics with TURBOSPARK_CUDA_KQ=int8) run on the CPU through
// warp_emulator.h. Every product must give the bits of kq_reference.h's
// scalar reference of kq.cu's order, with moe.cu's activation and biases
// on top (moe_act_value, moe_down_value, which the GPU-checked kernels
// share):
//   - route by route (a decode step's kernels), for many routes at once
//     and for one token's routes alone;
//   - grouped by expert on the integer tensor cores (a batch's kernels,
//     with moe.cu's order / offsets), one expert holding more routes than
//     a tile's 64 tokens;
// a route to a masked slot or past the bank writes nothing. The gate/up
// and down stages are checked apart, each on its own quantized input.
// Exit status 0 when every check passes.
//
// Built and run by tests/host_emulation.rs (`c++ -std=c++17 -O2`).

#include "kq_reference.h"
#include "bit_checks.h"
#include "expert_order.h"

#include <algorithm>
#include <string>

namespace {

using kqref::random_rows;
using kqref::reference_dot;
using kqref::Rows;

const float SENTINEL = -12345.0f;
const int EXPERTS = 3, TOKENS = 70, TOP_K = 2;

struct Case {
    int gate_up, down;  // formats
    int hidden, inter;
    bool biases;
    MoeAct act;
};

using kqref::format_name;

void run_case(const Case& c, std::mt19937& rng) {
    std::string name = std::string(format_name(c.gate_up)) + " gate/up, " + format_name(c.down) + " down, " +
                       std::to_string(c.hidden) + " → " + std::to_string(c.inter) +
                       (c.biases ? ", biases" : "") + ", activation " + std::to_string(c.act.act);
    int H = c.hidden, I = c.inter;
    Rows gate = random_rows(rng, c.gate_up, EXPERTS * I, H);
    Rows up = random_rows(rng, c.gate_up, EXPERTS * I, H);
    Rows down = random_rows(rng, c.down, EXPERTS * H, I);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> gb(EXPERTS * I), ub(EXPERTS * I), db(EXPERTS * H);
    for (auto* v : {&gb, &ub, &db})
        for (auto& e : *v) e = 0.1f * normal(rng);
    BankView b = {};
    b.gate = gate.bytes();
    b.up = up.bytes();
    b.down = down.bytes();
    if (c.biases) {
        b.gate_bias = gb.data();
        b.up_bias = ub.data();
        b.down_bias = db.data();
    }
    b.gate_row_bytes = (i64)gate.row_bytes;
    b.up_row_bytes = (i64)up.row_bytes;
    b.down_row_bytes = (i64)down.row_bytes;
    b.hidden = H;
    b.inter = I;
    b.slots = EXPERTS;

    // Quantized inputs (16-byte aligned codes, scales): the tokens for
    // gate/up, every route's activations for down.
    int n_routes = TOKENS * TOP_K;
    std::uniform_int_distribution<int> code(-127, 127);
    std::uniform_real_distribution<float> scale(0.001f, 0.05f);
    auto codes = [&](size_t n) {
        std::vector<int4> store(n / 16 + 1);
        int8_t* p = (int8_t*)store.data();
        for (size_t i = 0; i < n; i++) p[i] = (int8_t)code(rng);
        return store;
    };
    auto scales = [&](size_t n) {
        std::vector<float> v(n);
        for (auto& e : v) e = scale(rng);
        return v;
    };
    auto xq_store = codes((size_t)TOKENS * H), aq_store = codes((size_t)n_routes * I);
    const int8_t* xq = (const int8_t*)xq_store.data();
    const int8_t* aq = (const int8_t*)aq_store.data();
    auto xd = scales((size_t)TOKENS * H / 32), ad = scales((size_t)n_routes * I / 32);

    // Token t's first route to slot 0 (so slot 0 holds more routes than a
    // tile), its second to slot 1 or 2; token 3's second past the bank.
    std::vector<RouteOut> routes(n_routes);
    for (int t = 0; t < TOKENS; t++)
        for (int r = 0; r < TOP_K; r++) routes[t * TOP_K + r] = {(u32)(r == 0 ? 0 : 1 + t % 2), 0.5f};
    routes[3 * TOP_K + 1].slot = EXPERTS + 1;

    std::vector<float> act_ref((size_t)n_routes * I, SENTINEL), y_ref((size_t)n_routes * H, SENTINEL);
    for (int i = 0; i < n_routes; i++) {
        u32 e = routes[i].slot;
        if (e >= (u32)EXPERTS) continue;
        int t = i / TOP_K;
        for (int o = 0; o < I; o++) {
            size_t r = (size_t)e * I + o;
            float g = reference_dot(gate, r, xq + (size_t)t * H, xd.data() + (size_t)t * H / 32);
            float u = reference_dot(up, r, xq + (size_t)t * H, xd.data() + (size_t)t * H / 32);
            act_ref[(size_t)i * I + o] = moe_act_value(b, c.act, (i64)r, g, u);
        }
        for (int o = 0; o < H; o++) {
            size_t r = (size_t)e * H + o;
            float v = reference_dot(down, r, aq + (size_t)i * I, ad.data() + (size_t)i * I / 32);
            y_ref[(size_t)i * H + o] = moe_down_value(b, (i64)r, v);
        }
    }

    const signed char* xs = (const signed char*)xq;
    const signed char* as = (const signed char*)aq;
    kqref::Kernels kg = kqref::kernels_of(c.gate_up), kd = kqref::kernels_of(c.down);
    // Route by route: `n` routes from route `first`, under `mask`.
    auto few = [&](int first, int n, SlotMask mask) {
        std::vector<float> act((size_t)n * I, SENTINEL), y((size_t)n * H, SENTINEL);
        const RouteOut* rp = routes.data() + first;
        // A route reads token (first + i) / k: the tokens from `first`'s;
        // the down stage route first + i's activations.
        const signed char* x0 = xs + (size_t)(first / TOP_K) * H;
        const float* d0 = xd.data() + (size_t)(first / TOP_K) * H / 32;
        const signed char* a0 = as + (size_t)first * I;
        const float* e0 = ad.data() + (size_t)first * I / 32;
        emu::launch({(unsigned)((I + Q8_WARPS - 1) / Q8_WARPS), (unsigned)n, 1}, {Q8_WARPS * 32, 1, 1}, [&] {
            kg.gate_up1(x0, d0, rp, TOP_K, mask, b, c.act, act.data());
        });
        emu::launch({(unsigned)((H + Q8_WARPS - 1) / Q8_WARPS), (unsigned)n, 1}, {Q8_WARPS * 32, 1, 1}, [&] {
            kd.down1(a0, e0, rp, mask, b, y.data());
        });
        return std::make_pair(act, y);
    };
    // Grouped by expert, as moe_group lists them.
    auto grouped = [&](SlotMask mask) {
        ExpertOrder g = expert_order(routes, EXPERTS, mask);
        const std::vector<u32>& order = g.order;
        const std::vector<u32>& offsets = g.offsets;
        std::vector<float> act((size_t)n_routes * I, SENTINEL), y((size_t)n_routes * H, SENTINEL);
        emu::launch({(unsigned)((I + MQ_BM / 2 - 1) / (MQ_BM / 2)), EXPERTS, 1}, {MQ_THREADS, 1, 1}, [&] {
            kg.gate_up_tile(xs, xd.data(), order.data(), offsets.data(), TOP_K, b, c.act, act.data());
        });
        emu::launch({(unsigned)((H + MQ_BM - 1) / MQ_BM), EXPERTS, 1}, {MQ_THREADS, 1, 1}, [&] {
            kd.down_tile(as, ad.data(), order.data(), offsets.data(), b, y.data());
        });
        return std::make_pair(act, y);
    };
    SlotMask all = {};
    SlotMask masked = {};
    masked.on = 1;
    masked.bits[0] = (1u << EXPERTS) - 1 - (1u << 2);
    auto expect = [&](const std::string& what,
                      const std::pair<std::vector<float>, std::vector<float>>& got, int first, int n,
                      const SlotMask& mask) {
        expect_route_rows(name + ": " + what, got, act_ref, y_ref, routes, first, n, I, H, EXPERTS,
                          mask, SENTINEL);
    };
    // (Route by route over the first 12 tokens' routes, which reach every
    // slot and past the bank: the emulator runs a thread at a time.)
    const int FEW = 12 * TOP_K;
    expect("12 tokens' routes one by one", few(0, FEW, all), 0, FEW, all);
    expect("token 3's routes alone", few(3 * TOP_K, TOP_K, all), 3 * TOP_K, TOP_K, all);
    expect("grouped by expert", grouped(all), 0, n_routes, all);
    expect("one by one, slot 2 masked", few(0, FEW, masked), 0, FEW, masked);
    expect("grouped, slot 2 masked", grouped(masked), 0, n_routes, masked);
}

}  // namespace

int main() {
    std::mt19937 rng(20261205);
    const MoeAct swiglu = {0, 0.0f, 0.0f}, clamped = {2, 1.702f, 7.0f};
    const Case cases[] = {
        // Llama.cpp's Q4_K_M experts (Mixtral, Qwen3-MoE GGUFs): Q6_K down
        // rows of one super-block, every other one 2 bytes off a word.
        {F_Q4_K, F_Q6_K, 512, 256, false, swiglu},
        // The other way round, with biases and gpt-oss's clamped GLU.
        {F_Q6_K, F_Q4_K, 768, 512, true, clamped},
        // Legacy formats at the conformance suite's widths (10 and 5
        // blocks: partial chunks), as llama.cpp's mixed quantizations
        // store them.
        {F_Q4_1, F_Q5_0, 320, 160, true, swiglu},
        {F_Q5_1, F_Q4_0, 160, 320, false, clamped},
    };
    for (const Case& c : cases) run_case(c, rng);
    return bits::verdict();
}
