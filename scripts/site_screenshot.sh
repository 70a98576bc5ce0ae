#!/usr/bin/env bash
# A screenshot of one page of the built docs site, taken with headless Chromium (Debian's
# chromium package: apt-get install chromium):
#   bash scripts/site_screenshot.sh [PAGE] [OUT.png]
# PAGE is a path of the site (default guide/client/, the client guide), OUT defaults to
# /tmp/site_shot.png. Builds the site into a temporary directory with the interpreter of
# $PYTHON (default .venv/bin/python, set up with the docs extra: bash scripts/docs.sh), serves
# it on a free loopback port for the time of the shot, and stops the server by its PID.
set -euo pipefail
cd "$(dirname "$0")/.."
page=${1:-guide/client/}
out=$(realpath -m "${2:-/tmp/site_shot.png}")
py=${PYTHON:-.venv/bin/python}
chromium=${CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] || { echo "site_screenshot: $chromium not found (apt-get install chromium)" >&2; exit 2; }

work=$(mktemp -d)
server=""
cleanup() {
  local rc=$?
  if [ -n "$server" ]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true  # its SIGTERM status is not this script's
  fi
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT

NO_MKDOCS_2_WARNING=1 "$py" -m mkdocs build --strict --quiet --site-dir "$work/site"
[ -e "$work/site/$page" ] || { echo "site_screenshot: the site has no page $page" >&2; exit 2; }
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$py" -m http.server --bind 127.0.0.1 --directory "$work/site" "$port" >"$work/http.log" 2>&1 &
server=$!
for _ in $(seq 50); do
  curl -fsS -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null && break
  sleep 0.1
done
# A fresh profile, no network beyond the page, nothing that phones home.
timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync --hide-scrollbars \
  --user-data-dir="$work/profile" --screenshot="$out" --window-size=1280,1600 \
  "http://127.0.0.1:$port/$page" >"$work/chromium.log" 2>&1 \
  || { cat "$work/chromium.log" >&2; exit 1; }
[ -s "$out" ] || { echo "site_screenshot: chromium wrote no $out" >&2; cat "$work/chromium.log" >&2; exit 1; }
echo "site_screenshot: $out (http://127.0.0.1:$port/$page)"
