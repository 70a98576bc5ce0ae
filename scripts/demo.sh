#!/usr/bin/env bash
# The main job from a fresh clone: set up, start a local three-bookie cluster with
# `zbk sandbox` (embedded metadata, free loopback ports, a temporary data dir), run the
# sample workload through the client library (zbk/demo.py; extra arguments go to it),
# stop the sandbox with SIGINT as a Ctrl-C would, and check that it exited 0 and left no
# process behind.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

work=$(mktemp -d "${TMPDIR:-/tmp}/zbk-demo.XXXXXX")
cluster="$work/cluster"
out="$work/sandbox.out"
sandbox_pid=""
ok=""

# PIDs of processes whose command line names the cluster dir (the sandbox and its bookies).
leftovers() {
  local p
  for p in /proc/[0-9]*; do
    [ "${p#/proc/}" = "$BASHPID" ] && continue
    if tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qF -- "$cluster"; then echo "${p#/proc/}"; fi
  done
}

cleanup() {
  if [ -n "$sandbox_pid" ] && kill -0 "$sandbox_pid" 2>/dev/null; then
    kill -TERM "$sandbox_pid"  # the sandbox stops its bookies itself
    wait "$sandbox_pid" || true
  fi
  if [ -n "$ok" ]; then
    rm -rf "$work"
  else
    echo "demo: FAILED; sandbox output and bookie logs kept in $work" >&2
    sed 's/^/  sandbox | /' "$out" >&2 || true
  fi
}
trap cleanup EXIT

mkdir -p "$cluster"
echo "demo: starting zbk sandbox (3 bookies) in $cluster"
.venv/bin/zbk sandbox --bookies 3 --data-dir "$cluster" --base-port 0 --no-status >"$out" 2>&1 &
sandbox_pid=$!
for _ in $(seq 300); do  # up to 60 s for every bookie to register
  grep -q '^ready:' "$out" && break
  kill -0 "$sandbox_pid" 2>/dev/null || { echo "demo: the sandbox exited early" >&2; exit 1; }
  sleep 0.2
done
grep -q '^ready:' "$out" || { echo "demo: the bookies did not register within 60 s" >&2; exit 1; }
shown=$(wc -l <"$out")
sed 's/^/  sandbox | /' "$out"

.venv/bin/python -m zbk.demo --metadata "sqlite:///$cluster/meta.db" --bookies 3 "$@"

echo "demo: stopping the sandbox (SIGINT)"
kill -INT "$sandbox_pid"
rc=0
wait "$sandbox_pid" || rc=$?
sandbox_pid=""
tail -n +"$((shown + 1))" "$out" | sed 's/^/  sandbox | /'
if [ "$rc" -ne 0 ]; then
  echo "demo: the sandbox exited with $rc" >&2
  exit 1
fi
left=$(leftovers)
if [ -n "$left" ]; then
  echo "demo: processes left behind: $left" >&2
  exit 1
fi
echo "demo: sandbox exited 0, no process left behind"
ok=1
