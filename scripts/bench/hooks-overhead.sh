#!/usr/bin/env bash
# hooks-overhead.sh — is decoding with no capture, steering or census option
# as fast as before those hooks existed? Builds the commit before they
# landed and the current tree (release), then alternates `turbospark bench`
# runs of the two on the same models in one run.
#
# Usage: scripts/bench/hooks-overhead.sh [options] [MODEL...]
#   MODEL     smollm2 (SmolLM2-135M-Instruct Q4_1, scripts/fetch-models.sh)
#             | gptoss (the tiny gpt-oss fixture, tests/fixtures/tiny/gpt_oss:
#             4 layers, hidden 64, 8 MXFP4 experts, top-2 — the per-layer
#             overhead, not the matmuls, dominates its decode step)
#             (default: both)
#   -b REV    the "before" commit (default: the parent of the first commit
#             that added crates/engine/src/hooks.rs)
#   -a REV    the "now" commit (default: the working tree)
#   -t N      threads (default 2)
#   -n N      decode steps per run (default 128 for smollm2, 2048 for gptoss)
#   -p N      prompt tokens before the decode (default 16)
#   -R N      rounds (default 20)
#   -h        this help
#
# Method: each binary converts each model itself (the install format may
# differ between them); then ROUNDS rounds, a round being one `bench -r 1`
# of each binary (each with its own warm-up), the order swapped every round
# (before, now; now, before; ...) so that a drift of the machine's speed
# falls on both. Reported per model: each binary's median decode tok/s
# (min–max), the ratio now / before of the medians, and the median and
# quartiles of the per-round ratios (a paired measure: the two runs of a
# round are seconds apart). Default numerics (fast), experts resident.
#
# Output (stdout): a machine line and a markdown table; progress on stderr.
# Environment: TURBOSPARK_CACHE (default $HOME/.cache/turbospark); builds
# of commits live in $CACHE/hooks-bench (sources and target per commit, kept).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${TURBOSPARK_CACHE:-$HOME/.cache/turbospark}"
WORK="$CACHE/hooks-bench"

log() { printf '[hooks-overhead] %s\n' "$*" >&2; }
die() { printf '[hooks-overhead] error: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; }

BASE="" AFTER="" THREADS=2 N_GEN="" N_PROMPT=16 ROUNDS=20
while getopts "b:a:t:n:p:R:h" opt; do
  case "$opt" in
    b) BASE=$OPTARG ;;
    a) AFTER=$OPTARG ;;
    t) THREADS=$OPTARG ;;
    n) N_GEN=$OPTARG ;;
    p) N_PROMPT=$OPTARG ;;
    R) ROUNDS=$OPTARG ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
for v in THREADS N_PROMPT ROUNDS; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || die "$v must be a whole number, got '${!v}'"
done
[[ -z "$N_GEN" || "$N_GEN" =~ ^[1-9][0-9]*$ ]] || die "-n must be a positive number"
(( THREADS >= 1 && ROUNDS >= 1 )) || die "-t and -R must be at least 1"
MODELS=("$@")
[[ ${#MODELS[@]} -gt 0 ]] || MODELS=(smollm2 gptoss)
for m in "${MODELS[@]}"; do
  [[ "$m" == smollm2 || "$m" == gptoss ]] || die "unknown model '$m' (expected smollm2 or gptoss)"
done
command -v python3 >/dev/null || die "python3 is needed to read the JSON lines"

cd "$REPO"
if [[ -z "$BASE" ]]; then
  first="$(git log --format=%H --diff-filter=A -- crates/engine/src/hooks.rs | tail -1)"
  [[ -n "$first" ]] || die "no commit adds crates/engine/src/hooks.rs"
  BASE="$(git rev-parse "$first^")"
fi
BASE="$(git rev-parse --verify "$BASE^{commit}")" || die "no commit '$BASE'"
log "before: $(git log -1 --format='%h %s' "$BASE" | cut -c1-90)"

# --- builds --------------------------------------------------------------------
build_rev() { # REV -> path of its release turbospark (sources and target under $WORK)
  local rev="$1" src="$WORK/src-${1:0:12}" target="$WORK/target-${1:0:12}"
  if [[ ! -f "$src/Cargo.toml" ]]; then
    log "extracting $rev into $src"
    rm -rf "$src.tmp" && mkdir -p "$src.tmp"
    # --touch: sources newer than any artifact a seeded target holds.
    git archive "$rev" | tar -x --touch -C "$src.tmp"
    mv "$src.tmp" "$src"
  fi
  log "building ${rev:0:12} (release)"
  (cd "$src" && CARGO_TARGET_DIR="$target" nice -n 10 cargo build --release -q -p turbospark-cli) \
    || die "building $rev failed"
  echo "$target/release/turbospark"
}
declare -A BIN=()
BIN[before]="$(build_rev "$BASE")"
if [[ -n "$AFTER" ]]; then
  AFTER="$(git rev-parse --verify "$AFTER^{commit}")" || die "no commit '$AFTER'"
  NOW="$(git rev-parse --short "$AFTER")"
  BIN[now]="$(build_rev "$AFTER")"
else
  NOW="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates Cargo.toml Cargo.lock || echo +dirty)"
  log "building the working tree (release)"
  nice -n 10 cargo build --release -q -p turbospark-cli || die "building the working tree failed"
  BIN[now]="$REPO/target/release/turbospark"
fi
log "now:    $NOW"

# --- installs --------------------------------------------------------------------
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
declare -A SRC_OF=()
for m in "${MODELS[@]}"; do
  case "$m" in
    smollm2) SRC_OF[$m]="$("$REPO/scripts/fetch-models.sh" smollm2 | cut -f2)" ;;
    gptoss) SRC_OF[$m]="$REPO/tests/fixtures/tiny/gpt_oss" ;;
  esac
  [[ -e "${SRC_OF[$m]}" ]] || die "no source for $m at ${SRC_OF[$m]}"
  for b in before now; do
    log "$b: convert $m"
    "${BIN[$b]}" convert "${SRC_OF[$m]}" "$tmp/$b-$m" > "$tmp/convert.log" 2>&1 \
      || { tail -5 "$tmp/convert.log" >&2; die "$b: converting $m failed"; }
  done
done

# --- rounds ------------------------------------------------------------------------
tps() { # the decode test's tok/s from bench --json output
  python3 -c 'import json,sys
for l in sys.stdin:
    l = l.strip()
    if l.startswith("{"):
        v = json.loads(l)
        if v.get("test", "").startswith("tg"):
            print(v["tok_per_s"]); break' 
}
declare -A RUNS=()
for m in "${MODELS[@]}"; do
  n="$N_GEN"
  [[ -n "$n" ]] || { [[ "$m" == gptoss ]] && n=2048 || n=128; }
  for ((r = 1; r <= ROUNDS; r++)); do
    order=(before now)
    (( r % 2 == 0 )) && order=(now before)
    for b in "${order[@]}"; do
      out="$("${BIN[$b]}" bench -m "$tmp/$b-$m" -p "$N_PROMPT" -n "$n" -r 1 -t "$THREADS" \
              --experts resident --json 2>"$tmp/bench.err")" \
        || { tail -5 "$tmp/bench.err" >&2; die "$b: bench $m failed"; }
      v="$(tps <<<"$out")"
      [[ -n "$v" ]] || die "$b: no decode result in: $out"
      RUNS[$m,$b]+="$v "
      log "$m round $r $b: $v tok/s"
    done
  done
  RUNS[$m,n]=$n
done

# --- report ------------------------------------------------------------------------
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
echo "Machine: $cpu, $(nproc) cores; $(date -u +%Y-%m-%d); before $(git rev-parse --short "$BASE"), now $NOW; -t $THREADS, -p $N_PROMPT, $ROUNDS rounds"
echo
echo "| model | decode steps | before tok/s (min–max) | now tok/s (min–max) | now / before (medians) | per-round ratio: median [quartiles] (min–max) |"
echo "|---|---:|---:|---:|---:|---:|"
for m in "${MODELS[@]}"; do
  python3 - "$m" "${RUNS[$m,n]}" "${RUNS[$m,before]}" "${RUNS[$m,now]}" <<'PY'
import statistics as st, sys
m, n, before, now = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
b = [float(x) for x in before]; a = [float(x) for x in now]
r = [y / x for x, y in zip(b, a)]
f = lambda v: f"{st.median(v):.2f} ({min(v):.2f}–{max(v):.2f})"
q = st.quantiles(r, n=4) if len(r) > 1 else [r[0]] * 3
print(f"| {m} | {n} | {f(b)} | {f(a)} | {st.median(a) / st.median(b):.3f} | "
      f"{st.median(r):.3f} [{q[0]:.3f}–{q[2]:.3f}] ({min(r):.3f}–{max(r):.3f}) |")
PY
done
