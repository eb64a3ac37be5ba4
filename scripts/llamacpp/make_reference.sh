#!/usr/bin/env bash
# make_reference.sh — regenerate tests/reference/llamacpp/ from llama.cpp.
#
# Usage: scripts/llamacpp/make_reference.sh [smollm2|gemma3|qwen25]...   (default: all three)
#
# For each model:
#   1. tokenize PROMPT_TEXT with llama.cpp's own tokenizer (llama-tokenize --ids;
#      BOS is added iff the GGUF's tokenizer.ggml.add_bos_token says so),
#   2. run ref_logits: greedy-decode N_PREDICT tokens from those ids, 1 thread,
#      recording top-K log-probabilities per generated position,
#   3. write tests/reference/llamacpp/<model>.greedy.json and the `print_info:`
#      lines of the model load to tests/reference/llamacpp/<model>.print_info.txt.
#
# Fixed settings (also recorded in each JSON): 1 thread, CPU only, f16 KV cache
# (llama.cpp default), flash attention OFF, n_ctx = prompt + N_PREDICT (llama.cpp
# may pad it), whole prompt in one batch, then one token per decode; greedy
# argmax of raw logits, no stop on EOG. Results are bit-reproducible on the
# same machine/binary; other CPUs (other SIMD paths) may differ in the last bits.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUTDIR="$REPO/tests/reference/llamacpp"
PROMPT_TEXT="The capital of France is"
N_PREDICT=32
TOP_K=64
THREADS=1
KV=f16
FA=off

LOG_TAG=make-reference
# shellcheck source=common.sh
source "$HERE/common.sh"

models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(smollm2 gemma3 qwen25)

llamacpp_setup "${models[@]}"

mkdir -p "$OUTDIR"
for m in "${models[@]}"; do
  model="${MODEL_PATH[$m]:-}"
  [[ -n "$model" && -f "$model" ]] || die "no model file for $m"
  sha="$(sha256sum "$model" | cut -d' ' -f1)"
  log "$m: $(basename "$model")"

  # 1. tokenize (stdout: "[id, id, ...]")
  tok_out="$("${TOOL[llama-tokenize]}" -m "$model" -p "$PROMPT_TEXT" --ids --log-disable 2>/dev/null)" \
    || die "llama-tokenize failed for $m"
  ids="$(tr -d '[] \n' <<<"$tok_out")"
  [[ "$ids" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "unexpected llama-tokenize output for $m: $tok_out"
  log "$m: prompt ids [$ids]"

  # 2. greedy decode + top-k logprobs
  errlog="$(mktemp)"
  meta=(
    --meta "name=$(json_str "$m")"
    --meta "model_sha256=$(json_str "$sha")"
    --meta "llama_cpp=$(printf '{"llama_cpp_python_sdist": %s, "commit": %s, "commit_date": %s, "build_number": %s, "build_number_note": %s, "cmake_flags": %s}' \
        "$(json_str "$SDIST_VERSION")" "$(json_str "$COMMIT")" "$(json_str "$COMMIT_DATE")" "${BUILD_NUMBER:-0}" \
        "$(json_str "LLAMA_BUILD_NUMBER as compiled; the vendored git checkout is shallow so it is not the upstream bNNNN")" \
        "$(json_str "$CMAKE_FLAGS")")"
    --meta "tokenizer=$(json_str "llama-tokenize -m <model> -p <prompt_text> --ids (BOS iff GGUF add_bos_token)")"
    --meta "cpu=$(json_str "$CPU")"
  )
  "${TOOL[ref_logits]}" -m "$model" -p "$ids" -n "$N_PREDICT" -k "$TOP_K" -t "$THREADS" \
      --kv "$KV" --fa "$FA" --prompt-text "$PROMPT_TEXT" "${meta[@]}" \
      -o "$OUTDIR/$m.greedy.json" 2>"$errlog" \
    || { tail -n 30 "$errlog" >&2; rm -f "$errlog"; die "ref_logits failed for $m"; }

  # 3. print_info lines of the load
  grep '^print_info: ' "$errlog" >"$OUTDIR/$m.print_info.txt" || die "no print_info lines for $m"
  rm -f "$errlog"

  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("[make-reference] %s: greedy %s -> %r" % (sys.argv[2], d["greedy_ids"], d["greedy_text"]), file=sys.stderr)' \
    "$OUTDIR/$m.greedy.json" "$m"
  printf '%s\t%s\n' "$m" "$OUTDIR/$m.greedy.json"
done
