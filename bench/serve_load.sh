#!/usr/bin/env bash
# Load test of `dormouse serve`: starts it on a free port with a small model's export, fires concurrent
# streamed completions at it (bench/serve_load.py, standard-library Python), then stops it with
# SIGTERM and checks that it exits 0 (docs/serve.md: in-flight requests finish, then exit 0).
#
# Usage: bench/serve_load.sh [--concurrency N] [--max-tokens N] [--prompt STR]
#                            [--export FILE | CKPT_DIR [CKPT_NAME]]
#   --export FILE: serve this .dmexp as it is. CKPT_DIR/CKPT_NAME: a training run to export
#   (bf16); CKPT_NAME defaults to latest. With neither, a `small` model is trained for 3 steps
#   in a temporary folder and exported. Concurrency defaults to 64 (one wave of 64 streams, and
#   serve's --max-concurrent 64), max tokens to 64, the prompt to "And God said"; temperature
#   0.8 with seed = the request's index.
# Environment:
#   SKIP_BUILD=1  use target/release/dormouse as it is (no cargo build)
#   PYTHON        the interpreter for serve_load.py (default python3; it needs no packages)
# Prints serve's start line, serve_load.py's JSON summary and table, and the server's exit.
# Exit status: 0 when every request succeeded and serve exited 0 on SIGTERM, else 1.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/small_export.sh
. bench/small_export.sh

concurrency=64
max_tokens=64
prompt="And God said"
export_file=
ckpt=()
while [ $# -gt 0 ]; do
  case "$1" in
    --concurrency) concurrency=$2; shift 2 ;;
    --max-tokens) max_tokens=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --export) export_file=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    *) ckpt+=("$1"); shift ;;
  esac
done
[ ${#ckpt[@]} -le 2 ] || { echo "at most CKPT_DIR CKPT_NAME (see --help)" >&2; exit 2; }
python=${PYTHON:-python3}

build_cli || exit 2
work=$(mktemp -d)
server=
cleanup() {
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then
    kill -TERM "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
if [ -z "$export_file" ]; then
  export_file=$(make_export "$work" "${ckpt[@]}") || exit 2
fi

target/release/dormouse serve --export "$export_file" --port 0 --max-concurrent "$concurrency" \
  2> "$work/serve.err" &
server=$!
port=
for _ in $(seq 1 600); do  # up to 60 s for the model to load
  port=$(sed -n 's|^serving .* on http://127\.0\.0\.1:\([0-9][0-9]*\)/v1.*|\1|p' \
    "$work/serve.err" | head -n 1)
  [ -n "$port" ] && break
  if ! kill -0 "$server" 2>/dev/null; then
    echo "serve exited before it was serving:" >&2
    cat "$work/serve.err" >&2
    exit 1
  fi
  sleep 0.1
done
if [ -z "$port" ]; then
  echo "serve printed no 'serving ... on http://127.0.0.1:PORT/v1' line within 60 s:" >&2
  cat "$work/serve.err" >&2
  exit 1
fi
head -n 1 "$work/serve.err" >&2

status=0
"$python" bench/serve_load.py --url "http://127.0.0.1:$port" --concurrency "$concurrency" \
  --max-tokens "$max_tokens" --prompt "$prompt" || status=1

kill -TERM "$server"
server_status=0
wait "$server" || server_status=$?
server=
echo
if [ "$server_status" -eq 0 ]; then
  echo "serve exited 0 on SIGTERM"
else
  echo "serve exited $server_status on SIGTERM (expected 0):"
  cat "$work/serve.err"
  status=1
fi
exit "$status"
