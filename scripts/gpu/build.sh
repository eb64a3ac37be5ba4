#!/usr/bin/env bash
# build.sh — builds, on this machine, what scripts/gpu/run.sh runs on the
# GPU machine: the release `turbospark` binary and the CUDA crate's test
# binaries, copied into OUT (default .devcarry/bin), plus the packed
# llama.cpp sources (.devcarry/llama.cpp-cuda.tgz) when missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-.devcarry/bin}
mkdir -p "$OUT"
cargo build --release -p turbospark-cli
cp target/release/turbospark "$OUT/"
for t in conformance kernels_compile; do
    exe=$(cargo test --release -p turbospark-cuda --test "$t" --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import sys, json
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable"): print(m["executable"])' | tail -1)
    cp "$exe" "$OUT/cuda-$t"
done
cargo build --release -p turbospark-cuda --example decode_products
cp target/release/examples/decode_products "$OUT/"
[ -f .devcarry/llama.cpp-cuda.tgz ] || scripts/gpu/pack-llamacpp.sh .devcarry/llama.cpp-cuda.tgz
ls -la "$OUT"
