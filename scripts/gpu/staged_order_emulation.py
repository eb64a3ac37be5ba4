#!/usr/bin/env python3
# The f32 operations of q8_rows_dot<F,1,R> (shuffles) and
# q8_rows_dot_staged<F,R> (shared memory), both transcribed lane by lane
# from crates/cuda/src/kernels/q8dot.cu, as expression trees: the two must
# build the same tree (same sums in the same order, so the same bits) for
# every row width; the staged one's shared memory must hold, where lane l
# reads block j of its chunk, exactly that block's code and activation
# bytes; and no global read may fall past a row's codes, its scales or the
# activations. Usage: python3 scripts/gpu/staged_order_emulation.py
Q8_CHUNK = 4

def shuffle_version(F, nb, R=1):
    P = 2 if F == "q8_0" else 1
    BLOCKS = 32 // P; CHUNK_LANES = Q8_CHUNK * P; CHUNKS = 32 // CHUNK_LANES
    UNROLL = 8 if F == "q8_0" and R <= 4 else 4
    stretches = (nb + BLOCKS - 1) // BLOCKS
    acc = [0.0] * R
    for s0 in range(0, stretches, UNROLL):
        for i in range(UNROLL):
            first = (s0 + i) * BLOCKS
            if first >= nb: break
            lanes = []
            for lane in range(32):
                b = first + lane // P; valid = b < nb
                lanes.append(dict(sum=("int", b) if valid else 0, dw=("dw", b) if valid else 0.0,
                                  dx=("dx", b) if valid else 0.0))
            parts = []
            for lane in range(32):
                base = lane & ~(CHUNK_LANES - 1); part = 0.0
                for u in range(Q8_CHUNK):
                    src = base + u * P
                    if first + src // P < nb:
                        L = lanes[src]
                        part = ("fma", L["sum"], ("mul", L["dw"], L["dx"]), part)
                parts.append(part)
            for j in range(CHUNKS):
                if first + j * Q8_CHUNK >= nb: break
                for r in range(R): acc[r] = ("add", acc[r], parts[j * CHUNK_LANES])
    return acc

def staged_version(F, nb, R=1):
    CODE = 32 if F == "q8_0" else 16
    CHUNK = Q8_CHUNK * CODE; PITCH = CHUNK + 16; XP = 144; CH = 32
    PIECES = CH * CHUNK // 16 // 32
    nchunks = (nb + Q8_CHUNK - 1) // Q8_CHUNK
    oob = []
    acc = [0.0] * R
    for c0 in range(0, nchunks, CH):
        b0 = c0 * Q8_CHUNK
        wsm = [None] * (CH * PITCH); xsm = [None] * (CH * XP)
        for lane in range(32):
            for k in range(PIECES):
                byte = (k * 32 + lane) * 16
                valid = b0 + byte // CODE < nb
                g = b0 * CODE + byte
                if valid and g + 16 > nb * CODE: oob.append(("w", g))
                piece = [("w", (g + i) // CODE, (g + i) % CODE) for i in range(16)] if valid else [0] * 16
                c, off = byte // CHUNK, byte % CHUNK
                for i in range(16): wsm[c * PITCH + off + i] = piece[i]
        for q in range(CH * 8):
            c, piece = q // 8, q % 8
            valid = b0 + c * Q8_CHUNK + piece // 2 < nb
            g = b0 * 32 + q * 16
            if valid and g + 16 > nb * 32: oob.append(("x", g))
            v = [("x", (g + i) // 32, (g + i) % 32) for i in range(16)] if valid else [0] * 16
            for i in range(16): xsm[c * XP + piece * 16 + i] = v[i]
        parts = []
        for lane in range(32):
            cb = b0 + lane * Q8_CHUNK
            part = 0.0
            for j in range(Q8_CHUNK):
                if cb + j >= nb: break
                b = cb + j
                wbytes = wsm[lane * PITCH + j * CODE: lane * PITCH + j * CODE + CODE]
                xbytes = xsm[lane * XP + j * 32: lane * XP + j * 32 + 32]
                if wbytes != [("w", b, i) for i in range(CODE)] or xbytes != [("x", b, i) for i in range(32)]:
                    return None, ["smem content of block %d" % b]
                part = ("fma", ("int", b), ("mul", ("dw", b), ("dx", b)), part)
            parts.append(part)
        n = min(CH, nchunks - c0)
        for r in range(R):
            for c in range(n): acc[r] = ("add", acc[r], parts[c])
    return acc, oob

bad = 0
for F in ("q8_0", "mxfp4"):
    for nb in list(range(1, 400)) + [90, 128, 2880 // 32, 4096 // 32, 14336 // 32, 8192 // 32, 1000, 1024, 1025]:
        for R in (1, 2):
            a = shuffle_version(F, nb, R); b, oob = staged_version(F, nb, R)
            if b is None or a != b or oob:
                bad += 1
                if bad < 5: print("MISMATCH", F, nb, R, oob[:3])
print("staged order/content/bounds:", "all good" if not bad else f"{bad} bad")
