#!/usr/bin/env python3
"""Teacher-forced logits of a real GGUF model from HF transformers, as an
independent f32 reference for `turbospark logits`.

transformers loads the GGUF itself (dequantizing every tensor to f32 and
undoing llama.cpp's q/k row permutation), then runs its own modeling file
with eager attention. The token sequence is the prompt plus llama.cpp's
greedy tokens from tests/reference/llamacpp/<name>.greedy.json, the same
sequence crates/cli/tests/llamacpp_parity.rs teacher-forces.

Needs: torch, transformers==5.24.0, gguf (pip). Usage:

    python scripts/reference/hf_gguf_logits.py smollm2 OUT.npy [OURS.npy]

With OURS.npy (from `turbospark logits --model INSTALL --tokens ...` on the
same tokens) it prints max|ours - hf| / max|hf| over positions and the
argmax agreement.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    name, out = sys.argv[1], sys.argv[2]
    ref = json.loads((REPO / "tests/reference/llamacpp" / f"{name}.greedy.json").read_text())
    cache = Path(os.environ.get("TURBOSPARK_CACHE", Path.home() / ".cache/turbospark"))
    tokens = ref["prompt_ids"] + ref["greedy_ids"][:-1]
    model = AutoModelForCausalLM.from_pretrained(
        str(cache / "models"),
        gguf_file=ref["model_file"],
        torch_dtype=torch.float32,
        attn_implementation="eager",
    ).eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].numpy().astype(np.float32)
    np.save(out, logits)
    print(f"{name}: tokens {','.join(map(str, tokens))}")
    if len(sys.argv) > 3:
        ours = np.load(sys.argv[3])
        rel = np.abs(ours - logits).max(axis=1) / np.abs(logits).max(axis=1)
        agree = (ours.argmax(axis=1) == logits.argmax(axis=1)).mean()
        print(f"{name}: max rel error {rel.max():.3e}, argmax agreement {agree:.3f}")


if __name__ == "__main__":
    main()
