#!/usr/bin/env bash
# make_cvector_reference.sh — a control vector written by llama.cpp's own
# llama-cvector-generator, and an independent reading of it, for
# crates/engine/tests/control_vector_llamacpp.rs.
#
# Usage: scripts/llamacpp/make_cvector_reference.sh
#
# 1. llama-cvector-generator (the cached sdist's llama.cpp, built by
#    build.sh) on SmolLM2-135M-Instruct Q4_1 with the four positive and four
#    negative prompts below, `--method mean`, 2 threads, writes
#    tests/reference/llamacpp/cvector/smollm2-mean.gguf;
# 2. the sdist's gguf-py (GGUFReader) reads that file back and writes
#    smollm2-mean.directions.npy (f32 [tensors, hidden], rows in the file's
#    tensor order) and smollm2-mean.json (each tensor's name, layer number
#    and shape, the metadata, the prompts and the llama.cpp build).
#
# Python: $CACHE/convert-venv (numpy) when present, else PYTHON (default
# python3) with numpy installed.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUTDIR="$REPO/tests/reference/llamacpp/cvector"
CACHE="${TURBOSPARK_CACHE:-$HOME/.cache/turbospark}"
NAME=smollm2-mean

LOG_TAG=make-cvector-reference
# shellcheck source=common.sh
source "$HERE/common.sh"
llamacpp_setup smollm2

model="${MODEL_PATH[smollm2]}"
gen="$(dirname "${TOOL[ref_logits]}")/llama-cvector-generator"
[[ -x "$gen" ]] || die "no llama-cvector-generator next to ref_logits (build.sh builds it)"
py="${PYTHON:-python3}"
[[ -x "$CACHE/convert-venv/bin/python" ]] && py="$CACHE/convert-venv/bin/python"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat > "$work/positive.txt" <<'P'
I am overjoyed, today is the happiest day of my life.
What a wonderful surprise, I feel so grateful and glad.
Everything went perfectly and I could not be more delighted.
The sun is shining and my heart is full of joy.
P
cat > "$work/negative.txt" <<'N'
I am devastated, today is the saddest day of my life.
What a terrible shock, I feel so bitter and miserable.
Everything went wrong and I could not be more disappointed.
The rain is falling and my heart is full of grief.
N

mkdir -p "$OUTDIR"
log "llama-cvector-generator on $(basename "$model")"
"$gen" -m "$model" --positive-file "$work/positive.txt" --negative-file "$work/negative.txt" \
  --method mean -t 2 -o "$OUTDIR/$NAME.gguf" > "$work/gen.log" 2>&1 \
  || { tail -20 "$work/gen.log" >&2; die "llama-cvector-generator failed"; }

PYTHONPATH="$LLAMA_SRC/gguf-py" "$py" - "$OUTDIR/$NAME.gguf" "$OUTDIR/$NAME" "$work" \
  "$SDIST_VERSION" "$COMMIT" "$(sha256sum "$model" | cut -d' ' -f1)" <<'PY'
import json, re, sys
import numpy as np
import gguf

path, stem, work, sdist, commit, model_sha = sys.argv[1:]
r = gguf.GGUFReader(path)

def field(name):
    f = r.fields.get(name)
    if f is None:
        return None
    v = f.parts[f.data[0]]
    return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else v.tolist()[0]

rows, tensors = [], []
for t in r.tensors:
    assert t.tensor_type == gguf.GGMLQuantizationType.F32, t.name
    m = re.fullmatch(r"direction\.(\d+)", t.name)
    assert m, t.name
    data = np.asarray(t.data, dtype=np.float32).reshape(-1)
    rows.append(data)
    tensors.append({"name": t.name, "layer": int(m.group(1)), "shape": [int(d) for d in t.shape]})
np.save(stem + ".directions.npy", np.stack(rows).astype("<f4"))
read = lambda f: [l for l in open(f"{work}/{f}").read().splitlines() if l]
json.dump({
    "generator": "llama-cvector-generator --method mean -t 2",
    "model": "smollm2-135m-instruct-q4_1.gguf",
    "model_sha256": model_sha,
    "llama_cpp": {"llama_cpp_python_sdist": sdist, "commit": commit},
    "reader": "gguf-py GGUFReader (the same sdist)",
    "metadata": {k: field(k) for k in ("general.architecture", "controlvector.model_hint", "controlvector.layer_count")},
    "tensors": tensors,
    "positive": read("positive.txt"),
    "negative": read("negative.txt"),
}, open(stem + ".json", "w"), indent=1)
print(f"{len(tensors)} directions of {len(rows[0])}", file=sys.stderr)
PY
ls -l "$OUTDIR"
