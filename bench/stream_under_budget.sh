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
#     which is how mmap-based runtimes run a model that does not fit;
#   - llama.cpp itself (llama-bench, mmap as it defaults, all cores) on the same weights,
#     requantized to Q4_0 (bench/mlx_to_gguf.py through llama.cpp's own converter, then
#     llama-quantize --pure), inside a cgroup of the same limit: what a user would run instead.
#     Twice: with its defaults (which copy the Q4_0 matrices it can repack into anonymous
#     memory at load, leaving the page cache less of the limit) and with --repack 0 (every
#     weight stays in the map). Each is stopped after S seconds (default 300) if it has not
#     finished. llama-bench decodes from an empty context, without the prompt.
# Every run's bytes read from the device are counted (/proc/diskstats of the device holding
# target/, before and after the run: the machine should be otherwise idle) beside its tok/s.
# minirun's runs and the mmap baseline must compute the same logits bit for bit (SHA-256 over
# the prompt's and every step's logits, as `minirun run --json` and mmap-baseline print it):
# any difference makes the script exit 1 after the table.
# Before each run the artifact's pages are dropped from the page cache (posix_fadvise
# DONTNEED on every file), so no run reads what an earlier one left cached.
# Everything lives under target/stream-bench (about 2x the artifact size on disk while it is
# made, and about 5x more while llama.cpp's GGUF is converted). The cgroups need root and a
# writable cgroup v1 memory controller or cgroup v2 memory.max; without them the script says so
# and runs without a limit.
#
#   bench/stream_under_budget.sh [GB] [BUDGET] [TOKENS] [--without-llamacpp] [--llamacpp-seconds=S]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
positional=()
LLAMACPP=1
LLAMA_SECONDS=300
for arg in "$@"; do
  case "$arg" in
    --without-llamacpp) LLAMACPP=0 ;;
    --llamacpp-seconds=*) LLAMA_SECONDS=${arg#*=} ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $arg (see --help)" >&2; exit 2 ;;
    *) positional+=("$arg") ;;
  esac
done
GB="${positional[0]:-8.2}"
BUDGET="${positional[1]:-1GiB}"
TOKENS="${positional[2]:-16}"
WORK="$ROOT/target/stream-bench"
MINIRUN="$ROOT/target/release/minirun"
BASELINE="$ROOT/target/release/mmap-baseline"
SYNTH="$ROOT/target/release/examples/synth_deepseek"
LLAMA_BENCH="$ROOT/target/llamacpp-bench/build/bin/llama-bench"
LLAMA_QUANTIZE="$ROOT/target/llamacpp-bench/build/bin/llama-quantize"
PROMPT="The clockmaker opened the"
OVERHEAD=$((64 << 20))

cd "$ROOT"
cargo build --release -q -p minirun-cli -p minirun-mmap-baseline
cargo build --release -q -p minirun-synth --example synth_deepseek
mkdir -p "$WORK"
# The generator is deterministic (a fixed seed): a checkpoint made again holds the same weights.
make_checkpoint() {
  rm -rf "$WORK/checkpoint"
  "$SYNTH" "$WORK/checkpoint" "$GB" 2048 64 8
}
GGUF="$WORK/model-q4_0.gguf"
if [ ! -f "$WORK/artifact/index.json" ] || [ "$(cat "$WORK/artifact.gb" 2>/dev/null)" != "$GB" ]; then
  rm -rf "$WORK/artifact" "$GGUF"
  make_checkpoint
  "$MINIRUN" pack --source "$WORK/checkpoint" --out "$WORK/artifact" >/dev/null
  echo "$GB" > "$WORK/artifact.gb"
fi
if [ "$LLAMACPP" = 1 ] && [ ! -f "$GGUF" ]; then
  LLAMA_SRC=$(bench/llamacpp_build.sh)
  TORCH=$(tools/python-venv.sh torch-oracle)
  [ -d "$WORK/checkpoint" ] || make_checkpoint
  echo "== the same weights for llama.cpp: a BF16 GGUF by its converter, then llama-quantize --pure Q4_0"
  PYTHONPATH="$LLAMA_SRC:$LLAMA_SRC/gguf-py" "$TORCH" bench/mlx_to_gguf.py \
    "$WORK/checkpoint" "$WORK/model-bf16.gguf" > "$WORK/convert.log" 2>&1 ||
    { echo "the conversion failed: see $WORK/convert.log" >&2; exit 1; }
  "$LLAMA_QUANTIZE" --pure "$WORK/model-bf16.gguf" "$GGUF.partial" Q4_0 > "$WORK/quantize.log" 2>&1 ||
    { echo "llama-quantize failed: see $WORK/quantize.log" >&2; exit 1; }
  mv "$GGUF.partial" "$GGUF"
  rm -f "$WORK/model-bf16.gguf"
fi
rm -rf "$WORK/checkpoint"
# Every time: evidence from an earlier build may be in a format this one no longer reads.
"$MINIRUN" verify "$WORK/artifact" 2>&1 | tail -1
du -sh "$WORK/artifact"

# shellcheck source=bench/stream_common.sh
. "$ROOT/bench/stream_common.sh"
drop_cache() { drop_cache_of "$WORK/artifact" "$@"; }
before_run() { if [ -f "$GGUF" ]; then drop_cache "$GGUF"; else drop_cache; fi; }

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
rm -f "$WORK"/run-llamacpp-* "$WORK"/llamacpp-*.log

floor=$(plan_field floor floor)
budget_bytes=$(plan_field "$BUDGET" budget)
limit=$((budget_bytes + OVERHEAD))
echo "== minirun run --budget floor"
in_cgroup $((floor + OVERHEAD)) "$WORK/run-floor.json" "${RUN[@]}" --budget floor
echo "== minirun run --budget $BUDGET"
in_cgroup "$limit" "$WORK/run-budget.json" "${RUN[@]}" --budget "$BUDGET"
echo "== mmap baseline"
in_cgroup "$limit" "$WORK/run-mmap.json" \
  "$BASELINE" "$WORK/artifact" --prompt "$PROMPT" --max-tokens "$TOKENS"
if [ "$LLAMACPP" = 1 ]; then
  LLAMA=("$LLAMA_BENCH" -m "$GGUF" -p 0 -n "$TOKENS" -r 1 --no-warmup -t "$(nproc)" -o json)
  for variant in defaults map; do
    case "$variant" in
      defaults) extra=(); label="its defaults (Q4_0 weights repacked at load)" ;;
      map) extra=(--repack 0); label="--repack 0 (every weight stays in the map)" ;;
    esac
    echo "== llama.cpp (llama-bench, mmap), $label, stopped after $LLAMA_SECONDS s"
    status=0
    in_cgroup "$limit" "$WORK/run-llamacpp-$variant.json" timeout "$LLAMA_SECONDS" \
      "${LLAMA[@]}" "${extra[@]}" 2> "$WORK/llamacpp-$variant.log" || status=$?
    echo "$status" > "$WORK/run-llamacpp-$variant.status"
    case "$status" in
      0) ;;
      124) echo "  not done in $LLAMA_SECONDS s: stopped" ;;
      *) echo "  exit $status: $(tail -n 2 "$WORK/llamacpp-$variant.log" | tr '\n' ' ')" ;;
    esac
  done
fi

python3 - "$WORK" "$BUDGET" "$dd_bps" "$TOKENS" "$LLAMA_SECONDS" <<'PY'
import json, os, sys
work, budget_name, dd_bps, tokens, llama_seconds = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
load = lambda n: json.load(open(f"{work}/{n}.json"))
def device(n):
    path = f"{work}/{n}.device"
    return int(open(path).read()) if os.path.exists(path) else -1
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
      " I/O at bench: the bytes read at the one-buffer bench's best throughput;"
      " device read: what /proc/diskstats counted for the whole run (prompt and loading included).")
print("\n| run | budget | weights / budget | expert bytes/token (plan without cache hits) | layer bytes/token (plan) | I/O busy ms | I/O at bench ms | compute ms | ms/token | vs max(I/O busy, compute) | vs max(I/O at bench, compute) | tok/s | device read | peak RSS |")
print("|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
def read_cell(n):
    b = device(n)
    return f"{b/mib:.0f} MiB" if b >= 0 else "n/a"
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
          f"{r['tokens_per_second']:.2f} | {read_cell(name)} | {r['peak_rss_bytes']/mib:.0f} MiB |")
    print(f"  (its reads ran at {(r['expert_read_bytes_per_token'] + r['layer_read_bytes_per_token'])/busy/1e9:.2f} GB/s while storage was busy)", file=sys.stderr)
print(f"| mmap baseline | same cgroup | | | | | | | {1e3/mmap['tokens_per_second']:.0f} | | | {mmap['tokens_per_second']:.2f} | "
      f"{read_cell('run-mmap')} | {mmap['peak_rss_bytes']/mib:.0f} MiB |")
llama = None
for name, label in [("run-llamacpp-defaults", "llama.cpp Q4_0, mmap, defaults"),
                    ("run-llamacpp-map", "llama.cpp Q4_0, mmap, --repack 0")]:
    if not os.path.exists(f"{work}/{name}.status"):
        continue
    status = int(open(f"{work}/{name}.status").read())
    try:
        rows = [row for row in load(name) if row.get("n_gen", 0) > 0]
    except (json.JSONDecodeError, TypeError):
        rows = []
    if status != 0 or not rows:
        why = f"not done in {llama_seconds} s" if status == 124 else f"failed (exit {status})"
        print(f"| {label} | same cgroup | | | | | | | {why} | | | | {read_cell(name)} | |")
        continue
    rate = rows[0]["avg_ts"]
    llama = rate if llama is None else max(llama, rate)
    print(f"| {label} | same cgroup | | | | | | | {1e3/rate:.0f} | | | {rate:.2f} | {read_cell(name)} | |")

budget_run = load("run-budget")
print(f"\nminirun --budget {budget_name} vs the mmap baseline under the same limit: "
      f"{budget_run['tokens_per_second']/mmap['tokens_per_second']:.2f}x tokens/s")
if llama:
    print(f"minirun --budget {budget_name} vs llama.cpp's faster finished run under the same limit: "
          f"{budget_run['tokens_per_second']/llama:.2f}x tokens/s (llama.cpp decodes {tokens} tokens "
          f"from an empty context, minirun after the prompt)")
# The same logits, bit for bit, or the figures above are of different computations.
runs = {"minirun --budget floor": load("run-floor"), f"minirun --budget {budget_name}": budget_run,
        "mmap baseline": mmap}
if resident.get("logits_sha256"):
    runs["resident"] = resident
digests = {label: r.get("logits_sha256") for label, r in runs.items()}
distinct = len(set(budget_run["generated_token_ids"]))
print(f"logits SHA-256 of every run: {next(iter(digests.values()))}; "
      f"{distinct} distinct ids among {len(budget_run['generated_token_ids'])} generated")
if len(set(digests.values())) != 1 or None in digests.values():
    for label, digest in digests.items():
        print(f"  !! {label}: logits SHA-256 {digest}")
    print("!! the runs computed different logits: the figures above compare different computations")
    sys.exit(1)
PY
