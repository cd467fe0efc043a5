#!/usr/bin/env bash
# The project's test command: installs what the tests need beside Rust, says what it installed,
# checks the README's and docs' relative links, then runs `cargo test --workspace` (arguments
# after the script's name go to cargo test).
#
# The tests need, beside the Rust toolchain:
#   - python3 >= 3.11 (tomllib) for the cross-language reader test (tools/dmexp_read.py);
#   - python3-venv: the OpenAI-client and oracle tests make venvs under target/ and pip-install
#     pinned packages into them (the tests do that themselves);
#   - ssh-keygen (openssh-client): the signed-artifact tests check signatures both ways with it;
#   - Chromium: the page tests drive both servers' page in a real headless browser (or the
#     browser CHROME names).
# Missing ones are installed with apt-get where this runs as root (or with sudo that asks no
# password); elsewhere the script stops before the tests and prints the one command to run.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
python3 -c 'import tomllib' 2>/dev/null || missing+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
command -v ssh-keygen >/dev/null || missing+=(openssh-client)
[ -n "${CHROME:-}" ] || command -v chromium >/dev/null || command -v chromium-browser >/dev/null \
  || command -v google-chrome >/dev/null || missing+=(chromium)

if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo)
  else
    echo "the tests need ${missing[*]}, which are not installed, and this user cannot install them." >&2
    echo "install them, then run tools/test.sh again:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "installing ${missing[*]} (apt-get), which the tests need"
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
  echo "installed: ${missing[*]}"
fi
python3 -c 'import tomllib' || { echo "python3 >= 3.11 is required (tools/dmexp_read.py uses tomllib)" >&2; exit 1; }

# One build, no incremental state; test binaries without debug info take half the disk (a full
# disk kills the linker mid-build). Panics still name their file and line.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export CARGO_PROFILE_DEV_STRIP="${CARGO_PROFILE_DEV_STRIP:-debuginfo}"
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-false}"
df -h . | awk 'NR == 2 { print "disk free for the build: " $4 " (the build and tests take about 8 GB)" }'

# Every relative link of the README and the docs resolves (a file, a heading), then the tests.
python3 tools/check_links.py
exec cargo test --workspace "$@"
