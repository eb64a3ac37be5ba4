#!/usr/bin/env bash
# run.sh — the GPU tests and benchmarks, in one call, on a machine with an
# NVIDIA GPU (the device machine: nothing is fetched, everything it needs
# travels with the repository; see scripts/gpu/build.sh).
#
# Usage: scripts/gpu/run.sh [STAGE...]     (default: every stage, in order)
#   info         GPU, driver, NVRTC, HBM copy bandwidth
#   conformance  the backend conformance suite on the GPU (exact and fast)
#   fixtures     every tiny fixture family: CUDA logits vs CPU exact logits
#                (max |Δ| / max |logit|) and 32 greedy tokens, CUDA exact and fast
#   bench        gpt-oss-20b-shaped synthetic model (synth --gguf): our
#                pp512 / tg128 with resident experts, and the roofline
#   llamacpp     builds llama.cpp with CUDA for sm_90 from the packed sources
#                and races it on the same GGUF (resident, and --n-cpu-moe)
#   streamed     our VRAM slot cache at 50 % and 25 % of the experts,
#                uniform and skewed routing
#
# Environment: BIN (turbospark and the test binaries; default .devcarry/bin),
#   WORK (scratch, default /tmp/ts-gpu), LLAMA_TGZ (default
#   .devcarry/llama.cpp-cuda.tgz, made by scripts/gpu/pack-llamacpp.sh),
#   REPS (benchmark repetitions, default 3).
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-.devcarry/bin}
WORK=${WORK:-/tmp/ts-gpu}
LLAMA_TGZ=${LLAMA_TGZ:-.devcarry/llama.cpp-cuda.tgz}
REPS=${REPS:-3}
TS="$BIN/turbospark"
mkdir -p "$WORK"
STAGES=${*:-info conformance fixtures bench llamacpp streamed}
t_all=$SECONDS
stage() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }

# NVRTC: the CUDA toolkit's, else the one pip installed beside PyTorch.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    $(python3 -c 'import site; print(" ".join(p + "/nvidia/cu13/lib" for p in site.getsitepackages()))' 2>/dev/null); do
    if [ -e "$d/libnvrtc.so.13" ] || ls "$d"/libnvrtc.so* >/dev/null 2>&1; then
        export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        break
    fi
done

synth20b() {
    if [ ! -d "$WORK/synth20b" ]; then
        "$TS" synth -q --vocab 201088 --gguf "$WORK/synth20b.gguf" "$WORK/synth20b" || return 1
    fi
    if [ ! -d "$WORK/synth20b-skew" ]; then
        "$TS" synth -q --vocab 201088 --router-skew 1.0 --gguf "$WORK/synth20b-skew.gguf" "$WORK/synth20b-skew" || return 1
    fi
}

for s in $STAGES; do
    t0=$SECONDS
    case $s in
    info)
        stage "info"
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
        echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
        python3 - <<'PY'
import torch, time
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda").random_(0, 255)
y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(20): y.copy_(x)
e.record(); torch.cuda.synchronize()
ms = s.elapsed_time(e) / 20
print(f"copy bandwidth: {2 * x.numel() / ms / 1e6:.0f} GB/s (read + write of {x.numel() >> 20} MiB in {ms:.3f} ms)")
PY
        ;;
    conformance)
        stage "conformance"
        for t in "$BIN"/cuda-*; do
            echo "--- $t"
            "$t" --nocapture --test-threads 1 2>&1 | tail -15
        done
        ;;
    fixtures)
        stage "fixtures: CUDA vs CPU exact"
        printf '%-14s %-6s %12s %12s %s\n' family mode "max|Δ|/max" "greedy32" ""
        for dir in tests/fixtures/tiny/*/; do
            fam=$(basename "$dir")
            [ -f "$dir/config.json" ] || continue
            inst="$WORK/fx-$fam"
            "$TS" convert -q --force "$dir" "$inst" || { echo "$fam: convert failed"; continue; }
            toks=$(python3 -c "import json; print(','.join(map(str, json.load(open('$dir/tokens.json'))['tokens'])))")
            "$TS" logits --model "$inst" --tokens "$toks" --out "$WORK/$fam-cpu.npy" --numerics exact --greedy 32 > "$WORK/$fam-cpu.txt" || { echo "$fam: cpu failed"; continue; }
            for mode in exact fast; do
                if "$TS" logits --model "$inst" --backend cuda --tokens "$toks" --out "$WORK/$fam-cuda-$mode.npy" --numerics $mode --greedy 32 > "$WORK/$fam-cuda-$mode.txt"; then
                    python3 - "$WORK/$fam-cpu" "$WORK/$fam-cuda-$mode" "$fam" "$mode" <<'PY'
import sys, numpy as np
a, b, fam, mode = sys.argv[1:5]
x, y = np.load(a + ".npy").astype(np.float64), np.load(b + ".npy").astype(np.float64)
rel = np.abs(x - y).max() / np.abs(x).max()
ga, gb = open(a + ".txt").read().strip(), open(b + ".txt").read().strip()
ok = rel <= 2e-3 and ga == gb
print(f"{fam:<14} {mode:<6} {rel:12.2e} {'same' if ga == gb else 'DIFFER':>12} {'ok' if ok else 'FAIL'}")
PY
                else
                    echo "$fam $mode: cuda failed"
                fi
            done
        done
        ;;
    bench)
        stage "bench: gpt-oss-20b shape, resident experts"
        synth20b || { echo "synth failed"; continue; }
        du -sh "$WORK/synth20b" "$WORK/synth20b.gguf"
        "$TS" bench -m "$WORK/synth20b" --backend cuda --experts resident -p 512 -n 128 -r "$REPS" --numerics fast,exact
        ;;
    *) echo "unknown stage $s" ;;
    esac
    echo "<== $s: $((SECONDS - t0)) s"
done
echo "all stages: $((SECONDS - t_all)) s"
