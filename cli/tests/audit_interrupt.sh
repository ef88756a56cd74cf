#!/usr/bin/env bash
# Kills a running audit of a plugin whose every call hangs, and checks what it leaves behind
# (issue 14). Usage: audit_interrupt.sh DSA_VERIFY HANG_PLUGIN.so JUNIT_XSD
#  - SIGTERM: the auditor exits 143, no process of the audit remains, and the partial JSON
#    and JUnit reports exist, with the running case marked "interrupted";
#  - SIGKILL: no process of the audit remains (the plugin child dies with its parent).
# Every wait polls with a deadline (a loaded 2-core machine is slow, never racy).
set -uo pipefail
bin=$1; plugin=$2; xsd=$3
tmp=$(mktemp -d)

# Processes of this test's audits: their command line holds $tmp (the plugin child is a fork
# of the auditor). Pure bash, so the scan itself starts no process that would match.
# Zombies are dead (their parent may not reap them at once).
audit_pids() {
  local f pid arg state rest
  for f in /proc/[0-9]*/cmdline; do
    pid=${f#/proc/}; pid=${pid%/cmdline}
    local hit=0
    while IFS= read -r -d '' arg; do [[ $arg == *"$tmp"* ]] && hit=1; done 2>/dev/null <"$f"
    [ "$hit" = 1 ] || continue
    exited "$pid" || echo "$pid"
  done
}
# The process is gone or a zombie.
exited() {
  local rest state
  IFS= read -r rest 2>/dev/null <"/proc/$1/stat" || return 0
  state=${rest##*) }; state=${state%% *}
  [ "$state" = Z ]
}
cleanup() {
  local p
  for p in $(audit_pids); do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# until CMD succeeds or SECONDS pass; returns 1 on timeout
poll() {
  local secs=$1; shift
  local end=$((SECONDS + secs))
  until "$@"; do
    [ "$SECONDS" -ge "$end" ] && return 1
    sleep 0.05
  done
}
no_audit_process() { [ -z "$(audit_pids)" ]; }

# Starts an audit in the background (pid in $apid) and waits until a plugin call hangs.
start_audit() {
  local tag=$1
  DSA_HANG_PIDFILE="$tmp/$tag.pid" "$bin" audit --plugin "$plugin" --ops topk --timeout 600 \
    --json "$tmp/$tag.json" --junit "$tmp/$tag.xml" --dump-dir "$tmp/failures" \
    >"$tmp/$tag.out" 2>&1 &
  apid=$!
  if ! poll 120 test -s "$tmp/$tag.pid"; then
    echo "FAIL ($tag): no plugin call started within 120 s"; cat "$tmp/$tag.out"; exit 1
  fi
  child=$(cat "$tmp/$tag.pid")
  echo "$tag: auditor $apid, plugin call running in child $child"
}
fail() { echo "FAIL: $*"; echo "--- processes left:"; for p in $(audit_pids); do
  tr '\0' ' ' <"/proc/$p/cmdline"; echo " (pid $p)"; done; exit 1; }

# --- SIGTERM: the child is killed and the partial report written.
start_audit term
kill -TERM "$apid"
poll 60 exited "$apid" || fail "the auditor ignored SIGTERM for 60 s"
wait "$apid"; rc=$?
[ "$rc" = 143 ] || { cat "$tmp/term.out"; fail "SIGTERM: exit code $rc, expected 143 (128 + 15)"; }
poll 20 no_audit_process || fail "SIGTERM: a process of the audit outlived it (child $child)"
tail -4 "$tmp/term.out"
python3 - "$tmp/term.json" <<'PY' || fail "SIGTERM: the partial JSON report is wrong"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["interrupted"] == "SIGTERM", r.get("interrupted")
assert r["finished"] is False, r.get("finished")
cases = r["cases"]
stopped = [c for c in cases if c["status"] == "interrupted"]
assert len(stopped) == 1, stopped
assert stopped[0]["op"] in ("topk", "fixture"), stopped[0]  # a property or a golden case
assert "SIGTERM" in stopped[0]["message"], stopped[0]["message"]
assert r["summary"]["interrupted"] == 1 and r["tasks_not_run"] > 0, (r["summary"], r["tasks_not_run"])
print("partial json report: %d case(s), interrupted: %s" % (len(cases), stopped[0]["property"]))
PY
xmllint --noout --schema "$xsd" "$tmp/term.xml" || fail "SIGTERM: the partial JUnit report is invalid"
grep -q 'type="interrupted"' "$tmp/term.xml" || fail "SIGTERM: JUnit does not mark the case"

# --- SIGKILL: nothing runs in the auditor; the child must die with it.
start_audit kill
kill -KILL "$apid"
wait "$apid" 2>/dev/null
poll 20 no_audit_process || fail "SIGKILL: the plugin child outlived the auditor (child $child)"
# The reports exist from the start and are rewritten atomically (fresh12 F5): SIGKILL leaves
# valid ones saying the audit did not finish (before: 0-byte files).
python3 - "$tmp/kill.json" <<'PY' || fail "SIGKILL: the JSON report is not a valid unfinished report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["format"] == "dsa-verify-audit/1" and r["finished"] is False, r
print("json report after SIGKILL: valid, finished false, %d case(s)" % len(r["cases"]))
PY
xmllint --noout --schema "$xsd" "$tmp/kill.xml" || fail "SIGKILL: the JUnit report is invalid"
ls -a "$tmp" | grep -q '\.tmp$' && fail "a temporary report file was left behind"
echo "no process left after SIGTERM and SIGKILL of the auditor"
