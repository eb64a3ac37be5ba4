#!/usr/bin/env bash
# record.sh — the benchmark record in one device call, packed to fit a short
# device budget: the synthetic model (with its GGUF) and llama.cpp's CUDA
# build run in the background while the GPU checks run (conformance, tiny
# fixtures, faults, FFN census); then our bench, llama.cpp's on the same GGUF, a decode
# profile and the streamed sweep (last, as the first thing a time limit cuts).
#
# Usage: scripts/gpu/record.sh     (environment as scripts/gpu/run.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
export REPS=${REPS:-2} SKEW=${SKEW:-0} CPU_MOE=${CPU_MOE:-0} PROFILE=${PROFILE:-decode}
RUN=scripts/gpu/run.sh
WORK=${WORK:-/tmp/ts-gpu}
mkdir -p "$WORK"
t0=$SECONDS
bash "$RUN" prepare > "$WORK/prepare.log" 2>&1 &
prep=$!
bash "$RUN" conformance
bash "$RUN" fixtures faults census 2>&1 | grep -v "^experts resident"
echo "=== waiting for the synthetic model and llama.cpp's build ($((SECONDS - t0)) s so far)"
wait $prep
tail -5 "$WORK/prepare.log"
bash "$RUN" bench llamacpp profile streamed 2>&1 | grep -v "^experts resident"
echo "record: $((SECONDS - t0)) s"
