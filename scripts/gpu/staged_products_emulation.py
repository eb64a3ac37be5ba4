#!/usr/bin/env python3
# Checks, on the CPU, the address math of q8_rows_dot_staged
# (crates/cuda/src/kernels/q8dot.cu, transcribed here): the
# code and activation bytes lane l reads from shared memory for block j of
# its chunk must be those of block cb + j of the row, for every stretch,
# row width and both formats.
import random
def check(F, cols):
    CODE = 32 if F == "q8_0" else 16
    CHUNK = 4 * CODE; PITCH = CHUNK + 16; XP = 144; CH = 32
    PIECES = CH * CHUNK // 16 // 32
    nb = cols // 32; nchunks = (nb + 3) // 4
    row = [random.randrange(256) for _ in range(nb * CODE)]          # codes only
    xq = [random.randrange(256) for _ in range(nb * 32)]
    bad = 0
    for c0 in range(0, nchunks, CH):
        b0 = c0 * 4
        wsm = [None] * (CH * PITCH); xsm = [None] * (CH * XP)
        for lane in range(32):
            for k in range(PIECES):
                byte = (k * 32 + lane) * 16
                valid = b0 + byte // CODE < nb
                piece = row[b0 * CODE + byte: b0 * CODE + byte + 16] if valid else [0] * 16
                c, off = byte // CHUNK, byte % CHUNK
                for i in range(16): wsm[c * PITCH + off + i] = piece[i]
        for q in range(CH * 8):
            c, piece = q // 8, q % 8
            valid = b0 + c * 4 + piece // 2 < nb
            v = xq[b0 * 32 + q * 16: b0 * 32 + q * 16 + 16] if valid else [0] * 16
            for i in range(16): xsm[c * XP + piece * 16 + i] = v[i]
        for lane in range(32):
            cb = b0 + lane * 4
            for j in range(4):
                if cb + j >= nb: break
                b = cb + j
                wc = lane * PITCH + j * CODE
                got_w = wsm[wc: wc + CODE]
                got_x = xsm[lane * XP + j * 32: lane * XP + j * 32 + 32]
                if got_w != row[b * CODE:(b + 1) * CODE] or got_x != xq[b * 32:(b + 1) * 32]:
                    bad += 1
    return bad
random.seed(1)
res = {(F, cols): check(F, cols) for F in ("q8_0", "mxfp4") for cols in (32, 96, 2880, 4096, 4128, 8192, 14336)}
print(res)
print("all good" if not any(res.values()) else "MISMATCH")
