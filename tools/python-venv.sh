#!/usr/bin/env bash
# Creates, or reuses, a Python virtual environment under the workspace's target/ directory with
# one of the project's pinned requirements files, for the benchmarks' references and the
# fixture generators. Nothing outside the workspace is written (pip's own download cache
# aside).
#
# Usage: tools/python-venv.sh ENV                  prints the environment's interpreter path
#        tools/python-venv.sh ENV SCRIPT [ARGS...] runs SCRIPT with that interpreter
#   ENV        venv                  requirements
#   reference  target/bench-venv     bench/requirements-reference.txt (PyTorch, about 5.4 GiB)
#   oracle     target/oracle-venv    tools/requirements-oracle.txt (mlx[cpu], mlx-lm)
#   torch-oracle target/torch-oracle-venv tools/requirements-torch-oracle.txt (PyTorch,
#              transformers; about 5.6 GiB)
#   openai     target/openai-venv    tools/requirements-openai.txt (the official client)
#   llamacpp   target/llamacpp-venv  bench/requirements-llamacpp.txt (cmake, ninja)
# Environment:
#   PYTHON3   the interpreter that creates the environment (default python3; the pins were
#             measured with CPython 3.11)
#
# The environment is made with `python3 -m venv`, then `pip install -r REQUIREMENTS`. It is
# reused while the requirements file is unchanged (its SHA-256 is recorded in the environment
# once pip has succeeded); an edited requirements file, or an install that was interrupted,
# runs pip again. To start over: rm -rf target/bench-venv (or the other venv). Callers at
# the same time wait for one another while the environment is made (flock on ENV_DIR.lock).
# Progress goes to stderr. Exit status 2 when the environment cannot be made.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

case "${1:-}" in
  reference) venv="$ROOT/target/bench-venv"; requirements="$ROOT/bench/requirements-reference.txt" ;;
  oracle) venv="$ROOT/target/oracle-venv"; requirements="$ROOT/tools/requirements-oracle.txt" ;;
  torch-oracle) venv="$ROOT/target/torch-oracle-venv"; requirements="$ROOT/tools/requirements-torch-oracle.txt" ;;
  openai) venv="$ROOT/target/openai-venv"; requirements="$ROOT/tools/requirements-openai.txt" ;;
  llamacpp) venv="$ROOT/target/llamacpp-venv"; requirements="$ROOT/bench/requirements-llamacpp.txt" ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: $0 reference|oracle|torch-oracle|openai|llamacpp [SCRIPT ARGS...] (see --help)" >&2; exit 2 ;;
esac
shift

[ -f "$requirements" ] || { echo "$requirements is missing" >&2; exit 2; }
python3=${PYTHON3:-python3}
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$requirements" | cut -d' ' -f1)

# One creator at a time: test binaries run in parallel may ask for the same environment.
mkdir -p "$ROOT/target"
exec 9> "$venv.lock"
flock 9

if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  if [ ! -x "$venv/bin/python" ]; then
    echo "creating $venv ($python3 -m venv)" >&2
    mkdir -p "$ROOT/target"
    "$python3" -m venv --clear "$venv" >&2 || {
      echo "could not create a virtual environment with $python3 (is its venv module installed?)" >&2
      exit 2
    }
  fi
  rm -f "$stamp"
  echo "installing ${requirements#"$ROOT"/} into $venv" >&2
  "$venv/bin/python" -m pip install --disable-pip-version-check -r "$requirements" >&2 || {
    echo "pip install -r ${requirements#"$ROOT"/} failed; rerun to retry (installed wheels are kept)" >&2
    exit 2
  }
  printf '%s\n' "$want" > "$stamp"
fi

exec 9>&-

if [ $# -eq 0 ]; then
  printf '%s\n' "$venv/bin/python"
else
  exec "$venv/bin/python" "$@"
fi
