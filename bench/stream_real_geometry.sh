#!/usr/bin/env bash
# minirun streaming at the published DeepSeek V4 Flash's real geometry, against the device's
# own read limit:
#   - a random checkpoint at V4 Flash's geometry (its upstream config.json: hidden 4096, 256
#     FP4 experts of 2048 x 4096 a layer, FP8 attention, vocabulary 129,280) cut to its first
#     LAYERS layers (default 5: two sliding-window hash-routed layers, a compressed-sparse
#     hash-routed one, then heavily compressed and compressed-sparse router-driven ones), written
#     by crates/minirun-pack/examples/synth_v4_flash.rs and packed into the published layout
#     (`minirun pack --layout deepseek-v4-published`, under a synthetic repository id). Every file the
#     published artifact also has (layersNN containers and blobs, the embedding and head) must
#     have that file's size in the recorded Hub tree (crates/minirun-hub/tests/data/hf/
#     DeepSeek-V4-Flash-0731-minirun), or the script stops: the geometry is the real one;
#   - the artifact verified, against a tree listing of its own files in the Hub's format (the
#     stand-in for a publisher a synthetic artifact lacks), so that runs read as a user of the
#     verified published artifact does: without hashing every tile again;
#   - the device's read bandwidth at the experts' read size (one expert tile, 4,352 KiB): the
#     best of `dd iflag=direct` over the expert containers and `minirun bench storage` over
#     its queue depths, before the runs and after them; the runs read at the best depth;
#   - minirun run at --budget floor and at --budget balanced (halfway from the floor to
#     everything resident), and at the floor unverified (every tile hashed as it is read), each
#     inside a memory cgroup of its budget + 192 MiB, the page cache of the artifact dropped
#     first: time per token, bytes read per token (routed experts and streamed layers), the
#     device's bytes read (/proc/diskstats), and the ratio of time per token to the limit the
#     bytes set at the device's bandwidth;
#   - a fully resident run of the same tokens (outside any cgroup; skipped when MemAvailable is
#     smaller than the artifact), whose logits must be the streamed runs' bit for bit (SHA-256
#     over every logits vector): a difference makes the script exit 1.
# The time per token for LAYERS layers is extrapolated to the model's 43: the time outside the
# layers (embedding and head, which `minirun run --json` reports) plus the rest scaled by
# 43 / LAYERS; bytes per token scale by 43 / LAYERS. The expert bytes per token are set beside
# the reference runtime's published figure (3,449,340,288 bytes a token over 43 layers) scaled
# to LAYERS.
# Everything lives under target/stream-real (about 2 x 20 GB on disk while the artifact is
# made, 20 GB after). The cgroups need root and a writable memory controller; without them the
# script says so and runs without a limit.
#
#   bench/stream_real_geometry.sh [--layers N] [--tokens T] [--json]
#
# --json ends the output with one line {"rows": [...]}: a row per geometry and budget with
# geometry, budget, layers, s_per_token, bytes_per_token, read_bandwidth (bytes/s, the
# device's best), ratio_to_limit (s_per_token / (bytes_per_token / read_bandwidth)),
# verified, bits_equal_resident (null where no resident run was possible), and the
# extrapolation.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LAYERS=5
TOKENS=8
JSON=0
while [ $# -gt 0 ]; do
  case "$1" in
    --layers) LAYERS="$2"; shift 2 ;;
    --tokens) TOKENS="$2"; shift 2 ;;
    --json) JSON=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
WORK="$ROOT/target/stream-real"
ART="$WORK/v4-flash-$LAYERS"
MINIRUN="$ROOT/target/release/minirun"
SYNTH="$ROOT/target/release/examples/synth_v4_flash"
TREE="$ROOT/crates/minirun-hub/tests/data/hf/DeepSeek-V4-Flash-0731-minirun"
PROMPT="The clockmaker opened the"
# Beyond the budget the process needs its binary, stacks and allocator slack (85 MiB of RSS
# measured at this geometry under --budget balanced), and a cgroup also counts the kernel's page
# tables for what the process holds (8 bytes a 4 KiB page: 22 MiB at 11 GB): docs/runtime.md.
OVERHEAD=$((192 << 20))
# The storage calibration `minirun bench storage` keeps, and the runs project their reads from:
# this script's own, from its own measurement.
export XDG_STATE_HOME="$WORK/state"
# The expert tile of the published V4 containers: 2048 x 4096 FP4 codes and scales, page aligned.
TILE_KIB=4352

cd "$ROOT"
cargo build --release -q -p minirun-cli
cargo build --release -q -p minirun-pack --example synth_v4_flash
mkdir -p "$WORK"
# shellcheck source=bench/stream_common.sh
. "$ROOT/bench/stream_common.sh"
before_run() { drop_cache_of "$ART"; }

echo "== CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ ! -f "$ART/index.json" ]; then
  rm -rf "$ART" "$ART.partial" "$WORK/checkpoint"
  echo "== a random checkpoint at V4 Flash's geometry, $LAYERS layers"
  "$SYNTH" "$WORK/checkpoint" "$LAYERS"
  echo "== packed into the published layout"
  "$MINIRUN" pack --source "$WORK/checkpoint" --out "$ART.partial" --layout deepseek-v4-published \
    --source-repo minirun-bench/synthetic-v4-flash \
    --source-revision 0000000000000000000000000000000000000000 > /dev/null
  rm -rf "$WORK/checkpoint"
  mv "$ART.partial" "$ART"
fi
du -sh "$ART"
# The runs read as a user who verified the published artifact does: with full evidence, tiles
# are not hashed again on every read (an unverified run hashes each tile it reads; one such run
# is measured too). A synthetic artifact has no publisher, so its evidence is against a tree
# listing of its own files, made here in the Hub's format: the bench's stand-in for the Hub.
if [ ! -f "$ART/.minirun/evidence.json" ]; then
  python3 - "$ART" > "$WORK/tree.json" <<'PY'
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
  "$MINIRUN" verify "$ART" --repo minirun-bench/synthetic-v4-flash \
    --revision 0000000000000000000000000000000000000000 --tree "$WORK/tree.json" | tail -n 1
fi

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

# The device's read bandwidth at the experts' read size: dd over three expert containers and
# minirun bench storage over its queue depths, before the runs and again after them (a virtual
# disk's rate drifts); the best figure of all is the limit the runs are held to.
dd_bps=0
measure_device() {
  echo "== device read bandwidth at the expert read size ($TILE_KIB KiB), $1 the runs"
  local experts start end bytes
  mapfile -t experts < <(find "$ART" -name '*.mxfp4tile' | sort | head -n 3)
  before_run
  start=$(date +%s.%N); bytes=0
  for f in "${experts[@]}"; do
    dd if="$f" of=/dev/null bs="${TILE_KIB}k" iflag=direct status=none
    bytes=$((bytes + $(stat -c %s "$f")))
  done
  end=$(date +%s.%N)
  dd_bps=$(python3 -c "print(max($dd_bps, $bytes / ($end - $start)))")
  echo "dd iflag=direct bs=${TILE_KIB}k: $(python3 -c "print(f'{$bytes / ($end - $start) / 1e9:.2f} GB/s')")"
  "$MINIRUN" bench storage "$ART" --read-size "${TILE_KIB}KiB" --seconds 3 --json > "$WORK/storage-$1.json"
  python3 -c "
import json; d = json.load(open('$WORK/storage-$1.json'))['depths']
print('minirun bench storage: ' + ', '.join(f\"{r['gb_per_second']:.2f} GB/s at depth {r['queue_depth']}\" for r in d))"
}
measure_device before
DEPTH=$(python3 -c "import json; d = json.load(open('$WORK/storage-before.json'))['depths']; print(max(d, key=lambda r: r['gb_per_second'])['queue_depth'])")
echo "reads in flight for the runs: $DEPTH"

RUN=("$MINIRUN" run "$ART" --prompt "$PROMPT" --max-tokens "$TOKENS" --ignore-eos --json
     --reads-in-flight "$DEPTH")
available=$(( $(awk '/MemAvailable/ {print $2}' /proc/meminfo) * 1024 ))
artifact_bytes=$(du -sb "$ART" | cut -f1)
if [ "$available" -gt $((artifact_bytes + (2 << 30))) ]; then
  echo "== minirun run fully resident (no cgroup)"
  before_run
  "${RUN[@]}" --budget generous > "$WORK/run-resident.json"
else
  echo "== (no resident run: MemAvailable $((available >> 20)) MiB < the artifact + 2 GiB)"
  echo '{}' > "$WORK/run-resident.json"
fi
for run in floor balanced floor-unverified; do
  budget=${run%-unverified}
  extra=()
  [ "$run" = "$budget" ] || extra=(--unverified)
  bytes=$("$MINIRUN" run "$ART" --prompt "$PROMPT" --max-tokens 1 --json --budget "$budget" \
    | python3 -c "import json, sys; print(json.load(sys.stdin)['plan']['budget'])")
  echo "== minirun run --budget $budget ${extra[*]} ($((bytes >> 20)) MiB)"
  in_cgroup $((bytes + OVERHEAD)) "$WORK/run-$run.json" "${RUN[@]}" --budget "$budget" "${extra[@]}"
done
measure_device after

python3 - "$WORK" "$LAYERS" "$dd_bps" "$JSON" <<'PY'
import json, os, sys
work, layers, dd_bps, as_json = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
MODEL_LAYERS = 43
# The reference runtime's routed-expert bytes per V4 Flash token, all 43 layers.
REFERENCE_EXPERT_BYTES = 3_449_340_288
load = lambda n: json.load(open(f"{work}/{n}.json"))
depths = load("storage-before")["depths"] + load("storage-after")["depths"]
best = max(depths, key=lambda d: d["gb_per_second"])
bandwidth = max(best["gb_per_second"] * 1e9, dd_bps)
print(f"\nread bandwidth, the best before and after the runs: {bandwidth/1e9:.2f} GB/s (minirun bench storage "
      f"{best['gb_per_second']:.2f} GB/s at depth {best['queue_depth']}, dd iflag=direct {dd_bps/1e9:.2f} GB/s)")
resident = load("run-resident")
if resident:
    print(f"compute, fully resident: {1e3/resident['tokens_per_second']:.0f} ms/token")
mib = 2**20
rows = []
print("\n| geometry | budget | layers | s/token | bytes/token (experts + layers) | expert bytes/token vs the reference's, scaled | "
      "limit s/token (bytes / bandwidth) | ratio to limit | projected reads s/token (measured / projected) | device read | "
      "s/token at 43 layers (extrapolated) | bits = resident |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
for run in ("floor", "balanced", "floor-unverified"):
    r = load(f"run-{run}")
    budget = run.removesuffix("-unverified")
    steps = max(r["decode_steps"], 1)
    s_token = 1 / r["tokens_per_second"]
    bytes_token = r["expert_read_bytes_per_token"] + r["layer_read_bytes_per_token"]
    limit = bytes_token / bandwidth
    outside = r["decode_outside_layers_seconds"] / steps
    s_model = outside + (s_token - outside) * MODEL_LAYERS / layers
    reference = REFERENCE_EXPERT_BYTES * layers / MODEL_LAYERS
    equal = (r["logits_sha256"] == resident["logits_sha256"]) if resident else None
    device = int(open(f"{work}/run-{run}.device").read())
    row = {
        "geometry": "v4-flash", "budget": budget, "budget_bytes": r["plan"]["budget"],
        "layers": layers, "s_per_token": s_token, "bytes_per_token": bytes_token,
        "expert_bytes_per_token": r["expert_read_bytes_per_token"],
        "reference_expert_bytes_per_token_scaled": round(reference),
        "read_bandwidth": bandwidth, "ratio_to_limit": s_token / limit if limit else None,
        "s_per_token_model_layers": s_model, "model_layers": MODEL_LAYERS,
        "bytes_per_token_model_layers": round(bytes_token * MODEL_LAYERS / layers),
        "outside_layers_s_per_token": outside, "device_read_bytes": device,
        "tokens": r["decode_steps"], "verified": r["verified"], "bits_equal_resident": equal,
        "projected_read_s_per_token": r.get("projected_read_seconds_per_token"),
    }
    rows.append(row)
    ratio = f"{row['ratio_to_limit']:.2f}x" if limit else "n/a"
    projected = row["projected_read_s_per_token"]
    projection = f"{projected:.3f} ({s_token / projected:.2f}x)" if projected else "none"
    print(f"| v4-flash | {budget} ({r['plan']['budget']/mib:.0f} MiB){'' if r['verified'] else ', unverified'} | {layers} | {s_token:.3f} | "
          f"{bytes_token/mib:.1f} MiB | {r['expert_read_bytes_per_token']/reference:.4f} | {limit:.3f} | {ratio} | {projection} | "
          f"{device/mib:.0f} MiB | {s_model:.2f} | {equal} |")
if as_json:
    print(json.dumps({"rows": rows}))
if any(row["bits_equal_resident"] is False for row in rows):
    print("!! a streamed run computed other logits than the resident run", file=sys.stderr)
    sys.exit(1)
PY
