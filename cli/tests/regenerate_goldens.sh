#!/usr/bin/env bash
# Golden test: `fixtures generate --preset ci` must reproduce the committed fixtures/golden
# byte for byte (MANIFEST included). Usage: regenerate_goldens.sh DSA_VERIFY SOURCE_DIR
set -euo pipefail
bin=$1; src=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$bin" fixtures generate --preset ci --out "$tmp/golden" >/dev/null
if diff -r "$src/fixtures/golden" "$tmp/golden"; then
  echo "fixtures/golden: $(ls "$tmp/golden" | wc -l) files reproduced byte for byte"
else
  echo "fixtures/golden differs from a fresh 'fixtures generate --preset ci' (files above)" >&2
  exit 1
fi
