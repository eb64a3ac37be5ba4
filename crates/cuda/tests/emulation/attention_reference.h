// The f64 formula the tensor-core attention harnesses (attention_tc.cpp,
// attention_decode_tc.cpp) hold their kernels to: HF eager attention with
// sinks, sliding windows and soft-cap over an f16 cache, key j at row
// j % capacity, and the comparison within a tolerance of each row's
// largest |value| (the kernels round q and the softmax weights to f16).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace attn_ref {

// An f16 KV cache: `capacity` rows of n_kv_heads heads hd wide.
struct F16Cache {
    const u16* k;
    const u16* v;
    int n_kv_heads, hd, capacity;
};

// out[0 .. hd): query row qh (f32) of a head of KV head kvh, at position
// pos, over keys lo .. pos (lo = pos - window + 1 when window > 0, else
// 0); sink null: none, softcap 0: none.
inline void head(const float* qh, int kvh, int pos, int window, float scale, float softcap,
                 const float* sink, const F16Cache& c, double* out) {
    int lo = window > 0 ? std::max(0, pos + 1 - window) : 0;
    auto row = [&](const u16* cache, int j) {
        return &cache[((size_t)(j % c.capacity) * c.n_kv_heads + kvh) * c.hd];
    };
    std::vector<double> s;
    double m = sink ? (double)*sink : -INFINITY;
    for (int j = lo; j <= pos; j++) {
        const u16* kr = row(c.k, j);
        double dot = 0.0;
        for (int d = 0; d < c.hd; d++) dot += (double)qh[d] * (double)f16_to_f32(kr[d]);
        double v = dot * scale;
        if (softcap > 0.0f) v = std::tanh(v / softcap) * softcap;
        s.push_back(v);
        m = std::max(m, v);
    }
    double denom = sink ? std::exp((double)*sink - m) : 0.0;
    for (double v : s) denom += std::exp(v - m);
    for (int d = 0; d < c.hd; d++) {
        double acc = 0.0;
        for (int j = lo; j <= pos; j++) acc += std::exp(s[j - lo] - m) * (double)f16_to_f32(row(c.v, j)[d]);
        out[d] = acc / denom;
    }
}

// The outputs out (rows of hd, row r = token r / n_heads, head
// r % n_heads) within `tol` of their reference row's largest |value|: the
// first few misses printed under `label`, their count returned, the worst
// relative error in `worst`.
inline int compare(const char* label, const std::vector<float>& out,
                   const std::vector<double>& want, int n_heads, int hd, double tol,
                   double& worst) {
    int bad = 0;
    worst = 0.0;
    for (size_t row = 0; row * hd < out.size(); row++) {
        const double* w = &want[row * hd];
        double big = 0.0;
        for (int d = 0; d < hd; d++) big = std::max(big, std::fabs(w[d]));
        for (int d = 0; d < hd; d++) {
            float o = out[row * hd + d];
            double err = std::fabs((double)o - w[d]) / std::max(big, 1e-30);
            if (!(err <= tol)) {
                if (bad < 5)
                    std::printf("  %s: token %zu head %zu dim %d is %.7g, the reference %.7g\n",
                                label, row / n_heads, row % n_heads, d, o, w[d]);
                bad++;
            }
            if (err == err) worst = std::max(worst, err);
        }
    }
    return bad;
}

}  // namespace attn_ref
