# common.sh — sourced by make_reference.sh and make_chat_reference.sh:
# logging, JSON string quoting, and `llamacpp_setup MODEL...`, which fetches
# the models and the llama.cpp sdist, builds the tools, and sets
#   MODEL_PATH[name], TOOL[name]            (assoc arrays)
#   SRCROOT LLAMA_SRC SDIST_VERSION COMMIT COMMIT_DATE
#   BUILD_INFO BUILD_NUMBER CMAKE_FLAGS CPU (what each reference records).
# The sourcing script sets HERE (this directory), REPO and LOG_TAG first.

log() { printf '[%s] %s\n' "$LOG_TAG" "$*" >&2; }
die() { printf '[%s] error: %s\n' "$LOG_TAG" "$*" >&2; exit 1; }
json_str() { # minimal JSON string quoting for simple ASCII values
  local s="${1//\\/\\\\}"; s="${s//\"/\\\"}"; printf '"%s"' "$s"
}

llamacpp_setup() {
  declare -gA MODEL_PATH=()
  while IFS=$'\t' read -r name path; do MODEL_PATH[$name]="$path"; done \
    < <("$REPO/scripts/fetch-models.sh" "$@" llamacpp)

  declare -gA TOOL=()
  while IFS=$'\t' read -r name path; do TOOL[$name]="$path"; done < <("$HERE/build.sh")

  SRCROOT="${MODEL_PATH[llamacpp]}"
  LLAMA_SRC="$SRCROOT/vendor/llama.cpp"
  SDIST_VERSION="$(sed -n 's/^Version: //p' "$SRCROOT/PKG-INFO" | head -1)"
  COMMIT="$(git -C "$LLAMA_SRC" rev-parse HEAD)"
  COMMIT_DATE="$(git -C "$LLAMA_SRC" log -1 --format=%cI)"
  BUILD_INFO="$(dirname "${TOOL[ref_logits]}")/../turbospark-build-info.txt"
  BUILD_NUMBER="$(sed -n 's/.*LLAMA_BUILD_NUMBER *= *\([0-9]*\).*/\1/p' "$(dirname "${TOOL[ref_logits]}")/../common/build-info.cpp" | head -1)"
  CMAKE_FLAGS="$(sed -n 's/^cmake flags: //p' "$BUILD_INFO")"
  CPU="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
}
