#!/usr/bin/env bash
# build.sh — build the llama.cpp vendored in the cached llama-cpp-python sdist
# (CPU only, Release) plus scripts/llamacpp/ref_logits.cpp.
#
# Usage: scripts/llamacpp/build.sh
#
# Output (stdout): "name<TAB>path" for each built tool; progress on stderr.
#   $CACHE/llama.cpp-build/                 cmake build tree
#   $CACHE/llama.cpp-build/bin/llama-*      llama.cpp tools (+ shared libs)
#   $CACHE/llama.cpp-build/bin/ref_logits   reference logits tool
#   $CACHE/llama.cpp-build/turbospark-build-info.txt
#
# Idempotent: configure runs once (or when the flags below change), the build
# is incremental (a no-op when nothing changed). A cold build of the selected
# targets takes ~10 minutes on 2 cores.
#
# cmake/ninja: taken from PATH if present, otherwise pip-installed (pinned)
# into $CACHE/venv.
#
# Environment: TURBOSPARK_CACHE (default $HOME/.cache/turbospark), JOBS (default nproc),
#              PYTHON (default python3; used only to create $CACHE/venv)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${TURBOSPARK_CACHE:-$HOME/.cache/turbospark}"
PYTHON="${PYTHON:-python3}"
SRC="$CACHE/llama-cpp-python/vendor/llama.cpp"
BUILD="$CACHE/llama.cpp-build"
JOBS="${JOBS:-$(nproc)}"
CMAKE_PIN="cmake==4.4.5"
NINJA_PIN="ninja==1.13.2"

TARGETS=(llama-completion llama-simple llama-eval-callback llama-bench llama-tokenize llama-perplexity llama-cvector-generator)
CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_NATIVE=ON
  -DLLAMA_CURL=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_SERVER=OFF   # also drops llama-cli (depends on the server); llama-completion is the classic CLI
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_APP=OFF
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF
)

log() { printf '[llamacpp-build] %s\n' "$*" >&2; }
die() { printf '[llamacpp-build] error: %s\n' "$*" >&2; exit 1; }

# --- sources -----------------------------------------------------------------
if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
  log "llama.cpp sources not in cache; running fetch-models.sh llamacpp"
  "$REPO/scripts/fetch-models.sh" llamacpp >/dev/null
fi
[[ -f "$SRC/CMakeLists.txt" ]] || die "no llama.cpp sources at $SRC"

# --- toolchain -----------------------------------------------------------------
command -v c++ >/dev/null || die "no C++ compiler (c++) in PATH"
if ! command -v cmake >/dev/null 2>&1; then
  if [[ ! -x "$CACHE/venv/bin/cmake" ]]; then
    log "cmake not found; installing $CMAKE_PIN $NINJA_PIN into $CACHE/venv"
    [[ -x "$CACHE/venv/bin/python" ]] || "$PYTHON" -m venv "$CACHE/venv" || die "could not create venv $CACHE/venv"
    "$CACHE/venv/bin/python" -m pip install --disable-pip-version-check -q "$CMAKE_PIN" "$NINJA_PIN" \
      || die "pip install $CMAKE_PIN $NINJA_PIN failed (is PyPI reachable?)"
  fi
  export PATH="$CACHE/venv/bin:$PATH"
fi
GEN=()
if command -v ninja >/dev/null 2>&1; then GEN=(-G Ninja)
elif [[ -x "$CACHE/venv/bin/ninja" ]]; then export PATH="$CACHE/venv/bin:$PATH"; GEN=(-G Ninja)
fi
log "cmake: $(command -v cmake) ($(cmake --version | head -1)), generator: ${GEN[*]:-default}"

# --- configure (only when needed) ------------------------------------------------
flags_sig="$(printf '%s\n' "${GEN[@]}" "${CMAKE_FLAGS[@]}" | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$BUILD/CMakeCache.txt" || "$(cat "$BUILD/.turbospark-flags" 2>/dev/null)" != "$flags_sig" ]]; then
  log "configuring $BUILD"
  cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" "${CMAKE_FLAGS[@]}" >&2
  printf '%s\n' "$flags_sig" >"$BUILD/.turbospark-flags"
fi

# --- build ---------------------------------------------------------------------------
log "building ${TARGETS[*]} (-j$JOBS)"
start=$(date +%s)
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" >&2
log "cmake build done in $(( $(date +%s) - start ))s"

# --- ref_logits ---------------------------------------------------------------------
REF_SRC="$HERE/ref_logits.cpp"
REF_BIN="$BUILD/bin/ref_logits"
if [[ ! -x "$REF_BIN" || "$REF_SRC" -nt "$REF_BIN" || "$BUILD/bin/libllama.so" -nt "$REF_BIN" ]]; then
  log "compiling ref_logits"
  c++ -O2 -std=c++17 -Wall -Wextra \
    -I"$SRC/include" -I"$SRC/ggml/include" \
    "$REF_SRC" -o "$REF_BIN" \
    -L"$BUILD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$BUILD/bin" -lpthread
fi

# --- build info ----------------------------------------------------------------------
sdist_version="$(sed -n 's/^Version: //p' "$CACHE/llama-cpp-python/PKG-INFO" | head -1)"
commit="$(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo unknown)"
commit_date="$(git -C "$SRC" log -1 --format=%cI 2>/dev/null || echo unknown)"
build_number="$(sed -n 's/.*LLAMA_BUILD_NUMBER *= *\([0-9]*\).*/\1/p' "$BUILD/common/build-info.cpp" 2>/dev/null | head -1)"
{
  echo "llama-cpp-python sdist: $sdist_version"
  echo "llama.cpp commit: $commit ($commit_date)"
  echo "llama.cpp LLAMA_BUILD_NUMBER: ${build_number:-unknown} (the sdist's vendored git checkout is shallow, so this is not the upstream bNNNN number)"
  echo "cmake flags: ${CMAKE_FLAGS[*]}"
  echo "targets: ${TARGETS[*]} ref_logits"
  echo "compiler: $(c++ --version | head -1)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
} >"$BUILD/turbospark-build-info.txt"

for t in "${TARGETS[@]}" ref_logits; do
  [[ -x "$BUILD/bin/$t" ]] || die "missing $BUILD/bin/$t after build"
  printf '%s\t%s\n' "$t" "$BUILD/bin/$t"
done
