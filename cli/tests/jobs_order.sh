#!/usr/bin/env bash
# `fixtures check --jobs N` judges files concurrently but prints the same report, byte for
# byte, as --jobs 1 (issue 13: the report order stays deterministic). Usage: jobs_order.sh
# DSA_VERIFY FIXTURE_DIR
set -euo pipefail
bin=$1 dir=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" fixtures check "$dir" --backend reference -v --jobs 1 --json "$tmp/1.json" > "$tmp/1.txt"
"$bin" fixtures check "$dir" --backend reference -v --jobs 4 --json "$tmp/4.json" > "$tmp/4.txt"
grep -q "agree" "$tmp/1.txt" || { echo "FAIL: no result rows in the --jobs 1 report"; exit 1; }
cmp "$tmp/1.txt" "$tmp/4.txt" || { echo "FAIL: --jobs 4 printed another report than --jobs 1"; diff "$tmp/1.txt" "$tmp/4.txt" | head -20; exit 1; }
cmp "$tmp/1.json" "$tmp/4.json" || { echo "FAIL: --jobs 4 wrote another JSON than --jobs 1"; exit 1; }
echo "PASS: --jobs 1 and --jobs 4 reports identical ($(wc -l < "$tmp/1.txt") lines)"
