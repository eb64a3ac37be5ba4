// Tensor-core products of weights in every format that takes them
// (tcmm.cu, fast numerics: weights decoded to bf16) run on the CPU through
// warp_emulator.h. For each format:
//   - tc_decode8, the kernels' decoding of a lane's 8 weights, gives
//     load_unit's values (common.cuh: matmul.cu's and the embedding's
//     decoding, which the GPU conformance suite checks against the CPU's
//     dequantization) bit for bit, for every unit and lane of every row;
//   - each kernel (a few tokens by segments and by whole rows, a batch)
//     gives the bits of the bf16 kernels run on those values rounded to
//     bf16 (bf16_products checks the bf16 kernels themselves), so a token's
//     result is the same alone, among a few or in a batch;
//   - the matrix sits at the least alignment kernels/tc.rs `tc_align` allows
//     for the format, and every load of a block's words checks its address
//     (warp_emulator.h `ld_aligned`), as the GPU would fault.
// Exit status 0 when every check passes.
//
// Built and run by tests/host_emulation.rs (`c++ -std=c++17 -O2`).

#include "tc_formats.h"
#include "bit_checks.h"

namespace {

// load_unit and tc_decode8 for a format known at run time.
template <int F>
void decode_with(const u8* row, int u, int cols, float* unit32, int q, float* part8) {
    if (unit32) load_unit<F>(row, u, cols, unit32);
    if (part8) tc_decode8<F>(row, u, q, part8);
}
void decode(int f, const u8* row, int u, int cols, float* unit32, int q, float* part8) {
    switch (f) {
#define CASE(F) \
    case F: return decode_with<F>(row, u, cols, unit32, q, part8);
        CASE(F_F32) CASE(F_F16) CASE(F_Q4_0) CASE(F_Q4_1) CASE(F_Q5_0) CASE(F_Q5_1)
        CASE(F_Q4_K) CASE(F_Q5_K) CASE(F_Q6_K)
#undef CASE
    }
    abort();
}

struct Case {
    int cols;
    int rows;
    bool bias;
};

void run_case(const Format& f, const Case& c, std::mt19937& rng) {
    const int BATCH = 40, FEW = 5;
    std::string name = std::string(f.name) + ", " + std::to_string(c.rows) + " rows × " +
                       std::to_string(c.cols);
    size_t row_bytes = f.row_bytes(c.cols);
    // The matrix at an address `align` divides and no larger power of two
    // (within a 64-byte aligned allocation), so that a load wider than
    // the alignment the format is promised would show.
    std::vector<uint64_t> storage((row_bytes * c.rows + 64 + 128) / 8);
    u8* base = (u8*)storage.data();
    base += (64 - (uintptr_t)base % 64) % 64;
    u8* w = base + (f.align < 64 ? f.align : 0);
    if (row_bytes % f.align) {
        printf("FAIL %s: rows of %zu bytes break the format's alignment of %d\n", name.c_str(),
               row_bytes, f.align);
        bits::failures++;
        return;
    }
    for (int r = 0; r < c.rows; r++) random_row(f, c.cols, w + r * row_bytes, rng);

    // The decoding: every lane's 8 values of every unit of every row, and
    // the bf16 rows the bf16 kernels take.
    std::vector<uint16_t> wb((size_t)c.rows * c.cols);
    std::vector<float> got, want;
    for (int r = 0; r < c.rows; r++) {
        const u8* row = w + r * row_bytes;
        for (int u = 0; u < c.cols / 32; u++) {
            float unit[32];
            decode(f.id, row, u, c.cols, unit, 0, nullptr);
            for (int q = 0; q < 4; q++) {
                float part[8];
                decode(f.id, row, u, c.cols, nullptr, q, part);
                for (int j = 0; j < 8; j++) {
                    got.push_back(part[j]);
                    want.push_back(unit[8 * q + j]);
                }
            }
            for (int j = 0; j < 32; j += 2) {
                u32 pair = bf16x2_rn(unit[j], unit[j + 1]);
                wb[(size_t)r * c.cols + 32 * u + j] = (uint16_t)(pair & 0xFFFF);
                wb[(size_t)r * c.cols + 32 * u + j + 1] = (uint16_t)(pair >> 16);
            }
        }
    }
    bits::expect_same(name + ": tc_decode8 against load_unit", got, want);

    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x((size_t)BATCH * c.cols), bias;
    for (auto& v : x) v = normal(rng);
    if (c.bias)
        for (int r = 0; r < c.rows; r++) bias.push_back(normal(rng));

    auto run = [&](const u8* weights, size_t stride, Launch k, int n, int rows_a_block,
                   unsigned threads) {
        return tc_product(k, weights, stride, c.rows, c.cols, c.bias ? bias.data() : nullptr,
                          x.data(), n, rows_a_block, threads);
    };
    int chunks = c.cols / TC_CHUNK, per = std::max(TC_SEG, (chunks + TC_MAX_SEGS - 1) / TC_MAX_SEGS);
    unsigned seg_threads = 32 * (unsigned)((chunks + per - 1) / per);
    struct Way {
        std::string what;
        Launch Format::*kernel;
        int n, rows_a_block;
        unsigned threads;
    };
    const Way ways[] = {
        {"a token by segments", &Format::few, 1, 16, seg_threads},
        {std::to_string(FEW) + " tokens by segments", &Format::few, FEW, 16, seg_threads},
        {"a token by whole rows", &Format::rows, 1, 16 * TC_ROW_WARPS, TC_ROW_WARPS * 32},
        {std::to_string(FEW) + " tokens by whole rows", &Format::rows, FEW, 16 * TC_ROW_WARPS,
         TC_ROW_WARPS * 32},
        {std::to_string(BATCH) + " tokens in a batch", &Format::batch, BATCH, TC_BATCH_ROWS,
         TC_BATCH_WARPS * 32},
    };
    std::vector<float> batch_ref;
    for (const Way& way : ways) {
        auto mine = run(w, row_bytes, f.*way.kernel, way.n, way.rows_a_block, way.threads);
        auto ref = run((const u8*)wb.data(), (size_t)c.cols * 2, BF16.*way.kernel, way.n,
                       way.rows_a_block, way.threads);
        bits::expect_same(name + ": " + way.what + ", the bf16 kernel's bits", mine, ref);
        if (way.n == BATCH) batch_ref = ref;
    }
    // And the batch's tokens alone: the bits of a decode step.
    auto alone = run(w, row_bytes, f.few, 1, 16, seg_threads);
    std::vector<float> first(batch_ref.begin(), batch_ref.begin() + c.rows);
    bits::expect_same(name + ": a token alone, its bits in the batch", alone, first);
}

}  // namespace

int main() {
    std::mt19937 rng(20261205);
    // 256 columns: one super-block, 8 chunks in two segments; 1280: five
    // super-blocks, 40 chunks in 10 segments. Rows not a multiple of 16.
    // And one chunk of 5 rows (formats of 32-element blocks): a row of one
    // segment, a tile mostly past the rows.
    const Case cases[] = {{256, 40, true}, {1280, 24, false}, {32, 5, true}};
    for (const Format& f : FORMATS)
        for (const Case& c : cases)
            if (c.cols % (f.block_elems == 256 ? 256 : 32) == 0) run_case(f, c, rng);
    return bits::verdict();
}
