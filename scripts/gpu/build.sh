#!/usr/bin/env bash
# build.sh — builds, on this machine, what scripts/gpu/run.sh runs on the
# GPU machine: the release `turbospark` binary and the CUDA crate's test
# binaries, copied into OUT (default .devcarry/bin), the sm_90 kernels
# compiled into .devcarry/cache (when NVRTC is here), the kernel tracer
# (kernel_trace.so and its libcupti.so.13), plus the packed
# llama.cpp sources (.devcarry/llama.cpp-cuda.tgz) when missing, the
# cached real models' layouts (.devcarry/layout-*.json) and Q4_K_M layouts
# of larger models made from them (.devcarry/kquant); all of it but
# llama.cpp packed into .devcarry/pack.tgz, which is what a device call
# carries (the repository's tracked files already take about 30 of a
# call's 64 MiB; run.sh unpacks it): carry [".devcarry/pack.tgz"], or
# also ".devcarry/llama.cpp-cuda.tgz" when the call builds llama.cpp.
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
cargo build --release -p turbospark-cuda --example decode_products --example stage_sync \
    --example kernel_cache
cp target/release/examples/decode_products target/release/examples/stage_sync \
    target/release/examples/kernel_cache "$OUT/"
# The sm_90 kernels, compiled here into a kernel cache that run.sh hands
# to the binaries (TURBOSPARK_CACHE), so that a fresh device machine with
# the same NVRTC version skips its compile: carry .devcarry/cache
# with the binaries.
NVRTC_LIB=${NVRTC_LIB:-$HOME/.cache/turbospark/nvrtc-13.0/nvidia/cu13/lib}
if [ -d "$NVRTC_LIB" ]; then
    rm -rf .devcarry/cache
    LD_LIBRARY_PATH="$NVRTC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" TURBOSPARK_CACHE=.devcarry/cache \
        target/release/examples/kernel_cache 90
else
    echo "no NVRTC at $NVRTC_LIB (scripts/test.sh installs it): no prebuilt kernel cache"
fi
# The kernel tracer (run.sh `trace`), with the CUPTI library it was built
# against beside it (found there through its $ORIGIN run path, whatever
# CUPTI the device machine has): CUPTI's, the CUDA runtime's and the
# compiler's headers come from PyPI, as NVRTC does.
CUPTI_DIR=${CUPTI_DIR:-$HOME/.cache/turbospark/cupti-13.0}
if [ ! -e "$CUPTI_DIR/nvidia/cu13/include/crt/host_defines.h" ]; then
    python3 -m pip install --quiet --no-deps --target "$CUPTI_DIR" "nvidia-cuda-cupti==13.0.*" \
        "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*" ||
        python3 -m pip install --quiet --no-deps --break-system-packages --target "$CUPTI_DIR" \
            "nvidia-cuda-cupti==13.0.*" "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*" ||
        echo "CUPTI could not be installed: no kernel tracer (run.sh trace builds one there)"
fi
if [ -e "$CUPTI_DIR/nvidia/cu13/lib/libcupti.so.13" ]; then
    gcc -O2 -Wall -shared -fPIC -o "$OUT/kernel_trace.so" scripts/gpu/kernel_trace.c \
        -I"$CUPTI_DIR/nvidia/cu13/include" "$CUPTI_DIR/nvidia/cu13/lib/libcupti.so.13" \
        -Wl,-rpath,'$ORIGIN' && cp "$CUPTI_DIR/nvidia/cu13/lib/libcupti.so.13" "$OUT/"
fi
[ -f .devcarry/llama.cpp-cuda.tgz ] || scripts/gpu/pack-llamacpp.sh .devcarry/llama.cpp-cuda.tgz
# The real models' layouts (no weights; run.sh `like` and `likebench`
# build random installs from them on the device), from the GGUFs that
# scripts/fetch-models.sh caches here.
MODELS=${TURBOSPARK_CACHE:-$HOME/.cache/turbospark}/models
for gguf in "$MODELS"/*.gguf; do
    [ -f "$gguf" ] || continue
    name=$(basename "$gguf" .gguf)
    layout=.devcarry/layout-$name.json
    [ -f "$layout" ] && continue
    tmp=$(mktemp -d)
    target/release/turbospark convert -q "$gguf" "$tmp/install" &&
        target/release/turbospark synth --like "$tmp/install" --save-layout "$layout" ||
        echo "$name: no layout saved"
    rm -rf "$tmp"
done
# Q4_K_M layouts of an 8B Llama and a Qwen3-30B-A3B (run.sh `kquant`),
# from SmolLM2's layout (a llama) and the qwen3moe fixture's.
mkdir -p .devcarry/kquant
smol=.devcarry/layout-smollm2-135m-instruct-q4_1.json
kq_last=.devcarry/kquant/layout-qwen3moe30b-q4_k_m.json
if [ -f "$smol" ] && { [ ! -f "$kq_last" ] || [ scripts/gpu/kquant_layouts.py -nt "$kq_last" ]; }; then
    tmp=$(mktemp -d)
    { target/release/turbospark convert -q tests/fixtures/tiny/qwen3moe "$tmp/q3m" &&
        target/release/turbospark synth --like "$tmp/q3m" --save-layout "$tmp/q3m.json" > /dev/null &&
        python3 scripts/gpu/kquant_layouts.py "$smol" "$tmp/q3m.json" .devcarry/kquant; } ||
        echo "no K-quant layouts"
    rm -rf "$tmp"
fi
tar czf .devcarry/pack.tgz "$OUT" .devcarry/cache .devcarry/layout-*.json .devcarry/kquant 2>/dev/null ||
    tar czf .devcarry/pack.tgz "$OUT"
ls -la "$OUT" .devcarry/pack.tgz
