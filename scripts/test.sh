#!/usr/bin/env bash
# The project's test command (README, .ci/run): formatting, lints, then every
# test in an optimised test profile, after fetching the real models that the
# real-model tests use (cached under ${TURBOSPARK_CACHE:-~/.cache/turbospark}).
# Prints how long each stage took.
set -euo pipefail
cd "$(dirname "$0")/.."

stage() {
    local name=$1
    shift
    local t0=$SECONDS
    echo "==> $name"
    "$@"
    echo "<== $name: $((SECONDS - t0))s"
}

stage "cargo fmt --check" cargo fmt --all -- --check
stage "cargo clippy" cargo clippy --workspace --all-targets --locked -- -D warnings
# The paths fetch-models.sh prints are not needed here; its progress goes to stderr.
fetch_models() { scripts/fetch-models.sh "$@" >/dev/null; }
if [ "${TURBOSPARK_SKIP_FETCH:-0}" != 1 ]; then
    stage "fetch real models and the llama.cpp sdist" fetch_models smollm2 gemma3 qwen25 llamacpp
    export TURBOSPARK_REQUIRE_MODELS=1
fi
# NVRTC (CUDA's runtime compiler, from PyPI) lets the CUDA crate's test
# compile every kernel for sm_80 and sm_90 on this GPU-less machine.
nvrtc_dir="${TURBOSPARK_CACHE:-$HOME/.cache/turbospark}/nvrtc-13.0"
install_nvrtc() {
    if [ ! -e "$nvrtc_dir/nvidia/cu13/lib/libnvrtc.so.13" ]; then
        local spec="nvidia-cuda-nvrtc==13.0.*"
        python3 -m pip install --quiet --no-deps --target "$nvrtc_dir" "$spec" ||
            python3 -m pip install --quiet --no-deps --break-system-packages --target "$nvrtc_dir" "$spec" ||
            { echo "NVRTC could not be installed: the kernel compile test will skip"; return 0; }
    fi
    export LD_LIBRARY_PATH="$nvrtc_dir/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
stage "install NVRTC 13.0 (pip)" install_nvrtc
# Installs Debian packages when apt-get can (as root; the package lists
# updated once a run), else says why the test named by $1 will skip and
# fails.
apt_updated=0
apt_install() {
    local test=$1
    shift
    if ! command -v apt-get >/dev/null; then
        echo "$* not installed and there is no apt-get: $test will skip"
        return 1
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "$* not installed and apt-get needs root: $test will skip"
        return 1
    fi
    if [ "$apt_updated" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq || { echo "apt-get update failed: $test will skip"; return 1; }
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null ||
        { echo "apt-get could not install $*: $test will skip"; return 1; }
}
# The serve test drives the chat page in headless Chromium (Debian's
# `chromium`; scripts/serve/page_check.py). A fresh CI machine (Debian, root)
# lacks it: install it when apt-get can, else the page test skips and says
# why. Once chromium is there the test must run (TURBOSPARK_REQUIRE_CHROMIUM).
install_chromium() {
    if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
        # Fonts so the saved screenshot shows text rather than boxes.
        apt_install "the page test" chromium fonts-dejavu-core || return 0
    fi
    local version
    if ! version=$( (chromium --version || chromium-browser --version) 2>/dev/null); then
        echo "chromium does not run (--version failed): the page test will skip"
        return 0
    fi
    echo "$version"
    export TURBOSPARK_REQUIRE_CHROMIUM=1
}
stage "install chromium (apt-get) for the page test" install_chromium
# The CUDA crate's emulation tests (crates/cuda/tests/host_emulation.rs)
# build the kernel sources as host C++: install a C++ compiler when apt-get
# can, else they skip and say why. Once one is there they must run
# (TURBOSPARK_REQUIRE_CXX).
install_cxx() {
    if ! command -v "${CXX:-c++}" >/dev/null; then
        apt_install "the emulation tests" g++ || return 0
    fi
    "${CXX:-c++}" --version | head -1
    export TURBOSPARK_REQUIRE_CXX=1
}
stage "install a C++ compiler (apt-get) for the kernel emulation tests" install_cxx
stage "cargo test (test-opt profile)" cargo test --workspace --locked --profile test-opt
echo "all stages passed in ${SECONDS}s"
