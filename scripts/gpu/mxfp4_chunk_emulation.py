#!/usr/bin/env python3
# CPU emulation of the MXFP4 chunk kernels' arithmetic (crates/cuda/src/
# kernels/q8chunk.cu) against the per-row kernels' (q8dot.cu), with no GPU:
#
# 1. mxfp4_words (selectors of a code word's two halves formed at once,
#    raw prmt.b32) against mxfp4_word on each half (__byte_perm, whose
#    selector nibbles are masked to 3 bits): the same 8 int8 values for
#    every 16-bit half, and against the e2m1 table (doubled: 0, ±1, ±2,
#    ±3, ±4, ±6, ±8, ±12) that the weights encode.
# 2. chunk_units' lane-per-chunk parts (blocks past the row skipped) and
#    their in-order sum against the canonical order of q8_rows_dot, in IEEE
#    f32 (numpy float32; fmaf as the exactly rounded a·b + c): the same bits
#    for random rows of several widths, partial last chunks included, every
#    unit of the grid-stride covered once, and the scale load never past
#    the row's padding.
#
# Usage: python3 scripts/gpu/mxfp4_chunk_emulation.py   (needs numpy)
import random
import numpy as np
from fractions import Fraction

LO0, LO1, HI0, HI1 = 0x03020100, 0x0C080604, 0xFDFEFF00, 0xF4F8FAFC
Q8_CHUNK, ONE_MAX_COLS = 4, 4096


def prmt(a, b, sel):
    """PTX prmt.b32 (default mode): byte n of the result is byte
    (sel >> 4n) & 7 of the 8 bytes {b, a}; when bit 3 of that nibble is
    set, the selected byte's sign bit replicated."""
    src = (b << 32) | a
    r = 0
    for n in range(4):
        nib = (sel >> (4 * n)) & 0xF
        byte = (src >> (8 * (nib & 7))) & 0xFF
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        r |= byte << (8 * n)
    return r


def byte_perm(a, b, sel):
    """CUDA __byte_perm: selector nibbles masked to 3 bits."""
    return prmt(a, b, sel & 0x7777)


def mxfp4_word(h):  # q8dot.cu
    sel = h & 0x7777
    pos, neg = byte_perm(LO0, LO1, sel), byte_perm(HI0, HI1, sel)
    return byte_perm(pos, neg, ((h & 0x8888) >> 1) | 0x3210)


def mxfp4_words(w):  # q8chunk.cu
    sel = w & 0x77777777
    sgn = ((w >> 1) & 0x44444444) | 0x32103210
    lo = prmt(prmt(LO0, LO1, sel), prmt(HI0, HI1, sel), sgn)
    selh, sgnh = sel >> 16, sgn >> 16
    hi = prmt(prmt(LO0, LO1, selh), prmt(HI0, HI1, selh), sgnh)
    return lo, hi


E2M1_DOUBLED = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]


def check_decode():
    for h in range(1 << 16):
        want = mxfp4_word(h)
        table = [E2M1_DOUBLED[(h >> (4 * n)) & 0xF] & 0xFF for n in range(4)]
        assert want == sum(b << (8 * n) for n, b in enumerate(table)), hex(h)
        for other in (0, 0xFFFF, h ^ 0xA5A5):
            lo, _ = mxfp4_words(h | (other << 16))
            _, hi = mxfp4_words(other | (h << 16))
            assert lo == want and hi == want, (hex(h), hex(other))
    print("decode: mxfp4_words = mxfp4_word on both halves for all 65536 halves, = the e2m1 table")


f32 = np.float32


def fmaf(a, b, c):
    """Exactly rounded a·b + c in f32 (a, b, c f32)."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    r = f32(float(exact))  # nearest double, then nearest f32: exact here
    # (a·b + c of f32 inputs needs at most 48 + 24 bits; the double
    # rounding can only err on exact ties of the f32 grid, checked below)
    lo, hi = np.nextafter(r, f32(-np.inf)), np.nextafter(r, f32(np.inf))
    best = min((lo, r, hi), key=lambda v: (abs(Fraction(float(v)) - exact), int(np.float32(v).view(np.uint32)) & 1))
    return f32(best)


def canonical_row(sums, f):
    """q8_rows_dot's order: part per chunk (fmaf block by block from 0),
    total the parts added in order from 0."""
    nb = len(sums)
    acc = f32(0)
    for c0 in range(0, nb, Q8_CHUNK):
        part = f32(0)
        for b in range(c0, min(c0 + Q8_CHUNK, nb)):
            part = fmaf(f32(sums[b]), f[b], part)
        acc = f32(acc + part)
    return acc


def chunk_kernel(units, cols, sums, f, warps=3):
    """chunk_units: warp w takes units w, w + warps, …; lane c forms chunk
    c's part (blocks past the row skipped), and the parts are added in
    chunk order, each broadcast from its lane."""
    nb = cols // 32
    nc = (nb + Q8_CHUNK - 1) // Q8_CHUNK
    assert nc <= 32
    out, written = {}, []
    for w in range(warps):
        for u in range(w, units, warps):
            parts = []
            for lane in range(32):
                b0 = lane * Q8_CHUNK
                # the 32-bit scale load (only for a chunk in the row): bytes
                # nb*16 + b0 .. + 3 of a row padded to 16 bytes (layout.rs
                # device_row_bytes)
                row_bytes = -(-(nb * 17) // 16) * 16
                if b0 < nb:
                    assert nb * 16 + b0 + 4 <= row_bytes, (cols, lane)
                part = f32(0)
                for b in range(b0, b0 + Q8_CHUNK):
                    if b < nb:
                        part = fmaf(f32(sums[u][b]), f[u][b], part)
                parts.append(part)
            acc = f32(0)
            for c in range(nc):
                acc = f32(acc + parts[c])
            out[u] = acc
            written.append(u)
    assert sorted(written) == list(range(units))
    return out


def check_order():
    rng = random.Random(5)
    for cols in (32, 96, 128, 160, 2880, 2944, 4064, 4096):
        nb = cols // 32
        units = rng.choice([1, 7, 8, 9, 23])
        sums = [[rng.randint(-40000, 40000) for _ in range(nb)] for _ in range(units)]
        f = [[f32(rng.uniform(-1, 1) * 2.0 ** rng.randint(-20, 0)) * f32(rng.uniform(0, 0.05)) for _ in range(nb)] for _ in range(units)]
        got = chunk_kernel(units, cols, sums, f)
        for u in range(units):
            want = canonical_row(sums[u], f[u])
            assert got[u].view(np.uint32) == want.view(np.uint32), (cols, u, got[u], want)
    print("order: chunk_units = q8_rows_dot's canonical order bit for bit (widths 32 … 4096, partial chunks, 1–23 units)")


if __name__ == "__main__":
    check_decode()
    check_order()
