#!/usr/bin/env python3
"""Layouts of K-quant models too large to fetch, for `turbospark synth --like`.

The GPU's Q4_K / Q6_K products (kernels/kq.cu; TURBOSPARK_CUDA_KQ=tc for the tensor cores)
matter on models whose rows are multiples of 256 wide; the real models this
project can fetch (SmolLM2-135M, Gemma 3 270M, Qwen2.5-0.5B) are 576, 640 and
896 wide, so their GGUFs hold few K-quant tensors (llama.cpp falls back to
Q5_0/Q8_0 for the others). This writes the layouts of two common Q4_K_M
GGUFs' shapes, with every tensor in the format llama.cpp's Q4_K_M recipe
gives it (llama-quant.cpp: Q4_K throughout; Q6_K for the output head and for
attn_v and ffn_down in the layers `use_more_bits` picks):

  llama8b:   Llama-3-8B (32 layers, hidden 4096, 32 heads, 8 KV heads, ffn
             14336), from a llama-family layout (SmolLM2's, whose tokenizer
             it keeps: vocabulary 49152, not Llama 3's 128256);
  qwen3moe:  Qwen3-30B-A3B (48 layers, hidden 2048, 32 heads, 4 KV heads of
             128, 128 experts of 768, top 8, vocabulary 151936), from the
             qwen3_moe fixture's layout (no tokenizer: bench feeds token ids).

Usage: kquant_layouts.py LLAMA_LAYOUT QWEN3MOE_LAYOUT OUT_DIR [--layers N]
(layouts from `turbospark synth --like INSTALL --save-layout FILE`; --layers
cuts both models to N layers, for a quicker synth). `synth --like` checks
what it writes (shapes against the architecture, lengths, offsets).
"""

import copy
import json
import math
import sys

RESIDENT_ALIGN = 64
EXPERT_ALIGN = 4096
# (elements, bytes) of a block of each format.
BLOCKS = {"f32": (1, 4), "q8_0": (32, 34), "q4_k": (256, 144), "q6_k": (256, 210)}


def nbytes(dtype, shape):
    elems = math.prod(shape)
    per, size = BLOCKS[dtype]
    assert elems % per == 0, (dtype, shape)
    return elems // per * size


def align(n, a):
    return (n + a - 1) // a * a


def use_more_bits(i, n):
    """llama.cpp's choice of the layers whose attn_v / ffn_down get Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_format(name, layer, layers):
    if name.endswith("norm.weight") or name.endswith("ffn_gate_inp.weight"):
        return "f32"
    if name == "output.weight":
        return "q6_k"
    if name.endswith("attn_v.weight") or "ffn_down" in name:
        return "q6_k" if use_more_bits(layer, layers) else "q4_k"
    return "q4_k"


def shapes(a, suffix):
    h, hd, i = a["hidden_size"], a["head_dim"], a["intermediate_size"]
    q, kv = a["num_heads"] * hd, a["num_kv_heads"] * hd
    return {
        "attn_norm.weight": [h],
        "ffn_norm.weight": [h],
        "attn_q.weight": [q, h],
        "attn_k.weight": [kv, h],
        "attn_v.weight": [kv, h],
        "attn_output.weight": [h, q],
        "attn_q_norm.weight": [hd],
        "attn_k_norm.weight": [hd],
        "ffn_gate.weight": [i, h],
        "ffn_up.weight": [i, h],
        "ffn_down.weight": [h, i],
        "ffn_gate_inp.weight": [a["moe"]["num_experts"], h] if a.get("moe") else None,
    }[suffix]


def build(template, arch_changes, layers, moe_every_layer):
    out = copy.deepcopy(template)
    a = out["arch"]
    a.update(arch_changes)
    a["attention"]["scale"] = 1.0 / math.sqrt(a["head_dim"])
    layer0 = copy.deepcopy(a["layers"][0])
    layer0["head_dim"] = a["head_dim"]
    layer0["num_kv_heads"] = a["num_kv_heads"]
    layer0["rope"]["rotary_dim"] = a["head_dim"]
    if moe_every_layer:
        layer0["ffn"] = "moe"
    a["layers"] = [copy.deepcopy(layer0) for _ in range(layers)]
    # The template's tensors of layer 0 (for a MoE template: a MoE layer's)
    # name every layer's.
    moe_layer = next((l["layer"] for l in template["experts"]), 0)
    per_layer = [
        t["name"].split(".", 2)[2]
        for t in template["resident"]
        if t["name"].startswith(f"blk.{moe_layer}.")
    ]
    names = [("token_embd.weight", [a["vocab_size"], a["hidden_size"]], -1)]
    for layer in range(layers):
        for suffix in per_layer:
            names.append((f"blk.{layer}.{suffix}", shapes(a, suffix), layer))
    names.append(("output_norm.weight", [a["hidden_size"]], -1))
    if not a["head"]["tied"]:
        names.append(("output.weight", [a["vocab_size"], a["hidden_size"]], -1))
    resident, end = [], 0
    for name, shape, layer in names:
        dtype = tensor_format(name, layer, layers)
        offset = align(end, RESIDENT_ALIGN)
        length = nbytes(dtype, shape)
        resident.append({"name": name, "dtype": dtype, "shape": shape, "offset": offset, "length": length})
        end = offset + length
    out["resident"] = resident
    out["resident_bytes"] = end
    experts = []
    if a.get("moe"):
        m, h = a["moe"], a["hidden_size"]
        ei = m["expert_intermediate"]
        for layer in range(layers):
            parts, at = [], 0
            for part, shape in (("gate", [ei, h]), ("up", [ei, h]), ("down", [h, ei])):
                dtype = tensor_format(f"blk.{layer}.ffn_{part}_exps.weight", layer, layers)
                at = align(at, RESIDENT_ALIGN)
                length = nbytes(dtype, shape)
                parts.append({"name": part, "dtype": dtype, "shape": shape, "offset": at, "length": length})
                at += length
            experts.append({
                "layer": layer,
                "file": f"experts/{layer:03}.bin",
                "num_experts": m["num_experts"],
                "stride": align(at, EXPERT_ALIGN),
                "parts": parts,
            })
    out["experts"] = experts
    out["source"] = {"kind": "synthetic", "name": "kquant_layouts.py"}
    return out


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    layers = None
    if "--layers" in argv:
        layers = int(argv[argv.index("--layers") + 1])
        args.remove(str(layers))
    if len(args) != 3:
        sys.exit(__doc__)
    llama_t, qwen_t = (json.load(open(p)) for p in args[:2])
    out_dir = args[2]
    llama = build(llama_t, {
        "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128,
        "intermediate_size": 14336,
        "head": dict(llama_t["arch"]["head"], tied=False),
    }, layers or 32, False)
    qwen_moe = dict(qwen_t["arch"]["moe"], num_experts=128, top_k=8, expert_intermediate=768)
    qwen = build(qwen_t, {
        "hidden_size": 2048, "num_heads": 32, "num_kv_heads": 4, "head_dim": 128,
        "intermediate_size": 6144, "vocab_size": 151936, "moe": qwen_moe,
    }, layers or 48, True)
    for name, layout in (("llama8b-q4_k_m", llama), ("qwen3moe30b-q4_k_m", qwen)):
        path = f"{out_dir}/layout-{name}.json"
        with open(path, "w") as f:
            json.dump(layout, f)
        gib = (layout["resident_bytes"] + sum(e["num_experts"] * e["stride"] for e in layout["experts"])) / 2**30
        print(f"{path}: {len(layout['resident'])} resident tensors, {len(layout['experts'])} expert layers, {gib:.2f} GiB")


if __name__ == "__main__":
    main(sys.argv[1:])
