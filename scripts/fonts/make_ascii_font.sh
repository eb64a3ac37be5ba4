#!/usr/bin/env bash
# Writes crates/cli/assets/DejaVuSans-ASCII.ttf, the font `turbospark plot`
# embeds to draw text into PNGs: DejaVu Sans (Debian's fonts-dejavu-core)
# cut to the printable ASCII characters (U+0020..U+007E), without hinting
# or layout features, by fontTools' pyftsubset. About 20 KB instead of
# 760 KB. Needs apt and pip; runs in a throwaway venv.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
src=/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
if [ ! -f "$src" ]; then
    apt-get update -q && apt-get install -y -q fonts-dejavu-core
fi
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install -q fonttools==4.55.0
"$venv/bin/pyftsubset" "$src" --unicodes=U+0020-007E --no-hinting \
    --desubroutinize --layout-features= --name-IDs='*' \
    --output-file="$root/crates/cli/assets/DejaVuSans-ASCII.ttf"
ls -l "$root/crates/cli/assets/DejaVuSans-ASCII.ttf"
