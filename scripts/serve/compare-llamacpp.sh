#!/usr/bin/env bash
# Races `turbospark serve` against llama.cpp's `llama-server` under the same
# load (scripts/serve/load.py: C concurrent streaming clients × R greedy chat
# requests) on the same GGUF, the same thread count and the same number of
# parallel sequences, in one run, and prints each server's report and the
# ratios of total tok/s and of p99 time to first token.
#
# Usage: scripts/serve/compare-llamacpp.sh [-t THREADS] [-c CLIENTS] [-r REQUESTS]
#            [-n MAX_TOKENS] [--numerics fast|exact|llama-cpp] [GGUF]
# Env: LLAMA_SERVER (default: a llama-server on PATH, else
#      ${TURBOSPARK_CACHE:-~/.cache/turbospark}/llama-server-build/bin/llama-server,
#      built by `cmake -DLLAMA_BUILD_SERVER=ON` from the llama.cpp sdist that
#      scripts/llamacpp/build.sh uses), TURBOSPARK (default: target/release/turbospark).
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE=${TURBOSPARK_CACHE:-$HOME/.cache/turbospark}
THREADS=2 CLIENTS=16 REQUESTS=4 MAXTOK=64 NUMERICS=fast
GGUF=$CACHE/models/smollm2-135m-instruct-q4_1.gguf
while [ $# -gt 0 ]; do
    case $1 in
        -t) THREADS=$2; shift 2 ;;
        -c) CLIENTS=$2; shift 2 ;;
        -r) REQUESTS=$2; shift 2 ;;
        -n) MAXTOK=$2; shift 2 ;;
        --numerics) NUMERICS=$2; shift 2 ;;
        *) GGUF=$1; shift ;;
    esac
done
TS=${TURBOSPARK:-target/release/turbospark}
LS=${LLAMA_SERVER:-$(command -v llama-server || echo "$CACHE/llama-server-build/bin/llama-server")}
[ -x "$TS" ] || { echo "no $TS (cargo build --release)" >&2; exit 2; }
[ -x "$LS" ] || { echo "no llama-server at $LS (set LLAMA_SERVER)" >&2; exit 2; }
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
"$TS" convert -q "$GGUF" "$WORK/install" >/dev/null

wait_up() { for _ in $(seq 600); do curl -sf "$1/health" >/dev/null 2>&1 && return 0; sleep 0.5; done; return 1; }

"$TS" serve --model "$WORK/install" --port 18631 --parallel "$CLIENTS" --threads "$THREADS" \
    --context 1024 --numerics "$NUMERICS" --model-name m 2>"$WORK/ts.log" &
PIDS+=($!)
wait_up http://127.0.0.1:18631
python3 scripts/serve/load.py http://127.0.0.1:18631 --clients "$CLIENTS" --requests "$REQUESTS" \
    --max-tokens "$MAXTOK" --label "turbospark ($NUMERICS)" --json | tee "$WORK/ts.json"
kill "${PIDS[0]}"; wait "${PIDS[0]}" 2>/dev/null || true

"$LS" -m "$GGUF" --port 18632 -np "$CLIENTS" -t "$THREADS" -c $((CLIENTS * 1024)) \
    2>"$WORK/ls.log" &
PIDS+=($!)
wait_up http://127.0.0.1:18632
# llama.cpp's batched arithmetic is not batch-invariant: its answers under
# load may differ from its single-client ones, which load.py reports.
python3 scripts/serve/load.py http://127.0.0.1:18632 --clients "$CLIENTS" --requests "$REQUESTS" \
    --max-tokens "$MAXTOK" --label llama-server --json | tee "$WORK/ls.json" || true

python3 - "$WORK/ts.json" "$WORK/ls.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
print(f"total tok/s: turbospark {a['total_tok_per_s']:.1f}, llama-server {b['total_tok_per_s']:.1f}, "
      f"ratio {a['total_tok_per_s'] / b['total_tok_per_s']:.2f}x")
print(f"p99 TTFT: turbospark {a['ttft_p99_s']:.2f} s, llama-server {b['ttft_p99_s']:.2f} s, "
      f"ratio {a['ttft_p99_s'] / b['ttft_p99_s']:.2f}x (lower is better)")
PY
