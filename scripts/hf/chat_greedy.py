#!/usr/bin/env python3
"""Greedy answer of HF transformers to a chat-templated prompt, as a test
reference for `turbospark run --numerics exact`.

transformers loads the GGUF (dequantizing every tensor to f32) and runs its
own PyTorch implementation of the architecture with eager attention; the
prompt ids are taken from the llama.cpp reference JSON
(scripts/llamacpp/make_chat_reference.sh), so both references start from the
same templated prompt. Greedy decoding (`do_sample=False`) stops at the
model's end-of-generation token or after N new tokens.

Usage (needs torch, transformers, gguf; e.g. the venv of
scripts/fixtures/make_tiny.py):
  python scripts/hf/chat_greedy.py MODEL.gguf LLAMACPP_REF.json OUT.json [N]
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    gguf, ref_path, out_path = sys.argv[1:4]
    n_new = int(sys.argv[4]) if len(sys.argv) > 4 else 32
    ref = json.load(open(ref_path))
    folder, name = os.path.split(os.path.abspath(gguf))
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, torch_dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ids = torch.tensor([ref["prompt_ids"]])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, -1].double(), -1)
        top = torch.topk(logp, 8)
        out = model.generate(ids, max_new_tokens=n_new, do_sample=False)
    new = out[0, ids.shape[1]:].tolist()
    result = {
        "tool": "scripts/hf/chat_greedy.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model_file": name,
        "model_sha256": ref.get("model_sha256"),
        "dtype": "float32 (GGUF tensors dequantized by transformers)",
        "attention": "eager",
        "prompt_source": os.path.basename(ref_path),
        "prompt_ids": ref["prompt_ids"],
        "max_new_tokens": n_new,
        "greedy_ids": new,
        "greedy_text": tok.decode(new),
        "first_step_top": [[int(i), float(v)] for v, i in zip(top.values, top.indices)],
    }
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"{name}: {new} {result['greedy_text']!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
