#!/usr/bin/env bash
# make_chat_reference.sh — llama.cpp greedy reference for a *chat-templated*
# prompt: tests/reference/llamacpp/smollm2-chat.greedy.json.
#
# Usage: scripts/llamacpp/make_chat_reference.sh
#
#   1. render the GGUF's own `tokenizer.chat_template` for the single user
#      message USER_MESSAGE with add_generation_prompt=true, independently of
#      turbospark: Python jinja2, the way transformers' apply_chat_template
#      does it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
#      bos_token/eos_token from the GGUF vocabulary),
#   2. tokenize that text with llama.cpp's llama-tokenize (special tokens
#      parsed, which is its default; BOS iff the GGUF's add_bos_token),
#   3. ref_logits: greedy-decode N_PREDICT tokens, 1 thread, CPU, f16 KV,
#      flash attention off, no stop on EOG (compare up to the first EOG).
#
# Environment:
#   PYTHON   interpreter with `jinja2` and `gguf` (default: /tmp/hfvenv/bin/python
#            if present, else python3)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUTDIR="$REPO/tests/reference/llamacpp"
NAME=smollm2-chat
USER_MESSAGE="What is the capital of France?"
N_PREDICT=32
TOP_K=64
THREADS=1
KV=f16
FA=off

if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x /tmp/hfvenv/bin/python ]]; then PYTHON=/tmp/hfvenv/bin/python; else PYTHON=python3; fi
fi

LOG_TAG=make-chat-reference
# shellcheck source=common.sh
source "$HERE/common.sh"

llamacpp_setup smollm2
JINJA_VERSION="$("$PYTHON" -c 'import jinja2; print(jinja2.__version__)')" \
  || die "$PYTHON has no jinja2 (set PYTHON to an interpreter with jinja2 and gguf)"

model="${MODEL_PATH[smollm2]:-}"
[[ -n "$model" && -f "$model" ]] || die "no model file for smollm2"
sha="$(sha256sum "$model" | cut -d' ' -f1)"
log "$(basename "$model")"

# 1. render the chat template (exact bytes, no trailing newline added)
prompt_file="$(mktemp)"
errlog="$(mktemp)"
trap 'rm -f "$prompt_file" "$errlog"' EXIT
"$PYTHON" - "$model" "$USER_MESSAGE" >"$prompt_file" <<'PY'
import sys
import gguf
from jinja2.sandbox import ImmutableSandboxedEnvironment

path, user = sys.argv[1], sys.argv[2]
r = gguf.GGUFReader(path)

def field(key):
    f = r.fields.get(key)
    if f is None:
        return None
    v = f.parts[f.data[0]]
    return bytes(v).decode("utf-8") if f.types[0] == gguf.GGUFValueType.STRING else v.tolist()[0]

template = field("tokenizer.chat_template")
if not template:
    sys.exit("GGUF has no tokenizer.chat_template")
tokens = r.fields["tokenizer.ggml.tokens"]
def token(key):
    i = field(key)
    return None if i is None else bytes(tokens.parts[tokens.data[i]]).decode("utf-8")

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
text = env.from_string(template).render(
    messages=[{"role": "user", "content": user}],
    add_generation_prompt=True,
    bos_token=token("tokenizer.ggml.bos_token_id"),
    eos_token=token("tokenizer.ggml.eos_token_id"),
)
sys.stdout.write(text)
PY
PROMPT_TEXT="$(cat "$prompt_file"; printf x)"; PROMPT_TEXT="${PROMPT_TEXT%x}" # keep trailing newline
log "rendered prompt: $("$PYTHON" -c 'import sys; print(repr(sys.stdin.read()))' <"$prompt_file")"

# 2. tokenize with llama.cpp (stdout: "[id, id, ...]")
tok_out="$("${TOOL[llama-tokenize]}" -m "$model" -f "$prompt_file" --ids --log-disable 2>/dev/null)" \
  || die "llama-tokenize failed"
ids="$(tr -d '[] \n' <<<"$tok_out")"
[[ "$ids" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "unexpected llama-tokenize output: $tok_out"
log "prompt ids [$ids]"

# 3. greedy decode + top-k logprobs
meta=(
  --meta "name=$(json_str "$NAME")"
  --meta "model_sha256=$(json_str "$sha")"
  --meta "llama_cpp=$(printf '{"llama_cpp_python_sdist": %s, "commit": %s, "commit_date": %s, "build_number": %s, "build_number_note": %s, "cmake_flags": %s}' \
      "$(json_str "$SDIST_VERSION")" "$(json_str "$COMMIT")" "$(json_str "$COMMIT_DATE")" "${BUILD_NUMBER:-0}" \
      "$(json_str "LLAMA_BUILD_NUMBER as compiled; the vendored git checkout is shallow so it is not the upstream bNNNN")" \
      "$(json_str "$CMAKE_FLAGS")")"
  --meta "chat=$(printf '{"messages": [{"role": "user", "content": %s}], "add_generation_prompt": true, "template_source": %s, "renderer": %s}' \
      "$(json_str "$USER_MESSAGE")" "$(json_str "GGUF tokenizer.chat_template")" \
      "$(json_str "Python jinja2 $JINJA_VERSION ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True), as transformers apply_chat_template")")"
  --meta "tokenizer=$(json_str "llama-tokenize -m <model> -f <rendered prompt file> --ids (special tokens parsed; BOS iff GGUF add_bos_token)")"
  --meta "cpu=$(json_str "$CPU")"
)
"${TOOL[ref_logits]}" -m "$model" -p "$ids" -n "$N_PREDICT" -k "$TOP_K" -t "$THREADS" \
    --kv "$KV" --fa "$FA" --prompt-text "$PROMPT_TEXT" "${meta[@]}" \
    -o "$OUTDIR/$NAME.greedy.json" 2>"$errlog" \
  || { tail -n 30 "$errlog" >&2; die "ref_logits failed"; }

python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("[make-chat-reference] greedy %s -> %r" % (d["greedy_ids"], d["greedy_text"]), file=sys.stderr)' \
  "$OUTDIR/$NAME.greedy.json"
printf '%s\t%s\n' "$NAME" "$OUTDIR/$NAME.greedy.json"
