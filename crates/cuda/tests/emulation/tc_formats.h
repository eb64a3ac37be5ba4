// The weight formats tcmm.cu and tcmoe.cu decode onto the tensor cores,
// for the emulation harnesses (tc_products.cpp, tc_experts.cpp): their
// block shapes, the alignment kernels/tc.rs `tc_align` promises, their
// kernels, and random rows of each.
#pragma once

#include "kernel_sources.h"

#include <random>

using Launch = void (*)(MatGroup, int, const float*, int);
using GateUpFew = void (*)(const float*, const RouteOut*, int, SlotMask, BankView, MoeAct, float*);
using DownFew = void (*)(const float*, const RouteOut*, SlotMask, BankView, float*);
using GateUpGrouped = void (*)(const float*, const u32*, const u32*, int, BankView, MoeAct, float*);
using DownGrouped = void (*)(const float*, const u32*, const u32*, BankView, float*);

struct Format {
    const char* name;
    int id;          // F_*
    int block_elems; // elements a block (1: plain floats)
    int block_bytes;
    int align;       // kernels/tc.rs `tc_align`
    Launch few, rows, batch;
    GateUpFew gate_up_few;
    DownFew down_few;
    GateUpGrouped gate_up_grouped;
    DownGrouped down_grouped;

    size_t row_bytes(int cols) const { return (size_t)cols / block_elems * block_bytes; }
};

#define FORMAT(fmt, F, elems, bytes, align)                                                   \
    Format {                                                                                     \
        #fmt, F, elems, bytes, align, matmul_tc1_##fmt, matmul_tc1r_##fmt, matmul_tc_##fmt,      \
            moe_gate_up_tc1_##fmt, moe_down_tc1_##fmt, moe_gate_up_tc_##fmt, moe_down_tc_##fmt \
    }

inline const Format FORMATS[] = {
    FORMAT(f32, F_F32, 1, 4, 16),      FORMAT(f16, F_F16, 1, 2, 16),
    FORMAT(q4_0, F_Q4_0, 32, 18, 2),   FORMAT(q4_1, F_Q4_1, 32, 20, 4),
    FORMAT(q5_0, F_Q5_0, 32, 22, 2),   FORMAT(q5_1, F_Q5_1, 32, 24, 8),
    FORMAT(q4_k, F_Q4_K, 256, 144, 8), FORMAT(q5_k, F_Q5_K, 256, 176, 8),
    FORMAT(q6_k, F_Q6_K, 256, 210, 2),
};
inline const Format BF16 = FORMAT(bf16, F_BF16, 1, 2, 16);

// A random half whose value is finite and of the size of a block scale
// (2^-8 .. 2^-2 in magnitude), either sign.
inline uint16_t random_scale(std::mt19937& rng) {
    uint32_t r = rng();
    uint32_t exp = 7 + r % 7;  // biased exponent 7..13
    return (uint16_t)(((r >> 8) & 1) << 15 | exp << 10 | ((r >> 12) & 1023));
}
inline void put16(u8* p, uint16_t v) { memcpy(p, &v, 2); }

// A row of `cols` random weights of the format: random codes, finite
// scales; plain floats drawn from N(0, 0.1).
inline void random_row(const Format& f, int cols, u8* row, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 0.1f);
    if (f.id == F_F32) {
        for (int i = 0; i < cols; i++) {
            float v = normal(rng);
            memcpy(row + 4 * i, &v, 4);
        }
        return;
    }
    if (f.id == F_BF16) {
        for (int i = 0; i < cols; i++) put16(row + 2 * i, (uint16_t)(bf16x2_rn(normal(rng), 0.0f) & 0xFFFF));
        return;
    }
    if (f.id == F_F16) {
        for (int i = 0; i < cols; i++) put16(row + 2 * i, random_scale(rng) ^ (rng() & 0x3ff));
        return;
    }
    int blocks = cols / f.block_elems;
    for (int b = 0; b < blocks; b++) {
        u8* p = row + (size_t)b * f.block_bytes;
        for (int i = 0; i < f.block_bytes; i++) p[i] = (u8)rng();
        switch (f.id) {
        case F_Q4_1:
        case F_Q5_1:
        case F_Q4_K:
        case F_Q5_K:
            put16(p, random_scale(rng));
            put16(p + 2, random_scale(rng));
            break;
        case F_Q6_K: put16(p + 208, random_scale(rng)); break;
        default: put16(p, random_scale(rng));
        }
    }
}

// What a kernel leaves in an output it did not write.
inline const float SENTINEL = -12345.0f;

// One matrix's product (rows × cols, rows `row_bytes` apart, `bias` or
// null) with `n` inputs by kernel `k` of tcmm.cu, in blocks of
// `rows_a_block` rows and `threads` threads (and a grid row a 64-input
// tile for batches); the outputs not written hold SENTINEL.
inline std::vector<float> tc_product(Launch k, const u8* w, size_t row_bytes, int rows, int cols,
                                     const float* bias, const float* x, int n, int rows_a_block,
                                     unsigned threads) {
    std::vector<float> out((size_t)n * rows, SENTINEL);
    MatGroup g = {};
    g.count = 1;
    g.w[0] = w;
    g.out[0] = out.data();
    g.bias[0] = bias;
    g.row_bytes[0] = (i64)row_bytes;
    g.rows[0] = rows;
    g.block_start[1] = (rows + rows_a_block - 1) / rows_a_block;
    unsigned tiles = n > TC_BATCH_NT ? (unsigned)((n + TC_BATCH_TOKENS - 1) / TC_BATCH_TOKENS) : 1;
    emu::launch({(unsigned)g.block_start[1], tiles, 1}, {threads, 1, 1},
                [&] { k(g, cols, x, n); });
    return out;
}
