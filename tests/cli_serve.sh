#!/usr/bin/env bash
# h3run serve on 127.0.0.1 with the small model: tests/serve_test.py (its docstring lists what each case checks:
# submit and follow to a clip ffprobe accepts, range requests, cancel, 20 jobs from 4 clients in order, kill -9 and
# restart, at least 200 bad requests answered 4xx, the token, the second job's DiT at least 3x sooner).
# Usage: cli_serve.sh PATH/TO/h3run (CTest passes it). Needs python3 and ffprobe (scripts/deps.sh installs them).
set -u
SRC=$(cd "${H3_SOURCE_DIR:-$(dirname "$0")/..}" && pwd)
command -v ffprobe >/dev/null || { echo "FAIL: ffprobe is needed (install ffmpeg: scripts/deps.sh)"; exit 1; }
exec python3 "$SRC/tests/serve_test.py" "$@"
