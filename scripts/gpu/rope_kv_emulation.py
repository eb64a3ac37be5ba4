#!/usr/bin/env python3
# Checks, on the CPU, the thread mapping of the fused rope + KV write kernel
# (crates/cuda/src/kernels/elementwise.cu `rope_kv`, transcribed here) against
# the separate rope and kv_write semantics on 300 random shapes (partial
# rotary dims, both rope kinds, ring wrap-around, threads in random order).
# Needs numpy. Usage: python3 scripts/gpu/rope_kv_emulation.py
import numpy as np, random
def run(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 5); hd = rng.choice([8, 12, 16]); pairs = rng.randint(1, hd // 2)
    kind = rng.choice([0, 1]); hq = rng.randint(1, 6); hk = rng.randint(1, 3)
    cap = rng.randint(n, 12); fp = rng.randint(0, 30)
    inv = np.array([rng.random() for _ in range(pairs)], np.float32)
    q = np.random.default_rng(seed).standard_normal(n * hq * hd).astype(np.float32)
    k = np.random.default_rng(seed + 1).standard_normal(n * hk * hd).astype(np.float32)
    v = np.random.default_rng(seed + 2).standard_normal(n * hk * hd).astype(np.float32)
    def rot(x, heads, t, h, pair):
        base = (t * heads + h) * hd
        a = pair if kind == 0 else 2 * pair; b = pair + pairs if kind == 0 else 2 * pair + 1
        ang = np.float32(fp + t) * inv[pair]
        c, s = np.float32(np.cos(float(ang))), np.float32(np.sin(float(ang)))
        xa, xb = x[base + a], x[base + b]
        return base + a, base + b, np.float32(xa * c - xb * s), np.float32(xb * c + xa * s)
    # reference
    rq, rk = q.copy(), k.copy()
    for x, heads in ((rq, hq), (rk, hk)):
        for t in range(n):
            for h in range(heads):
                for pr in range(pairs):
                    ia, ib, ra, rb = rot(x, heads, t, h, pr)
                    x[ia], x[ib] = ra, rb
    row = hk * hd
    ck = np.full(cap * row, np.nan, np.float32); cv = ck.copy()
    refk, refv = ck.copy(), cv.copy()
    for t in range(n):
        for c in range(row):
            refk[((fp + t) % cap) * row + c] = rk[t * row + c]
            refv[((fp + t) % cap) * row + c] = v[t * row + c]
    # fused mapping, transcribed
    fq, fk = q.copy(), k.copy()
    xs = [fq, fk]; heads = [hq, hk]; caches = [ck, cv]; srcs = [fk, v]; roped = [1, -1]
    rowl = [row, row]; n_w = 2; tail = hd - 2 * pairs
    w_of = [(0 if roped[0] == i else 1 if roped[1] == i else -1) for i in range(2)]
    pairs0 = n * heads[0] * pairs; pairs1 = n * heads[1] * pairs
    tail0 = n * (rowl[0] // hd) * tail if roped[0] >= 0 else 0
    tail1 = n * (rowl[1] // hd) * tail if roped[1] >= 0 else 0
    plain0 = n * rowl[0] if roped[0] < 0 else 0
    plain1 = n * rowl[1] if roped[1] < 0 else 0
    total = pairs0 + pairs1 + tail0 + tail1 + plain0 + plain1
    order = list(range(total)); rng.shuffle(order)  # any thread order
    # rotations read then write their own pair only; emulate reads of the
    # original values by doing rotations first per pair atomically
    for g in order:
        i = g
        if i < pairs0 + pairs1:
            second = i >= pairs0
            if second: i -= pairs0
            hh = heads[1] if second else heads[0]; x = xs[1] if second else xs[0]
            w = w_of[1] if second else w_of[0]
            pr = i % pairs; th = i // pairs; t = th // hh; h = th % hh
            ia, ib, ra, rb = rot(x, hh, t, h, pr)
            x[ia], x[ib] = ra, rb
            if w >= 0:
                rr = ((fp + t) % cap) * rowl[w] + h * hd
                a = ia - (t * hh + h) * hd; b = ib - (t * hh + h) * hd
                caches[w][rr + a] = ra; caches[w][rr + b] = rb
            continue
        i -= pairs0 + pairs1
        tailed = i < tail0 + tail1
        if tailed:
            w = 0 if i < tail0 else 1
            if w: i -= tail0
        else:
            i -= tail0 + tail1
            w = 0 if i < plain0 else 1
            if w: i -= plain0
        rl = rowl[w]
        if tailed:
            hh = rl // hd
            t = i // (hh * tail); rest = i % (hh * tail)
            c = (rest // tail) * hd + 2 * pairs + rest % tail
        else:
            t = i // rl; c = i % rl
        caches[w][((fp + t) % cap) * rl + c] = srcs[w][t * rl + c]
    ok = (np.array_equal(fq, rq) and np.array_equal(fk, rk)
          and np.array_equal(ck, refk, equal_nan=True) and np.array_equal(cv, refv, equal_nan=True))
    return ok, (n, hd, pairs, kind, hq, hk, cap, fp)
bad = [r for r in (run(s) for s in range(300)) if not r[0]]
print("mismatches:", len(bad), bad[:3])
