#!/usr/bin/env bash
# compare-llamacpp.sh — race `turbospark bench` against llama.cpp's
# `llama-bench` on the same weights, on this machine, in one run.
#
# Usage: scripts/bench/compare-llamacpp.sh [options] [MODEL...]
#   MODEL          smollm2 | gemma3 | qwen25 | synth (default: all four)
#   -t N           threads for both engines (default 2)
#   -p N           prompt tokens of the prefill test (default 512; 0 skips it)
#   -n N           decode steps of the generation test (default 128; 0 skips it)
#   -R N           rounds (default 5)
#   -o DIR         keep the raw JSON lines of every run in DIR (default: a
#                  temporary directory, removed at the end)
#   -h             this help
#
# Models: the three GGUFs of scripts/fetch-models.sh, and `synth`: a 4-layer
# gpt-oss-shaped model of random weights (gpt-oss-20b's dimensions, MXFP4
# experts) written by `turbospark synth --gguf` as a GGUF that llama.cpp
# loads. Each GGUF is converted to an install with `turbospark convert` (the
# synth install is made from its GGUF the same way), so both engines read
# the same bytes; installs are cached under $CACHE/bench-installs and
# rebuilt when their source or the turbospark version changes.
#
# Method: for each model, ROUNDS rounds; a round is one run of each engine,
# ours first, then llama.cpp (ours, llama.cpp, ours, llama.cpp, ...), each
# `-r 1` at the same thread count with its default arithmetic (turbospark
# `--numerics fast`; llama.cpp's defaults: n_batch 2048, n_ubatch 512, f16
# KV cache). Each run does its own warm-up (the whole prefill, one decode
# step), then one timed repetition. Alternating spreads slow minutes of a
# shared machine over both engines; the report gives each engine's median
# over the rounds and the ratio ours / llama.cpp (above 1: we are faster).
# MoE experts are resident in both (`--experts resident`).
#
# Output (stdout): a machine line (CPU, cores, date, turbospark commit,
# llama.cpp build) and a markdown table; progress on stderr.
#
# Environment: TURBOSPARK_CACHE (default $HOME/.cache/turbospark),
#              TURBOSPARK_BIN (default: cargo build --release, target/release/turbospark)
#              LLAMA_BENCH (a llama-bench built elsewhere; default: scripts/llamacpp/build.sh)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${TURBOSPARK_CACHE:-$HOME/.cache/turbospark}"
INSTALLS="$CACHE/bench-installs"

log() { printf '[compare-llamacpp] %s\n' "$*" >&2; }
die() { printf '[compare-llamacpp] error: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; }

THREADS=2 N_PROMPT=512 N_GEN=128 ROUNDS=5 RAW_DIR=""
while getopts "t:p:n:R:o:h" opt; do
  case "$opt" in
    t) THREADS=$OPTARG ;;
    p) N_PROMPT=$OPTARG ;;
    n) N_GEN=$OPTARG ;;
    R) ROUNDS=$OPTARG ;;
    o) RAW_DIR=$OPTARG ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
for v in THREADS N_PROMPT N_GEN ROUNDS; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || die "$v must be a whole number, got '${!v}'"
done
(( THREADS >= 1 )) || die "-t must be at least 1"
(( ROUNDS >= 1 )) || die "-R must be at least 1"
(( N_PROMPT + N_GEN > 0 )) || die "-p and -n are both 0: nothing to run"

MODELS=("$@")
[[ ${#MODELS[@]} -gt 0 ]] || MODELS=(smollm2 gemma3 qwen25 synth)
FETCH=()
for m in "${MODELS[@]}"; do
  case "$m" in
    smollm2|gemma3|qwen25) FETCH+=("$m") ;;
    synth) ;;
    *) die "unknown model '$m' (expected smollm2, gemma3, qwen25 or synth)" ;;
  esac
done
command -v python3 >/dev/null || die "python3 is needed to read the JSON lines"

if [[ -z "$RAW_DIR" ]]; then
  RAW_DIR="$(mktemp -d)"
  trap 'rm -rf -- "$RAW_DIR"' EXIT
fi
mkdir -p "$RAW_DIR" "$INSTALLS"

# --- tools -------------------------------------------------------------------
# The commit the binary is built from (the tree may change while this runs).
commit="$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
dirty="$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null | head -1)"
if [[ -n "${TURBOSPARK_BIN:-}" ]]; then
  TS="$TURBOSPARK_BIN"
else
  log "building turbospark (release)"
  (cd "$REPO" && cargo build --release -q -p turbospark-cli) || die "cargo build failed"
  TS="$REPO/target/release/turbospark"
fi
[[ -x "$TS" ]] || die "no turbospark binary at $TS"
TS_VERSION="$("$TS" --version)"

if [[ -n "${LLAMA_BENCH:-}" ]]; then
  [[ -x "$LLAMA_BENCH" ]] || die "LLAMA_BENCH=$LLAMA_BENCH is not an executable"
else
  declare -A TOOL=()
  while IFS=$'\t' read -r name path; do TOOL[$name]="$path"; done < <("$REPO/scripts/llamacpp/build.sh")
  LLAMA_BENCH="${TOOL[llama-bench]:-}"
  [[ -x "$LLAMA_BENCH" ]] || die "scripts/llamacpp/build.sh did not build llama-bench"
fi

# --- models and installs -------------------------------------------------------------
declare -A GGUF=()
if [[ ${#FETCH[@]} -gt 0 ]]; then
  while IFS=$'\t' read -r name path; do GGUF[$name]="$path"; done \
    < <("$REPO/scripts/fetch-models.sh" "${FETCH[@]}")
fi

# The synthetic model: 4 gpt-oss-20b layers, random weights, seed 1.
SYNTH_ARGS=(--layers 4 --seed 1)
SYNTH_GGUF="$INSTALLS/synth-gpt-oss-4l.gguf"

# stamp_of FILE: what an install made from FILE depends on.
stamp_of() { printf '%s %s %s\n' "$(stat -c '%s %Y' -- "$1")" "$TS_VERSION" "${*:2}"; }

# install_for NAME GGUF: converts GGUF into $INSTALLS/NAME unless cached.
install_for() {
  local name=$1 gguf=$2 dst="$INSTALLS/$1"
  local stamp; stamp="$(stamp_of "$gguf")"
  if [[ -f "$dst/manifest.json" && "$(cat "$dst.stamp" 2>/dev/null)" == "$stamp" ]]; then
    log "$name: cached install $dst"
  else
    log "$name: converting $gguf"
    "$TS" convert -q --force "$gguf" "$dst" >&2 || die "converting $gguf failed"
    printf '%s\n' "$stamp" >"$dst.stamp"
  fi
}

if [[ " ${MODELS[*]} " == *" synth "* ]]; then
  # synth writes the GGUF and converts it into the install itself.
  synth_stamp="$TS_VERSION ${SYNTH_ARGS[*]}"
  dst="$INSTALLS/synth"
  if [[ -f "$SYNTH_GGUF" && -f "$dst/manifest.json" \
        && "$(cat "$dst.stamp" 2>/dev/null)" == "$synth_stamp" ]]; then
    log "synth: cached $SYNTH_GGUF and install $dst"
  else
    log "synth: writing $SYNTH_GGUF and $dst (${SYNTH_ARGS[*]})"
    "$TS" synth -q --force "$dst" "${SYNTH_ARGS[@]}" --gguf "$SYNTH_GGUF" >&2 \
      || die "turbospark synth --gguf failed"
    printf '%s\n' "$synth_stamp" >"$dst.stamp"
  fi
  GGUF[synth]="$SYNTH_GGUF"
fi
for m in "${MODELS[@]}"; do
  [[ "$m" == synth ]] || install_for "$m" "${GGUF[$m]}"
done

# --- the race ------------------------------------------------------------------------------
for m in "${MODELS[@]}"; do
  ours=(-m "$INSTALLS/$m" -p "$N_PROMPT" -n "$N_GEN" -r 1 -t "$THREADS" --json)
  [[ "$m" == synth ]] && ours+=(--experts resident)
  theirs=(-m "${GGUF[$m]}" -p "$N_PROMPT" -n "$N_GEN" -r 1 -t "$THREADS" -o jsonl)
  for ((r = 1; r <= ROUNDS; r++)); do
    log "$m: round $r/$ROUNDS: turbospark"
    "$TS" bench "${ours[@]}" >>"$RAW_DIR/$m.turbospark.jsonl" \
      2>>"$RAW_DIR/$m.turbospark.log" || die "turbospark bench failed on $m (see $RAW_DIR/$m.turbospark.log)"
    log "$m: round $r/$ROUNDS: llama.cpp"
    "$LLAMA_BENCH" "${theirs[@]}" >>"$RAW_DIR/$m.llamacpp.jsonl" \
      2>>"$RAW_DIR/$m.llamacpp.log" || die "llama-bench failed on $m (see $RAW_DIR/$m.llamacpp.log)"
  done
done

# --- report --------------------------------------------------------------------------------------
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
python3 - "$RAW_DIR" "$THREADS" "$ROUNDS" "$cpu" "$(nproc)" "$(date -u +%Y-%m-%dT%H:%MZ)" \
  "$commit${dirty:+ (modified)}" "${MODELS[@]}" <<'EOF'
import json, statistics, sys

raw, threads, rounds, cpu, cores, date, commit, *models = sys.argv[1:]

def lines(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]

def test_name(n_prompt, n_gen):
    return f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"

build = "?"
rows = []
for m in models:
    ours, theirs = {}, {}
    for j in lines(f"{raw}/{m}.turbospark.jsonl"):
        ours.setdefault(j["test"], []).append(j["tok_per_s"])
        numerics = j["numerics"]
    for j in lines(f"{raw}/{m}.llamacpp.jsonl"):
        theirs.setdefault(test_name(j["n_prompt"], j["n_gen"]), []).append(j["avg_ts"])
        build = j.get("build_commit", build)
    for test in ours:
        a, b = statistics.median(ours[test]), statistics.median(theirs.get(test, [float("nan")]))
        rows.append((m, test, a, min(ours[test]), max(ours[test]), b,
                     min(theirs.get(test, [b])), max(theirs.get(test, [b])), a / b))

print(f"machine: {cpu}, {cores} cores; {date}; turbospark {commit} (--numerics {numerics}); "
      f"llama.cpp {build}; {threads} threads; median of {rounds} alternating rounds")
print()
print("| model | test | turbospark t/s (min–max) | llama.cpp t/s (min–max) | ours / llama.cpp |")
print("|---|---|---:|---:|---:|")
for m, test, a, alo, ahi, b, blo, bhi, ratio in rows:
    print(f"| {m} | {test} | {a:.2f} ({alo:.2f}–{ahi:.2f}) | {b:.2f} ({blo:.2f}–{bhi:.2f}) | {ratio:.2f} |")
EOF
