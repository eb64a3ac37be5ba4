#!/usr/bin/env bash
# Races `turbospark serve` against llama.cpp's `llama-server` under the same
# load (scripts/serve/load.py: C concurrent streaming clients × R greedy chat
# requests) on the same GGUF, the same thread count and the same number of
# parallel sequences, in one run, and prints each server's report and the
# ratios of total tok/s and of p99 time to first token.
#
# Usage: scripts/serve/compare-llamacpp.sh [-t THREADS] [-c CLIENTS] [-r REQUESTS]
#            [-n MAX_TOKENS] [--numerics fast|exact|llama-cpp] [--rounds K] [--build] [GGUF]
#
# --rounds K   K rounds, each turbospark then llama-server (default 1): on a
#              shared machine the load changes between phases, and the
#              load average is printed before and after each phase.
# --build      build llama-server first if none is found (cmake, Release,
#              GGML_NATIVE, from the llama.cpp sdist that
#              scripts/llamacpp/build.sh uses, into
#              $CACHE/llama-server-build; about 9 minutes on 2 cores).
#
# Env: LLAMA_SERVER (default: a llama-server on PATH, else
#      $CACHE/llama-server-build/bin/llama-server, else
#      /tmp/llama-server-build/bin/llama-server), TURBOSPARK (default:
#      target/release/turbospark), TURBOSPARK_CACHE (default ~/.cache/turbospark).
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE=${TURBOSPARK_CACHE:-$HOME/.cache/turbospark}
THREADS=2 CLIENTS=16 REQUESTS=4 MAXTOK=64 NUMERICS=fast ROUNDS=1 BUILD=0
GGUF=$CACHE/models/smollm2-135m-instruct-q4_1.gguf
while [ $# -gt 0 ]; do
    case $1 in
        -t) THREADS=$2; shift 2 ;;
        -c) CLIENTS=$2; shift 2 ;;
        -r) REQUESTS=$2; shift 2 ;;
        -n) MAXTOK=$2; shift 2 ;;
        --numerics) NUMERICS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --build) BUILD=1; shift ;;
        *) GGUF=$1; shift ;;
    esac
done
TS=${TURBOSPARK:-target/release/turbospark}
find_llama_server() {
    if [ -n "${LLAMA_SERVER:-}" ]; then echo "$LLAMA_SERVER"; return; fi
    for c in "$(command -v llama-server || true)" "$CACHE/llama-server-build/bin/llama-server" \
        /tmp/llama-server-build/bin/llama-server; do
        [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return; }
    done
    echo "$CACHE/llama-server-build/bin/llama-server"
}
LS=$(find_llama_server)
if [ ! -x "$LS" ] && [ "$BUILD" = 1 ]; then
    SRC=$CACHE/llama-cpp-python/vendor/llama.cpp
    [ -f "$SRC/CMakeLists.txt" ] || scripts/fetch-models.sh llamacpp >/dev/null
    [ -x "$CACHE/venv/bin/cmake" ] && export PATH="$CACHE/venv/bin:$PATH"
    GEN=(); command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
    cmake -S "$SRC" -B "$CACHE/llama-server-build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF -DGGML_NATIVE=ON >&2
    cmake --build "$CACHE/llama-server-build" --target llama-server >&2
    LS=$CACHE/llama-server-build/bin/llama-server
fi
[ -x "$TS" ] || { echo "no $TS (cargo build --release -p turbospark-cli)" >&2; exit 2; }
[ -x "$LS" ] || { echo "no llama-server at $LS (set LLAMA_SERVER, or pass --build)" >&2; exit 2; }
# The build's shared libraries sit beside the binary (a copied build tree
# keeps working wherever it was first built).
export LD_LIBRARY_PATH="$(dirname "$LS")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
"$TS" convert -q "$GGUF" "$WORK/install" >/dev/null
echo "turbospark: $TS ($("$TS" --version 2>/dev/null || echo '?')); llama-server: $LS"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"

wait_up() { for _ in $(seq 600); do curl -sf "$1/health" >/dev/null 2>&1 && return 0; sleep 0.5; done; return 1; }
load() { cut -d' ' -f1 /proc/loadavg; }

for round in $(seq "$ROUNDS"); do
    echo "round $round: turbospark serve from load $(load) at $(date +%H:%M:%S)"
    "$TS" serve --model "$WORK/install" --port 18631 --parallel "$CLIENTS" --threads "$THREADS" \
        --context 1024 --numerics "$NUMERICS" --model-name m 2>"$WORK/ts.log" &
    PIDS+=($!)
    wait_up http://127.0.0.1:18631
    python3 scripts/serve/load.py http://127.0.0.1:18631 --clients "$CLIENTS" --requests "$REQUESTS" \
        --max-tokens "$MAXTOK" --label "turbospark ($NUMERICS)" --json | tee "$WORK/ts.$round.json"
    kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
    echo "  to load $(load)"

    echo "round $round: llama-server from load $(load) at $(date +%H:%M:%S)"
    "$LS" -m "$GGUF" --port 18632 -np "$CLIENTS" -t "$THREADS" -c $((CLIENTS * 1024)) \
        2>"$WORK/ls.log" &
    PIDS+=($!)
    wait_up http://127.0.0.1:18632
    # llama.cpp's batched arithmetic is not batch-invariant: its answers under
    # load may differ from its single-client ones, which load.py reports.
    python3 scripts/serve/load.py http://127.0.0.1:18632 --clients "$CLIENTS" --requests "$REQUESTS" \
        --max-tokens "$MAXTOK" --label llama-server --json | tee "$WORK/ls.$round.json" || true
    kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
    echo "  to load $(load)"
done

python3 - "$WORK" "$ROUNDS" <<'PY'
import json, sys
work, rounds = sys.argv[1], int(sys.argv[2])
for r in range(1, rounds + 1):
    a, b = (json.load(open(f"{work}/{n}.{r}.json")) for n in ("ts", "ls"))
    print(f"round {r}: total tok/s: turbospark {a['total_tok_per_s']:.1f} "
          f"({a['ratio_vs_single']:.2f}x its single client), llama-server {b['total_tok_per_s']:.1f} "
          f"({b['ratio_vs_single']:.2f}x), ratio {a['total_tok_per_s'] / b['total_tok_per_s']:.2f}x")
    print(f"round {r}: p99 TTFT: turbospark {a['ttft_p99_s']:.2f} s, llama-server {b['ttft_p99_s']:.2f} s, "
          f"ratio {a['ttft_p99_s'] / b['ttft_p99_s']:.2f}x (lower is better)")
PY
