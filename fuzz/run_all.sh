#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 60) each, one after the other, with cargo-fuzz
# (`cargo install cargo-fuzz`). New inputs go to the git-ignored corpus/<target>; seeds/<target>
# (golden files, where present) seed it. With only a stable toolchain the sanitizer flags need
# RUSTC_BOOTSTRAP=1, which this script sets unless a nightly toolchain is installed.
# Exit status: 0 when no target found a crash, else the first failing target's status.
#
#   fuzz/run_all.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  fuzz=(cargo +nightly fuzz)
else
  export RUSTC_BOOTSTRAP=1
  fuzz=(cargo fuzz)
fi
for target in $("${fuzz[@]}" list); do
  mkdir -p "corpus/$target"
  seeds=()
  [ -d "seeds/$target" ] && seeds=("seeds/$target")
  echo "== $target ($seconds s)"
  "${fuzz[@]}" run "$target" "corpus/$target" "${seeds[@]}" -- -max_total_time="$seconds"
done
