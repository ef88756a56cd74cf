#!/usr/bin/env bash
# The audit reaches the query-row counts and top-k widths production kernels see (fresh-user
# finding 7: a kernel that returned empty rows from row 128 on, and a top-k that wrote -1 past
# the first 2048 ids, passed `dsa-verify audit`). At level 0, on seeds 1, 2, 3 and unseeded:
#  - ROWS_PLUGIN (the example plugin with query rows >= 128 empty) fails topk.many_rows,
#    indexer.many_rows and smla.many_rows;
#  - KCAP_PLUGIN (the example plugin writing -1 into top-k slots >= 2048) fails topk.wide_k;
#  - OK_PLUGIN (the shipped example plugin) passes the four properties.
# Usage: audit_row_limits.sh DSA_VERIFY ROWS_PLUGIN.so KCAP_PLUGIN.so OK_PLUGIN.so
set -uo pipefail
bin=$1; rows=$2; kcap=$3; ok=$4
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
props=topk.many_rows,indexer.many_rows,smla.many_rows
bad=0
# expect PLUGIN PROPERTIES EXIT SEED_ARGS...: the audit exits EXIT; with 1, every property
# listed in PROPERTIES is reported failed.
expect() {
  local plugin=$1 only=$2 want=$3; shift 3
  "$bin" audit --plugin "$plugin" --only "$only" --level 0 "$@" --dump-dir "$tmp/failures" \
    >"$tmp/out" 2>&1
  local rc=$?
  echo "$(basename "$plugin") --only $only $* -> exit $rc ($(grep '^audit:' "$tmp/out"))"
  if [ "$rc" != "$want" ]; then
    echo "  expected exit $want"; tail -n 30 "$tmp/out"; bad=1; return
  fi
  if [ "$want" = 1 ]; then
    for p in ${only//,/ }; do
      if ! grep -Eq "property:$p +fail" "$tmp/out"; then
        echo "  $p did not fail"; bad=1
      fi
    done
  fi
}
for seed in "--seed 1" "--seed 2" "--seed 3" ""; do
  # shellcheck disable=SC2086  # $seed is two words or none
  expect "$rows" "$props" 1 $seed
  # shellcheck disable=SC2086
  expect "$kcap" topk.wide_k 1 $seed
  # shellcheck disable=SC2086
  expect "$ok" "$props,topk.wide_k" 0 $seed
done
exit $bad
