// Fast numerics (turbospark_backend::Numerics::Fast) for Q4_K, Q6_K and
// the legacy 4- and 5-bit formats (Q4_0, Q4_1, Q5_0, Q5_1) against 8-bit
// activations: dense products and routed experts in integers, opt-in
// (`TURBOSPARK_CUDA_KQ=int8`, kernels/kq.rs), where the default decodes
// the weights to bf16 for the tensor cores (tcmm.cu, tcmoe.cu).
//
// Math. ggml's blocks (dequantize_row_q4_K, _q6_K, _q4_0, _q4_1, _q5_0,
// _q5_1): a K-quant super-block covers 256 weights, 8 sub-blocks of 32;
// a legacy block 32:
//   Q4_K: d and dmin (f16), eight 6-bit (scale, min) pairs (sc_s, m_s)
//         packed in 12 bytes, 4-bit codes c: w = d·sc_s·c − dmin·m_s;
//   Q6_K: 6-bit codes q (low 4 bits in ql, high 2 in qh), sixteen int8
//         scales, one per 16 weights, and d (f16): w = d·sc·(q − 32);
//   Q4_0, Q5_0: d (f16), 4- or 5-bit codes q: w = d·(q − 8 or 16);
//   Q4_1, Q5_1: d and m (f16), 4- or 5-bit codes q: w = d·q + m.
// The activations are q8dot.cu's, in natural order: per 32-element block
// b, x_i ≈ dx_b · a_i with a_i in [-127, 127]. Block b of a row is a
// legacy block or sub-block s of its super-block, so
//   Q4_K: Σ_i w_i x_i ≈ dx · (d · sc · Σ c_i a_i − dmin · m · Σ a_i),
//   Q6_K: Σ_i w_i x_i ≈ dx · d · (sc_0 · Σ_{i<16} (q_i − 32) a_i
//                                + sc_1 · Σ_{i≥16} (q_i − 32) a_i),
//   Q4_0, Q5_0: Σ_i w_i x_i ≈ dx · d · Σ (q_i − 8 or 16) a_i,
//   Q4_1, Q5_1: Σ_i w_i x_i ≈ dx · (d · Σ q_i a_i + m · Σ a_i),
// where the integer sums are exact. The f32 order, which every kernel
// below follows so that a token's result has the same bits alone (a decode
// step) or in a batch (prefill) — the fast numerics' batch invariance:
//   - per block, the exact integers as f32 (exact: Q4_K
//     v = sc · Σ c a, |v| ≤ 63 · 32 · 15 · 127 < 2^22, and vm = m · Σ a,
//     |vm| ≤ 63 · 32 · 127 < 2^18; Q6_K v = sc_0 · Σ_0 + sc_1 · Σ_1,
//     |v| ≤ 2 · 128 · 16 · 32 · 127 < 2^24; the legacy sums < 2^18);
//   - per chunk of Q8_CHUNK consecutive blocks (the row's last one maybe
//     partial), from p = 0, block by block:
//       Q4_K: p = fmaf(v, d · dx, p);  p = fmaf(-vm, dmin · dx, p);
//       Q6_K: p = fmaf(v, d · dx, p);
//       Q4_0, Q5_0: p = fmaf((float)Σ (q − 8 or 16) a, d · dx, p);
//       Q4_1, Q5_1: p = fmaf((float)Σ q a, d · dx, p);
//                   p = fmaf((float)Σ a, m · dx, p);
//   - the row's total, from 0, adds the chunks' parts in order; then the
//     bias, if any, is added.
// Rows are whole blocks (cols a multiple of 256 or 32). Q4_K's 144-byte
// super-blocks load in 16-byte pieces, so its matrices and rows must be
// 16-byte aligned (kq.rs `kq_fits`); the others load as aligned words
// from matrices 4-byte aligned (Q6_K's 210-byte, Q4_0's 18-byte and Q5_0's
// 22-byte blocks may start 2 bytes past a word: kq_ld16_raw,
// kq_block_load).
//
// tests/emulation (`kq_products`, `kq_experts`) runs every kernel on the
// CPU against a scalar reference of this order, bit for bit.

// Scale and min of sub-block s (0..7) from a Q4_K header's scale words
// (bytes 0..3, 4..7, 8..11 of the 12 scale bytes): ggml's get_scale_min_k4.
__device__ __forceinline__ void kq_scale_min(uint4 hd, int s, int* sc, int* mn) {
    int sh = 8 * (s & 3);
    u32 a = (hd.y >> sh) & 0xFFu, b = (hd.z >> sh) & 0xFFu, c = (hd.w >> sh) & 0xFFu;
    if (s < 4) {
        *sc = (int)(a & 63u);
        *mn = (int)(b & 63u);
    } else {
        *sc = (int)((c & 0xFu) | ((a >> 6) << 4));
        *mn = (int)((c >> 4) | ((b >> 6) << 4));
    }
}

// Σ of the four signed bytes of each word of v plus s.
__device__ __forceinline__ int kq_byte_sum(int4 v, int s) {
    s = dp4a(v.x, 0x01010101, s);
    s = dp4a(v.y, 0x01010101, s);
    s = dp4a(v.z, 0x01010101, s);
    return dp4a(v.w, 0x01010101, s);
}

// Σ code · a of four words of codes (one code a byte) against four of a.
__device__ __forceinline__ int kq_dot4(const u32* c, int4 a) {
    int s = dp4a((int)c[0], a.x, 0);
    s = dp4a((int)c[1], a.y, s);
    s = dp4a((int)c[2], a.z, s);
    return dp4a((int)c[3], a.w, s);
}

// 16 bytes at a 2-byte aligned address p (a Q6_K super-block's), from
// the five aligned words that hold them: word i of the result is bytes
// 4i .. 4i + 3 of p. (The fifth word lies inside the super-block for
// every piece read here: ql and qh end at byte 192 of 210.)
struct KqRaw16 {
    u32 w[5];
    int shift;  // 0 or 16 bits
};
__device__ __forceinline__ KqRaw16 kq_ld16_raw(const u8* p) {
    KqRaw16 r;
    const u8* a = (const u8*)((unsigned long long)p & ~3ull);
    r.shift = 8 * (int)((unsigned long long)p & 3ull);
#pragma unroll
    for (int i = 0; i < 5; i++) r.w[i] = ld_stream_u32(a + 4 * i);
    return r;
}
__device__ __forceinline__ void kq_ld16_words(const KqRaw16& r, u32* out) {
#pragma unroll
    for (int i = 0; i < 4; i++)
        out[i] = (u32)((((unsigned long long)r.w[i + 1] << 32) | r.w[i]) >> r.shift);
}

// Q6_K's codes of one 16-byte piece of ql and the matching 16 bytes of
// qh: bytes l of ql hold sub-block j's low 4 bits in their low nibbles and
// sub-block j + 2's in their high nibbles, bits 2j, 2j + 1 and 2j + 4,
// 2j + 5 of qh[l] their high 2 bits (j = 0, 1 within a half super-block).
// Codes 0..63, one a byte.
__device__ __forceinline__ void kq_q6_codes(const u32* ql, const u32* qh, int j, u32* lo,
                                            u32* hi) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        lo[i] = (ql[i] & 0x0F0F0F0Fu) | (((qh[i] >> (2 * j)) & 0x03030303u) << 4);
        hi[i] = ((ql[i] >> 4) & 0x0F0F0F0Fu) | (((qh[i] >> (2 * j + 4)) & 0x03030303u) << 4);
    }
}

// A format's blocks: the legacy formats' blocks hold 32 weights, the
// K-quants' super-blocks 256; `bytes` a block's. Q4_K, Q4_1 and Q5_1
// weights have a min (a second f32 step a block); Q4_0's and Q5_0's codes
// are centred on 8 and 16.
template <int F>
struct KqFormat {
    static constexpr bool legacy = F == F_Q4_0 || F == F_Q4_1 || F == F_Q5_0 || F == F_Q5_1;
    static constexpr int bytes = F == F_Q4_K   ? 144
                                 : F == F_Q6_K ? 210
                                 : F == F_Q4_0 ? 18
                                 : F == F_Q4_1 ? 20
                                 : F == F_Q5_0 ? 22
                                               : 24;
    static constexpr int elems = legacy ? 32 : 256;
    static constexpr bool has_min = F == F_Q4_K || F == F_Q4_1 || F == F_Q5_1;
    static constexpr int centre = F == F_Q4_0 ? 8 : F == F_Q5_0 ? 16 : 0;
};

// A legacy block's bytes, from the aligned words that hold them: Q4_1's
// and Q5_1's blocks (20 and 24 bytes) lie on word boundaries; Q4_0's and
// Q5_0's (18 and 22) every other one 2 bytes past one (`odd`), whose
// words then start 2 bytes before the block (in the block before it: a
// matrix starts on a word), and whose last word is whole; a block on a
// boundary ends with half a word, read as such (nothing past the block
// is read).
struct KqBlockRaw {
    u32 w[6];
    bool odd;
};
template <int F>
__device__ __forceinline__ KqBlockRaw kq_block_load(const u8* blk) {
    constexpr int W = (KqFormat<F>::bytes + 3) / 4;
    KqBlockRaw r;
    const u8* a = (const u8*)((unsigned long long)blk & ~3ull);
    r.odd = ((unsigned long long)blk & 2ull) != 0;
#pragma unroll
    for (int i = 0; i < W - 1; i++) r.w[i] = ld_stream_u32(a + 4 * i);
    if (KqFormat<F>::bytes % 4 == 0)
        r.w[W - 1] = ld_stream_u32(a + 4 * (W - 1));
    else
        r.w[W - 1] = r.odd ? ld_stream_u32(a + 4 * (W - 1)) : ld_stream_u16(a + 4 * (W - 1));
#pragma unroll
    for (int i = W; i < 6; i++) r.w[i] = 0;
    return r;
}

// The upper half of lo and the lower half of hi, as one word.
__device__ __forceinline__ u32 kq_funnel16(u32 lo, u32 hi) { return (lo >> 16) | (hi << 16); }

// Bits 0..3 of v, bit j at the bottom of byte j.
__device__ __forceinline__ u32 kq_spread4(u32 v) { return ((v & 15u) * 0x00204081u) & 0x01010101u; }

// What a lane of kq_rows_dot loads of a stretch (raw; decoded after the
// round's loads are all issued).
template <int F>
struct KqLaneRaw {
    KqBlockRaw b;  // the legacy formats: the lane's whole block
};
template <>
struct KqLaneRaw<F_Q4_K> {
    uint4 qs, hd;  // the lane's code piece, the header
};
template <>
struct KqLaneRaw<F_Q6_K> {
    KqRaw16 ql, qh;
    u32 sc_lo, sc_hi, d;  // the two pieces' scales (bytes), d (f16 bits)
};

// Where a K-quant lane's work sits in a super-block: lane l of a stretch
// owns sub-block l % 8 of super-block l / 8, and reads 16 elements of two
// sub-blocks, `lo` and `hi` (ending up with its own one's sums after
// exchanging halves with lane l ^ partner):
//   Q4_K: piece p = l % 8 of the codes: elements 16(p % 2) .. of
//         sub-blocks 2(p / 2) (lo) and 2(p / 2) + 1 (hi); partner 1;
//   Q6_K: the 16 ql bytes of elements 16e .. of sub-blocks 4h + j (lo)
//         and 4h + j + 2 (hi), with h = p / 4, j = p % 2, e = p / 2 % 2;
//         partner 2.
template <int F>
struct KqPlace {
    int lo, hi;   // sub-blocks
    int offset;   // the elements' first, within a sub-block
    bool own_hi;  // whether the lane owns `hi`
    __device__ __forceinline__ KqPlace(int p) {
        if (KqFormat<F>::legacy) {  // (its own whole block: see kq_spot)
            lo = hi = offset = 0;
            own_hi = false;
        } else if (F == F_Q4_K) {
            lo = 2 * (p >> 1);
            hi = lo + 1;
            offset = 16 * (p & 1);
            own_hi = p & 1;
        } else {
            int h = p >> 2, j = p & 1, e = (p >> 1) & 1;
            lo = 4 * h + j;
            hi = lo + 2;
            offset = 16 * e;
            own_hi = e;
        }
    }
    static constexpr int partner = F == F_Q4_K ? 1 : 2;
};

// A K-quant lane's loads of super-block sb (KqPlace's piece p).
template <int F>
__device__ __forceinline__ KqLaneRaw<F> kq_piece_load(const u8* sb, int p) {
    KqLaneRaw<F> r;
    if constexpr (F == F_Q4_K) {
        r.qs = ld_stream_u4(sb + 16 + 16 * p);
        r.hd = ld_stream_u4(sb);
    } else {
        int h = p >> 2, j = p & 1, e = (p >> 1) & 1;
        r.ql = kq_ld16_raw(sb + 64 * h + 32 * j + 16 * e);
        r.qh = kq_ld16_raw(sb + 128 + 32 * h + 16 * e);
        r.sc_lo = ld_stream_u8(sb + 192 + 8 * h + 2 * j + e);
        r.sc_hi = ld_stream_u8(sb + 192 + 8 * h + 2 * j + 4 + e);
        r.d = ld_stream_u16(sb + 208);
    }
    return r;
}

// Lane `lane`'s loads of stretch `s` of a row of nb blocks of 32 weights
// (a block past the row's end reads the row's last).
template <int F>
__device__ __forceinline__ KqLaneRaw<F> kq_lane_load(const u8* row, int s, int lane, int nb) {
    if constexpr (KqFormat<F>::legacy) {
        KqLaneRaw<F> r;
        r.b = kq_block_load<F>(row + (i64)min(32 * s + lane, nb - 1) * KqFormat<F>::bytes);
        return r;
    } else {
        int sb = min(4 * s + (lane >> 3), nb / 8 - 1);
        return kq_piece_load<F>(row + (i64)sb * KqFormat<F>::bytes, lane & 7);
    }
}

// A lane's decoded share of a stretch: the codes of its two pieces, and
// what its own block's f32 steps take.
struct KqLane {
    u32 lo[4], hi[4];
    // Q6_K: the pieces' scales; Q4_K: the own block's scale and min;
    // legacy: 1 and -1 (min formats) or 0.
    int k_lo, k_hi;
    float d, dmin;  // dmin: the min formats' min (Q4_K's dmin, Q4_1's m)
};

template <int F>
__device__ __forceinline__ KqLane kq_lane_decode(const KqLaneRaw<F>& r, int p) {
    KqLane l;
    if constexpr (KqFormat<F>::legacy) {
        // ggml's blocks: d (and m) as f16, Q5's 32 high bits (element j's
        // bit j), then 16 bytes whose low nibbles are elements 0..15 and
        // high nibbles 16..31. k_lo = 1 and k_hi = -1 put a min format's
        // d · Σ q a + m · Σ a in Q4_K's steps.
        const u32* w = r.b.w;
        bool odd = r.b.odd;
        u32 d16, m16 = 0, qh = 0, qs[4];
        if constexpr (F == F_Q4_0) {
            d16 = odd ? w[0] >> 16 : w[0] & 0xFFFFu;
#pragma unroll
            for (int i = 0; i < 4; i++) qs[i] = odd ? w[i + 1] : kq_funnel16(w[i], w[i + 1]);
        } else if constexpr (F == F_Q5_0) {
            d16 = odd ? w[0] >> 16 : w[0] & 0xFFFFu;
            qh = odd ? w[1] : kq_funnel16(w[0], w[1]);
#pragma unroll
            for (int i = 0; i < 4; i++) qs[i] = odd ? w[i + 2] : kq_funnel16(w[i + 1], w[i + 2]);
        } else {
            d16 = w[0] & 0xFFFFu;
            m16 = w[0] >> 16;
            if (F == F_Q5_1) qh = w[1];
#pragma unroll
            for (int i = 0; i < 4; i++) qs[i] = w[i + (F == F_Q5_1 ? 2 : 1)];
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            l.lo[i] = qs[i] & 0x0F0F0F0Fu;
            l.hi[i] = (qs[i] >> 4) & 0x0F0F0F0Fu;
            if (F == F_Q5_0 || F == F_Q5_1) {
                l.lo[i] |= kq_spread4(qh >> (4 * i)) << 4;
                l.hi[i] |= kq_spread4(qh >> (16 + 4 * i)) << 4;
            }
        }
        l.k_lo = 1;
        l.k_hi = KqFormat<F>::has_min ? -1 : 0;
        l.d = f16_to_f32((u16)d16);
        l.dmin = KqFormat<F>::has_min ? f16_to_f32((u16)m16) : 0.0f;
    } else if constexpr (F == F_Q4_K) {
        u32 q[4] = {r.qs.x, r.qs.y, r.qs.z, r.qs.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            l.lo[i] = q[i] & 0x0F0F0F0Fu;
            l.hi[i] = (q[i] >> 4) & 0x0F0F0F0Fu;
        }
        kq_scale_min(r.hd, p, &l.k_lo, &l.k_hi);
        l.d = f16_to_f32((u16)(r.hd.x & 0xFFFFu));
        l.dmin = f16_to_f32((u16)(r.hd.x >> 16));
    } else {
        u32 ql[4], qh[4];
        kq_ld16_words(r.ql, ql);
        kq_ld16_words(r.qh, qh);
        kq_q6_codes(ql, qh, p & 1, l.lo, l.hi);
        l.k_lo = (int)(signed char)r.sc_lo;
        l.k_hi = (int)(signed char)r.sc_hi;
        l.d = f16_to_f32((u16)r.d);
        l.dmin = 0.0f;
    }
    return l;
}

// Where a lane's token codes for stretch s lie (offsets into a token's
// codes): its two pieces' 16 codes each, and its own block (its scale);
// `valid` false past the row's end. K-quants: KqPlace's pieces of
// super-block 4s + lane / 8; legacy formats: elements 0..15 and 16..31 of
// block 32s + lane.
struct KqSpot {
    i64 lo, hi, own;
    bool valid;
};
template <int F>
__device__ __forceinline__ KqSpot kq_spot(const KqPlace<F>& at, int s, int lane, int nb) {
    KqSpot x;
    if constexpr (KqFormat<F>::legacy) {
        i64 b = 32 * (i64)s + lane;
        x = {b * 32, b * 32 + 16, b, b < nb};
    } else {
        i64 sb = 4 * (i64)s + (lane >> 3);
        x = {(sb * 8 + at.lo) * 32 + at.offset, (sb * 8 + at.hi) * 32 + at.offset,
             sb * 8 + (lane & 7), sb < nb / 8};
    }
    return x;
}

// A lane's share of a token for one stretch (at `spot`): the 16 codes of
// each of its two pieces and its own block's scale; zeros past the row's
// end. EARLY: loads kept after the wait (common.cuh).
struct KqToken {
    int4 lo, hi;
    float d;
};
template <bool EARLY>
__device__ __forceinline__ KqToken kq_token_load(const signed char* xq, const float* xd,
                                                 const KqSpot& spot) {
    KqToken x = {make_int4(0, 0, 0, 0), make_int4(0, 0, 0, 0), 0.0f};
    if (spot.valid) {
        const signed char* xl = xq + spot.lo;
        const signed char* xh = xq + spot.hi;
        i64 b = spot.own;
        x.lo = EARLY ? ld_i4_after_wait(xl) : *(const int4*)xl;
        x.hi = EARLY ? ld_i4_after_wait(xh) : *(const int4*)xh;
        x.d = EARLY ? ld_f32_after_wait(xd + b) : xd[b];
    }
    return x;
}

// Stretches (32 blocks of 32 weights: 4 K-quant super-blocks, 8 lanes
// each, or 32 legacy blocks, a lane each) whose loads a warp issues
// before using any, for one row (two rows: half as many).
#define KQ_UNROLL 4

// A lane's block of one row against one token (x, with the Σ a of its
// two pieces): the integer sums of its pieces, the exchange with its
// partner, the block's f32 steps; then the chunk's chain, lane 4c + pos
// forming block pos's steps after the part of the blocks before it. The
// lane at pos Q8_CHUNK - 1 ends with the chunk's part. Every lane of the
// warp calls it.
template <int F>
__device__ __forceinline__ float kq_chunk_part(const KqLane& w, const KqToken& x, int a_lo,
                                               int a_hi, const KqPlace<F>& at, int pos) {
    int i_lo = kq_dot4(w.lo, x.lo), i_hi = kq_dot4(w.hi, x.hi);
    float p;
    if constexpr (KqFormat<F>::has_min) {
        int isum, asum;
        if constexpr (F == F_Q4_K) {
            int gi = __shfl_xor_sync(FULL_MASK, at.own_hi ? i_lo : i_hi, KqPlace<F>::partner);
            int ga = __shfl_xor_sync(FULL_MASK, at.own_hi ? a_lo : a_hi, KqPlace<F>::partner);
            isum = (at.own_hi ? i_hi : i_lo) + gi;
            asum = (at.own_hi ? a_hi : a_lo) + ga;
        } else {  // the lane's own block
            isum = i_lo + i_hi;
            asum = a_lo + a_hi;
        }
        float v = (float)(w.k_lo * isum), vm = (float)(w.k_hi * asum);
        float g = w.d * x.d, gm = w.dmin * x.d;
        p = fmaf(-vm, gm, fmaf(v, g, 0.0f));
#pragma unroll
        for (int u = 1; u < Q8_CHUNK; u++) {
            float back = __shfl_up_sync(FULL_MASK, p, 1);
            if (pos == u) p = fmaf(-vm, gm, fmaf(v, g, back));
        }
    } else {
        float v;
        if constexpr (F == F_Q6_K) {
            // Σ (q − 32) a of each piece, times its scale.
            int p_lo = w.k_lo * (i_lo - 32 * a_lo), p_hi = w.k_hi * (i_hi - 32 * a_hi);
            int got = __shfl_xor_sync(FULL_MASK, at.own_hi ? p_lo : p_hi, KqPlace<F>::partner);
            v = (float)((at.own_hi ? p_hi : p_lo) + got);
        } else {  // Q4_0, Q5_0: Σ (q − centre) a of the lane's own block
            v = (float)(i_lo + i_hi - KqFormat<F>::centre * (a_lo + a_hi));
        }
        float g = w.d * x.d;
        p = fmaf(v, g, 0.0f);
#pragma unroll
        for (int u = 1; u < Q8_CHUNK; u++) {
            float back = __shfl_up_sync(FULL_MASK, p, 1);
            if (pos == u) p = fmaf(v, g, back);
        }
    }
    return p;
}

// R rows (of one format and width) dotted with T tokens' quantized
// activations (nt of them live) into acc[r][t], by every lane of a warp
// (each ends with the totals). Lane l of a stretch owns block l
// (KqPlace): it forms integer sums over its two pieces, sends its partner
// the one the partner owns, and adds the one it gets; the chunk's fmaf
// chain then passes from lane to lane (4 lanes a chunk), and every lane
// adds the chunks' parts in order. A round's weight loads are all issued
// before any is used, and with one token its loads too (more tokens read
// theirs stretch by stretch, to spare registers); two rows (a route's
// gate and up rows) share the token's loads, in rounds of half as many
// stretches.
// EARLY (the kernel has not yet run KERNEL_ENTRY): the first round's
// weight loads are issued, then every lane waits for the kernel before
// (each row has a super-block, so every warp has a first round), then
// reads the tokens, which that kernel may have written.
template <int F, int T, int R, bool EARLY = false>
__device__ __forceinline__ void kq_rows_dot(const u8* const* rows, int cols,
                                            const signed char* const* xq, const float* const* xd,
                                            int nt, float (*acc)[T]) {
    constexpr int UNROLL = KQ_UNROLL / R;
    constexpr int SLOTS = UNROLL * (32 / Q8_CHUNK);  // chunk parts of a round, a row
    // One token: a round's chunk parts meet in shared memory, and lane r
    // adds row r's in order (a warp of a block of Q8_WARPS).
    __shared__ __align__(16) float parts_of_warp[T == 1 ? Q8_WARPS : 1][R][SLOTS];
    float(*parts)[SLOTS] = parts_of_warp[T == 1 ? threadIdx.x >> 5 : 0];
    int lane = threadIdx.x & 31, piece = lane & 7;
    int pos = lane & 3;  // the lane's block in its chunk
    KqPlace<F> at(piece);
    int nb = cols / 32;
    int stretches = (nb + 31) / 32;  // 32 blocks of 32 weights a stretch
    float total = 0.0f;              // one token: lane r < R's row r's
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < T; t++) acc[r][t] = 0.0f;
    for (int s0 = 0; s0 < stretches; s0 += UNROLL) {
        KqLaneRaw<F> raw[R][UNROLL];
#pragma unroll
        for (int i = 0; i < UNROLL; i++)
#pragma unroll
            for (int r = 0; r < R; r++) raw[r][i] = kq_lane_load<F>(rows[r], s0 + i, lane, nb);
        if (EARLY && s0 == 0) KERNEL_ENTRY();
        // One token: its loads for the round too, before any is used.
        KqToken held[T == 1 ? UNROLL : 1];
        if constexpr (T == 1) {
#pragma unroll
            for (int i = 0; i < UNROLL; i++)
                held[i] = kq_token_load<EARLY>(xq[0], xd[0], kq_spot<F>(at, s0 + i, lane, nb));
        }
#pragma unroll
        for (int i = 0; i < UNROLL; i++) {
            int first = 32 * (s0 + i);  // the stretch's first block
            if (first >= nb) break;     // uniform over the warp
            KqLane w[R];
#pragma unroll
            for (int r = 0; r < R; r++) w[r] = kq_lane_decode<F>(raw[r][i], piece);
#pragma unroll
            for (int t = 0; t < T; t++) {
                if (t >= nt) break;
                KqToken x = T == 1 ? held[i]
                                   : kq_token_load<EARLY>(xq[t], xd[t], kq_spot<F>(at, s0 + i, lane, nb));
                int a_lo = kq_byte_sum(x.lo, 0), a_hi = kq_byte_sum(x.hi, 0);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float p = kq_chunk_part<F>(w[r], x, a_lo, a_hi, at, pos);
                    // Chunks c = 0 .. 7 of the stretch in order. A partial
                    // chunk's part is its last lane's (the lanes past the
                    // row's end added 0 · 0); a chunk past the end is ±0,
                    // which leaves the total as it is (it starts at +0
                    // and never becomes -0).
                    if constexpr (T == 1) {
                        if (pos == Q8_CHUNK - 1) parts[r][i * (32 / Q8_CHUNK) + lane / Q8_CHUNK] = p;
                    } else {
#pragma unroll
                        for (int c = 0; c < 32 / Q8_CHUNK; c++)
                            acc[r][t] += __shfl_sync(FULL_MASK, p, Q8_CHUNK * c + Q8_CHUNK - 1);
                    }
                }
            }
        }
        if constexpr (T == 1) {
            int used = min(UNROLL, stretches - s0) * (32 / Q8_CHUNK);  // uniform
            total = q8_add_parts<R, SLOTS>(parts, total, used);
        }
    }
    if constexpr (T == 1) {
#pragma unroll
        for (int r = 0; r < R; r++) acc[r][0] = __shfl_sync(FULL_MASK, total, r);
    }
}

// out[m][t, o] (+ bias[m][o]) for quantized x: grid (block_start[count],
// ceil(n / T)), blocks of Q8_WARPS warps, a warp a row (the q8dot.cu
// matmul_q8_impl's shape, so MatGroup counts blocks alike). T: tokens a
// block, MM_TOKENS, or 1 for a decode step (fewer registers). EARLY: as
// kq_rows_dot's (the block's matrix and row are read from the parameters,
// not from memory the kernel before writes).
template <int F, int T, bool EARLY>
__device__ void kq_matmul_impl(const MatGroup& g, int cols, const signed char* __restrict__ xq,
                               const float* __restrict__ xd, int n) {
    TcMember m = tc_member(g, blockIdx.x);  // the block's matrix (tcmm.cu)
    int row = (blockIdx.x - m.first_block) * Q8_WARPS + (threadIdx.x >> 5);
    int t0 = blockIdx.y * T;
    int nb = cols / 32;
    const signed char* qs[T];
    const float* ds[T];
#pragma unroll
    for (int t = 0; t < T; t++) {
        int tt = min(t0 + t, n - 1);
        qs[t] = xq + (i64)tt * cols;
        ds[t] = xd + (i64)tt * nb;
    }
    float acc[1][T];
    const u8* wr[1] = {m.row(row)};
    kq_rows_dot<F, T, 1, EARLY>(wr, cols, qs, ds, min(n - t0, T), acc);
    if (row < m.rows && (threadIdx.x & 31) == 0) {
#pragma unroll
        for (int t = 0; t < T; t++)
            if (t0 + t < n)
                m.out[(i64)(t0 + t) * m.rows + row] = m.bias ? acc[0][t] + m.bias[row] : acc[0][t];
    }
}

// Batches on the integer tensor cores: mmq.cu's tiles (MQ_BM rows ×
// MQ_BN tokens a block of MQ_THREADS, a step of Q8_CHUNK blocks — half a
// super-block — staged in shared memory, the warps' fragments as there),
// with the codes one a byte (Q6_K's as q − 32, Q4_0's and Q5_0's as
// q − 8 and q − 16), and per (row, block) k0, k1 (Q4_K: the scale and min;
// Q6_K: the scales of elements 0..15 and 16..31; legacy: 1 and -1 for the
// min formats) and d, dmin (K-quants: the super-block's, in column 0),
// per (token, block) the activations' Σ a (the min formats) beside their
// scale. A Q6_K block takes two MMAs, one a 16-element half (the other
// half's A registers zero: in m16n8k32's A fragment registers 0 and 1
// hold k < 16, 2 and 3 k ≥ 16).
struct __align__(16) KqTiles {
    u8 a[MQ_BM][MQ_LD];
    int k0[MQ_BM][Q8_CHUNK];
    int k1[MQ_BM][Q8_CHUNK];
    float d[MQ_BM][Q8_CHUNK];
    float dmin[MQ_BM][Q8_CHUNK];
    u8 b[MQ_BN][MQ_LD];
    float bs[MQ_BN][Q8_CHUNK];
    int bsum[MQ_BN][Q8_CHUNK];
};

// Q6_K codes 0..63 as the bytes of q − 32 (each byte lifted by 128 so
// that the subtraction borrows from no neighbour, then dropped again).
__device__ __forceinline__ u32 kq_q6_centred(u32 q) {
    return ((q | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
}

// Stages blocks b0 .. b0 + nu (nu ≤ Q8_CHUNK; K-quants: half `b0 / 4 %
// 2` of super-block b0 / 8, nu = Q8_CHUNK) of the tile's rows and tokens;
// every load is issued before any store.
template <int F>
__device__ __forceinline__ void kq_stage(KqTiles& s, const u8* const* arow,
                                         const signed char* const* xrow,
                                         const float* const* xsc, int b0, int nu) {
    static_assert(MQ_BM * 4 == MQ_THREADS, "four threads a row");
    static_assert(MQ_BN * Q8_CHUNK * 2 == 2 * MQ_THREADS, "two pieces of tokens a thread");
    static_assert(MQ_BN * Q8_CHUNK == MQ_THREADS, "a token scale a thread");
    int sb = b0 / 8, half = (b0 / 4) & 1;
    int ar = threadIdx.x / 4, ap = threadIdx.x % 4;
    const u8* blk = arow[ar] + (i64)sb * KqFormat<F>::bytes;
    // Legacy formats: thread ap takes block b0 + ap of the row, whole.
    KqBlockRaw lb;
    if constexpr (KqFormat<F>::legacy) {
        if (ap < nu) lb = kq_block_load<F>(arow[ar] + (i64)(b0 + ap) * KqFormat<F>::bytes);
    }
    // Q4_K: thread ap takes code piece 4·half + ap (elements 16(ap % 2) ..
    // of local blocks 2(ap / 2) and 2(ap / 2) + 1), thread r < MQ_BM row
    // r's header. Q6_K: thread ap takes the ql and qh pieces of elements
    // 16(ap % 2) .. of local blocks ap / 2 and ap / 2 + 2, threads ap = 0
    // the half's 8 scales and d.
    uint4 qa = make_uint4(0, 0, 0, 0), hd = make_uint4(0, 0, 0, 0);
    KqRaw16 ql, qh;
    u32 sc[4] = {0, 0, 0, 0}, d6 = 0;
    if constexpr (F == F_Q4_K) {
        qa = ld_stream_u4(blk + 16 + 16 * (4 * half + ap));
        if (threadIdx.x < MQ_BM) hd = ld_stream_u4(arow[threadIdx.x] + (i64)sb * KqFormat<F>::bytes);
    } else if constexpr (F == F_Q6_K) {
        int j = ap >> 1, e = ap & 1;
        ql = kq_ld16_raw(blk + 64 * half + 32 * j + 16 * e);
        qh = kq_ld16_raw(blk + 128 + 32 * half + 16 * e);
        if (ap == 0) {
#pragma unroll
            for (int i = 0; i < 4; i++) sc[i] = ld_stream_u16(blk + 192 + 8 * half + 2 * i);
            d6 = ld_stream_u16(blk + 208);
        }
    }
    uint4 rb[2];
    int bt[2], bp[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        int i = threadIdx.x + j * MQ_THREADS;
        bt[j] = i / (Q8_CHUNK * 2);
        bp[j] = i % (Q8_CHUNK * 2);
        rb[j] = (bp[j] >> 1) < nu
                    ? ((const uint4*)(xrow[bt[j]] + (i64)(b0 + (bp[j] >> 1)) * 32))[bp[j] & 1]
                    : make_uint4(0, 0, 0, 0);
    }
    int st = threadIdx.x / Q8_CHUNK, su = threadIdx.x % Q8_CHUNK;
    float rs = su < nu ? xsc[st][b0 + su] : 0.0f;
    if constexpr (KqFormat<F>::legacy) {
        if (ap < nu) {
            KqLaneRaw<F> r;
            r.b = lb;
            KqLane l = kq_lane_decode<F>(r, 0);
            // Q4_0's and Q5_0's codes as q − centre (each byte lifted by
            // 128, so that no subtraction borrows from its neighbour).
            constexpr u32 c = 0x01010101u * KqFormat<F>::centre;
            u32 v[8];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                v[i] = c ? ((l.lo[i] | 0x80808080u) - c) ^ 0x80808080u : l.lo[i];
                v[i + 4] = c ? ((l.hi[i] | 0x80808080u) - c) ^ 0x80808080u : l.hi[i];
            }
            u8* dst = &s.a[ar][ap * 32];
            ((uint4*)dst)[0] = make_uint4(v[0], v[1], v[2], v[3]);
            ((uint4*)dst)[1] = make_uint4(v[4], v[5], v[6], v[7]);
            s.k0[ar][ap] = l.k_lo;
            s.k1[ar][ap] = l.k_hi;
            s.d[ar][ap] = l.d;
            s.dmin[ar][ap] = l.dmin;
        }
    } else if constexpr (F == F_Q4_K) {
        u8* lo = &s.a[ar][(2 * (ap >> 1)) * 32 + 16 * (ap & 1)];
        ((uint4*)lo)[0] = make_uint4(qa.x & 0x0F0F0F0Fu, qa.y & 0x0F0F0F0Fu, qa.z & 0x0F0F0F0Fu,
                                     qa.w & 0x0F0F0F0Fu);
        ((uint4*)(lo + 32))[0] =
            make_uint4((qa.x >> 4) & 0x0F0F0F0Fu, (qa.y >> 4) & 0x0F0F0F0Fu,
                       (qa.z >> 4) & 0x0F0F0F0Fu, (qa.w >> 4) & 0x0F0F0F0Fu);
        if (threadIdx.x < MQ_BM) {
            int r = threadIdx.x;
#pragma unroll
            for (int u = 0; u < Q8_CHUNK; u++) kq_scale_min(hd, 4 * half + u, &s.k0[r][u], &s.k1[r][u]);
            s.d[r][0] = f16_to_f32((u16)(hd.x & 0xFFFFu));
            s.dmin[r][0] = f16_to_f32((u16)(hd.x >> 16));
        }
    } else {
        u32 lw[4], hw[4], lo[4], hi[4];
        kq_ld16_words(ql, lw);
        kq_ld16_words(qh, hw);
        int j = ap >> 1;
        kq_q6_codes(lw, hw, j, lo, hi);
        u8* dst = &s.a[ar][j * 32 + 16 * (ap & 1)];
        ((uint4*)dst)[0] = make_uint4(kq_q6_centred(lo[0]), kq_q6_centred(lo[1]),
                                      kq_q6_centred(lo[2]), kq_q6_centred(lo[3]));
        ((uint4*)(dst + 64))[0] = make_uint4(kq_q6_centred(hi[0]), kq_q6_centred(hi[1]),
                                             kq_q6_centred(hi[2]), kq_q6_centred(hi[3]));
        if (ap == 0) {
            // Scale 2u + e of the half is byte e of word u.
#pragma unroll
            for (int u = 0; u < Q8_CHUNK; u++) {
                s.k0[ar][u] = (int)(signed char)(sc[u] & 0xFFu);
                s.k1[ar][u] = (int)(signed char)(sc[u] >> 8);
            }
            s.d[ar][0] = f16_to_f32((u16)d6);
            s.dmin[ar][0] = 0.0f;
        }
    }
#pragma unroll
    for (int j = 0; j < 2; j++) {
        ((uint4*)&s.b[bt[j]][0])[bp[j]] = rb[j];
        if constexpr (KqFormat<F>::has_min) {
            // The block's Σ a: this piece's half, and its partner's (the
            // neighbouring lane holds the other half of the same block).
            int4 v = make_int4((int)rb[j].x, (int)rb[j].y, (int)rb[j].z, (int)rb[j].w);
            int part = kq_byte_sum(v, 0);
            int sum = part + __shfl_xor_sync(FULL_MASK, part, 1);
            if ((bp[j] & 1) == 0) s.bsum[bt[j]][bp[j] >> 1] = sum;
        }
    }
    s.bs[st][su] = rs;
}

// The warp's products over all blocks (cols / 32) into acc[mt][nt][i], C
// element i of row tile mt (shared rows ra[mt] + g, + 8) and token tile
// nt (shared tokens tb + 8 nt + g for B, + 2q + e for the scales): mmq.cu
// mq_products's walk, a step of Q8_CHUNK blocks staged at a time, each
// block's f32 steps in the documented order; token tiles past the first
// `valid` token slots take no MMAs, as there.
template <int F>
__device__ __forceinline__ void kq_products(KqTiles& s, const u8* const* arow, int cols,
                                            const signed char* const* xrow,
                                            const float* const* xsc, const int* ra, int tb,
                                            int valid, float (*acc)[MMQ_NT][4]) {
    int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
        for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mt][nt][i] = 0.0f;
    int nb = cols / 32;
    for (int b0 = 0; b0 < nb; b0 += Q8_CHUNK) {
        // (K-quant rows are whole super-blocks: every step whole.)
        int nu = KqFormat<F>::legacy ? min(Q8_CHUNK, nb - b0) : Q8_CHUNK;
        __syncthreads();  // the row and token pointers are set; the last step's tiles read
        kq_stage<F>(s, arow, xrow, xsc, b0, nu);
        __syncthreads();
        float part[MMQ_MT][MMQ_NT][4];
#pragma unroll
        for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) part[mt][nt][i] = 0.0f;
        // Row tile by row tile (its fragments and scales), then the token
        // tiles (theirs read again for each row tile, to spare registers).
        // The blocks of a step one at a time (not unrolled): unrolled,
        // ptxas 13.0 (sm_90, 128 registers at MQ_MIN_BLOCKS) hoisted their
        // shared-memory reads and spilled 16-144 bytes a thread in every
        // tile but Q4_0's and Q5_0's; this way none spills (96-128).
#pragma unroll 1
        for (int u = 0; u < Q8_CHUNK; u++) {
            if (u >= nu) break;  // uniform over the block
#pragma unroll
            for (int mt = 0; mt < MMQ_MT; mt++) {
                const u8* p0 = &s.a[ra[mt] + g][u * 32];
                const u8* p1 = &s.a[ra[mt] + g + 8][u * 32];
                u32 a[4] = {*(const u32*)(p0 + 4 * q), *(const u32*)(p1 + 4 * q),
                            *(const u32*)(p0 + 16 + 4 * q), *(const u32*)(p1 + 16 + 4 * q)};
                int k0[2], k1[2];
                float d[2], dmin[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int r = ra[mt] + g + 8 * e;
                    k0[e] = s.k0[r][u];
                    k1[e] = s.k1[r][u];
                    // (A K-quant step lies in one super-block: one d.)
                    d[e] = s.d[r][KqFormat<F>::legacy ? u : 0];
                    dmin[e] = s.dmin[r][KqFormat<F>::legacy ? u : 0];
                }
#pragma unroll
                for (int nt = 0; nt < MMQ_NT; nt++) {
                    if (tb + 8 * nt >= valid) break;  // uniform over the warp
                    const u8* x = &s.b[tb + 8 * nt + g][u * 32];
                    u32 bx[2] = {*(const u32*)(x + 4 * q), *(const u32*)(x + 16 + 4 * q)};
                    float dx[2];
                    int as[2];
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        dx[e] = s.bs[tb + 8 * nt + 2 * q + e][u];
                        as[e] = KqFormat<F>::has_min ? s.bsum[tb + 8 * nt + 2 * q + e][u] : 0;
                    }
                    if constexpr (KqFormat<F>::has_min) {
                        int c[4];
                        mma_s8(c, a, bx);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            int r = i >> 1, t = i & 1;
                            float v = (float)(k0[r] * c[i]), vm = (float)(k1[r] * as[t]);
                            float p = fmaf(v, d[r] * dx[t], part[mt][nt][i]);
                            part[mt][nt][i] = fmaf(-vm, dmin[r] * dx[t], p);
                        }
                    } else if constexpr (F != F_Q6_K) {  // Q4_0, Q5_0: codes centred
                        int c[4];
                        mma_s8(c, a, bx);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            int r = i >> 1, t = i & 1;
                            part[mt][nt][i] = fmaf((float)c[i], d[r] * dx[t], part[mt][nt][i]);
                        }
                    } else {
                        int c0[4], c1[4];
                        u32 first[4] = {a[0], a[1], 0u, 0u};
                        u32 second[4] = {0u, 0u, a[2], a[3]};
                        mma_s8(c0, first, bx);
                        mma_s8(c1, second, bx);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            int r = i >> 1, t = i & 1;
                            float v = (float)(k0[r] * c0[i] + k1[r] * c1[i]);
                            part[mt][nt][i] = fmaf(v, d[r] * dx[t], part[mt][nt][i]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int mt = 0; mt < MMQ_MT; mt++)
#pragma unroll
            for (int nt = 0; nt < MMQ_NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[mt][nt][i] += part[mt][nt][i];
    }
}

// kq_products as mmq.cu's tiles take it (mq_matmul_impl: the dense batch
// kernel; mq_gate_up_impl, mq_down_impl: the routed experts grouped by
// expert).
template <int F>
struct KqProducts {
    using Tiles = KqTiles;
    __device__ __forceinline__ static void products(Tiles& s, const u8* const* arow, int cols,
                                                    const signed char* const* xrow,
                                                    const float* const* xsc, const int* ra, int tb,
                                                    int valid, float (*acc)[MMQ_NT][4]) {
        kq_products<F>(s, arow, cols, xrow, xsc, ra, tb, valid, acc);
    }
};

// Routed experts (moe.cu's computation, the activation and biases
// moe_act_value's and moe_down_value's), each product in the order above,
// so a route has the same bits alone (a decode step) or grouped with its
// expert's other routes (a batch). Gate and up share a format.
//
// Route by route: grid (ceil(rows / Q8_WARPS), routes), a warp a row of
// the route's expert; the gate/up stage reads token i / k's quantized
// input (xq, xd: [tokens, hidden]) and writes act [routes, inter], the
// down stage reads route i's quantized activations (aq, ad: [routes,
// inter]) and writes y [routes, hidden]. Routes to a masked slot or past
// the bank write nothing.
// Each stage reads its route's slot and issues its first weight loads
// before it waits for the kernel before it (EARLY): stream/moe.rs
// launches a quantization before each stage, so the routing (and the
// gate/up stage, for the down stage's activations' quantization) finished
// before the launch before this one began (common.cuh), and nothing the
// kernels before write is read before the wait.
template <int F>
__device__ void kq_gate_up1_impl(const signed char* __restrict__ xq, const float* __restrict__ xd,
                                 const RouteOut* __restrict__ routes, int k, const SlotMask& only,
                                 const BankView& b, const MoeAct& a, float* __restrict__ act) {
    int i = blockIdx.y;
    u32 slot;
    if (!route_slot<true>(routes, i, only, b.slots, slot)) return;
    int row = blockIdx.x * Q8_WARPS + (threadIdx.x >> 5);
    i64 r = (i64)slot * b.inter + min(row, b.inter - 1);
    const u8* rows[2] = {b.gate + r * b.gate_row_bytes, b.up + r * b.up_row_bytes};
    int t = i / k;
    const signed char* xs[1] = {xq + (i64)t * b.hidden};
    const float* ds[1] = {xd + (i64)t * (b.hidden / 32)};
    float acc[2][1];
    kq_rows_dot<F, 1, 2, true>(rows, b.hidden, xs, ds, 1, acc);
    if (row < b.inter && (threadIdx.x & 31) == 0)
        act[(i64)i * b.inter + row] = moe_act_value(b, a, r, acc[0][0], acc[1][0]);
}

template <int F>
__device__ void kq_down1_impl(const signed char* __restrict__ aq, const float* __restrict__ ad,
                              const RouteOut* __restrict__ routes, const SlotMask& only,
                              const BankView& b, float* __restrict__ y) {
    int i = blockIdx.y;
    u32 slot;
    if (!route_slot<true>(routes, i, only, b.slots, slot)) return;
    int row = blockIdx.x * Q8_WARPS + (threadIdx.x >> 5);
    i64 r = (i64)slot * b.hidden + min(row, b.hidden - 1);
    const u8* rows[1] = {b.down + r * b.down_row_bytes};
    const signed char* xs[1] = {aq + (i64)i * b.inter};
    const float* ds[1] = {ad + (i64)i * (b.inter / 32)};
    float acc[1][1];
    kq_rows_dot<F, 1, 1, true>(rows, b.inter, xs, ds, 1, acc);
    if (row < b.hidden && (threadIdx.x & 31) == 0)
        y[(i64)i * b.hidden + row] = moe_down_value(b, r, acc[0][0]);
}

// The kernels of format F, named after it: a few tokens, one token (a
// decode step's: the first weights loaded before the wait), a batch; the
// routed experts route by route (also EARLY) and grouped by expert.
#define KQ_KERNELS(fmt, F)                                                                       \
    KERNEL void kq_matmul_##fmt(MatGroup g, int cols, const signed char* xq,                     \
                                               const float* xd, int n) {                         \
        KERNEL_ENTRY();                                                                          \
        kq_matmul_impl<F, MM_TOKENS, false>(g, cols, xq, xd, n);                                 \
    }                                                                                            \
    KERNEL void kq_matmul1_##fmt(MatGroup g, int cols, const signed char* xq,                    \
                                                const float* xd, int n) {                        \
        kq_matmul_impl<F, 1, true>(g, cols, xq, xd, n);                                          \
    }                                                                                            \
    KERNEL void __launch_bounds__(MQ_THREADS, MQ_MIN_BLOCKS)                                     \
        kq_tile_##fmt(const u8* W, int rows, int cols, i64 row_bytes, const signed char* xq,     \
                      const float* xd, int n, float* out, const float* bias) {                   \
        KERNEL_ENTRY();                                                                          \
        mq_matmul_impl<KqProducts<F>>(W, rows, cols, row_bytes, xq, xd, n, out, bias);           \
    }                                                                                            \
    KERNEL void kq_gate_up1_##fmt(const signed char* xq, const float* xd,                        \
                                                 const RouteOut* routes, int k, SlotMask only,   \
                                                 BankView b, MoeAct a, float* act) {             \
        kq_gate_up1_impl<F>(xq, xd, routes, k, only, b, a, act);                                 \
    }                                                                                            \
    KERNEL void kq_down1_##fmt(const signed char* aq, const float* ad,                           \
                                              const RouteOut* routes, SlotMask only, BankView b, \
                                              float* y) {                                        \
        kq_down1_impl<F>(aq, ad, routes, only, b, y);                                            \
    }                                                                                            \
    KERNEL void __launch_bounds__(MQ_THREADS, MQ_MIN_BLOCKS)                                     \
        kq_gate_up_tile_##fmt(const signed char* xq, const float* xd, const u32* order,          \
                              const u32* offsets, int k, BankView b, MoeAct a, float* act) {     \
        KERNEL_ENTRY();                                                                          \
        mq_gate_up_impl<KqProducts<F>>(xq, xd, order, offsets, k, b, a, act);                    \
    }                                                                                            \
    KERNEL void __launch_bounds__(MQ_THREADS, MQ_MIN_BLOCKS)                                     \
        kq_down_tile_##fmt(const signed char* aq, const float* ad, const u32* order,             \
                           const u32* offsets, BankView b, float* y) {                           \
        KERNEL_ENTRY();                                                                          \
        mq_down_impl<KqProducts<F>>(aq, ad, order, offsets, b, y);                               \
    }

KQ_KERNELS(q4_0, F_Q4_0)
KQ_KERNELS(q4_1, F_Q4_1)
KQ_KERNELS(q5_0, F_Q5_0)
KQ_KERNELS(q5_1, F_Q5_1)
KQ_KERNELS(q4_k, F_Q4_K)
KQ_KERNELS(q6_k, F_Q6_K)
