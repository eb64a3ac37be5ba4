// The scalar reference of kq.cu's Q4_K and Q6_K products, for the
// emulation tests (kq_products.cpp, kq_experts.cpp): rows in ggml's
// layout, their decoding written from ggml's definitions
// (dequantize_row_q4_K, get_scale_min_k4, dequantize_row_q6_K) rather
// than from the kernels' helpers, and the documented f32 order:
//   Q4_K: v = (float)(sc · Σ c a), vm = (float)(m · Σ a);
//         p = fmaf(v, d · dx, p), then p = fmaf(-vm, dmin · dx, p);
//   Q6_K: v = (float)(sc_0 · Σ_{i<16} (q − 32) a + sc_1 · Σ_{i≥16} (q − 32) a);
//         p = fmaf(v, d · dx, p);
// p from 0 per chunk of 4 blocks, the row's total the chunks' parts added
// in order from 0.
#pragma once

#include "kernel_sources.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace kqref {


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

}  // namespace kqref
