// Routed experts on the tensor cores (tcmoe.cu, fast numerics) run on the
// CPU through warp_emulator.h, for expert banks in the formats tcmm.cu
// decodes (and bf16). Each route's activations and output rows must have
// the same bits
//   - computed route by route (a decode step's kernels), for all the
//     routes at once and for one token's routes alone,
//   - grouped by expert (a batch's kernels, with moe.cu's order/offsets),
//   - and as the dense kernels compute them (tcmm.cu's batch kernel on the
//     expert's gate, up and down matrices, whose bits tc_products and
//     bf16_products check), the activation and biases applied by
//     moe_act_value / moe_down_value;
// a route to a masked slot or past the bank writes nothing. Exit status 0
// when every check passes.
//
// Built and run by tests/host_emulation.rs (`c++ -std=c++17 -O2`).

#include "tc_formats.h"
#include "bit_checks.h"
#include "expert_order.h"

#include <algorithm>

namespace {

struct Case {
    const Format* gate_up;
    const Format* down;
    int hidden, inter;
    bool biases;
    MoeAct act;
};

const int EXPERTS = 5, TOKENS = 7, TOP_K = 3;

// A 16-byte aligned copy of `bytes` at offset `align` past a 64-byte
// boundary (the least alignment the format is promised).
struct Placed {
    std::vector<uint64_t> storage;
    u8* at;
    Placed(const std::vector<u8>& bytes, int align) : storage(bytes.size() / 8 + 32) {
        u8* base = (u8*)storage.data();
        base += (64 - (uintptr_t)base % 64) % 64;
        at = base + (align < 64 ? align : 0);
        memcpy(at, bytes.data(), bytes.size());
    }
};

void run_case(const Case& c, std::mt19937& rng) {
    const Format& fg = *c.gate_up;
    const Format& fd = *c.down;
    std::string name = std::string(fg.name) + " gate/up, " + fd.name + " down, " +
                       std::to_string(c.hidden) + " → " + std::to_string(c.inter) +
                       (c.biases ? ", biases" : "") + ", activation " + std::to_string(c.act.act);
    int H = c.hidden, I = c.inter;
    size_t gr = fg.row_bytes(H), dr = fd.row_bytes(I);
    std::vector<u8> gate(EXPERTS * I * gr), up(EXPERTS * I * gr), down(EXPERTS * H * dr);
    for (int r = 0; r < EXPERTS * I; r++) {
        random_row(fg, H, gate.data() + r * gr, rng);
        random_row(fg, H, up.data() + r * gr, rng);
    }
    for (int r = 0; r < EXPERTS * H; r++) random_row(fd, I, down.data() + r * dr, rng);
    Placed pg(gate, fg.align), pu(up, fg.align), pd(down, fd.align);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> gb(EXPERTS * I), ub(EXPERTS * I), db(EXPERTS * H);
    for (auto* v : {&gb, &ub, &db})
        for (auto& e : *v) e = 0.1f * normal(rng);
    BankView b = {};
    b.gate = pg.at;
    b.up = pu.at;
    b.down = pd.at;
    if (c.biases) {
        b.gate_bias = gb.data();
        b.up_bias = ub.data();
        b.down_bias = db.data();
    }
    b.gate_row_bytes = b.up_row_bytes = (i64)gr;
    b.down_row_bytes = (i64)dr;
    b.hidden = H;
    b.inter = I;
    b.slots = EXPERTS;

    std::vector<float> x((size_t)TOKENS * H);
    for (auto& v : x) v = normal(rng);
    // Distinct slots per token; token 3's last route past the bank and
    // slot 4 masked in the masked run.
    std::vector<RouteOut> routes(TOKENS * TOP_K);
    for (int t = 0; t < TOKENS; t++)
        for (int r = 0; r < TOP_K; r++) routes[t * TOP_K + r] = {(u32)((t + 2 * r) % EXPERTS), 0.5f};
    routes[3 * TOP_K + TOP_K - 1].slot = EXPERTS + 1;

    // The reference: each expert's dense products of every token (gate,
    // up) and of every route's activations (down) by tcmm.cu's batch
    // kernel, the activation and biases on top.
    auto dense = [&](const Format& f, const u8* w, size_t row_bytes, int rows, int cols,
                     const float* in, int n) {
        return tc_product(f.batch, w, row_bytes, rows, cols, nullptr, in, n, TC_BATCH_ROWS,
                          TC_BATCH_WARPS * 32);
    };
    int n_routes = TOKENS * TOP_K;
    std::vector<float> act_ref((size_t)n_routes * I, SENTINEL), y_ref((size_t)n_routes * H, SENTINEL);
    for (int e = 0; e < EXPERTS; e++) {
        auto G = dense(fg, pg.at + (size_t)e * I * gr, gr, I, H, x.data(), TOKENS);
        auto U = dense(fg, pu.at + (size_t)e * I * gr, gr, I, H, x.data(), TOKENS);
        for (int i = 0; i < n_routes; i++) {
            if (routes[i].slot != (u32)e) continue;
            int t = i / TOP_K;
            for (int o = 0; o < I; o++)
                act_ref[(size_t)i * I + o] = moe_act_value(b, c.act, (i64)e * I + o,
                                                           G[(size_t)t * I + o], U[(size_t)t * I + o]);
        }
    }
    for (int e = 0; e < EXPERTS; e++) {
        // The down products of every route's activations (those of other
        // experts' routes too: only this expert's are kept).
        std::vector<float> acts = act_ref;
        for (auto& v : acts)
            if (v == SENTINEL) v = 0.0f;
        auto D = dense(fd, pd.at + (size_t)e * H * dr, dr, H, I, acts.data(), n_routes);
        for (int i = 0; i < n_routes; i++)
            if (routes[i].slot == (u32)e)
                for (int o = 0; o < H; o++)
                    y_ref[(size_t)i * H + o] = moe_down_value(b, (i64)e * H + o, D[(size_t)i * H + o]);
    }

    int chunks_h = H / TC_CHUNK, chunks_i = I / TC_CHUNK;
    auto segs = [](int chunks) {
        int per = std::max(TC_SEG, (chunks + TC_MAX_SEGS - 1) / TC_MAX_SEGS);
        return (unsigned)((chunks + per - 1) / per);
    };
    // Route by route: `n` routes from route `first` (the act and y rows of
    // those routes), under `mask`.
    auto few = [&](int first, int n, SlotMask mask) {
        std::vector<float> act((size_t)n * I, SENTINEL), y((size_t)n * H, SENTINEL);
        const RouteOut* rp = routes.data() + first;
        // A route reads token (first + i) / k: the tokens from `first`'s.
        const float* xs = x.data() + (size_t)(first / TOP_K) * H;
        emu::launch({(unsigned)((I + 15) / 16), (unsigned)n, 1}, {32 * segs(chunks_h), 1, 1},
                    [&] { fg.gate_up_few(xs, rp, TOP_K, mask, b, c.act, act.data()); });
        std::vector<float> acts = act;
        for (auto& v : acts)
            if (v == SENTINEL) v = 0.0f;
        emu::launch({(unsigned)((H + 15) / 16), (unsigned)n, 1}, {32 * segs(chunks_i), 1, 1},
                    [&] { fd.down_few(acts.data(), rp, mask, b, y.data()); });
        return std::make_pair(act, y);
    };
    // Grouped by expert, as moe_group lists them.
    auto grouped = [&](SlotMask mask) {
        ExpertOrder g = expert_order(routes, EXPERTS, mask);
        const std::vector<u32>& order = g.order;
        const std::vector<u32>& offsets = g.offsets;
        std::vector<float> act((size_t)n_routes * I, SENTINEL), y((size_t)n_routes * H, SENTINEL);
        emu::launch({(unsigned)((I + TC_BATCH_ROWS - 1) / TC_BATCH_ROWS), EXPERTS, 1},
                    {TC_BATCH_WARPS * 32, 1, 1}, [&] {
                        fg.gate_up_grouped(x.data(), order.data(), offsets.data(), TOP_K, b, c.act,
                                           act.data());
                    });
        std::vector<float> acts = act;
        for (auto& v : acts)
            if (v == SENTINEL) v = 0.0f;
        emu::launch({(unsigned)((H + TC_BATCH_ROWS - 1) / TC_BATCH_ROWS), EXPERTS, 1},
                    {TC_BATCH_WARPS * 32, 1, 1},
                    [&] { fd.down_grouped(acts.data(), order.data(), offsets.data(), b, y.data()); });
        return std::make_pair(act, y);
    };
    SlotMask all = {};
    SlotMask masked = {};
    masked.on = 1;
    masked.bits[0] = (1u << EXPERTS) - 1 - (1u << 4);
    auto expect = [&](const std::string& what, const std::pair<std::vector<float>, std::vector<float>>& got,
                      int first, int n, const SlotMask& mask) {
        expect_route_rows(name + ": " + what, got, act_ref, y_ref, routes, first, n, I, H, EXPERTS,
                          mask, SENTINEL);
    };
    expect("every route one by one", few(0, n_routes, all), 0, n_routes, all);
    expect("token 2's routes alone", few(2 * TOP_K, TOP_K, all), 2 * TOP_K, TOP_K, all);
    expect("grouped by expert", grouped(all), 0, n_routes, all);
    expect("one by one, slot 4 masked", few(0, n_routes, masked), 0, n_routes, masked);
    expect("grouped, slot 4 masked", grouped(masked), 0, n_routes, masked);
}

}  // namespace

int main() {
    std::mt19937 rng(20261205);
    const Format& q4_1 = FORMATS[3];
    const Format& q5_0 = FORMATS[4];
    const Format& q4_k = FORMATS[6];
    const Format& q6_k = FORMATS[8];
    const Format& f16 = FORMATS[1];
    const MoeAct swiglu = {0, 0.0f, 0.0f}, clamped = {2, 1.702f, 7.0f};
    const Case cases[] = {
        // Llama.cpp's Q4_K_M experts (Mixtral, Qwen3-MoE GGUFs).
        {&q4_k, &q6_k, 512, 256, false, swiglu},
        // bf16 experts as safetensors ship them, gpt-oss's biases and
        // clamped activation.
        {&BF16, &BF16, 320, 160, true, clamped},
        {&q4_1, &q5_0, 160, 96, true, swiglu},
        {&f16, &q4_k, 256, 512, false, swiglu},
    };
    for (const Case& c : cases) run_case(c, rng);
    return bits::verdict();
}
