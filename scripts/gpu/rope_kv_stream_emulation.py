#!/usr/bin/env python3
# Stream-level CPU emulation of the held rope / kv_write fusion:
# transcribes crates/cuda/src/fusion.rs (RopeKvLaunch::rope, join_rope,
# join_write), crates/cuda/src/stream.rs (rope, kv_write: hold / join /
# flush) and the rope_kv kernel (elementwise.cu) thread by thread, records
# each thread's reads and writes to check that no two threads of a launch
# touch one address where one writes, and compares the memory after a
# sequence of calls with the separate rope and kv_write semantics.
# Needs numpy. Usage: python3 scripts/gpu/rope_kv_stream_emulation.py [--as-before]
# (--as-before: join_write without the conditions that keep each address
# to one thread, as the branch first had them: the "double" cases then
# mismatch and the "samecache" and "overlap" launches race.)
import numpy as np, random, sys

ROPE_KV_MAX = 2

class Launch:
    def __init__(s, x, heads, n, hd, fp, p, step):
        s.x = [x, 0]; s.heads = [heads, 0]; s.n_x = 1; s.n_w = 0
        s.cache = [0, 0]; s.src = [0, 0]; s.row_len = [0, 0]; s.cap = [0, 0]
        s.f16 = [0, 0]; s.roped = [0, 0]
        s.n = n; s.hd = hd; s.fp = fp; s.p = p; s.step = step
    def copy(s):
        c = Launch.__new__(Launch); c.__dict__ = {k: (list(v) if isinstance(v, list) else v) for k, v in s.__dict__.items()}; return c
    def join_rope(s, o):
        fits = (s.n_x == 1 and s.n_w == 0 and o.n_x == 1 and (o.n, o.hd, o.fp) == (s.n, s.hd, s.fp)
                and o.step == s.step and o.p == s.p and o.x[0] != s.x[0]
                and (not FIXED or not meet((o.x[0], o.n * o.heads[0] * o.hd), (s.x[0], s.n * s.heads[0] * s.hd))))
        if fits:
            s.x[1] = o.x[0]; s.heads[1] = o.heads[0]; s.n_x = 2
        return fits
    def join_write(s, cache, f16, src, n, row_len, fp, cap, step, fixed):
        w = s.n_w
        if w >= ROPE_KV_MAX or (n, fp) != (s.n, s.fp) or step != s.step:
            return False
        roped = next((i for i in range(s.n_x) if s.x[i] == src), None)
        if roped is not None and row_len != s.heads[roped] * s.hd:
            return False
        if fixed and not fixed_ok(s, cache, src, n, row_len, cap, roped):
            return False
        s.cache[w] = cache; s.src[w] = src; s.row_len[w] = row_len; s.cap[w] = cap
        s.f16[w] = int(f16); s.roped[w] = -1 if roped is None else roped; s.n_w += 1
        return True

def meet(a, b):
    return a[1] > 0 and b[1] > 0 and a[0] < b[0] + b[1] and b[0] < a[0] + a[1]

def fixed_ok(s, cache, src, n, row_len, cap, roped):
    # join_write's conditions that keep every address to one thread
    # (element units here, bytes in fusion.rs)
    if roped is not None and any(s.roped[w] == roped for w in range(s.n_w)):
        return False
    xs = [(s.x[i], s.n * s.heads[i] * s.hd) for i in range(s.n_x)]
    caches = [(s.cache[w], s.cap[w] * s.row_len[w]) for w in range(s.n_w)]
    srcs = [(s.src[w], s.n * s.row_len[w]) for w in range(s.n_w)]
    if any(meet((cache, cap * row_len), o) for o in xs + caches + srcs):
        return False
    if roped is None and any(meet((src, n * row_len), o) for o in xs + caches):
        return False
    return True

def f16r(v):
    return np.float32(np.float16(v))

def rot_vals(xa, xb, pos, inv, af):
    ang = np.float32(np.float32(pos) * np.float32(inv))
    c = np.float32(np.cos(float(ang)) * float(af)); s_ = np.float32(np.sin(float(ang)) * float(af))
    ra = np.float32(np.float32(xa * c) - np.float32(xb * s_))
    rb = np.float32(np.float32(xb * c) + np.float32(xa * s_))
    return ra, rb

def run_kernel(mem, L):
    """The rope_kv kernel, thread by thread; returns race list."""
    p = L.p; inv, af, pairs, kind = p
    n, hd, fp = L.n, L.hd, L.fp; tail = hd - 2 * pairs
    r = L
    w_of0 = 0 if r.n_w > 0 and r.roped[0] == 0 else 1 if r.n_w > 1 and r.roped[1] == 0 else -1
    w_of1 = 0 if r.n_w > 0 and r.roped[0] == 1 else 1 if r.n_w > 1 and r.roped[1] == 1 else -1
    pairs0 = n * r.heads[0] * pairs
    pairs1 = n * r.heads[1] * pairs if r.n_x > 1 else 0
    tail0 = n * (r.row_len[0] // hd) * tail if r.n_w > 0 and r.roped[0] >= 0 else 0
    tail1 = n * (r.row_len[1] // hd) * tail if r.n_w > 1 and r.roped[1] >= 0 else 0
    plain0 = n * r.row_len[0] if r.n_w > 0 and r.roped[0] < 0 else 0
    plain1 = n * r.row_len[1] if r.n_w > 1 and r.roped[1] < 0 else 0
    total = pairs0 + pairs1 + tail0 + tail1 + plain0 + plain1
    reads, writes, effects = [], [], []
    for g in range(total):
        rd, wr, eff = set(), set(), []
        i = g
        if i < pairs0 + pairs1:
            second = i >= pairs0
            if second: i -= pairs0
            heads = r.heads[1] if second else r.heads[0]
            x = r.x[1] if second else r.x[0]
            w = w_of1 if second else w_of0
            pair = i % pairs; th = i // pairs; t = th // heads; h = th % heads
            head = x + th * hd
            a = pair if kind == 0 else 2 * pair; b = pair + pairs if kind == 0 else 2 * pair + 1
            rd |= {head + a, head + b}
            def f(mem, head=head, a=a, b=b, t=t, h=h, w=w, pair=pair):
                ra, rb = rot_vals(mem[head + a], mem[head + b], fp + t, inv[pair], af)
                out = [(head + a, ra), (head + b, rb)]
                if w >= 0:
                    row = ((fp + t) % r.cap[w]) * r.row_len[w] + h * hd
                    cv = (lambda v: f16r(v)) if r.f16[w] else (lambda v: v)
                    out += [(r.cache[w] + row + a, cv(ra)), (r.cache[w] + row + b, cv(rb))]
                return out
            wr |= {head + a, head + b}
            if w >= 0:
                row = ((fp + t) % r.cap[w]) * r.row_len[w] + h * hd
                wr |= {r.cache[w] + row + a, r.cache[w] + row + b}
            reads.append(rd); writes.append(wr); effects.append(f)
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
        row_len = r.row_len[w]; cap = r.cap[w]
        if tailed:
            heads = row_len // hd
            t = i // (heads * tail); rest = i % (heads * tail)
            c = (rest // tail) * hd + 2 * pairs + rest % tail
        else:
            t = i // row_len; c = i % row_len
        s_at = r.src[w] + t * row_len + c
        d_at = r.cache[w] + ((fp + t) % cap) * row_len + c
        rd.add(s_at); wr.add(d_at)
        cv = (lambda v: f16r(v)) if r.f16[w] else (lambda v: v)
        effects.append(lambda mem, s_at=s_at, d_at=d_at, cv=cv: [(d_at, cv(mem[s_at]))])
        reads.append(rd); writes.append(wr)
    # races: an address written by one thread and touched by another
    owner = {}
    races = 0
    for tid, wr in enumerate(writes):
        for a in wr:
            if a in owner and owner[a] != tid: races += 1
            owner[a] = tid
    for tid, rd in enumerate(reads):
        for a in rd:
            if a in owner and owner[a] != tid: races += 1
    # execute: all reads of a thread then its writes, threads in order
    for f in effects:
        for at, v in f(mem):
            mem[at] = v
    return races

class Stream:
    def __init__(s, mem, fixed):
        s.mem = mem; s.pending = None; s.races = 0; s.launches = 0; s.fixed = fixed
    def flush(s):
        if s.pending is not None:
            s.races += run_kernel(s.mem, s.pending); s.launches += 1
            s.pending = None
    def rope(s, x, n, heads, hd, fp, p):
        l = Launch(x, heads, n, hd, fp, p, 0)
        if s.pending is not None:
            held = s.pending.copy()
            if held.join_rope(l):
                s.pending = held; return
        s.flush(); s.pending = l
    def kv_write(s, cache, f16, src, n, row_len, fp, cap):
        if s.pending is not None:
            held = s.pending.copy()
            if held.join_write(cache, f16, src, n, row_len, fp, cap, 0, s.fixed):
                s.pending = held; return
        s.flush()
        ref_kv_write(s.mem, cache, f16, src, n, row_len, fp, cap); s.launches += 1

def ref_rope(mem, x, n, heads, hd, fp, p):
    inv, af, pairs, kind = p
    for t in range(n):
        for h in range(heads):
            head = x + (t * heads + h) * hd
            for pair in range(pairs):
                a = pair if kind == 0 else 2 * pair; b = pair + pairs if kind == 0 else 2 * pair + 1
                mem[head + a], mem[head + b] = rot_vals(mem[head + a], mem[head + b], fp + t, inv[pair], af)

def ref_kv_write(mem, cache, f16, src, n, row_len, fp, cap):
    for t in range(n):
        for c in range(row_len):
            v = mem[src + t * row_len + c]
            mem[cache + ((fp + t) % cap) * row_len + c] = f16r(v) if f16 else v

class Ref:
    def __init__(s, mem): s.mem = mem
    def flush(s): pass
    def rope(s, *a): ref_rope(s.mem, *a)
    def kv_write(s, *a): ref_kv_write(s.mem, *a)

def scenario(seed, fixed):
    rng = random.Random(seed)
    n = rng.randint(1, 4); hd = rng.choice([4, 8, 12, 16, 18])
    pairs = rng.randint(0, hd // 2); kind = rng.choice([0, 1])
    hq = rng.randint(1, 5); hk = rng.randint(1, 3)
    cap = rng.randint(n, 9); fp = rng.randint(0, 40)
    inv = tuple(float(np.float32(rng.random())) for _ in range(pairs))
    af = float(np.float32(rng.choice([1.0, 1.0, 0.75, 1.3])))
    p = (inv, af, pairs, kind)
    # memory: q, k, v, kc, vc, spare, with gaps
    size = 0; bufs = {}
    def alloc(name, ln):
        nonlocal size; bufs[name] = size; size += ln + 7
    alloc("q", n * hq * hd); alloc("k", n * hk * hd); alloc("v", n * hk * hd)
    alloc("kc", cap * hk * hd); alloc("vc", cap * hk * hd); alloc("c2", cap * hq * hd)
    kind_s = rng.choice(["engine", "engine", "latent", "norope", "ropeonly", "qwrite",
                         "kvfirst", "double", "samecache", "overlap", "wider"])
    f16 = rng.random() < 0.5
    q, k, v, kc, vc, c2 = (bufs[x] for x in ("q", "k", "v", "kc", "vc", "c2"))
    row = hk * hd
    if kind_s == "engine":
        ops = [("rope", q, n, hq, hd, fp, p), ("rope", k, n, hk, hd, fp, p),
               ("kv", kc, f16, k, n, row, fp, cap), ("kv", vc, f16, v, n, row, fp, cap)]
    elif kind_s == "latent":
        ops = [("rope", q, n, hq, hd, fp, p), ("rope", k, n, 1, hd, fp, p),
               ("kv", kc, f16, k, n, hd, fp, cap)]
    elif kind_s == "norope":
        ops = [("kv", kc, f16, k, n, row, fp, cap), ("kv", vc, f16, v, n, row, fp, cap)]
    elif kind_s == "ropeonly":
        ops = [("rope", q, n, hq, hd, fp, p)]
    elif kind_s == "qwrite":   # a roped tensor in write slot 0 from x[0]
        ops = [("rope", q, n, hq, hd, fp, p), ("rope", k, n, hk, hd, fp, p),
               ("kv", vc, f16, v, n, row, fp, cap), ("kv", c2, f16, q, n, hq * hd, fp, cap)]
    elif kind_s == "kvfirst":  # a write before the second rope
        ops = [("rope", q, n, hq, hd, fp, p), ("kv", kc, f16, k, n, row, fp, cap),
               ("rope", k, n, hk, hd, fp, p), ("kv", vc, f16, k, n, row, fp, cap)]
    elif kind_s == "double":   # one roped tensor into two caches
        ops = [("rope", q, n, hq, hd, fp, p), ("rope", k, n, hk, hd, fp, p),
               ("kv", kc, f16, k, n, row, fp, cap), ("kv", vc, f16, k, n, row, fp, cap)]
    elif kind_s == "samecache":  # two writes into one cache (the second wins)
        ops = [("rope", q, n, hq, hd, fp, p), ("rope", k, n, hk, hd, fp, p),
               ("kv", kc, f16, k, n, row, fp, cap), ("kv", kc, f16, v, n, row, fp, cap)]
    elif kind_s == "overlap":  # a plain write of part of a roped tensor
        ops = [("rope", q, n, hq, hd, fp, p), ("rope", k, n, hk, hd, fp, p),
               ("kv", kc, f16, k + hd, n, row - hd if hk > 1 else row, fp, cap)]
        if hk == 1:
            ops[-1] = ("kv", kc, f16, q + hd, n, row, fp, cap)
    else:  # a roped tensor written with another row width
        ops = [("rope", q, n, hq, hd, fp, p), ("rope", k, n, hk, hd, fp, p),
               ("kv", c2, f16, k, n, hd, fp, cap)]
    init = np.random.default_rng(seed).standard_normal(size).astype(np.float32)
    m1, m2 = init.copy(), init.copy()
    st, rf = Stream(m1, fixed), Ref(m2)
    for o in ops:
        for s_ in (st, rf):
            if o[0] == "rope": s_.rope(*o[1:])
            else: s_.kv_write(*o[1:])
    st.flush()
    same = np.array_equal(m1, m2, equal_nan=True)
    return kind_s, same, st.races, st.launches

fixed = "--as-before" not in sys.argv
FIXED = fixed
res = {}
for seed in range(1500):
    ks, same, races, launches = scenario(seed, fixed)
    r = res.setdefault(ks, [0, 0, 0, 0])
    r[0] += 1; r[1] += (not same); r[2] += (races > 0); r[3] += launches
for ks, (cnt, bad, racy, launches) in sorted(res.items()):
    print(f"{ks:10} cases {cnt:4}  mismatches {bad:4}  racy launches {racy:4}  launches/case {launches / cnt:.2f}")
