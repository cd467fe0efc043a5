#!/usr/bin/env bash
# minirun streaming at the real geometry of the published DeepSeek V4 Flash and Kimi K3, against
# the device's own read limit. For each geometry:
#   - a random checkpoint at the model's geometry (its upstream config.json) cut to its first
#     LAYERS layers, written by crates/minirun-synth/examples/synth_v4_flash.rs or synth_k3.rs
#     and packed into the published layout (`minirun pack --layout deepseek-v4-published` or
#     `kimi-k3-published`, under a synthetic repository id):
#       v4-flash: hidden 4096, 256 FP4 experts of 2048 x 4096 a layer, FP8 attention, vocabulary
#         129,280; default 5 layers (two sliding-window hash-routed layers, a compressed-sparse
#         hash-routed one, then heavily compressed and compressed-sparse router-driven ones);
#       k3: hidden 7168, 896 MXFP4 experts of 3072 x 3584 a layer in row bands, BF16 KDA and MLA
#         attention, vocabulary 163,840; default 2 layers (the dense first layer, then a KDA
#         layer with its mixture of experts).
#     Every file the published artifact also has (the layers' blobs and expert containers, the
#     embedding and head) must have that file's size in the recorded Hub tree
#     (crates/minirun-hub/tests/data/hf/DeepSeek-V4-Flash-0731-minirun, .../Kimi-K3-minirun), or
#     the script stops: the geometry is the real one;
#   - the artifact verified, against a tree listing of its own files in the Hub's format (the
#     stand-in for a publisher a synthetic artifact lacks), so that runs read as a user of the
#     verified published artifact does: without hashing every tile again;
#   - the device's read bandwidth at the experts' read size (one expert projection: 4,352 KiB
#     for V4, 5,712 KiB for K3): the best of `dd iflag=direct` over the expert containers and
#     `minirun bench storage` over its queue depths, before the runs and after them; the runs
#     read at `minirun run`'s default depth (8 reads in flight) unless --reads-in-flight says
#     otherwise;
#   - minirun run at --budget floor and at --budget balanced (halfway from the floor to
#     everything resident), there again with no expert read ahead on a guess (--guessed-layers 0,
#     right after the guessing run), and at the floor unverified (every tile hashed as it is
#     read), each
#     inside a memory cgroup of its budget + 192 MiB, the page cache of the artifact dropped
#     first: time per token, bytes read per token (routed experts and streamed layers), the
#     device's bytes read (/proc/diskstats), and the ratio of time per token to the limit the
#     bytes set at the device's bandwidth;
#   - the same tokens computed with every weight in memory, outside any cgroup: `minirun run
#     --budget generous` where MemAvailable holds the artifact, else the mmap baseline
#     (crates/minirun-mmap-baseline: the same model with every expert container memory-mapped,
#     nothing streamed); its logits must be the streamed runs' bit for bit (SHA-256 over every
#     logits vector): a difference makes the script exit 1.
# Where a run streams every layer (as any run of the whole model at these budgets must), its time
# per token for LAYERS layers is extrapolated to the model's 43 (V4) or 93 (K3) layers: the time
# outside the layers (embedding and head, which `minirun run --json` reports) plus the rest
# scaled by the layer count (for K3 this overstates: its first layer is the dense 2.3 GB one, the
# others 0.8 to 1.3 GB and their experts); bytes per token scale the same way, but for the
# embedding's and head's rows, read once a token. A run that holds layers has none (null). The
# expert bytes per token are set beside the reference runtime's figure: V4, its published
# 3,449,340,288 expert bytes a token over 43 layers, scaled to LAYERS; K3, 16 experts x three
# projections of 5,849,088 bytes (the published containers' stride) per mixture-of-experts layer,
# the part of its published 136,990,303,232 bytes a token that the experts are.
# Everything lives under target/stream-real: V4 Flash about 2 x 20 GB on disk while the artifact
# is made, 20 GB after; K3 about 2 x 24 GB, then 24 GB. The cgroups need root and a writable
# memory controller; without them the script says so and runs without a limit.
#
#   bench/stream_real_geometry.sh [--geometry v4-flash|k3|all] [--layers N] [--tokens T]
#                                 [--reads-in-flight D|best] [--activations f32|int8]
#                                 [--stream-every-layer] [--rounds N] [--caps "B/s ..."|none]
#                                 [--json]
#
# Capped rows (--caps, default "400000000 1000000000": the USB3 and USB4 classes of storage): the
# floor run again inside a block-I/O cgroup that throttles reads of the artifact's device to each
# rate (cgroup v2 io.max rbps=, v1 blkio.throttle.read_bps_device), so that the limit the run is
# held to is known rather than measured from a disk whose rate drifts: each such row has
# cap_bytes_per_s, limit_s_per_token (bytes read a token / the cap), ratio_to_limit against it,
# and stall_s_per_token (waiting for reads) and compute_s_per_token (the rest). Rows without a
# cap (cap_bytes_per_s null) are against the device's measured rate. Where no throttle can be
# set (it needs root and a block-I/O controller), the capped runs are left out, saying so.
#
# --rounds N runs the four runs N times, in the same order each round, and measures the device
# (`minirun bench storage`, every depth for a second) right before each run: the disk's rate
# drifts by a third between runs minutes apart here, so each run is also held to the rate the
# device gave just before it (ratio_to_adjacent_limit), and the table gives medians over the
# rounds with their ranges.
#
# --stream-every-layer runs every minirun run with `minirun run --stream-every-layer`: each
# layer's deterministic weights stream every step even where the cut's budget would hold them,
# the floor planned for that. The whole model at these budgets must stream its layers, but a
# cut of two K3 layers holds both at its floor (two layer buffers of the largest, 2.3 GB, would
# take more than the two layers), so without it the cut measures a model that holds its layers,
# and its per-token figures do not extrapolate.
#
# --activations int8 runs every minirun run and the all-in-memory check with 8-bit activations
# (`minirun run --activations int8`: MXFP4 and affine experts multiply in integers; FP8 and BF16
# tensors stay exact), whose logits are then compared with the same arithmetic in memory; the
# default is the exact f32 path. Computing a token costs less, so less of it is left beside the
# reads.
# --layers applies to one geometry (--geometry v4-flash or k3). --reads-in-flight D runs at D
# reads in flight instead of `minirun run`'s default, 8; --reads-in-flight best at the depth
# `minirun bench storage` found fastest before the runs. (On a virtual disk whose rate drifts,
# depths within a few percent of each other trade places from one measurement to the next, and
# the fastest has been depth 1 once and depth 8 in the next run: a depth picked from one noisy
# measurement moves the figures more than the depth itself does.) --json ends the output with one
# line {"rows": [...]}: a row per geometry and budget with geometry, budget, layers, s_per_token,
# bytes_per_token, read_bandwidth (bytes/s, the device's best, at the expert read size or at
# 64 MiB reads, whichever is faster), ratio_to_limit (s_per_token /
# (bytes_per_token / read_bandwidth)), verified, bits_equal_resident (null where no run with
# every weight in memory was possible), resident_check (minirun-resident or mmap-baseline), the
# extrapolation, read_wait_s_per_token (the time a token waited for reads), and ratio_to_bound:
# s_per_token over the larger of the read limit and all_in_memory_s_per_token (the same tokens
# with every weight in memory), with bound naming which is larger ("reads" or "compute"): where
# computing a token takes longer than reading its bytes, no streaming reaches the read limit;
# and run (floor, balanced, balanced-unguessed, floor-unverified), activations (f32 or int8),
# guessed_layers (the plan's),
# every_layer_streamed_as_asked (the runs had --stream-every-layer), rounds, and over the rounds
# (s_per_token, ratio_to_limit and the others are medians): s_per_token_range,
# ratio_to_limit_range, adjacent_read_bandwidths (bytes/s, the device's best right before each
# round's run), ratio_to_adjacent_limit and its range (time per token over the bytes at that rate),
# guessed_experts, guess_hit_rate (the share of guessed experts the router chose; null where
# none was guessed) and guess_wasted_bytes_per_token (what the guesses read that no expert
# computed from).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
GEOMETRY=all
LAYERS_ASKED=""
TOKENS=8
DEPTH_ASKED=8
ACTIVATIONS=f32
EVERY_LAYER=()
ROUNDS=1
CAPS="400000000 1000000000"
JSON=0
while [ $# -gt 0 ]; do
  case "$1" in
    --geometry) GEOMETRY="$2"; shift 2 ;;
    --layers) LAYERS_ASKED="$2"; shift 2 ;;
    --tokens) TOKENS="$2"; shift 2 ;;
    --reads-in-flight) DEPTH_ASKED="$2"; shift 2 ;;
    --activations) ACTIVATIONS="$2"; shift 2 ;;
    --stream-every-layer) EVERY_LAYER=(--stream-every-layer); shift ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --caps) CAPS="$2"; shift 2 ;;
    --json) JSON=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$ROUNDS" in
  ''|*[!0-9]*|0) echo "--rounds takes a positive whole number, not $ROUNDS" >&2; exit 2 ;;
esac
[ "$CAPS" = none ] && CAPS=""
for cap in $CAPS; do
  case "$cap" in
    ''|*[!0-9]*|0) echo "--caps takes rates in bytes a second (or none), not $cap" >&2; exit 2 ;;
  esac
done
case "$ACTIVATIONS" in
  f32|int8) ;;
  *) echo "unknown activations $ACTIVATIONS: f32 or int8" >&2; exit 2 ;;
esac
case "$GEOMETRY" in
  v4-flash|k3) GEOMETRIES=("$GEOMETRY") ;;
  all) GEOMETRIES=(v4-flash k3) ;;
  *) echo "unknown geometry $GEOMETRY: v4-flash, k3 or all" >&2; exit 2 ;;
esac
if [ -n "$LAYERS_ASKED" ] && [ "${#GEOMETRIES[@]}" -ne 1 ]; then
  echo "--layers applies to one geometry: add --geometry v4-flash or --geometry k3" >&2; exit 2
fi
WORK="$ROOT/target/stream-real"
MINIRUN="$ROOT/target/release/minirun"
BASELINE="$ROOT/target/release/mmap-baseline"
HUB_DATA="$ROOT/crates/minirun-hub/tests/data/hf"
PROMPT="The clockmaker opened the"
REVISION=0000000000000000000000000000000000000000
# Beyond the budget the process needs its binary, stacks and allocator slack (85 MiB of RSS
# measured at V4 Flash's geometry under --budget balanced), and a cgroup also counts the kernel's
# page tables for what the process holds (8 bytes a 4 KiB page: 22 MiB at 11 GB):
# docs/runtime.md.
OVERHEAD=$((192 << 20))
# The storage calibration `minirun bench storage` keeps, and the runs project their reads from:
# this script's own, from its own measurement.
export XDG_STATE_HOME="$WORK/state"

# The constants of geometry $1: its generator, layout, recorded Hub tree, default layer count and
# the read size of one expert projection in its published containers (V4: 2048 x 4096 FP4 codes
# and scales, page aligned; K3: 3072 x 3584 MXFP4 codes and scales, three bands of 1,024 rows).
use_geometry() {
  case "$1" in
    v4-flash)
      SYNTH=synth_v4_flash; LAYOUT=deepseek-v4-published; LAYERS=${LAYERS_ASKED:-5}
      TREE="$HUB_DATA/DeepSeek-V4-Flash-0731-minirun"; TILE_KIB=4352 ;;
    k3)
      SYNTH=synth_k3; LAYOUT=kimi-k3-published; LAYERS=${LAYERS_ASKED:-2}
      TREE="$HUB_DATA/Kimi-K3-minirun"; TILE_KIB=5712 ;;
  esac
  REPO="minirun-bench/synthetic-$1"
  ART="$WORK/$1-$LAYERS"
  RUNS="$WORK/$1-runs"
}

cd "$ROOT"
cargo build --release -q -p minirun-cli -p minirun-mmap-baseline
cargo build --release -q -p minirun-synth --example synth_v4_flash --example synth_k3
mkdir -p "$WORK"
# shellcheck source=bench/stream_common.sh
. "$ROOT/bench/stream_common.sh"
before_run() { drop_cache_of "$ART"; }

echo "== CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"

# The artifact of the current geometry, generated and packed unless already there.
make_artifact() {
  [ -f "$ART/index.json" ] && return 0
  rm -rf "$ART" "$ART.partial" "$WORK/checkpoint"
  echo "== a random checkpoint at $1's geometry, $LAYERS layers"
  "$ROOT/target/release/examples/$SYNTH" "$WORK/checkpoint" "$LAYERS"
  echo "== packed into the published layout"
  "$MINIRUN" pack --source "$WORK/checkpoint" --out "$ART.partial" --layout "$LAYOUT" \
    --source-repo "$REPO" --source-revision "$REVISION" > /dev/null
  rm -rf "$WORK/checkpoint"
  mv "$ART.partial" "$ART"
}

# The runs read as a user who verified the published artifact does: with full evidence, tiles
# are not hashed again on every read (an unverified run hashes each tile it reads; one such run
# is measured too). A synthetic artifact has no publisher, so its evidence is against a tree
# listing of its own files, made here in the Hub's format: the bench's stand-in for the Hub.
verify_artifact() {
  [ -f "$ART/.minirun/evidence.json" ] && return 0
  python3 - "$ART" > "$RUNS/tree.json" <<'PY'
import hashlib, json, os, sys
art, entries = sys.argv[1], []
for d, dirs, files in os.walk(art):
    dirs[:] = [x for x in dirs if not x.startswith(".")]
    for f in sorted(files):
        path = os.path.join(d, f)
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 24):
                digest.update(chunk)
        size = os.path.getsize(path)
        entries.append({"type": "file", "path": os.path.relpath(path, art), "size": size,
                        "oid": "0" * 40, "lfs": {"oid": digest.hexdigest(), "size": size}})
json.dump(entries, sys.stdout)
PY
  "$MINIRUN" verify "$ART" --repo "$REPO" --revision "$REVISION" --tree "$RUNS/tree.json" | tail -n 1
}

check_sizes() {
  echo "== file sizes against the published artifact's tree"
  python3 - "$ART" "$TREE" <<'PY'
import glob, json, os, sys
art, tree = sys.argv[1], sys.argv[2]
published = {}
for page in sorted(glob.glob(f"{tree}/tree-page-*.json")):
    for entry in json.load(open(page)):
        if entry["type"] == "file":
            published[entry["path"]] = entry["size"]
compared = differ = 0
for d, _, files in os.walk(art):
    for f in files:
        path = os.path.relpath(os.path.join(d, f), art)
        # Only the units' payload: manifests name the synthetic repository, and the root files
        # (index, config, tokenizer, licence) are not the model's weights.
        if path not in published or f == "manifest.json" or "/" not in path:
            continue
        compared += 1
        size = os.path.getsize(os.path.join(d, f))
        if size != published[path]:
            differ += 1
            print(f"  !! {path}: {size} bytes, the published file {published[path]}")
print(f"  {compared} files compared, {differ} of another size than the published one")
if differ or compared == 0:
    sys.exit("!! the generated artifact is not at the published geometry")
PY
}

# The device's read bandwidth at the experts' read size: dd over three expert containers and
# minirun bench storage over its queue depths, before the runs and again after them (a virtual
# disk's rate drifts); then minirun bench storage at LARGE_READ_MIB a read: a streamed layer
# reads parts of tens to hundreds of MiB, which a device may serve at another rate than an
# expert's few MiB, and the limit must be the device's best at either. The best figure of all is
# the limit the runs are held to.
LARGE_READ_MIB=64
measure_device() {
  echo "== device read bandwidth at the expert read size ($TILE_KIB KiB) and at $LARGE_READ_MIB MiB, $1 the runs"
  local experts start end bytes dd_bps
  mapfile -t experts < <(find "$ART" -name '*.mxfp4tile' | sort | head -n 3)
  before_run
  start=$(date +%s.%N); bytes=0
  for f in "${experts[@]}"; do
    dd if="$f" of=/dev/null bs="${TILE_KIB}k" iflag=direct status=none
    bytes=$((bytes + $(stat -c %s "$f")))
  done
  end=$(date +%s.%N)
  dd_bps=$(python3 -c "print($bytes / ($end - $start))")
  echo "$dd_bps" > "$RUNS/dd-$1.bps"
  echo "dd iflag=direct bs=${TILE_KIB}k: $(python3 -c "print(f'{$dd_bps / 1e9:.2f} GB/s')")"
  "$MINIRUN" bench storage "$ART" --read-size "${TILE_KIB}KiB" --seconds 3 --json > "$RUNS/storage-$1.json"
  "$MINIRUN" bench storage "$ART" --read-size "${LARGE_READ_MIB}MiB" --seconds 3 --no-save --json \
    > "$RUNS/storage-large-$1.json"
  python3 -c "
import json
for name, size in (('storage-$1', '${TILE_KIB} KiB'), ('storage-large-$1', '${LARGE_READ_MIB} MiB')):
    d = json.load(open('$RUNS/' + name + '.json'))['depths']
    print(f'minirun bench storage, {size} reads: ' + ', '.join(f\"{r['gb_per_second']:.2f} GB/s at depth {r['queue_depth']}\" for r in d))"
}

# Every weight in memory, outside any cgroup: minirun resident where the artifact fits in
# MemAvailable, else the mmap baseline (the page cache holds what it maps).
resident_run() {
  local available artifact_bytes
  available=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) * 1024 ))
  artifact_bytes=$(du -sb "$ART" | cut -f1)
  before_run
  if [ "$available" -gt $((artifact_bytes + (2 << 30))) ]; then
    echo "== minirun run fully resident (no cgroup)"
    "${RUN[@]}" --budget generous > "$RUNS/run-resident.json"
    echo minirun-resident > "$RUNS/resident-check"
  else
    echo "== mmap baseline, every expert container mapped (no cgroup; MemAvailable $((available >> 20)) MiB < the artifact + 2 GiB)"
    "$BASELINE" "$ART" --prompt "$PROMPT" --max-tokens "$TOKENS" --activations "$ACTIVATIONS" \
      > "$RUNS/run-resident.json"
    echo mmap-baseline > "$RUNS/resident-check"
  fi
}

measure_geometry() {
  use_geometry "$1"
  mkdir -p "$RUNS"
  rm -f "$RUNS"/*.json "$RUNS"/*.device "$RUNS"/*.bps "$RUNS/resident-check"
  make_artifact "$1"
  du -sh "$ART"
  verify_artifact
  check_sizes
  measure_device before
  local depth budget bytes run extra
  depth=$(python3 -c "import json; d = json.load(open('$RUNS/storage-before.json'))['depths']; print(max(d, key=lambda r: r['gb_per_second'])['queue_depth'])")
  if [ "$DEPTH_ASKED" = best ]; then
    echo "reads in flight for the runs: $depth (--reads-in-flight best: the storage's fastest)"
  else
    echo "reads in flight for the runs: $DEPTH_ASKED (the storage's fastest before the runs: $depth)"
    depth=$DEPTH_ASKED
  fi
  RUN=("$MINIRUN" run "$ART" --prompt "$PROMPT" --max-tokens "$TOKENS" --ignore-eos --json
       --reads-in-flight "$depth" --activations "$ACTIVATIONS")
  STREAMED_RUN=("${RUN[@]}" "${EVERY_LAYER[@]}")
  resident_run
  local round
  for round in $(seq "$ROUNDS"); do
    local runs=(floor balanced balanced-unguessed floor-unverified) cap
    if [ -n "$CAPS" ]; then
      if can_throttle "$ART"; then
        for cap in $CAPS; do runs+=("floor-cap$cap"); done
      else
        echo "  (no block-I/O throttle can be set here: the capped runs are left out)"
      fi
    fi
    printf '%s\n' "${runs[@]}" > "$RUNS/runs"
    for run in "${runs[@]}"; do
      budget=${run%%-*}
      extra=()
      READ_CAP=""
      case "$run" in
        *-unverified) extra=(--unverified) ;;
        *-unguessed) extra=(--guessed-layers 0) ;;
        *-cap*) READ_CAP=${run##*-cap} ;;
      esac
      bytes=$("$MINIRUN" run "$ART" --prompt "$PROMPT" --max-tokens 1 --json --budget "$budget" \
        "${EVERY_LAYER[@]}" | python3 -c "import json, sys; print(json.load(sys.stdin)['plan']['budget'])")
      before_run
      "$MINIRUN" bench storage "$ART" --read-size "${TILE_KIB}KiB" --seconds 1 --no-save --json \
        > "$RUNS/storage-$run-$round.json"
      echo "== round $round/$ROUNDS: minirun run --budget $budget ${EVERY_LAYER[*]} ${extra[*]} ($((bytes >> 20)) MiB)"
      in_cgroup $((bytes + OVERHEAD)) "$RUNS/run-$run-$round.json" "${STREAMED_RUN[@]}" --budget "$budget" "${extra[@]}"
    done
    READ_CAP=""
  done
  measure_device after
  echo "$LAYERS" > "$RUNS/layers"
  echo "$ROUNDS" > "$RUNS/rounds"
}

for geometry in "${GEOMETRIES[@]}"; do
  echo
  echo "######## $geometry"
  measure_geometry "$geometry"
done

python3 - "$WORK" "$JSON" "$ACTIVATIONS" "${GEOMETRIES[@]}" <<'PY'
import json, os, statistics, sys
work, as_json, activations, geometries = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4:]
MODEL_LAYERS = {"v4-flash": 43, "k3": 93}
def reference_expert_bytes(geometry, layers):
    if geometry == "v4-flash":
        # The reference runtime's routed-expert bytes per V4 Flash token, all 43 layers.
        return 3_449_340_288 * layers / 43
    # K3: 16 experts x w1, w3, w2 of 5,849,088 bytes in each mixture-of-experts layer (all but
    # the first, dense one), the experts' part of the reference's 136,990,303,232 bytes a token.
    return 16 * 3 * 5_849_088 * (layers - 1)
mib = 2**20
rows = []
print(f"\nactivations: {activations} (every run and the all-in-memory check)")
every_asked = {g: json.load(open(f"{work}/{g}-runs/run-floor-1.json"))["plan"]["layers"] == "stream_every"
               for g in geometries}
for g, asked in every_asked.items():
    if asked:
        print(f"{g}: every layer streamed as asked (--stream-every-layer), whether or not the budget would hold it")
print("\n| geometry | budget | layers | s/token | bytes/token (experts + layers + embedding and head) | expert bytes/token vs the reference's | "
      "limit s/token (bytes / bandwidth) | ratio to limit | ratio to the rate just before the run | waiting for reads s/token | ratio to max(limit, all in memory) | "
      "projected reads s/token (measured / projected) | device read | "
      "s/token at the model's layers (extrapolated) | guessed experts: right, wasted/token | bits = all in memory |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
notes = []
for geometry in geometries:
    runs = f"{work}/{geometry}-runs"
    load = lambda n: json.load(open(f"{runs}/{n}.json"))
    layers = int(open(f"{runs}/layers").read())
    model_layers = MODEL_LAYERS[geometry]
    depths = [dict(d, read=size) for name, size in
              (("storage", "expert-size"), ("storage-large", "large"))
              for w in ("before", "after") if os.path.exists(f"{runs}/{name}-{w}.json")
              for d in load(f"{name}-{w}")["depths"]]
    best = max(depths, key=lambda d: d["gb_per_second"])
    dd_bps = max(float(open(f"{runs}/dd-{w}.bps").read()) for w in ("before", "after"))
    bandwidth = max(best["gb_per_second"] * 1e9, dd_bps)
    check = open(f"{runs}/resident-check").read().strip()
    resident = load("run-resident")
    in_memory = 1 / resident["tokens_per_second"]
    notes.append(f"{geometry}: read bandwidth, the best before and after the runs: {bandwidth/1e9:.2f} GB/s "
                 f"(minirun bench storage {best['gb_per_second']:.2f} GB/s at depth {best['queue_depth']}, {best['read']} reads, "
                 f"dd iflag=direct {dd_bps/1e9:.2f} GB/s); every weight in memory ({check}): "
                 f"{1e3/resident['tokens_per_second']:.0f} ms/token")
    rounds = int(open(f"{runs}/rounds").read())
    for run in open(f"{runs}/runs").read().split():
        budget = run.split("-")[0]
        cap = int(run.split("-cap")[1]) if "-cap" in run else None
        measured = []
        for k in range(1, rounds + 1):
            r = load(f"run-{run}-{k}")
            if r["activations"] != activations or resident["activations"] != activations:
                sys.exit(f"!! {geometry} {run}: ran with other activations than {activations}")
            adjacent = max(d["gb_per_second"] for d in load(f"storage-{run}-{k}")["depths"]) * 1e9
            steps = max(r["decode_steps"], 1)
            s_token = 1 / r["tokens_per_second"]
            bytes_token = (r["expert_read_bytes_per_token"] + r["layer_read_bytes_per_token"]
                           + r.get("table_read_bytes_per_token", 0))
            measured.append({
                "r": r, "steps": steps, "s_token": s_token, "bytes_token": bytes_token,
                "adjacent": adjacent, "waiting": r["decode_io_seconds"] / steps,
                "outside": r["decode_outside_layers_seconds"] / steps,
                "device": int(open(f"{runs}/run-{run}-{k}.device").read()),
                "ratio_adjacent": s_token / (bytes_token / adjacent) if bytes_token else None,
            })
        med = lambda key: statistics.median(m[key] for m in measured)
        span = lambda key: [min(m[key] for m in measured), max(m[key] for m in measured)]
        # The round whose time per token is the median's (the lower middle one of an even count)
        # gives the figures that are not medians: the plan, the guesses, the logits.
        middle = sorted(measured, key=lambda m: m["s_token"])[(len(measured) - 1) // 2]
        r, steps = middle["r"], middle["steps"]
        s_token, waiting, outside = med("s_token"), med("waiting"), med("outside")
        bytes_token = round(med("bytes_token"))
        table_bytes = r.get("table_read_bytes_per_token", 0)
        rate = cap or bandwidth
        limit = bytes_token / rate
        # What no streamed run can beat: its reads at the device's best, or the same tokens
        # computed with every weight in memory, whichever takes longer.
        bound = max(limit, in_memory)
        # Scaling by the layer count holds only where every layer streams, as it must at the
        # model's size: a run that holds layers its model could not hold at that budget would
        # extrapolate to a figure nobody could measure.
        every_layer_streams = len(r["plan"]["streamed_layers"]) == layers
        s_model = outside + (s_token - outside) * model_layers / layers if every_layer_streams else None
        reference = reference_expert_bytes(geometry, layers)
        equal = all(m["r"]["logits_sha256"] == resident["logits_sha256"] for m in measured)
        device = round(med("device"))
        ratios = [m["s_token"] / (m["bytes_token"] / rate) for m in measured] if limit else []
        row = {
            "geometry": geometry, "budget": budget, "budget_bytes": r["plan"]["budget"],
            "activations": activations,
            "layers": layers, "s_per_token": s_token, "bytes_per_token": bytes_token,
            "expert_bytes_per_token": r["expert_read_bytes_per_token"],
            "reference_expert_bytes_per_token_scaled": round(reference),
            "read_bandwidth": bandwidth, "ratio_to_limit": statistics.median(ratios) if ratios else None,
            "cap_bytes_per_s": cap, "limit_s_per_token": limit,
            "limit_against": "cap" if cap else "measured device rate",
            "table_bytes_per_token": table_bytes,
            "stall_s_per_token": waiting, "compute_s_per_token": s_token - waiting,
            "rounds": rounds, "s_per_token_range": span("s_token"),
            "ratio_to_limit_range": [min(ratios), max(ratios)] if ratios else None,
            "adjacent_read_bandwidths": [m["adjacent"] for m in measured],
            "ratio_to_adjacent_limit": med("ratio_adjacent") if limit else None,
            "ratio_to_adjacent_limit_range": span("ratio_adjacent") if limit else None,
            "all_in_memory_s_per_token": in_memory, "ratio_to_bound": s_token / bound,
            "bound": "reads" if limit >= in_memory else "compute",
            "read_wait_s_per_token": waiting,
            "s_per_token_model_layers": s_model, "model_layers": model_layers,
            # The embedding's and head's rows are read once a token, whatever the layer count.
            "bytes_per_token_model_layers": round(table_bytes + (bytes_token - table_bytes) * model_layers / layers)
            if every_layer_streams else None,
            "outside_layers_s_per_token": outside, "device_read_bytes": device,
            "tokens": r["decode_steps"], "verified": r["verified"], "bits_equal_resident": equal,
            "resident_check": check,
            "projected_read_s_per_token": r.get("projected_read_seconds_per_token"),
            "run": run, "guessed_layers": r["plan"]["guessed_layers"],
            "every_layer_streamed_as_asked": r["plan"]["layers"] == "stream_every",
            "guessed_experts": r["expert_guessed"],
            "guess_hit_rate": r["expert_guess_hits"] / r["expert_guessed"] if r["expert_guessed"] else None,
            "guess_wasted_bytes_per_token": r["expert_guess_wasted_bytes"] / steps,
        }
        rows.append(row)
        ratio = f"{row['ratio_to_limit']:.2f}x" if limit else "n/a"
        if rounds > 1 and limit:
            lo, hi = row["ratio_to_limit_range"]
            ratio += f" ({lo:.2f}-{hi:.2f}x)"
        adjacent_ratio = "n/a"
        if row["ratio_to_adjacent_limit"] is not None:
            lo, hi = row["ratio_to_adjacent_limit_range"]
            adjacent_ratio = f"{row['ratio_to_adjacent_limit']:.2f}x" + (f" ({lo:.2f}-{hi:.2f}x)" if rounds > 1 else "")
        projected = row["projected_read_s_per_token"]
        projection = f"{projected:.3f} ({s_token / projected:.2f}x)" if projected else "none"
        guesses = (f"{row['guess_hit_rate']:.0%}, {row['guess_wasted_bytes_per_token']/mib:.1f} MiB"
                   if row["guess_hit_rate"] is not None else f"none ({row['guessed_layers']} layers guessed)")
        label = {"floor-unverified": ", unverified", "balanced-unguessed": ", --guessed-layers 0"}.get(run, "")
        if cap:
            label = f", reads capped at {cap / 1e6:.0f} MB/s"
        print(f"| {geometry} | {budget} ({r['plan']['budget']/mib:.0f} MiB){label} | {layers} | {s_token:.3f} | "
              f"{bytes_token/mib:.1f} MiB | {r['expert_read_bytes_per_token']/reference:.4f} | {limit:.3f} | {ratio} | "
              f"{adjacent_ratio} | {waiting:.3f} | "
              f"{row['ratio_to_bound']:.2f}x ({row['bound']}) | {projection} | "
              f"{device/mib:.0f} MiB | {f'{s_model:.2f}' if s_model is not None else 'n/a (layers held)'} | {guesses} | {equal} |")
print()
for note in notes:
    print(note)
if as_json:
    print(json.dumps({"rows": rows}))
if any(row["bits_equal_resident"] is False for row in rows):
    print("!! a streamed run computed other logits than the run with every weight in memory", file=sys.stderr)
    sys.exit(1)
PY
