// The scalar reference of kq.cu's products, for the emulation tests
// (kq_products.cpp, kq_experts.cpp): rows in ggml's layout, their decoding
// written from ggml's definitions (dequantize_row_q4_0 / q4_1 / q5_0 /
// q5_1, dequantize_row_q4_K with get_scale_min_k4, dequantize_row_q6_K)
// rather than from the kernels' helpers, and the documented f32 order,
// per 32-element block with a the token's codes and dx their scale:
//   Q4_K: v = (float)(sc · Σ c a), vm = (float)(m · Σ a);
//         p = fmaf(v, d · dx, p), then p = fmaf(-vm, dmin · dx, p);
//   Q6_K: v = (float)(sc_0 · Σ_{i<16} (q − 32) a + sc_1 · Σ_{i≥16} (q − 32) a);
//         p = fmaf(v, d · dx, p);
//   Q4_0, Q5_0: v = (float)Σ (q − 8 or 16) a; p = fmaf(v, d · dx, p);
//   Q4_1, Q5_1: p = fmaf((float)Σ q a, d · dx, p), then
//         p = fmaf((float)Σ a, m · dx, p);
// p from 0 per chunk of 4 blocks (the last one maybe partial), the row's
// total the chunks' parts added in order from 0. The kernels of each
// format are listed in `kernels_of`.
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

// A format's block: its weights and bytes.
inline int block_elems(int fmt) { return fmt == F_Q4_K || fmt == F_Q6_K ? 256 : 32; }
inline int block_bytes(int fmt) {
    switch (fmt) {
    case F_Q4_0: return 18;
    case F_Q4_1: return 20;
    case F_Q5_0: return 22;
    case F_Q5_1: return 24;
    case F_Q4_K: return 144;
    default: return 210;  // F_Q6_K
    }
}
inline const char* format_name(int fmt) {
    switch (fmt) {
    case F_Q4_0: return "Q4_0";
    case F_Q4_1: return "Q4_1";
    case F_Q5_0: return "Q5_0";
    case F_Q5_1: return "Q5_1";
    case F_Q4_K: return "Q4_K";
    default: return "Q6_K";
    }
}

// Rows of one format in ggml's layout, rows block_bytes · cols /
// block_elems bytes apart (so a Q4_0 or Q5_0 or Q6_K row of an odd number
// of blocks puts every other row 2 bytes past a word, as on the GPU):
//   Q4_0: d (f16), qs[16];  Q4_1: d, m (f16), qs[16];
//   Q5_0: d, qh (u32), qs[16];  Q5_1: d, m, qh, qs[16];
//   Q4_K: d, dmin (f16); 12 scale bytes; 128 code bytes;
//   Q6_K: ql[128], qh[64], scales[16] (int8), d (f16).
struct Rows {
    int fmt = F_Q4_K, count = 0, cols = 0;
    size_t row_bytes = 0;
    std::vector<uint64_t> storage;  // 8-byte aligned bytes
    uint8_t* bytes() { return (uint8_t*)storage.data(); }
    const uint8_t* bytes() const { return (const uint8_t*)storage.data(); }
    const uint8_t* block(size_t r, int blk) const {
        return bytes() + r * row_bytes + (size_t)block_bytes(fmt) * blk;
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
    // The legacy formats: element j (0..31) of block b's code q (0..15 or
    // 0..31), as dequantize_row_q4_0 … q5_1 read it: the low nibble of
    // qs[j] for j < 16, the high nibble of qs[j − 16] else, and for Q5 bit
    // j of qh above it.
    int code_legacy(size_t r, int b, int j) const {
        const uint8_t* blk = block(r, b);
        int qs_at = fmt == F_Q4_0 ? 2 : fmt == F_Q4_1 ? 4 : fmt == F_Q5_0 ? 6 : 8;
        const uint8_t* qs = blk + qs_at;
        int q = j < 16 ? qs[j] & 15 : qs[j - 16] >> 4;
        if (fmt == F_Q5_0 || fmt == F_Q5_1) {
            const uint8_t* h = blk + (fmt == F_Q5_0 ? 2 : 4);
            uint32_t qh = h[0] | (h[1] << 8) | (h[2] << 16) | ((uint32_t)h[3] << 24);
            q |= ((qh >> j) & 1) << 4;
        }
        return q;
    }
    float half_at(size_t r, int b, int at) const {
        const uint8_t* p = block(r, b) + at;
        return half_value((uint16_t)(p[0] | (p[1] << 8)));
    }
};

Rows random_rows(std::mt19937& rng, int fmt, int count, int cols) {
    Rows m;
    m.fmt = fmt;
    m.count = count;
    m.cols = cols;
    int bb = block_bytes(fmt), blocks = cols / block_elems(fmt);
    m.row_bytes = (size_t)bb * blocks;
    m.storage.assign((m.row_bytes * count + 7) / 8 + 2, 0);
    std::uniform_int_distribution<int> byte(0, 255), sign(0, 1);
    // Scales: positive halves of magnitude 2^-12 .. 2^-5; mins either sign.
    std::uniform_int_distribution<int> exp(3, 10), mant(0, 1023);
    auto half = [&](bool either) {
        return (uint16_t)(((either && sign(rng)) << 15) | (exp(rng) << 10) | mant(rng));
    };
    uint8_t* p = m.bytes();
    for (int r = 0; r < count; r++)
        for (int b = 0; b < blocks; b++) {
            uint8_t* blk = p + r * m.row_bytes + (size_t)bb * b;
            for (int i = 0; i < bb; i++) blk[i] = (uint8_t)byte(rng);
            auto put = [&](int at, uint16_t h) {
                blk[at] = (uint8_t)h;
                blk[at + 1] = (uint8_t)(h >> 8);
            };
            if (fmt == F_Q6_K) {
                put(208, half(false));
            } else {
                put(0, half(false));
                if (fmt == F_Q4_K || fmt == F_Q4_1 || fmt == F_Q5_1) put(2, half(fmt != F_Q4_K));
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
        for (int u = 0; u < 4 && 4 * c + u < nb; u++) {
            int b = 4 * c + u;
            const int8_t* a = q + 32 * b;
            int sum = 0;
            for (int e = 0; e < 32; e++) sum += a[e];
            if (m.fmt == F_Q4_K) {
                int sb = b / 8, s = b % 8;
                const uint8_t* blk = m.block(r, sb);
                int sc, mn, dot = 0;
                Rows::scale_min(blk + 4, s, &sc, &mn);
                for (int e = 0; e < 32; e++) dot += m.code4(r, sb, 32 * s + e) * a[e];
                p = std::fmaf((float)(sc * dot), m.half_at(r, sb, 0) * d[b], p);
                p = std::fmaf(-(float)(mn * sum), m.half_at(r, sb, 2) * d[b], p);
            } else if (m.fmt == F_Q6_K) {
                int sb = b / 8, s = b % 8, v = 0;
                for (int h = 0; h < 2; h++) {
                    int part = 0, scale = 0;
                    for (int e = 16 * h; e < 16 * h + 16; e++) {
                        int code;
                        m.code6(r, sb, 32 * s + e, &code, &scale);
                        part += code * a[e];
                    }
                    v += scale * part;
                }
                p = std::fmaf((float)v, m.half_at(r, sb, 208) * d[b], p);
            } else {
                int dot = 0;
                for (int e = 0; e < 32; e++) dot += m.code_legacy(r, b, e) * a[e];
                float dd = m.half_at(r, b, 0) * d[b];
                if (m.fmt == F_Q4_0 || m.fmt == F_Q5_0) {
                    int centre = m.fmt == F_Q4_0 ? 8 : 16;
                    p = std::fmaf((float)(dot - centre * sum), dd, p);
                } else {
                    p = std::fmaf((float)dot, dd, p);
                    p = std::fmaf((float)sum, m.half_at(r, b, 2) * d[b], p);
                }
            }
        }
        total += p;
    }
    return total;
}

// The kq.cu kernels of a format.
struct Kernels {
    decltype(&kq_matmul_q4_k) matmul;
    decltype(&kq_matmul1_q4_k) matmul1;
    decltype(&kq_tile_q4_k) tile;
    decltype(&kq_gate_up1_q4_k) gate_up1;
    decltype(&kq_down1_q4_k) down1;
    decltype(&kq_gate_up_tile_q4_k) gate_up_tile;
    decltype(&kq_down_tile_q4_k) down_tile;
};
inline Kernels kernels_of(int fmt) {
#define KQ_OF(f) {kq_matmul_##f, kq_matmul1_##f, kq_tile_##f, kq_gate_up1_##f, kq_down1_##f, \
                  kq_gate_up_tile_##f, kq_down_tile_##f}
    switch (fmt) {
    case F_Q4_0: return KQ_OF(q4_0);
    case F_Q4_1: return KQ_OF(q4_1);
    case F_Q5_0: return KQ_OF(q5_0);
    case F_Q5_1: return KQ_OF(q5_1);
    case F_Q4_K: return KQ_OF(q4_k);
    default: return KQ_OF(q6_k);
    }
#undef KQ_OF
}

}  // namespace kqref
