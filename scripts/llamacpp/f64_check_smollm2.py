#!/usr/bin/env python3
"""Independent float64 forward pass of SmolLM2 (llama arch) from the dequantized
GGUF weights, teacher-forced on a reference's prompt + greedy ids, compared with
the llama.cpp reference (tests/reference/llamacpp/smollm2.greedy.json).

Purpose: a sanity check of the reference and a measure of how far llama.cpp's
CPU numerics are from exact math on the same (dequantized) weights.

  PYTHONPATH=$CACHE/llama-cpp-python/vendor/llama.cpp/gguf-py \
    python3 scripts/llamacpp/f64_check_smollm2.py MODEL.gguf REF.json [--emulate-q8]

--emulate-q8: additionally round every matmul input to Q8 blocks of 32 (int8,
fp16 scale, like llama.cpp's vec_dot_type Q8_0/Q8_1) and Q/K/V/softmax to fp16,
a rough emulation of llama.cpp's CPU path (not bit-exact).

Needs numpy and the gguf package (llama.cpp's gguf-py works; it needs pyyaml).
"""
import json
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

args = [a for a in sys.argv[1:] if not a.startswith("--")]
EMU = "--emulate-q8" in sys.argv
if len(args) != 2:
    sys.exit(__doc__)
model_path, ref_path = args

reader = GGUFReader(model_path)
tensors = {t.name: t for t in reader.tensors}


def field(key):
    return reader.fields[key].contents()


def weight(name):
    t = tensors[name]
    a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64)
    return a.reshape([int(x) for x in reversed(t.shape)])  # [rows(out), cols(in)]


def f16(a):
    return a.astype(np.float16).astype(np.float64) if EMU else a


def q8(x):
    if not EMU:
        return x
    b = x.reshape(-1, 32).astype(np.float32)
    d = np.abs(b).max(-1, keepdims=True) / np.float32(127)
    inv = np.where(d > 0, 1 / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.round(b * inv)
    return (q * d.astype(np.float16).astype(np.float64)).reshape(x.shape)


def mm(h, w):
    return q8(h) @ w.T


arch = field("general.architecture")
assert arch == "llama", arch
n_layer = field("llama.block_count")
n_embd = field("llama.embedding_length")
n_head = field("llama.attention.head_count")
n_kv = field("llama.attention.head_count_kv")
eps = field("llama.attention.layer_norm_rms_epsilon")
base = field("llama.rope.freq_base")
hd = n_embd // n_head

ref = json.load(open(ref_path))
toks = ref["prompt_ids"] + ref["greedy_ids"]
n = len(toks)
emb = weight("token_embd.weight")
out_w = weight("output.weight") if "output.weight" in tensors else emb
x = emb[toks]


def rms(v, w):
    return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w


inv_freq = base ** (-np.arange(0, hd, 2) / hd)
ang = np.arange(n)[:, None] * inv_freq[None, :]
cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]


def rope(v):  # llama.cpp rope type 0 (NORM): rotate adjacent pairs (GGUF Q/K are permuted for this)
    a, b = v[..., 0::2], v[..., 1::2]
    o = np.empty_like(v)
    o[..., 0::2] = a * cos - b * sin
    o[..., 1::2] = a * sin + b * cos
    return o


mask = np.triu(np.full((n, n), -np.inf), 1)
for il in range(n_layer):
    p = f"blk.{il}."
    h = rms(x, weight(p + "attn_norm.weight"))
    q = mm(h, weight(p + "attn_q.weight")).reshape(n, n_head, hd)
    k = mm(h, weight(p + "attn_k.weight")).reshape(n, n_kv, hd)
    v = mm(h, weight(p + "attn_v.weight")).reshape(n, n_kv, hd)
    q, k, v = f16(rope(q)), f16(rope(k)), f16(v)
    k = np.repeat(k, n_head // n_kv, axis=1)
    v = np.repeat(v, n_head // n_kv, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
    s = np.exp(s - s.max(-1, keepdims=True))
    s = f16(s / s.sum(-1, keepdims=True))
    o = np.einsum("hqk,khd->qhd", s, v).reshape(n, n_head * hd)
    x = x + mm(o, weight(p + "attn_output.weight"))
    h = rms(x, weight(p + "ffn_norm.weight"))
    g = mm(h, weight(p + "ffn_gate.weight"))
    u = mm(h, weight(p + "ffn_up.weight"))
    x = x + mm(g / (1 + np.exp(-g)) * u, weight(p + "ffn_down.weight"))

logits = mm(rms(x, weight("output_norm.weight")), out_w)
lp = logits - logits.max(-1, keepdims=True)
lp -= np.log(np.exp(lp).sum(-1, keepdims=True))

n_p = len(ref["prompt_ids"])
agree = 0
worst = 0.0
for i, st in enumerate(ref["steps"]):
    row = lp[n_p - 1 + i]
    srt = np.sort(row)
    am = int(row.argmax())
    agree += am == st["argmax"]
    d = max(abs(row[t] - l) for t, l in st["top"][:10])
    worst = max(worst, d)
    print(f"step {i:2d}: argmax f64 {am:6d} llama.cpp {st['argmax']:6d}  "
          f"max|dlogprob| over llama.cpp top-10 {d:.3e}  f64 top1-top2 gap {srt[-1] - srt[-2]:.3f}")
print(f"argmax agreement {agree}/{len(ref['steps'])}, worst top-10 |dlogprob| {worst:.3e}"
      f"{' (emulate-q8)' if EMU else ''}")
