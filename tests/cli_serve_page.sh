#!/usr/bin/env bash
# The web page of h3run serve in headless Chromium (tests/js/serve_page.js): shows the plan before submitting,
# offers the LoRA of its LoRA folder (made here by h3-testdata for the small model) and the job takes it, submits a
# prompt, sees the progress bar move, plays the finished clip; the screenshot is saved as
# BUILD/serve_page.png. Needs Debian's chromium and tests/js's puppeteer-core (scripts/deps.sh, npm ci --prefix
# tests/js); without them it skips, except under CI=true, where it fails.
# Usage: cli_serve_page.sh PATH/TO/h3run (CTest passes it).
set -u
H3RUN=$1
BUILD=${H3_BUILD_DIR:-$(dirname "$H3RUN")}
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
missing=""
[ -x "$CHROMIUM" ] || missing="chromium ($CHROMIUM)"
command -v node >/dev/null || missing="$missing node"
[ -f "$SRC/tests/js/node_modules/puppeteer-core/package.json" ] || missing="$missing puppeteer-core (npm ci --prefix tests/js)"
if [ -n "$missing" ]; then
    if [ "${CI:-}" = true ]; then echo "FAIL: missing $missing"; exit 1; fi
    echo "SKIP: missing $missing"
    exit 0
fi
tmp=$(mktemp -d)
# a LoRA folder with one LoRA for the small model: the page offers it and the job takes it
mkdir -p "$tmp/loras"
"$BUILD/h3-testdata" lora "$tmp/loras/shape.safetensors" --dit "$SRC/models/h3-small/transformer" --rank 4 \
    --seed 3 >/dev/null 2>"$tmp/lora.log" || { echo "FAIL: h3-testdata lora: $(cat "$tmp/lora.log")"; exit 1; }
"$H3RUN" serve --listen 127.0.0.1:0 --data "$tmp/data" --lora-dir "$tmp/loras" >"$tmp/out" 2>"$tmp/log" &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do grep -qs listening "$tmp/out" && break; sleep 0.1; done
url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$tmp/out")
[ -n "$url" ] || { echo "FAIL: the server did not start: $(cat "$tmp/log")"; exit 1; }
rc=0
CHROMIUM=$CHROMIUM LORA_NAME=shape.safetensors node "$SRC/tests/js/serve_page.js" "$url" "$BUILD/serve_page.png" || rc=1
kill -TERM $pid
wait $pid || { echo "FAIL: the server exited $? on SIGTERM"; rc=1; }
if grep -qE "AddressSanitizer|LeakSanitizer|runtime error" "$tmp/log"; then
    echo "FAIL: sanitizer report: $(head -c 1500 "$tmp/log")"
    rc=1
fi
[ $rc = 0 ] || { echo "server log:"; tail -20 "$tmp/log"; }
exit $rc
