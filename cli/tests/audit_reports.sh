#!/usr/bin/env bash
# Audits a plugin and validates what the audit leaves behind.
# Usage: audit_reports.sh DSA_VERIFY PLUGIN.so EXPECTED_EXIT JUNIT_XSD
#  - the exit code equals EXPECTED_EXIT (0 all passed, 1 failures);
#  - the JSON report parses and its summary counts match the cases listed;
#  - the JUnit XML validates against JUNIT_XSD (the common testsuites/testsuite/testcase form);
#  - with failures, every failed case carries a reproduction command;
#  - every file in the dump directory is the dumped fixture of a failed case.
set -uo pipefail
bin=$1; plugin=$2; want=$3; xsd=$4
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$bin" audit --plugin "$plugin" --json "$tmp/report.json" --junit "$tmp/report.xml" \
  --dump-dir "$tmp/failures" >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
tail -5 "$tmp/stdout"
if [ "$rc" != "$want" ]; then
  echo "exit code $rc, expected $want"; tail -n 40 "$tmp/stdout" "$tmp/stderr"; exit 1
fi
python3 - "$tmp/report.json" "$want" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))
cases = r["cases"]
assert r["format"] == "dsa-verify-audit/1", r["format"]
count = {s: sum(c["status"] == s for c in cases) for s in ("pass", "fail", "skip")}
assert count == {"pass": r["summary"]["passed"], "fail": r["summary"]["failed"],
                 "skip": r["summary"]["skipped"]}, (count, r["summary"])
assert count["pass"] + count["fail"] > 0, "no case ran"
if sys.argv[2] == "1":
    assert count["fail"] > 0, "expected failures"
    for c in cases:
        if c["status"] == "fail":
            assert c["repro"] or c["message"], c
else:
    assert count["fail"] == 0, [c for c in cases if c["status"] == "fail"][:3]
print("json report: %d passed, %d failed, %d skipped" % (count["pass"], count["fail"], count["skip"]))
PY
# Only failed cases are dumped (fresh-user F12: draws that judged nothing, k = 0, and declined
# draws left "failing case" files after a clean pass): every file is the fixture of a failure.
python3 - "$tmp/report.json" "$tmp/failures" <<'PY' || exit 1
import json, os, sys
r, d = json.load(open(sys.argv[1])), sys.argv[2]
files = sorted(os.path.join(d, f) for f in os.listdir(d)) if os.path.isdir(d) else []
named = {c["fixture"] for c in r["cases"] if c["status"] == "fail" and c["fixture"]}
extra = [f for f in files if f not in named]
assert not extra, "dumped cases of no failure: %s" % extra
print("dumps: %d, each a failed case's" % len(files))
PY
xmllint --noout --schema "$xsd" "$tmp/report.xml" || exit 1
