#!/usr/bin/env bash
# `minirun verify` (full, against a saved tree listing) vs `sha256sum` of the same files, in one
# run, best of 3, from the page cache (every file is read once first).
# Goals: verify on one thread >= 0.95x sha256sum's throughput (per core), and verify
# with two files hashing at once >= 1.8x single-core sha256sum on this 2-core machine.
# Usage: bench/verify_vs_sha256sum.sh [FILES] [TILES_PER_FILE]
#   default 4 files of 240 tiles of 2048 x 4096 mxfp4 (4.29 GB in all)
set -euo pipefail
cd "$(dirname "$0")/.."
files=${1:-4}
tiles=${2:-240}
runs=3

cargo build --release -q -p minirun-cli
minirun=target/release/minirun
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/art/layer00"
for i in $(seq "$files"); do
  "$minirun" synth --out "$dir/art/layer00/w$i.mxfp4tile" --rows 2048 --cols 4096 --tiles "$tiles" --seed "$i" > /dev/null
done
# The tree listing a publisher would give: one LFS entry per file.
python3 - "$dir/art" > "$dir/tree.json" <<'PY'
import hashlib, json, os, sys
root = sys.argv[1]
entries = []
for name in sorted(os.listdir(os.path.join(root, "layer00"))):
    path = os.path.join(root, "layer00", name)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    size = os.path.getsize(path)
    entries.append({"type": "file", "oid": "1" * 40, "size": size, "path": f"layer00/{name}",
                    "lfs": {"oid": h.hexdigest(), "size": size, "pointerSize": 134}})
print(json.dumps(entries))
PY
bytes=$(du -sb "$dir/art/layer00" | cut -f1)
cat "$dir"/art/layer00/* > /dev/null

best() {
  local best_s=""
  for _ in $(seq "$runs"); do
    local t0 t1
    t0=$(date +%s.%N)
    "$@" > /dev/null 2>&1 || { echo "failed: $*" >&2; return 1; }
    t1=$(date +%s.%N)
    best_s=$(python3 -c "a='$best_s'; d=$t1-$t0; print(d if a=='' else min(float(a), d))")
  done
  echo "$best_s"
}

pin=0123456789abcdef0123456789abcdef01234567
verify() { "$minirun" verify "$dir/art" --repo bench/x-minirun --revision "$pin" --tree "$dir/tree.json" --threads "$1"; }
sha=$(best sha256sum "$dir"/art/layer00/*)
one=$(best verify 1)
two=$(best verify 2)

python3 - "$bytes" "$files" "$sha" "$one" "$two" <<'PY'
import sys
size, files = int(sys.argv[1]), int(sys.argv[2])
sha, one, two = map(float, sys.argv[3:6])
gb = size / 1e9
print(f"\n{files} files, {gb:.2f} GB, best of 3, page cache warm")
print(f"{'command':<46} {'seconds':>8} {'GB/s':>7} {'vs sha256sum':>13}")
print(f"{'sha256sum (one core)':<46} {sha:>8.3f} {gb / sha:>7.2f} {'1.00x':>13}")
print(f"{'minirun verify --threads 1 (goal >= 0.95x)':<46} {one:>8.3f} {gb / one:>7.2f} {sha / one:>12.2f}x")
print(f"{'minirun verify --threads 2 (goal >= 1.8x)':<46} {two:>8.3f} {gb / two:>7.2f} {sha / two:>12.2f}x")
PY
