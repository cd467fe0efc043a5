#!/usr/bin/env bash
# `dormouse export run` (bf16) vs `cp` of the same training checkpoint `.bin`, best of 5, page cache warm.
# Goal: export <= 1.5x the copy's time. export fsyncs what it writes (atomic, durable); cp does
# not, so cp && sync is shown too.
# Usage: bench/export_vs_cp.sh [CKPT_DIR] [CKPT_NAME]
#   default: trains a `small` run for 3 steps in a temporary folder (the model section, the
#   part export reads, has the same size whatever the step).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=5
cargo build --release -q -p dormouse-cli
dormouse=target/release/dormouse
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if [[ $# -ge 1 ]]; then
  ckpt_dir=$1
  name=${2:-latest}
else
  ckpt_dir=$dir/ckpt
  name=latest
  "$dormouse" train --preset small --steps 3 --eval-bytes 4096 --ckpt-dir "$ckpt_dir" > /dev/null 2>&1
fi
cat "$ckpt_dir/$name.bin" > /dev/null

best() {
  local best_s=""
  for _ in $(seq "$runs"); do
    rm -f "$dir/out"
    local t0 t1
    t0=$(date +%s.%N)
    "$@" > /dev/null 2>&1 || { echo "failed: $*" >&2; return 1; }
    t1=$(date +%s.%N)
    best_s=$(python3 -c "a='$best_s'; d=$t1-$t0; print(d if a=='' else min(float(a), d))")
  done
  echo "$best_s"
}

cp_s=$(best cp "$ckpt_dir/$name.bin" "$dir/out")
cp_sync() { cp "$ckpt_dir/$name.bin" "$dir/out" && sync; }
cpsync_s=$(best cp_sync)
export_s=$(best "$dormouse" export run --ckpt-dir "$ckpt_dir" --ckpt-name "$name" --dtype bf16 --out "$dir/out")
bytes=$(stat -c %s "$ckpt_dir/$name.bin")
out_bytes=$(stat -c %s "$dir/out")

python3 - "$bytes" "$out_bytes" "$cp_s" "$cpsync_s" "$export_s" <<'PY'
import sys
size, out = int(sys.argv[1]), int(sys.argv[2])
cp, cpsync, export = map(float, sys.argv[3:6])
print(f"\ntraining checkpoint {size / 1e6:.1f} MB -> bf16 export {out / 1e6:.1f} MB, best of 5")
print(f"{'command':<40} {'seconds':>8} {'ratio':>7}")
print(f"{'cp checkpoint.bin':<40} {cp:>8.3f} {'1.00x':>7}")
print(f"{'cp checkpoint.bin && sync':<40} {cpsync:>8.3f} {cpsync / cp:>6.2f}x")
print(f"{'export run --dtype bf16 (goal <= 1.5x)':<40} {export:>8.3f} {export / cp:>6.2f}x")
print(f"{'  (same, vs cp && sync)':<40} {'':>8} {export / cpsync:>6.2f}x")
PY
