#!/usr/bin/env bash
# run.sh — the GPU tests and benchmarks, in one call, on a machine with an
# NVIDIA GPU (the device machine: nothing is fetched, everything it needs
# travels with the repository; see scripts/gpu/build.sh).
#
# Usage: scripts/gpu/run.sh [STAGE...]     (default: every stage, in order)
#   prepare      in parallel: the synthetic models (uniform and skewed
#                routing) and the llama.cpp CUDA build
#   info         GPU, driver, NVRTC, HBM copy bandwidth
#   conformance  the backend conformance suite on the GPU (exact and fast)
#   fixtures     every tiny fixture family: CUDA logits vs CPU exact logits
#                (max |Δ| / max |logit|) and 32 greedy tokens, CUDA exact and fast;
#                token by token (replayed steps), exact vs CPU exact and fast
#                vs CUDA fast prefill
#   census       every MoE fixture: --ffn-census on CUDA (experts resident and
#                streamed through top_k slots) vs the CPU's, exact numerics
#   bench        gpt-oss-20b-shaped synthetic model (synth --gguf): our
#                pp512 / tg128 with resident experts, and the roofline
#   llamacpp     builds llama.cpp with CUDA for sm_90 from the packed sources
#                and races it on the same GGUF (resident, and --n-cpu-moe)
#   race         prepare in the background; meanwhile info, then bench as
#                soon as the model is written (~70 s alone on 16 cores),
#                then llamacpp once its build is ready (~6 min) and bench
#                again: the whole same-call race in one device call. Waits
#                at most RACE_WAIT s (default 480) from the stage's start.
#   streamed     our VRAM slot cache at 50 % and 25 % of the experts,
#                uniform and skewed routing (misses copied from the locked
#                page cache, the default), then every miss read
#                (--pin-page-cache 0) and every expert in host memory; logits
#                of each way bit for bit against resident
#   like         parity on `synth --like` installs of the three real models
#                (layouts saved here with --save-layout as
#                .devcarry/layout-*.json): CUDA vs CPU logits, exact and fast
#   likebench    the same installs' speed, fast numerics: pp512 and tg128
#                under each setting of LIKE_SETTINGS (default: the default,
#                kq.cu's integer kernels for Q4_K, Q6_K and the legacy 4-
#                and 5-bit formats, then those formats decoded for the
#                tensor cores, TURBOSPARK_CUDA_KQ=tc; TURBOSPARK_CUDA_BF16=bf16
#                puts the decoded formats on matmul.cu's kernel), alternated (REPS rounds), after each
#                setting's logits of 24 tokens, by prefill and token by
#                token: how far apart the two ways are (the attention's
#                order differs between them) and each setting from the
#                first (their roundings)
#   kquant       likebench's measurement on Q4_K_M layouts of an 8B Llama
#                and a Qwen3-30B-A3B MoE (scripts/gpu/kquant_layouts.py,
#                .devcarry/kquant): kq.cu's integer K-quant kernels (the
#                default) against the tensor cores (TURBOSPARK_CUDA_KQ=tc);
#                LIKE_SETTINGS as likebench's (synth writes ~5 and ~17 GB)
#   faults       bad requests on the GPU: more VRAM than exists, a KV cache
#                that cannot fit, NVRTC missing with an empty kernel cache
#                (hidden in a private mount namespace), a GPU memory fault
#                in the middle of a decode (TURBOSPARK_CUDA_FAULT_STEP) —
#                each must end with a clear error and no output file
#   synth        only our synthetic model (no GGUF, no llama.cpp): quicker
#                when the call does not race llama.cpp
#   pdetail      Nsight Compute sections (occupancy, warp states, scheduler)
#                of decode_products' kernels matching PDETAIL
#   variants     decode logits with each setting of VARIANTS (default:
#                TURBOSPARK_CUDA_FUSE=0, no joined launches; unset is the
#                attention's join alone, since the sixteenth session) bit
#                for bit against VARIANT_BASE (default
#                TURBOSPARK_CUDA_FUSE=attention: the defaults), and how far
#                their prefill logits are, and pp512 and tg128 of each (at the
#                depths VARIANT_DEPTHS, default 0); a setting that changes
#                the sums' order (TURBOSPARK_CUDA_SPLIT_KEYS) reports DIFFER
#                by design, its correctness is the conformance suite's
#   ab           AB_BASE (another turbospark binary) against BIN's: decode
#                logits of both bit for bit, then alternated
#                (scripts/bench/ab.sh, AB_ROUNDS rounds, default 2): pp512 and
#                tg128 at each of DEPTHS on the synthetic model
#   products     bandwidth of the decode step's matrix-vector products,
#                shape by shape, one token's routed experts, and the launch
#                floor (examples/decode_products.rs); again with each
#                setting of PRODUCTS_ALT (default: the one-token kernels
#                off, then dependent launch off)
#   compile      the kernels compiled afresh for sm_90 here: as one
#                program, then as nvrtc.rs's programs at once (the first
#                start's compile on this machine; examples/kernel_cache.rs)
#   stagesync    a chain of 24 one-token products, one launch a step (PDL
#                graph) against one persistent kernel meeting at a grid
#                barrier a step, with and without the next step's weight
#                loads issued before the barrier, and (sm_90) with the
#                weights through a bulk-copy ring in shared memory; the
#                floors (examples/stage_sync.rs; REPLAYS, default 50;
#                CHAIN steps a chain, default 24)
#   racecheck    compute-sanitizer racecheck and synccheck on the kernels
#                matching RACE_KERNEL (a name substring; default the chunked
#                delta rule) while the conformance tests matching RACE_TESTS
#                run (default exact; `fast` for fast-numerics kernels), then
#                those three more times (a moving error is a race)
#   profile      Nsight Compute on a few decode steps of the synthetic
#                model, then on a 512-token prefill: time, DRAM bytes and
#                bandwidth per kernel (PROFILE=decode or prefill: only one)
#   knockout     where a decode step's time goes inside the replayed graph:
#                tg128 at VARIANT_DEPTHS (default 512) with each set of
#                KNOCKOUTS (space-separated; a set is comma-separated kernel
#                names for TURBOSPARK_CUDA_KNOCKOUT; NAME%P=R picks a
#                kernel's launches by their order in the step, e.g.
#                matmul1_q8x_q8_0_w2880$%2=1 the router products) left
#                out of the recorded step (~NAME hollows them instead: an
#                empty launch of the same shape in each one's place, so a
#                kernel's cost splits into its place in the chain and its
#                work), alternated with none (REPS
#                rounds; round 1 also prints how many launches each entry
#                named and left out in a step); the results are wrong by
#                design, only the rates count
#   trace        a timeline of the replayed decode step, launch by launch
#                (the device machine has no Nsight Systems): tg128 at
#                VARIANT_DEPTHS (default 512) under each set of TRACES
#                (space-separated knockout sets, as KNOCKOUTS; default
#                none, the default step), first untraced, then with
#                scripts/gpu/kernel_trace.c (CUPTI, loaded through
#                CUDA_INJECTION64_PATH) writing every graph kernel's start
#                and end; scripts/gpu/trace_report.py then gives each
#                kernel's advance (its end less the end of the launch
#                before it: what it adds to the chain), summed by kernel
#                and side by side across the sets; every launch of each
#                set's step in $OUT/trace-nodes.txt (or $WORK; TRACE_TAG
#                prefixes the files' names: trace-${TRACE_TAG}nodes.txt)
#   detail       Nsight Compute's occupancy, launch and warp-stall sections
#                for the kernels matching DETAIL (decode and prefill;
#                DETAIL_WHAT=decode or prefill for one, DETAIL_SECTIONS for
#                more sections, e.g. SourceCounters; reports under $OUT)
#
# Environment: BIN (turbospark and the test binaries; default .devcarry/bin),
#   WORK (scratch, default /tmp/ts-gpu), LLAMA_TGZ (default
#   .devcarry/llama.cpp-cuda.tgz, made by scripts/gpu/pack-llamacpp.sh),
#   REPS (benchmark repetitions, default 3), DEPTHS (bench and llamacpp:
#   tokens in the cache before each test, `-d`; default 0,512: tg128 from
#   an empty cache, as llama-bench's default, and after a 512-token
#   prompt, as issue 10 asks), SKEW=0 (no skewed model), NEED_GPU (e.g.
#   H200: stop at once, exit 3, unless the GPU's name contains it, so a
#   call lent another card spends no more of the device time),
#   NCU_CLOCKS (profile: Nsight Compute's --clock-control, default none:
#   kernels timed at the clocks the GPU runs them at; base locks them to
#   the base clock, as before 2026-12-02), NCU_CACHE (profile:
#   --cache-control, default none: caches as the decode leaves them, so a
#   decode step's kernel times add up to its measured time; all flushes
#   them before every kernel),
#   RESIDENT_FORMAT (the synthetic models' attention, router, embedding
#   and head: q8_0, the default, or bf16 as gpt-oss ships them),
#   CPU_MOE=0 (llama.cpp only with every layer on the GPU), IO_THREADS
#   (streamed: expert reader threads, bench's --io-threads; default
#   bench's: the cores less two, at most 12, with --backend cuda),
#   HOST_EXPERTS=0 (streamed: no sweep with every expert in host memory),
#   TURBOSPARK_CUDA_PIN=0 (streamed slots left pageable, fills staged),
#   TURBOSPARK_CUDA_COPY_STREAM=0 (fills copied on the session's stream,
#   not on a copy stream beside it).
set -uo pipefail
cd "$(dirname "$0")/../.."
# On the device machine ($OUT set), the whole log also goes to
# $OUT/run.log, which comes back even when the call runs out of time.
if [ -n "${OUT:-}" ] && [ -d "$OUT" ] && [ -w "$OUT" ]; then
    exec > >(tee -a "$OUT/run.log") 2>&1
fi
BIN=${BIN:-.devcarry/bin}
WORK=${WORK:-/tmp/ts-gpu}
LLAMA_TGZ=${LLAMA_TGZ:-.devcarry/llama.cpp-cuda.tgz}
REPS=${REPS:-3}
DEPTHS=${DEPTHS:-0,512}
RESIDENT_FORMAT=${RESIDENT_FORMAT:-q8_0}
TS="$BIN/turbospark"
# What build.sh packed, unpacked once on the device machine (under a
# lock: record.sh starts two run.sh at once).
if [ ! -x "$TS" ] && [ -f .devcarry/pack.tgz ]; then
    ( flock 9 && { [ -x "$TS" ] || tar xzf .devcarry/pack.tgz; } ) 9> .devcarry/unpack.lock || exit 1
fi
mkdir -p "$WORK"
# The kernels build.sh compiled for sm_90, when they travelled with the
# binaries (a miss — other source or NVRTC version — compiles as before).
if [ -z "${TURBOSPARK_CACHE:-}" ] && [ -d .devcarry/cache/cuda ]; then
    export TURBOSPARK_CACHE="$PWD/.devcarry/cache"
fi
if [ -n "${NEED_GPU:-}" ]; then
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    case "$gpu" in
    *"$NEED_GPU"*) ;;
    *) echo "NEED_GPU=$NEED_GPU but this machine's GPU is '${gpu:-none found}': stopping"; exit 3 ;;
    esac
fi
STAGES=${*:-prepare info conformance bench llamacpp fixtures census streamed}
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

# pp512 and tg128 of `synth --like` installs of the layouts given, under
# each setting of $1 (space-separated VAR=value), alternated REPS rounds,
# after each setting's logits of 24 tokens by prefill and token by token:
# how far apart the two ways are (the attention's order differs between
# them), and each setting from the first (their roundings).
like_bench() {
    local settings=$1 layout name inst toks v way flag r
    shift
    toks=$(python3 -c "print(','.join(str(7 + 13 * i) for i in range(24)))")
    for layout in "$@"; do
        [ -f "$layout" ] || { echo "$layout: no such layout (scripts/gpu/build.sh writes them)"; continue; }
        name=$(basename "$layout" .json); name=${name#layout-}
        inst="$WORK/like-$name"
        [ -d "$inst" ] || "$TS" synth -q --like "$layout" "$inst" || { echo "$name: synth failed"; continue; }
        for v in $settings; do
            for way in prefill decode; do
                flag=$([ $way = decode ] && echo --decode || true)
                env "$v" "$TS" logits --model "$inst" --backend cuda --numerics fast $flag --tokens "$toks" \
                    --out "$WORK/lb-$name-$v-$way.npy" > /dev/null || echo "$name $v $way: logits failed"
            done
        done
        # shellcheck disable=SC2086
        python3 - "$WORK" "$name" $settings <<'PY'
import sys, numpy as np
w, name, *settings = sys.argv[1:]
get = lambda v, way: np.load(f"{w}/lb-{name}-{v}-{way}.npy").astype(np.float64)
for v in settings:
    p, d = get(v, "prefill"), get(v, "decode")
    print(f"{name} {v}: decode vs prefill max|Δ|/max {np.abs(p - d).max() / np.abs(p).max():.2e}")
a = get(settings[0], "prefill")
for v in settings[1:]:
    b = get(v, "prefill")
    print(f"{name}: {settings[0]} vs {v}, prefill logits max|Δ|/max {np.abs(a - b).max() / np.abs(b).max():.2e}")
PY
        for r in $(seq "$REPS"); do
            for v in $settings; do
                echo "--- $name, $v, round $r"
                env "$v" "$TS" bench -m "$inst" --backend cuda -p 512 -n 128 -r 2 --numerics fast
            done
        done
    done
}

build_llamacpp() {
    [ -x "$WORK/lcb/bin/llama-bench" ] && return 0
    rm -rf "$WORK/llama.cpp" && tar xzf "$LLAMA_TGZ" -C "$WORK" || return 1
    cmake -S "$WORK/llama.cpp" -B "$WORK/lcb" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >"$WORK/lcb-configure.log" 2>&1 || { tail -20 "$WORK/lcb-configure.log"; return 1; }
    cmake --build "$WORK/lcb" --target llama-bench -j 16 >"$WORK/lcb-build.log" 2>&1 || { tail -30 "$WORK/lcb-build.log"; return 1; }
}

# tg128 @ d$VARIANT_DEPTHS of the synthetic model (experts resident, fast
# numerics, two repetitions), printed as "mean sd" from bench --json (the
# rate by its name, not a table column); bench's stderr goes to $1. The
# knockout and trace stages' measurement.
tg_rate() {
    "$TS" bench -m "$WORK/synth20b" --backend cuda --experts resident -p 0 -n 128 \
        -d "$VARIANT_DEPTHS" -r 2 --numerics fast --json 2> "$1" \
        | python3 -c 'import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        d = json.loads(line)
        print("%.2f %.2f" % (d["tok_per_s"], d["sd"]))'
}

synth20b() {
    if [ ! -d "$WORK/synth20b" ]; then
        "$TS" synth -q --vocab 201088 --resident-format "$RESIDENT_FORMAT" --gguf "$WORK/synth20b.gguf" "$WORK/synth20b" || return 1
    fi
    if [ "${SKEW:-1}" = 1 ] && [ ! -d "$WORK/synth20b-skew" ]; then
        "$TS" synth -q --vocab 201088 --resident-format "$RESIDENT_FORMAT" --router-skew 1.0 --gguf "$WORK/synth20b-skew.gguf" "$WORK/synth20b-skew" || return 1
    fi
}

for s in $STAGES; do
    t0=$SECONDS
    case $s in
    prepare)
        stage "prepare: synthetic models and the llama.cpp build, in parallel"
        # (an install made by the synth stage has no GGUF: made again)
        # (each part says how long it took: they share the machine's cores)
        ( [ -f "$WORK/synth20b.gguf" ] || { rm -rf "$WORK/synth20b"; "$TS" synth -q --vocab 201088 --resident-format "$RESIDENT_FORMAT" --gguf "$WORK/synth20b.gguf" "$WORK/synth20b"; }
          echo "prepare: synth20b finished after $((SECONDS - t0)) s" ) &
        if [ "${SKEW:-1}" = 1 ]; then
            ( [ -f "$WORK/synth20b-skew.gguf" ] || { rm -rf "$WORK/synth20b-skew"; "$TS" synth -q --vocab 201088 --resident-format "$RESIDENT_FORMAT" --router-skew 1.0 --gguf "$WORK/synth20b-skew.gguf" "$WORK/synth20b-skew"; }
              echo "prepare: synth20b-skew finished after $((SECONDS - t0)) s" ) &
        fi
        ( build_llamacpp; echo "prepare: llama.cpp build finished after $((SECONDS - t0)) s" ) &
        wait
        ls "$WORK"
        ;;
    faults)
        stage "faults: clear errors, no partial output"
        inst="$WORK/fx-llama"
        [ -d "$inst" ] || "$TS" convert -q --force tests/fixtures/tiny/llama "$inst"
        fault() {
            local label=$1; shift
            rm -f "$WORK/fault.npy"
            "$@" > "$WORK/fault.out" 2> "$WORK/fault.err"
            local rc=$?
            echo "--- $label: exit $rc; output file $([ -e "$WORK/fault.npy" ] && echo LEFT BEHIND || echo absent)"
            grep -v "^experts resident" "$WORK/fault.err" | tail -3
        }
        fault "VRAM budget past the GPU" "$TS" logits --model "$inst" --backend cuda --tokens 1,2,3 --out "$WORK/fault.npy" --gpu-memory-budget 100000
        # `run` needs a tokenizer: the tiny llama with a byte-level one (its
        # 256 ids are the fixture's vocabulary), converted again.
        tinst="$WORK/fx-llama-tok"
        if [ ! -d "$tinst" ]; then
            rm -rf "$WORK/fx-llama-src" && cp -r tests/fixtures/tiny/llama "$WORK/fx-llama-src"
            python3 - "$WORK/fx-llama-src/tokenizer.json" <<'PY'
import json, sys
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
json.dump({"version": "1.0", "added_tokens": [], "pre_tokenizer": bl, "decoder": bl,
           "model": {"type": "BPE", "vocab": {chr(c): b for b, c in zip(bs, cs)}, "merges": []}},
          open(sys.argv[1], "w"))
PY
            "$TS" convert -q --force "$WORK/fx-llama-src" "$tinst"
        fi
        fault "a KV cache past the GPU" "$TS" run --model "$tinst" --backend cuda --numerics fast --raw --prompt "hello" --max-tokens 2 --context 1500000000
        # NVRTC hidden: every folder the loader knows it from covered by an
        # empty tmpfs in a private mount namespace (root; this process only).
        nvrtc_dirs=$( { ldconfig -p | grep -o '/[^ ]*libnvrtc[^ ]*'; IFS=:; for d in ${LD_LIBRARY_PATH:-}; do ls "$d"/libnvrtc* 2>/dev/null; done; } \
            | xargs -r -n1 dirname | sort -u | tr '\n' ' ')
        echo "NVRTC found in: ${nvrtc_dirs:-nowhere}"
        fault "no NVRTC, empty kernel cache" unshare -m sh -c 'for d in $0; do mount -t tmpfs none "$d" || exit 99; done; exec "$@"' \
            "$nvrtc_dirs" env TURBOSPARK_CACHE="$WORK/empty-cache" "$TS" logits --model "$inst" --backend cuda --tokens 1,2,3 --out "$WORK/fault.npy"
        fault "GPU ordinal past the GPUs" "$TS" logits --model "$inst" --backend cuda --gpu 7 --tokens 1,2,3 --out "$WORK/fault.npy"
        # A real GPU memory fault in the 5th replayed decode step.
        fault "a GPU fault mid-generation (decode step 5)" env TURBOSPARK_CUDA_FAULT_STEP=5 timeout 120 "$TS" logits --model "$inst" --backend cuda --decode --tokens 1,2,3,4,5,6,7,8,9,10,11,12 --out "$WORK/fault.npy"
        ;;
    like)
        stage "like: synth --like installs of the real models, CUDA vs CPU"
        # The acceptance (≤ 2e-3, the same greedy tokens) is for exact
        # numerics; a fast row compares two different approximations (the
        # CPU's 8-bit activations, the tensor cores' bf16 roundings), so it
        # prints, as its scale, how far the CPU's fast logits are from its
        # exact ones.
        printf '%-36s %-6s %12s %12s %s\n' model mode "max|Δ|/max" "greedy32" ""
        toks=$(python3 -c "print(','.join(str(7 + 13 * i) for i in range(40)))")
        for layout in .devcarry/layout-*.json; do
            name=$(basename "$layout" .json); name=${name#layout-}
            inst="$WORK/like-$name"
            [ -d "$inst" ] || "$TS" synth -q --like "$layout" "$inst" || { echo "$name: synth failed"; continue; }
            for mode in exact fast; do
                "$TS" logits --model "$inst" --tokens "$toks" --out "$WORK/$name-cpu-$mode.npy" --numerics $mode --greedy 32 > "$WORK/$name-cpu-$mode.txt" 2>/dev/null || { echo "$name $mode: cpu failed"; continue; }
                "$TS" logits --model "$inst" --backend cuda --tokens "$toks" --out "$WORK/$name-cuda-$mode.npy" --numerics $mode --greedy 32 > "$WORK/$name-cuda-$mode.txt" 2>/dev/null || { echo "$name $mode: cuda failed"; continue; }
                python3 - "$WORK/$name-cpu-$mode" "$WORK/$name-cuda-$mode" "$name" "$mode" <<'PY'
import sys, numpy as np
a, b, name, mode = sys.argv[1:5]
x, y = np.load(a + ".npy").astype(np.float64), np.load(b + ".npy").astype(np.float64)
rel = np.abs(x - y).max() / np.abs(x).max()
ga, gb = open(a + ".txt").read().strip(), open(b + ".txt").read().strip()
if mode == "exact":
    verdict = "ok" if rel <= 2e-3 and ga == gb else "CHECK"
else:
    e = np.load(a.replace("-cpu-fast", "-cpu-exact") + ".npy").astype(np.float64)
    verdict = f"(CPU fast vs CPU exact: {np.abs(x - e).max() / np.abs(e).max():.2e})"
print(f"{name:<36} {mode:<6} {rel:12.2e} {'same' if ga == gb else 'DIFFER':>12} {verdict}")
PY
            done
        done
        ;;
    likebench)
        stage "likebench: the real models' layouts, decoded formats on the tensor cores or not"
        like_bench "${LIKE_SETTINGS:-TURBOSPARK_CUDA_KQ=int8 TURBOSPARK_CUDA_KQ=tc}" .devcarry/layout-*.json
        ;;
    kquant)
        stage "kquant: Q4_K_M layouts of an 8B Llama and a 30B-A3B Qwen3 MoE, K-quants on the tensor cores or in integers"
        like_bench "${LIKE_SETTINGS:-TURBOSPARK_CUDA_KQ=int8 TURBOSPARK_CUDA_KQ=tc}" .devcarry/kquant/layout-*.json
        ;;
    synth)
        stage "synth: the gpt-oss-20b-shaped model alone"
        [ -d "$WORK/synth20b" ] || "$TS" synth -q --vocab 201088 --resident-format "$RESIDENT_FORMAT" "$WORK/synth20b"
        ;;
    profile)
        stage "profile: Nsight Compute, decode kernels"
        NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
        [ -n "$NCU" ] || { echo "ncu not found"; continue; }
        whats=("decode:-p 1 -n 8:500" "prefill:-p 512 -n 1:400")
        [ "${PROFILE:-all}" = decode ] && whats=("decode:-p 1 -n 8:500")
        [ "${PROFILE:-all}" = prefill ] && whats=("prefill:-p 512 -n 1:400")
        for what in "${whats[@]}"; do
            IFS=: read -r label bargs count <<< "$what"
            echo "--- $label ($bargs)"
            # shellcheck disable=SC2086
            "$NCU" --csv --print-units base --clock-control "${NCU_CLOCKS:-none}" --cache-control "${NCU_CACHE:-none}" -k regex:'^(?!split_rows)' --metrics gpu__time_duration.sum,dram__bytes_read.sum -c "$count" \
                "$TS" bench -m "$WORK/synth20b" --backend cuda --experts resident $bargs -r 1 \
                --numerics ${NUMERICS:-fast} > "$WORK/ncu-$label.csv" 2> "$WORK/ncu.err" || tail -5 "$WORK/ncu.err"
            [ -n "${OUT:-}" ] && cp "$WORK/ncu-$label.csv" "$OUT/"
            python3 - "$WORK/ncu-$label.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]
ki, mi, vi = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
ii = head.index("ID")
per = collections.defaultdict(dict)
for r in rows[1:]:
    try:
        per[(r[ii], r[ki].split("(")[0])][r[mi]] = float(r[vi].replace(",", ""))
    except ValueError:
        pass
agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
for (_, name), m in per.items():
    a = agg[name]
    a[0] += 1
    a[1] += m.get("gpu__time_duration.sum", 0)
    a[2] += m.get("dram__bytes_read.sum", 0)
total = sum(a[1] for a in agg.values())
print(f"{'kernel':<36} {'calls':>6} {'mean us':>9} {'MB/call':>9} {'GB/s':>8} {'share':>6}")
for name, (n, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{name[:36]:<36} {n:>6} {t / n / 1e3:>9.2f} {b / n / 1e6:>9.3f} {b / t if t else 0:>8.0f} {t / total:>6.1%}")
PY
        done
        ;;
    detail)
        # Nsight Compute's occupancy, launch and stall sections for the
        # kernels matching DETAIL (a regex; default: the fast products),
        # a few launches each, decode (-p 1) and prefill (-p 512).
        stage "detail: Nsight Compute sections of ${DETAIL:=^(matmul_q8x|moe_gate_up_q8x|moe_down_q8x|mq_gate_up|mq_down|mq_matmul|attention)}"
        NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
        [ -n "$NCU" ] || { echo "ncu not found"; continue; }
        # DETAIL_WHAT=decode or prefill: only that bench; DETAIL_SECTIONS:
        # more Nsight Compute sections (e.g. "SourceCounters
        # ComputeWorkloadAnalysis": where the warps stall, by instruction);
        # DETAIL_ARGS: more bench arguments (e.g. "-d 512": decode after a
        # 512-token prompt).
        whats=("decode:-p 1 -n 4" "prefill:-p 512 -n 1")
        [ "${DETAIL_WHAT:-all}" = decode ] && whats=("decode:-p 1 -n 4")
        [ "${DETAIL_WHAT:-all}" = prefill ] && whats=("prefill:-p 512 -n 1")
        extra=()
        for sec in ${DETAIL_SECTIONS:-}; do extra+=(--section "$sec"); done
        for what in "${whats[@]}"; do
            IFS=: read -r label bargs <<< "$what"
            report="$WORK/detail-$label.txt"
            echo "--- $label ($bargs; the whole report: detail-$label.txt under \$OUT)"
            # shellcheck disable=SC2086
            "$NCU" --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
                ${extra[@]+"${extra[@]}"} -k regex:"$DETAIL" -c "${DETAIL_COUNT:-8}" \
                "$TS" bench -m "$WORK/synth20b" --backend cuda --experts resident $bargs ${DETAIL_ARGS:-} -r 1 --no-warmup \
                --numerics fast 2> "$WORK/ncu.err" > "$report"
            [ -n "${OUT:-}" ] && cp "$report" "$OUT/"
            grep -E '^  [a-z_0-9]+.*\(|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit (Reg|Shared)|DRAM Throughput|Memory Throughput|Compute \(SM\)|Warp Cycles Per Issued|Dynamic Shared|Static Shared|Grid Size|Block Size|Waves Per SM|Stall|stall' "$report" \
                | grep -v '^ *----' || tail -5 "$WORK/ncu.err"
        done
        ;;
    pdetail)
        # Nsight Compute on the products of examples/decode_products.rs
        # (no model needed): occupancy, launch, warp-state and scheduler
        # sections of every launch matching PDETAIL; the whole report goes
        # to $OUT/pdetail.txt, a summary to the log.
        stage "pdetail: Nsight Compute on decode_products, ${PDETAIL:=^(matmul_q8x|moe_gate_up_q8x|moe_down_q8x)}"
        NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
        [ -n "$NCU" ] || { echo "ncu not found"; continue; }
        "$NCU" --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
            --section WarpStateStats --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis \
            -k regex:"$PDETAIL" -c "${PDETAIL_COUNT:-120}" "$BIN/decode_products" 1 \
            > "$WORK/pdetail.txt" 2> "$WORK/ncu.err" || tail -5 "$WORK/ncu.err"
        [ -n "${OUT:-}" ] && cp "$WORK/pdetail.txt" "$OUT/"
        grep -E '^  [a-z_0-9]+.*\(|Duration|Registers Per|Achieved Occupancy|DRAM Throughput|Grid Size|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Instructions  |Executed Ipc A' "$WORK/pdetail.txt" \
            | head -150
        ;;
    info)
        stage "info"
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
        echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
        WORK="$WORK" python3 - <<'PY'
import os, torch, time
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
# For the bench stage's roofline in the same call.
open(os.environ["WORK"] + "/copy-bandwidth", "w").write(f"{2 * x.numel() / ms / 1e6:.0f}\n")
# Host to device, as a streamed expert's fill runs: from page-locked and
# from pageable memory, 64 MiB a copy.
for pinned in (True, False):
    h = torch.empty(64 << 20, dtype=torch.uint8).random_(0, 255)
    if pinned:
        h = h.pin_memory()
    d = torch.empty_like(h, device="cuda")
    for _ in range(3): d.copy_(h, non_blocking=pinned)
    torch.cuda.synchronize()
    s.record()
    for _ in range(20): d.copy_(h, non_blocking=pinned)
    e.record(); torch.cuda.synchronize()
    ms = s.elapsed_time(e) / 20
    print(f"host to device ({'pinned' if pinned else 'pageable'}): {h.numel() / ms / 1e6:.1f} GB/s")
PY
        ;;
    compile)
        stage "kernel compile: one program, then the programs at once (no cache)"
        echo "cores: $(nproc)"
        "$BIN/kernel_cache" --one 90
        rm -rf "$WORK/fresh-cache"
        TURBOSPARK_CACHE="$WORK/fresh-cache" "$BIN/kernel_cache" 90
        ;;
    conformance)
        stage "conformance"
        # (CONFORMANCE_DEFAULT=0: only the settings below, not the default
        # run of each test binary first, ~50 s of a call.)
        [ "${CONFORMANCE_DEFAULT:-1}" = 0 ] || for t in "$BIN"/cuda-*; do
            echo "--- $t"
            "$t" --nocapture --test-threads 1 2>&1 | grep -v "^ *[0-9]*: \|^ *at " | tail -25
        done
        # The suite again under other settings: the joined launches (by
        # default the attention's; =1 also the router's; =0 none), which
        # check_router_then_experts and check_attention_then_product compare
        # with separate launches bit for bit; larger decode attention
        # splits (the default is 32 keys a split; 128 until 2026-12-04), which
        # the decode attention checks compare with the f64 formula; the
        # generic products where kernels compiled for one row width would
        # be taken (TURBOSPARK_CUDA_WIDE=0); the strided norm where the
        # vector layout would be taken (TURBOSPARK_CUDA_NORM=strided); slot
        # fills copied on the session's stream rather than beside it
        # (TURBOSPARK_CUDA_COPY_STREAM=0); a few tokens' bf16 products with
        # whole rows a warp and with a warp a segment, whatever the rows,
        # and streamed through shared memory, with a bf16 router's routing
        # in its launch (TURBOSPARK_CUDA_BF16=rows, =segments, =stream+route;
        # check_matmul compares a token alone with the batch kernel's bits,
        # check_router_then_experts the joined routing with `route`'s);
        # one token's MXFP4
        # routed experts on the integer tensor cores (TURBOSPARK_CUDA_MXFP4=mma,
        # kernels/q8mma.cu; check_moe compares a token alone with the
        # batch's tensor-core tiles bit for bit), and one token's Q8_0
        # products there (TURBOSPARK_CUDA_Q8=mma; check_matmul likewise);
        # K-quant and legacy products decoded for the tensor cores rather
        # than against 8-bit activations (TURBOSPARK_CUDA_KQ=tc); one token's
        # per-route gate/up products waiting before they read their route
        # (TURBOSPARK_CUDA_GATE_UP=wait; `FUSE=1` runs the early ones with
        # the router's join); one token's q/k/v products with their ropes
        # and cache writes in their launch (TURBOSPARK_CUDA_QKV_ROPE=1;
        # check_projections_then_rope compares the joined launch with the
        # ops apart bit for bit); a batch's attention in the scalar kernels
        # rather than on the tensor cores (TURBOSPARK_CUDA_PREFILL_ATTN=scalar;
        # check_attention holds both to the f64 formula), and the scalar
        # kernels' long form at every length (TURBOSPARK_CUDA_ATTN_LONG=1,
        # taken by itself only past their shared memory), and one token's
        # attention on the tensor cores at every length, or never
        # (TURBOSPARK_CUDA_DECODE_ATTN=tc / =scalar; by itself from 4096
        # keys), and the split kernel with its key rows staged in shared
        # memory at every head width (=staged; by default only for heads
        # 64 wide) or never (=unstaged). A setting may join several with
        # commas.
        # CONFORMANCE_SETTINGS replaces the list (e.g. only the settings a
        # call is about, to spare its minutes; with CONFORMANCE_DEFAULT=0
        # only those run).
        for v in ${CONFORMANCE_SETTINGS:-TURBOSPARK_CUDA_FUSE=1 TURBOSPARK_CUDA_FUSE=0 \
            TURBOSPARK_CUDA_SPLIT_KEYS=64 TURBOSPARK_CUDA_SPLIT_KEYS=128 TURBOSPARK_CUDA_WIDE=0 \
            TURBOSPARK_CUDA_NORM=strided TURBOSPARK_CUDA_COPY_STREAM=0 \
            TURBOSPARK_CUDA_BF16=rows TURBOSPARK_CUDA_BF16=segments TURBOSPARK_CUDA_BF16=stream+route \
            TURBOSPARK_CUDA_MXFP4=mma \
            TURBOSPARK_CUDA_Q8=mma TURBOSPARK_CUDA_KQ=tc TURBOSPARK_CUDA_GATE_UP=wait \
            TURBOSPARK_CUDA_QKV_ROPE=1 TURBOSPARK_CUDA_PREFILL_ATTN=scalar \
            TURBOSPARK_CUDA_PREFILL_ATTN=scalar,TURBOSPARK_CUDA_ATTN_LONG=1 \
            TURBOSPARK_CUDA_DECODE_ATTN=tc TURBOSPARK_CUDA_DECODE_ATTN=scalar \
            TURBOSPARK_CUDA_DECODE_ATTN=staged TURBOSPARK_CUDA_DECODE_ATTN=unstaged}; do
            echo "--- $BIN/cuda-conformance, $v"
            env ${v//,/ } "$BIN/cuda-conformance" --test-threads 1 2>&1 | grep -E "^test |test result|panicked"
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
            "$TS" logits --model "$inst" --tokens "$toks" --out "$WORK/$fam-cpufast.npy" --numerics fast --greedy 32 > "$WORK/$fam-cpufast.txt" || { echo "$fam: cpu fast failed"; continue; }
            # Token by token (recorded decode steps replayed) against the CPU's prefill.
            if "$TS" logits --model "$inst" --backend cuda --tokens "$toks" --out "$WORK/$fam-cuda-decode.npy" --numerics exact --decode > /dev/null; then
                python3 -c "
import numpy as np
x, y = np.load('$WORK/$fam-cpu.npy').astype(np.float64), np.load('$WORK/$fam-cuda-decode.npy').astype(np.float64)
rel = np.abs(x - y).max() / np.abs(x).max()
print(f'{\"$fam\":<14} {\"decode\":<6} {rel:12.2e} {\"-\":>12} {\"ok\" if rel <= 2e-3 else \"FAIL\"}')"
            fi
            for mode in exact fast; do
                if "$TS" logits --model "$inst" --backend cuda --tokens "$toks" --out "$WORK/$fam-cuda-$mode.npy" --numerics $mode --greedy 32 > "$WORK/$fam-cuda-$mode.txt"; then
                    python3 - "$WORK/$fam-cpu" "$WORK/$fam-cuda-$mode" "$fam" "$mode" <<'PY'
import sys, numpy as np
a, b, fam, mode = sys.argv[1:5]
x, y = np.load(a + ".npy").astype(np.float64), np.load(b + ".npy").astype(np.float64)
rel = np.abs(x - y).max() / np.abs(x).max()
ga, gb = open(a + ".txt").read().strip(), open(b + ".txt").read().strip()
ok = rel <= 2e-3 and ga == gb
line = f"{fam:<14} {mode:<6} {rel:12.2e} {'same' if ga == gb else 'DIFFER':>12} {'ok' if ok else 'FAIL'}"
if mode == "fast":
    # Both backends' fast numerics (8-bit activations) against each other,
    # and the CPU's own distance from exact.
    c = a.replace("-cpu", "-cpufast")
    z = np.load(c + ".npy").astype(np.float64)
    line += f"   vs CPU fast {np.abs(z - y).max() / np.abs(z).max():.2e}; CPU fast vs exact {np.abs(z - x).max() / np.abs(x).max():.2e}"
    # Per position (rows of the prompt): where the two fast runs part.
    per = np.abs(z - y).max(axis=-1) / np.abs(z).max()
    line += "; by position " + " ".join(f"{v:.0e}" for v in per[:8]) + " …"
print(line)
PY
                else
                    echo "$fam $mode: cuda failed"
                fi
            done
            # Fast numerics token by token (replayed steps: one token's
            # attention over the f16 cache, split over the keys) against
            # the same numerics' prefill, whose products give the same bits
            # batched or not: what differs is the attention kernel.
            if "$TS" logits --model "$inst" --backend cuda --tokens "$toks" --out "$WORK/$fam-cuda-decodefast.npy" --numerics fast --decode > /dev/null \
                && [ -f "$WORK/$fam-cuda-fast.npy" ]; then
                python3 -c "
import numpy as np
x, y = np.load('$WORK/$fam-cuda-fast.npy').astype(np.float64), np.load('$WORK/$fam-cuda-decodefast.npy').astype(np.float64)
rel = np.abs(x - y).max() / np.abs(x).max()
print(f'{\"$fam\":<14} {\"dec/f\":<6} {rel:12.2e} {\"-\":>12} {\"ok\" if rel <= 2e-3 else \"FAIL\"}   (vs CUDA fast prefill)')"
            fi
        done
        ;;
    census)
        stage "census: CUDA vs CPU --ffn-census, exact"
        for fam in mixtral qwen3moe gpt_oss glm4_moe gemma4 deepseek_v3; do
            dir=tests/fixtures/tiny/$fam
            [ -f "$dir/config.json" ] || continue
            inst="$WORK/fx-$fam"
            [ -f "$inst/manifest.json" ] || "$TS" convert -q --force "$dir" "$inst" || { echo "$fam: convert failed"; continue; }
            toks=$(python3 -c "import json; print(','.join(map(str, json.load(open('$dir/tokens.json'))['tokens'])))")
            k=$(python3 -c "import json; print(json.load(open('$inst/manifest.json'))['arch']['moe']['top_k'])")
            run_census() { "$TS" logits --model "$inst" --tokens "$toks" --out "$WORK/c.npy" --numerics exact --ffn-census "$@" > /dev/null 2>&1; }
            run_census "$WORK/$fam-census-cpu.json" --backend cpu --experts resident || { echo "$fam: cpu census failed"; continue; }
            for ex in resident streamed; do
                slots=(); [ $ex = streamed ] && slots=(--expert-slots "$k")
                run_census "$WORK/$fam-census-cuda-$ex.json" --backend cuda --experts $ex "${slots[@]}" || { echo "$fam $ex: cuda census failed"; continue; }
                python3 - "$WORK/$fam-census-cpu.json" "$WORK/$fam-census-cuda-$ex.json" "$fam" "$ex" <<'PY'
import json, sys
a, b = (json.load(open(p))["sites"] for p in sys.argv[1:3])
key = lambda s: (s["layer"], s["site"])
a, b = {key(s): s for s in a}, {key(s): s for s in b}
rows = all(a[k].get("rows_per_expert") == b[k].get("rows_per_expert") and a[k]["rows"] == b[k]["rows"] for k in a) and a.keys() == b.keys()
mean = max(abs(a[k]["mean_abs"] - b[k]["mean_abs"]) / max(a[k]["mean_abs"], 1e-30) for k in a)
share = max(abs(x - y) for k in a for x, y in zip(a[k]["share_below"], b[k]["share_below"]))
ok = rows and mean <= 1e-4 and share <= 5e-3  # a value within rounding of a threshold may fall either side
print(f"{sys.argv[3]:<12} {sys.argv[4]:<9} sites {len(a):3}  rows {'same' if rows else 'DIFFER'}  mean|a| rel {mean:.1e}  share_below {share:.1e}  {'ok' if ok else 'FAIL'}")
PY
            done
        done
        ;;
    bench)
        stage "bench: gpt-oss-20b shape, resident experts"
        synth20b || { echo "synth failed"; continue; }
        du -sh "$WORK/synth20b" "$WORK/synth20b.gguf"
        "$TS" bench -m "$WORK/synth20b" --backend cuda --experts resident -p 512 -n 128 -d "$DEPTHS" -r "$REPS" --numerics fast
        python3 - "$WORK/synth20b/manifest.json" "$WORK/copy-bandwidth" <<'PY'
import json, os, sys
m = json.load(open(sys.argv[1]))
a = m["arch"]
moe = a["moe"]
# A token reads every resident byte except the embedding table (one row),
# and top_k experts of every MoE layer.
per_value = {"q8_0": 34 / 32, "bf16": 2, "f16": 2, "f32": 4}[m["quant"]["token_embd"][0]]
emb = int(a["vocab_size"] * a["hidden_size"] * per_value)
stride = sum(p["length"] for p in m["experts"][0]["parts"])
need = m["resident_bytes"] - emb + len(m["experts"]) * moe["top_k"] * stride
print(f"bytes a token reads: {need / 1e9:.3f} GB (resident {m['resident_bytes'] / 1e9:.3f} GB less the embedding, + {moe['top_k']} × {stride / 1e6:.2f} MB experts × {len(m['experts'])} layers)")
# The copy bandwidth the info stage measured on this machine, else an
# H200's (4273 GB/s, earlier sessions).
bw, where = 4273.0, "an H200's, not measured in this call: run the info stage first"
if os.path.exists(sys.argv[2]):
    bw, where = float(open(sys.argv[2]).read()), "measured by the info stage"
print(f"roofline at {bw:.0f} GB/s copy bandwidth ({where}): {bw * 1e9 / need:.0f} tok/s")
PY
        ;;
    race)
        stage "race: prepare in the background, each bench as soon as it can run"
        bg="$WORK/race-prepare.log"
        # (the stages it runs log through this one: OUT unset for them)
        sub() { env -u OUT "$0" "$@"; }
        if pgrep -f "run.sh prepare$" > /dev/null 2>&1; then
            echo "race: an earlier prepare is still running; waiting for it"
        else
            # (its own session: it outlives this call if the call ends first)
            rm -f "$bg"
            setsid env -u OUT "$0" prepare > "$bg" 2>&1 < /dev/null &
        fi
        sub info
        ready() { grep -q "$1 finished" "$bg" 2>/dev/null; }
        # Whether part $1 of the prepare finished before RACE_WAIT.
        await() {
            until ready "$1" || [ $((SECONDS - t0)) -ge "${RACE_WAIT:-480}" ]; do sleep 3; done
            ready "$1"
        }
        if await synth20b; then
            sub bench
            await "llama.cpp build"
        fi
        echo "--- prepare, after $((SECONDS - t0)) s:"; cat "$bg"
        if [ -x "$WORK/lcb/bin/llama-bench" ] && ready synth20b; then
            sub llamacpp bench
        else
            echo "race: not ready after ${RACE_WAIT:-480} s (prepare goes on in the background; run this stage again)"
        fi
        ;;
    llamacpp)
        stage "llama.cpp (CUDA, sm_90) on the same GGUF"
        build_llamacpp || { echo "llama.cpp build failed"; continue; }
        LB="$WORK/lcb/bin/llama-bench"
        "$LB" -m "$WORK/synth20b.gguf" -ngl 99 -fa 1 -p 512 -n 128 -d "$DEPTHS" -r "$REPS" -o md
        if [ "${CPU_MOE:-1}" = 1 ]; then
            echo "--- llama.cpp with every expert layer on the CPU (--n-cpu-moe 24 -t 16)"
            "$LB" -m "$WORK/synth20b.gguf" -ngl 99 -fa 1 --n-cpu-moe 24 -t 16 -p 512 -n 128 -r 1 -o md
            "$LB" -m "$WORK/synth20b-skew.gguf" -ngl 99 -fa 1 --n-cpu-moe 24 -t 16 -p 0 -n 128 -r 1 -o md
        fi
        ;;
    streamed)
        stage "streamed experts: VRAM slot cache at 50 % and 25 % of the experts"
        models=synth20b
        [ "${SKEW:-1}" = 1 ] && models="synth20b synth20b-skew"
        for m in $models; do
            echo "--- $m"
            # shellcheck disable=SC2086
            "$TS" bench -m "$WORK/$m" --backend cuda --sweep --slots 16,8 --resident --prompt 128 --generate 128 \
                ${IO_THREADS:+--io-threads $IO_THREADS}
        done
        # Every miss read by the reader threads (no page cache locked).
        echo "--- synth20b, --pin-page-cache 0"
        "$TS" bench -m "$WORK/synth20b" --backend cuda --sweep --slots 16,8 --prompt 128 --generate 128 \
            --pin-page-cache 0 ${IO_THREADS:+--io-threads $IO_THREADS}
        # The same routes give the same bits: logits of 24 tokens fed one at
        # a time (so decode steps are compared) with experts resident and
        # streamed through 8 and 16 slots (misses copied from the locked page
        # cache, the default; read, with --pin-page-cache 0; from host
        # memory, with --host-experts).
        # Every expert also held in host memory (--host-experts): a miss is
        # one copy from page-locked host memory instead of a read.
        if [ "${HOST_EXPERTS:-1}" = 1 ]; then
            echo "--- synth20b, --host-experts"
            "$TS" bench -m "$WORK/synth20b" --backend cuda --sweep --slots 16,8 --prompt 128 --generate 128 \
                --host-experts
        fi
        toks=$(python3 -c "print(','.join(str(11 + 97 * i) for i in range(24)))")
        for ex in resident streamed:8 streamed:16 streamed:8:host streamed:8:read; do
            IFS=: read -r mode slots how <<< "$ex"
            extra=
            [ "$how" = host ] && extra=--host-experts
            [ "$how" = read ] && extra="--pin-page-cache 0"
            # shellcheck disable=SC2086
            "$TS" logits --model "$WORK/synth20b" --backend cuda --numerics fast --decode --tokens "$toks" \
                --experts "$mode" ${slots:+--expert-slots $slots} $extra \
                --out "$WORK/bits-$mode$slots$how.npy" > /dev/null \
                || echo "logits $ex failed"
        done
        python3 - "$WORK" <<'PY'
import sys, numpy as np
w = sys.argv[1]
r = np.load(f"{w}/bits-resident.npy")
for s in ("streamed8", "streamed16", "streamed8host", "streamed8read"):
    x = np.load(f"{w}/bits-{s}.npy")
    same = r.shape == x.shape and r.tobytes() == x.tobytes()
    print(f"{s}: logits {x.shape} {'bit-identical to' if same else 'DIFFER from'} resident")
PY
        ;;
    racecheck)
        stage "racecheck: compute-sanitizer on ${RACE_KERNEL:=gated_delta_rule_chunked}"
        CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
        [ -n "$CS" ] || { echo "compute-sanitizer not found"; continue; }
        for tool in racecheck synccheck; do
            echo "--- $tool"
            "$CS" --tool "$tool" --kernel-name "kns=$RACE_KERNEL" --print-limit 20 \
                "$BIN/cuda-conformance" "${RACE_TESTS:-exact}" 2>&1 | grep -vE "^(running|test |$)" | tail -25
        done
        for i in 1 2 3; do
            echo "--- conformance (${RACE_TESTS:-exact}), run $i"
            "$BIN/cuda-conformance" "${RACE_TESTS:-exact}" 2>&1 | grep -E "test result|allowed error"
        done
        ;;
    variants)
        # The kernel and fusion settings that must give the same bits: decode
        # logits of 24 tokens with each setting of VARIANTS against those of
        # VARIANT_BASE (default TURBOSPARK_CUDA_FUSE=attention, the defaults;
        # until the forty-first session both joins, =1), and how far their
        # prefill logits are from those, then pp512 and tg128 of each at
        # the depths VARIANT_DEPTHS (bench's -d; default 0), alternated (REPS
        # rounds). A variant may be several settings joined
        # by commas (A=1,B=2).
        stage "variants: bits and speed of ${VARIANTS:=TURBOSPARK_CUDA_FUSE=0} against ${VARIANT_BASE:=TURBOSPARK_CUDA_FUSE=attention}"
        [ -d "$WORK/synth20b" ] || "$TS" synth -q --vocab 201088 --resident-format "$RESIDENT_FORMAT" "$WORK/synth20b"
        # Decode logits of 24 tokens, then prefill logits of 300 (one chunk),
        # the latter as a share of max |logit|: a setting of the batch
        # kernels (e.g. the tensor-core prefill attention) need not keep
        # their bits.
        for way in decode:24 prefill:300; do
            IFS=: read -r label n <<< "$way"
            flag=$([ "$label" = decode ] && echo --decode || true)
            toks=$(python3 -c "print(','.join(str(11 + 97 * i) for i in range($n)))")
            for v in $VARIANT_BASE $VARIANTS; do
                # shellcheck disable=SC2086
                env ${v//,/ } "$TS" logits --model "$WORK/synth20b" --backend cuda --numerics fast $flag \
                    --tokens "$toks" --out "$WORK/$label-$v.npy" > /dev/null || echo "$label logits $v failed"
            done
        done
        python3 - "$WORK" "$VARIANT_BASE" $VARIANTS <<'PY'
import sys, numpy as np
w, base, variants = sys.argv[1], sys.argv[2], sys.argv[3:]
r = np.load(f"{w}/decode-{base}.npy")
for v in variants:
    x = np.load(f"{w}/decode-{v}.npy")
    same = r.shape == x.shape and r.tobytes() == x.tobytes()
    print(f"{v}: decode logits {x.shape} {'bit-identical to' if same else 'DIFFER from'} {base}'s")
r = np.load(f"{w}/prefill-{base}.npy").astype(np.float64)
for v in variants:
    x = np.load(f"{w}/prefill-{v}.npy").astype(np.float64)
    rel = np.abs(x - r).max() / np.abs(r).max() if x.shape == r.shape else float("nan")
    print(f"{v}: prefill logits {x.shape}, max|Δ|/max|logit| {rel:.2e} from {base}'s")
PY
        for r in $(seq "$REPS"); do
            for v in $VARIANT_BASE $VARIANTS; do
                echo "--- $v, round $r"
                env ${v//,/ } "$TS" bench -m "$WORK/synth20b" --backend cuda --experts resident -p 512 -n 128 \
                    -d "${VARIANT_DEPTHS:-0}" -r 2 --numerics fast
            done
        done
        ;;
    knockout)
        # (crates/cuda/src/knockout.rs; BENCHMARKS.md, forty-fourth session)
        : "${KNOCKOUTS:=rms_norm rope_kv attention_decode route\$ rms_norm,quantize_q8,route\$ rms_norm,rope_kv,attention_decode,route\$,quantize_q8 matmul1_,moe_}"
        stage "knockout: tg128 @ d${VARIANT_DEPTHS:=512} without each of: $KNOCKOUTS"
        rm -f "$WORK/knockout.txt"
        [ -d "$WORK/synth20b" ] || "$TS" synth -q --vocab 201088 --resident-format "$RESIDENT_FORMAT" "$WORK/synth20b"
        for r in $(seq "$REPS"); do
            for v in none $KNOCKOUTS none; do
                # (`none` names no kernel: the default step)
                read -r mean sd <<< "$(TURBOSPARK_CUDA_KNOCKOUT="$v" tg_rate "$WORK/knockout.err")"
                echo "round $r, without [$v]: tg128 @ d$VARIANT_DEPTHS ${mean:-failed} ± ${sd:-}"
                # (what each entry matched in the first recorded step, once a set)
                [ "$r" = 1 ] && [ "$v" != none ] && sed -n 's/^TURBOSPARK_CUDA_KNOCKOUT: in the first recorded step, /    /p' "$WORK/knockout.err"
                [ -n "$mean" ] && echo "$v $mean" >> "$WORK/knockout.txt"
            done
        done
        # Each set's mean rate, µs a token, and what leaving it out saved
        # against the mean of the runs with none left out.
        [ -s "$WORK/knockout.txt" ] || { echo "knockout: no rates (did the benches fail?)"; continue; }
        python3 - "$WORK/knockout.txt" <<'PY'
import collections, sys
rates = collections.defaultdict(list)
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) == 2:
        try:
            rates[parts[0]].append(float(parts[1]))
        except ValueError:
            pass
if "none" not in rates:
    sys.exit("knockout: no rate with nothing left out")
base = 1e6 / (sum(rates["none"]) / len(rates["none"]))
print(f"{'left out':<60} {'tok/s':>9} {'us/token':>9} {'saved':>8}")
for v, r in rates.items():
    us = 1e6 / (sum(r) / len(r))
    print(f"{v[:60]:<60} {sum(r) / len(r):>9.2f} {us:>9.1f} {base - us:>8.1f}")
PY
        rm -f "$WORK/knockout.txt"
        ;;
    trace)
        # (scripts/gpu/kernel_trace.c, scripts/gpu/trace_report.py)
        stage "trace: tg128 @ d${VARIANT_DEPTHS:=512}, each launch of the replayed step, under: ${TRACES:=none}"
        lib="$BIN/kernel_trace.so"
        if [ ! -f "$lib" ]; then
            # (not carried: build it here against the toolkit's CUPTI)
            lib="$WORK/kernel_trace.so"
            cupti=/usr/local/cuda/extras/CUPTI
            gcc -O2 -shared -fPIC -o "$lib" scripts/gpu/kernel_trace.c -I"$cupti/include" \
                -I/usr/local/cuda/include -L"$cupti/lib64" -lcupti -Wl,-rpath,"$cupti/lib64" ||
                { echo "trace: no kernel_trace.so (build.sh makes one)"; continue; }
        fi
        lib=$(realpath "$lib")
        [ -d "$WORK/synth20b" ] || "$TS" synth -q --vocab 201088 --resident-format "$RESIDENT_FORMAT" "$WORK/synth20b"
        sets=()
        i=0
        for v in $TRACES; do
            i=$((i + 1))
            read -r mean sd <<< "$(TURBOSPARK_CUDA_KNOCKOUT="$v" tg_rate "$WORK/trace.err")"
            echo "--- [$v] untraced: tg128 @ d$VARIANT_DEPTHS ${mean:-failed} ± ${sd:-}"
            read -r mean sd <<< "$(TURBOSPARK_CUDA_KNOCKOUT="$v" CUDA_INJECTION64_PATH="$lib" \
                KERNEL_TRACE_OUT="$WORK/trace-${TRACE_TAG:-}$i.csv" tg_rate "$WORK/trace.err")"
            echo "--- [$v] traced:   tg128 @ d$VARIANT_DEPTHS ${mean:-failed} ± ${sd:-}"
            grep '^kernel_trace' "$WORK/trace.err" || tail -5 "$WORK/trace.err"
            [ -s "$WORK/trace-${TRACE_TAG:-}$i.csv" ] && sets+=("$v=$WORK/trace-${TRACE_TAG:-}$i.csv")
        done
        [ ${#sets[@]} -gt 0 ] || { echo "trace: no trace written"; continue; }
        nodes="${OUT:-$WORK}/trace-${TRACE_TAG:-}nodes.txt"
        python3 scripts/gpu/trace_report.py --nodes "$nodes" "${sets[@]}"
        echo "every launch of each step: $nodes"
        ;;
    ab)
        # Another build of ours (AB_BASE, e.g. .devcarry/bin-base/turbospark)
        # against this one on the synthetic model, alternated round by
        # round (scripts/bench/ab.sh), pp512 / tg128 at each of DEPTHS.
        stage "ab: ${AB_BASE:-(AB_BASE unset)} vs $TS"
        [ -x "${AB_BASE:-}" ] || { echo "AB_BASE must name a turbospark binary"; continue; }
        [ -d "$WORK/synth20b" ] || "$TS" synth -q --vocab 201088 --resident-format "$RESIDENT_FORMAT" "$WORK/synth20b"
        # Kernels that must give the same bits: decode logits of 24 tokens, A vs B.
        toks=$(python3 -c "print(','.join(str(11 + 97 * i) for i in range(24)))")
        for side in A B; do
            bin=$AB_BASE
            [ $side = B ] && bin=$TS
            "$bin" logits --model "$WORK/synth20b" --backend cuda --numerics fast --decode --tokens "$toks" \
                --out "$WORK/ab-bits-$side.npy" > /dev/null || echo "logits of $side ($bin) failed"
        done
        python3 - "$WORK" <<'PY'
import sys, numpy as np
a, b = (np.load(f"{sys.argv[1]}/ab-bits-{s}.npy") for s in "AB")
same = a.shape == b.shape and a.tobytes() == b.tobytes()
verdict = "bit-identical to" if same else "DIFFERS from"
extra = "" if same or a.shape != b.shape else f" (max |d| {np.abs(a - b).max():.3g})"
print(f"decode logits {b.shape}: B {verdict} A{extra}")
PY
        scripts/bench/ab.sh "$AB_BASE" "$TS" "${AB_ROUNDS:-2}" -- -m "$WORK/synth20b" --backend cuda \
            --experts resident -p 512 -n 128 -d "$DEPTHS" -r "$REPS" --numerics fast
        ;;
    products)
        stage "products: decode matrix-vector bandwidth by shape"
        "$BIN/decode_products" "${CALLS:-300}"
        for alt in ${PRODUCTS_ALT-TURBOSPARK_CUDA_ONE=0 TURBOSPARK_CUDA_PDL=0}; do
            echo "--- $alt"
            env "$alt" "$BIN/decode_products" "${CALLS:-300}"
        done
        ;;
    stagesync)
        stage "stagesync: a step boundary, dependent launches against one persistent kernel"
        "$BIN/stage_sync" "${REPLAYS:-50}" "${CHAIN:-24}"
        ;;
    *) echo "unknown stage $s" ;;
    esac
    echo "<== $s: $((SECONDS - t0)) s"
done
echo "all stages: $((SECONDS - t_all)) s"
