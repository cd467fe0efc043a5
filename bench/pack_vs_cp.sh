#!/usr/bin/env bash
# `minirun pack` vs `cp -r`, and `minirun check` vs `cmp`, on the same synthetic checkpoint
# (MLX affine 4-bit layout, ~2 GB by default), in one run, best of 3, page cache warm.
# Usage: bench/pack_vs_cp.sh [GB]
set -euo pipefail
cd "$(dirname "$0")/.."
gb=${1:-2}
runs=3

cargo build --release -q -p minirun-cli
cargo build --release -q -p minirun-synth --example synth_checkpoint
minirun=target/release/minirun
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
target/release/examples/synth_checkpoint "$dir/ckpt" "$gb" 2> /dev/null
bytes=$(du -sb "$dir/ckpt" | cut -f1)
cat "$dir"/ckpt/* > /dev/null

best() {
  local best_s=""
  for _ in $(seq "$runs"); do
    rm -rf "$dir/out"
    local t0 t1
    t0=$(date +%s.%N)
    "$@" > /dev/null || { echo "failed: $*" >&2; return 1; }
    t1=$(date +%s.%N)
    best_s=$(python3 -c "a='$best_s'; d=$t1-$t0; print(d if a=='' else min(float(a), d))")
  done
  echo "$best_s"
}

cp_s=$(best cp -r "$dir/ckpt" "$dir/out")
# pack fsyncs every file it writes (atomic, durable writes); cp does not, so also time cp + sync.
cp_sync() { cp -r "$dir/ckpt" "$dir/out" && sync; }
cpsync_s=$(best cp_sync)
pack_s=$(best "$minirun" pack --source "$dir/ckpt" --out "$dir/out")
"$minirun" pack --source "$dir/ckpt" --out "$dir/packed" > /dev/null
cp -r "$dir/ckpt" "$dir/copy"
cmp_all() { for f in "$dir"/ckpt/*; do cmp "$f" "$dir/copy/$(basename "$f")"; done; }
cmp_s=$(best cmp_all)
check_s=$(best "$minirun" check "$dir/packed" --source "$dir/ckpt")

python3 - "$bytes" "$cp_s" "$pack_s" "$cmp_s" "$check_s" "$cpsync_s" <<'PY'
import sys
size, cp, pack, cmp_, check, cpsync = int(sys.argv[1]), *map(float, sys.argv[2:7])
gb = size / 1e9
print(f"\n{gb:.2f} GB checkpoint, best of 3, page cache warm")
print(f"{'command':<44} {'seconds':>8} {'GB/s':>7} {'ratio':>7}")
print(f"{'cp -r checkpoint':<44} {cp:>8.3f} {gb / cp:>7.2f} {'1.00x':>7}")
print(f"{'cp -r checkpoint && sync':<44} {cpsync:>8.3f} {gb / cpsync:>7.2f} {cpsync / cp:>6.2f}x")
print(f"{'minirun pack (goal <= 1.3x cp)':<44} {pack:>8.3f} {gb / pack:>7.2f} {pack / cp:>6.2f}x")
print(f"{'  (same, vs cp -r && sync)':<44} {'':>8} {'':>7} {pack / cpsync:>6.2f}x")
print(f"{'cmp of every shard against a copy':<44} {cmp_:>8.3f} {gb / cmp_:>7.2f} {'1.00x':>7}")
print(f"{'minirun check (vs cmp)':<44} {check:>8.3f} {gb / check:>7.2f} {check / cmp_:>6.2f}x")
PY
