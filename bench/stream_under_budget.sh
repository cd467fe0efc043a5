#!/usr/bin/env bash
# minirun streaming under a memory budget, on a generated DeepSeek-V3-shaped affine-4-bit
# artifact larger than the budget (default about 8 GB: hidden 2048, 64 experts of 3.5 MB, top 8,
# 37 layers), measured side by side in one run:
#   - read throughput of the streaming reader (minirun bench storage, O_DIRECT, tile-sized reads,
#     into one buffer per reader and rotating through a run's worth) against `dd iflag=direct`
#     on the same container files; the runs read at the rotating measurement's best depth;
#   - the compute a token needs: minirun run fully resident (outside any cgroup, which needs
#     the whole artifact in memory: skipped when MemAvailable is smaller);
#   - minirun run at --budget floor and at --budget BUDGET, each inside a memory cgroup of its
#     budget + 64 MiB (docs/runtime.md: the process overhead): expert bytes read per token
#     against the plan's prediction, time per token against max(I/O, compute) where I/O is
#     both the wall time the run's own reads kept storage busy and the bytes read at the
#     reader's measured throughput, peak RSS against the budget;
#   - the mmap baseline (crates/minirun-mmap-baseline: the same model and kernels, every
#     container mapped, the page cache deciding what stays) inside a cgroup of the same limit,
#     which is how mmap-based runtimes run a model that does not fit; its tokens must equal
#     minirun's.
# Before each run the artifact's pages are dropped from the page cache (posix_fadvise
# DONTNEED on every file), so no run reads what an earlier one left cached.
# Everything lives under target/stream-bench (about 2x the artifact size on disk while it is
# made). The cgroups need root and a writable cgroup v1 memory controller or cgroup v2
# memory.max; without them the script says so and runs without a limit.
#
#   bench/stream_under_budget.sh [GB] [BUDGET] [TOKENS]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
GB="${1:-8.2}"
BUDGET="${2:-1GiB}"
TOKENS="${3:-16}"
WORK="$ROOT/target/stream-bench"
MINIRUN="$ROOT/target/release/minirun"
BASELINE="$ROOT/target/release/mmap-baseline"
SYNTH="$ROOT/target/release/examples/synth_deepseek"
PROMPT="The clockmaker opened the"
OVERHEAD=$((64 << 20))

cd "$ROOT"
cargo build --release -q -p minirun-cli -p minirun-mmap-baseline
cargo build --release -q -p minirun-pack --example synth_deepseek
mkdir -p "$WORK"
if [ ! -f "$WORK/artifact/index.json" ]; then
  rm -rf "$WORK/checkpoint" "$WORK/artifact"
  "$SYNTH" "$WORK/checkpoint" "$GB" 2048 64 8
  "$MINIRUN" pack --source "$WORK/checkpoint" --out "$WORK/artifact" >/dev/null
  rm -rf "$WORK/checkpoint"
fi
# Every time: evidence from an earlier build may be in a format this one no longer reads.
"$MINIRUN" verify "$WORK/artifact" 2>&1 | tail -1
du -sh "$WORK/artifact"

drop_cache() {
  python3 - "$WORK/artifact" <<'PY'
import os, sys
for d, _, files in os.walk(sys.argv[1]):
    for f in files:
        fd = os.open(os.path.join(d, f), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
PY
}

# A fresh memory cgroup limited to $1 bytes; prints its folder, or nothing if none can be made.
make_cgroup() {
  local name="minirun-bench-$$-$2" dir
  if grep -qs memory /sys/fs/cgroup/cgroup.controllers; then
    dir="/sys/fs/cgroup/$name"
    mkdir "$dir" 2>/dev/null && echo "$1" > "$dir/memory.max" 2>/dev/null && echo 0 > "$dir/memory.swap.max" 2>/dev/null || true
    [ -f "$dir/memory.max" ] && echo "$dir"
  else
    dir="/sys/fs/cgroup/memory/$name"
    if mkdir "$dir" 2>/dev/null && echo "$1" > "$dir/memory.limit_in_bytes" 2>/dev/null; then
      echo "$1" > "$dir/memory.memsw.limit_in_bytes" 2>/dev/null || true
      echo "$dir"
    fi
  fi
}

# Runs "$@" inside a cgroup of $1 bytes (or unlimited, saying so), stdout to $2.
in_cgroup() {
  local limit="$1" out="$2" dir
  shift 2
  dir=$(make_cgroup "$limit" "$(basename "$out" .json)")
  drop_cache
  if [ -n "$dir" ]; then
    sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$dir" "$@" > "$out"
    for f in memory.peak memory.max_usage_in_bytes; do
      [ -f "$dir/$f" ] && echo "  cgroup limit $((limit >> 20)) MiB, cgroup peak $(( $(cat "$dir/$f") >> 20 )) MiB (page cache included)"
    done
    rmdir "$dir" 2>/dev/null || true
  else
    echo "  (no memory cgroup could be made here: run without a limit)"
    "$@" > "$out"
  fi
}

# dd over about 2 GB of expert containers (one file is too short a sample).
mapfile -t big < <(find "$WORK/artifact" -name '*.affinetile' -size +50M | sort | head -n 28)
echo "== dd iflag=direct bs=1M over ${#big[@]} expert containers"
dd_bps=0
for attempt in 1 2; do
  start=$(date +%s.%N); bytes=0
  for f in "${big[@]}"; do
    dd if="$f" of=/dev/null bs=1M iflag=direct status=none
    bytes=$((bytes + $(stat -c %s "$f")))
  done
  end=$(date +%s.%N)
  dd_bps=$(python3 -c "print(max($dd_bps, $bytes / ($end - $start)))")
done
dd_line="$(python3 -c "print(f'{$dd_bps / 1e9:.2f} GB/s')")"
echo "dd iflag=direct: $dd_line (best of 2)"

# One buffer per reader is the storage's best case; a run's reads land in a pool of buffers
# (ROTATE: the top-8 experts' three tiles each), which some virtual disks serve slower.
ROTATE=24
echo "== minirun bench storage (tile-sized reads, 1.1 MiB, one buffer per reader)"
"$MINIRUN" bench storage "$WORK/artifact" --read-size 1136KiB --seconds 2 --json > "$WORK/storage.json"
"$MINIRUN" bench storage "$WORK/artifact" --read-size 1136KiB --seconds 2
echo "== minirun bench storage (the same, each reader rotating through $ROTATE buffers)"
"$MINIRUN" bench storage "$WORK/artifact" --read-size 1136KiB --seconds 2 --buffers "$ROTATE" --json > "$WORK/storage-rotating.json"
"$MINIRUN" bench storage "$WORK/artifact" --read-size 1136KiB --seconds 2 --buffers "$ROTATE"
# The runs read at the queue depth the rotating measurement found fastest.
DEPTH=$(python3 -c "import json; d = json.load(open('$WORK/storage-rotating.json'))['depths']; print(max(d, key=lambda r: r['gb_per_second'])['queue_depth'])")
echo "reads in flight for the runs: $DEPTH"

RUN=("$MINIRUN" run "$WORK/artifact" --prompt "$PROMPT" --max-tokens "$TOKENS" --ignore-eos --json --reads-in-flight "$DEPTH")
# The plan's figure at a budget, from a one-token run.
plan_field() {
  "$MINIRUN" run "$WORK/artifact" --prompt "$PROMPT" --max-tokens 1 --json --budget "$1" \
    | python3 -c "import json, sys; print(json.load(sys.stdin)['plan']['$2'])"
}

available=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) * 1024 ))
artifact_bytes=$(du -sb "$WORK/artifact" | cut -f1)
if [ "$available" -gt $((artifact_bytes + (2 << 30))) ]; then
  echo "== minirun run fully resident (the compute a token needs; no cgroup)"
  drop_cache
  "${RUN[@]}" --budget generous > "$WORK/run-resident.json"
else
  echo "== (skipping the resident run: MemAvailable $((available >> 20)) MiB < the artifact)"
  echo '{}' > "$WORK/run-resident.json"
fi

floor=$(plan_field floor floor)
budget_bytes=$(plan_field "$BUDGET" budget)
echo "== minirun run --budget floor"
in_cgroup $((floor + OVERHEAD)) "$WORK/run-floor.json" "${RUN[@]}" --budget floor
echo "== minirun run --budget $BUDGET"
in_cgroup $((budget_bytes + OVERHEAD)) "$WORK/run-budget.json" "${RUN[@]}" --budget "$BUDGET"
echo "== mmap baseline"
in_cgroup $((budget_bytes + OVERHEAD)) "$WORK/run-mmap.json" \
  "$BASELINE" "$WORK/artifact" --prompt "$PROMPT" --max-tokens "$TOKENS"

python3 - "$WORK" "$BUDGET" "$dd_bps" <<'PY'
import json, sys
work, budget_name, dd_bps = sys.argv[1], sys.argv[2], float(sys.argv[3])
load = lambda n: json.load(open(f"{work}/{n}.json"))
storage, rotating = load("storage"), load("storage-rotating")
resident, mmap = load("run-resident"), load("run-mmap")
mib = 2**20
best = lambda doc: max(doc["depths"], key=lambda d: d["gb_per_second"])
one, rot = best(storage), best(rotating)
read_bps = one["gb_per_second"] * 1e9
print(f"\nreader, one buffer: {read_bps/1e9:.2f} GB/s at queue depth {one['queue_depth']}; "
      f"rotating through {rotating['buffers']}: {rot['gb_per_second']:.2f} GB/s at depth {rot['queue_depth']}; "
      f"dd iflag=direct {dd_bps/1e9:.2f} GB/s: {read_bps/dd_bps:.2f}x dd")
compute = 1 / resident["tokens_per_second"] if resident.get("tokens_per_second") else None
if compute:
    print(f"compute: {compute*1e3:.0f} ms/token fully resident ({resident['tokens_per_second']:.2f} tok/s)")
print("\nI/O busy: wall time the run's own reads kept storage busy per token (overlaps once);"
      " I/O at bench: the bytes read at the one-buffer bench's best throughput.")
print("\n| run | budget | weights / budget | expert bytes/token (plan without cache hits) | layer bytes/token (plan) | I/O busy ms | I/O at bench ms | compute ms | ms/token | vs max(I/O busy, compute) | vs max(I/O at bench, compute) | tok/s | peak RSS |")
print("|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for name, label in [("run-floor", "minirun --budget floor"), ("run-budget", f"minirun --budget {budget_name}")]:
    r = load(name)
    p = r["plan"]
    steps = max(r["decode_steps"], 1)
    per = 1 / r["tokens_per_second"]
    busy = r["decode_read_busy_seconds"] / steps
    at_bench = (r["expert_read_bytes_per_token"] + r["layer_read_bytes_per_token"]) / read_bps
    c = compute or 0
    print(f"| {label} (held layers {len(p['held_layers'])}) | {p['budget']/mib:.0f} MiB | {p['everything']/p['budget']:.1f}x | "
          f"{r['expert_read_bytes_per_token']/mib:.1f} MiB ({p['uncached_read_per_token']/mib:.1f}) | "
          f"{r['layer_read_bytes_per_token']/mib:.1f} MiB ({p['layer_read_per_token']/mib:.1f}) | {busy*1e3:.0f} | {at_bench*1e3:.0f} | "
          f"{compute*1e3 if compute else float('nan'):.0f} | {per*1e3:.0f} | {per/max(busy, c):.2f}x | {per/max(at_bench, c):.2f}x | "
          f"{r['tokens_per_second']:.2f} | {r['peak_rss_bytes']/mib:.0f} MiB |")
    print(f"  (its reads ran at {(r['expert_read_bytes_per_token'] + r['layer_read_bytes_per_token'])/busy/1e9:.2f} GB/s while storage was busy)", file=sys.stderr)
    if r["generated_token_ids"] != mmap["generated_token_ids"]:
        print(f"  !! {label} and the mmap baseline generated different tokens")
budget_run = load("run-budget")
print(f"| mmap baseline | same cgroup | | | | | | | {1e3/mmap['tokens_per_second']:.0f} | | | {mmap['tokens_per_second']:.2f} | {mmap['peak_rss_bytes']/mib:.0f} MiB |")
print(f"\nminirun --budget {budget_name} vs the mmap baseline under the same limit: "
      f"{budget_run['tokens_per_second']/mmap['tokens_per_second']:.2f}x tokens/s; same tokens: "
      f"{budget_run['generated_token_ids'] == mmap['generated_token_ids']}")
if resident.get("generated_token_ids"):
    print(f"same tokens as the resident run: {budget_run['generated_token_ids'] == resident['generated_token_ids']}")
PY
