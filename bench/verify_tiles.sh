#!/usr/bin/env bash
# Tile hashing throughput: `minirun info --verify-tiles` on a ~2 GiB synthetic container vs
# `sha256sum` of the same file, in one run, from the page cache (the file is read once first).
# Usage: bench/verify_tiles.sh [TILES]   (default 482 tiles of 2048 x 4096 mxfp4 = 2.15 GB)
set -euo pipefail
cd "$(dirname "$0")/.."
tiles=${1:-482}
runs=3

cargo build --release -q -p minirun-cli
minirun=target/release/minirun
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
file="$dir/bench.mxfp4tile"
"$minirun" synth --out "$file" --rows 2048 --cols 4096 --tiles "$tiles" --digests
bytes=$(stat -c %s "$file")
cat "$file" > /dev/null

# Best wall time of $runs runs of a command, in seconds.
best() {
  local best_s=""
  for _ in $(seq "$runs"); do
    local t0 t1
    t0=$(date +%s.%N)
    "$@" > /dev/null || { echo "failed: $*" >&2; return 1; }
    t1=$(date +%s.%N)
    best_s=$(python3 -c "a='$best_s'; d=$t1-$t0; print(d if a=='' else min(float(a), d))")
  done
  echo "$best_s"
}

sha=$(best sha256sum "$file")
# OpenSSL's SHA-256 uses the CPU's SHA extensions where coreutils may not: a stronger reference.
ossl=$(if command -v openssl > /dev/null; then best openssl dgst -sha256 "$file"; else echo 0; fi)
one=$(best "$minirun" info "$file" --verify-tiles --threads 1)
two=$(best "$minirun" info "$file" --verify-tiles --threads 2)

python3 - "$bytes" "$sha" "$ossl" "$one" "$two" "$(nproc)" <<'PY'
import sys
size, sha, ossl, one, two, cores = int(sys.argv[1]), *map(float, sys.argv[2:6]), int(sys.argv[6])
gb = size / 1e9
rows = [("sha256sum (1 core)", sha)]
if ossl > 0:
    rows.append(("openssl dgst -sha256 (1 core)", ossl))
rows += [("minirun --verify-tiles --threads 1", one), ("minirun --verify-tiles --threads 2", two)]
print(f"\n{gb:.2f} GB container, best of 3, page cache warm, {cores} cores")
print(f"{'command':<38} {'seconds':>8} {'GB/s':>7} {'vs sha256sum':>13}")
for name, s in rows:
    print(f"{name:<38} {s:>8.3f} {gb / s:>7.2f} {sha / s:>12.2f}x")
print(f"scaling 1 -> 2 threads: {one / two:.2f}x (goal: per-core >= 0.95x sha256sum, near-linear across cores)")
PY
