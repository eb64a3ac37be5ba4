#!/usr/bin/env bash
# ab.sh — two turbospark binaries on the same install, alternated round by
# round (A B, B A, A B, …) so that drift of the machine (clocks, heat,
# other load, caches) falls on both alike; prints every round, then each
# test's mean tok/s over every repetition of every round for A and B and
# the ratio B / A.
#
# Usage: scripts/bench/ab.sh BIN_A BIN_B ROUNDS -- BENCH_ARGS...
#   e.g. scripts/bench/ab.sh .devcarry/bin-base/turbospark .devcarry/bin/turbospark 3 -- \
#          -m /tmp/ts-gpu/synth20b --backend cuda --experts resident -p 512 -n 128 -d 0,512 -r 2
# BENCH_ARGS go to `turbospark bench` as they are (with --json added).
# Needs python3. Exits 2 on bad usage, 1 when a run fails.
set -euo pipefail
usage() { echo "usage: $0 BIN_A BIN_B ROUNDS -- BENCH_ARGS..." >&2; exit 2; }
[ $# -ge 4 ] || usage
A=$1 B=$2 ROUNDS=$3
shift 3
[ "$1" = "--" ] || usage
shift
[ -x "$A" ] || { echo "$0: $A is not an executable" >&2; exit 2; }
[ -x "$B" ] || { echo "$0: $B is not an executable" >&2; exit 2; }
case $ROUNDS in '' | *[!0-9]* | 0) echo "$0: ROUNDS must be a positive integer, got '$ROUNDS'" >&2; exit 2 ;; esac
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
summary() {
    python3 -c 'import json, sys
print("  ".join("%s %.2f" % (j["test"], j["tok_per_s"]) for j in map(json.loads, open(sys.argv[1]))))' "$1"
}
for r in $(seq "$ROUNDS"); do
    # A first in odd rounds, B first in even ones (ABBA…), so that neither
    # always runs on the machine the other has just warmed.
    order="A B"
    [ $((r % 2)) = 0 ] && order="B A"
    for side in $order; do
        bin=$A
        [ $side = B ] && bin=$B
        if ! "$bin" bench "$@" --json > "$OUT/$side.$r.jsonl" 2> "$OUT/$side.$r.err"; then
            echo "$0: round $r, $side ($bin) failed:" >&2
            tail -5 "$OUT/$side.$r.err" >&2
            exit 1
        fi
        echo "round $r, $side: $(summary "$OUT/$side.$r.jsonl")"
    done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
rates = {}
for side in "AB":
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{side}.{r}.jsonl"):
            j = json.loads(line)
            rates.setdefault(j["test"], {"A": [], "B": []})[side].extend(j["samples"])
print(f"{'test':<16} {'A tok/s':>10} {'B tok/s':>10} {'B / A':>7}")
for test, s in rates.items():
    a, b = statistics.mean(s["A"]), statistics.mean(s["B"])
    print(f"{test:<16} {a:>10.2f} {b:>10.2f} {b / a:>7.3f}")
PY
