#!/usr/bin/env bash
# pack-llamacpp.sh — the llama.cpp sources vendored in the cached
# llama-cpp-python sdist, trimmed to what a CUDA build of llama-bench needs
# (no models, docs or web UI), as one tarball small enough to travel to the
# GPU machine (the sdist itself is over the 64 MiB a device call carries).
#
# Usage: scripts/gpu/pack-llamacpp.sh OUT.tgz
# Environment: TURBOSPARK_CACHE (default $HOME/.cache/turbospark); the
# sdist is fetched by scripts/fetch-models.sh llamacpp.
set -euo pipefail
OUT=${1:?usage: pack-llamacpp.sh OUT.tgz}
CACHE="${TURBOSPARK_CACHE:-$HOME/.cache/turbospark}"
SDIST=$(ls "$CACHE"/downloads/llama_cpp_python-*.tar.gz | tail -1)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
tar xzf "$SDIST" -C "$TMP"
SRC=$(ls -d "$TMP"/llama_cpp_python-*/vendor/llama.cpp)
rm -rf "$SRC"/{models,docs,media,benches,examples/llama.android,tools/server/public*,tools/server/webui,gguf-py/tests}
tar czf "$OUT" -C "$(dirname "$SRC")" llama.cpp
ls -la "$OUT" >&2
