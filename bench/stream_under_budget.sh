#!/usr/bin/env bash
# minirun streaming under a memory budget, on a generated DeepSeek-V3-shaped affine-4-bit
# artifact larger than the budget (default about 8 GB: hidden 2048, 64 experts of 3.5 MB, top 8,
# 37 layers), measured side by side in one run:
#   - read throughput of the streaming reader (minirun bench storage, O_DIRECT) against
#     `dd iflag=direct` on the same container file;
#   - minirun run at --budget floor and at --budget 1GiB: expert bytes read per token against
#     the plan's prediction, time per token against max(I/O wait, compute), peak RSS vs budget.
# Everything lives under target/stream-bench (about 2x the artifact size on disk).
#
#   bench/stream_under_budget.sh [GB] [BUDGET]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
GB="${1:-8.2}"
BUDGET="${2:-1GiB}"
WORK="$ROOT/target/stream-bench"
MINIRUN="$ROOT/target/release/minirun"
SYNTH="$ROOT/target/release/examples/synth_deepseek"

cd "$ROOT"
cargo build --release -q -p minirun-cli
cargo build --release -q -p minirun-pack --example synth_deepseek
mkdir -p "$WORK"
if [ ! -f "$WORK/artifact/index.json" ]; then
  rm -rf "$WORK/checkpoint" "$WORK/artifact"
  "$SYNTH" "$WORK/checkpoint" "$GB" 2048 64 8
  "$MINIRUN" pack --source "$WORK/checkpoint" --out "$WORK/artifact" >/dev/null
  rm -rf "$WORK/checkpoint"
  "$MINIRUN" verify "$WORK/artifact" 2>&1 | tail -1
fi
du -sh "$WORK/artifact"

big=$(find "$WORK/artifact" -name '*.affinetile' -size +50M | sort | sed -n 1p)
echo "== dd iflag=direct on $(basename "$big") (1 MiB blocks)"
dd if="$big" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1
dd_gbs=$(dd if="$big" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1 | awk '{print $(NF-1), $NF}')

echo "== minirun bench storage (tile-sized reads, 1.1 MiB)"
"$MINIRUN" bench storage "$WORK/artifact" --read-size 1136KiB --seconds 2

run() {
  "$MINIRUN" run "$WORK/artifact" --prompt "The clockmaker opened the" --max-tokens 16 \
    --ignore-eos --budget "$1" --json
}
for budget in floor "$BUDGET"; do
  echo "== minirun run --budget $budget"
  run "$budget" > "$WORK/run-$budget.json"
  python3 - "$WORK/run-$budget.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
p = r["plan"]
steps = max(r["decode_steps"], 1)
per = r["decode_seconds"] / steps
io = r["decode_io_seconds"] / steps
compute = per - io  # compute that overlapped the reads is not counted as I/O wait
mib, gib = 2**20, 2**30
print(f"budget {p['budget']/mib:.0f} MiB, floor {p['floor']/mib:.0f} MiB, weights {p['everything']/gib:.2f} GiB "
      f"({p['everything']/p['budget']:.1f}x the budget), mode {p['mode']}")
print(f"expert bytes/token {r['expert_read_bytes_per_token']/mib:.1f} MiB; the plan without cache hits "
      f"{p['uncached_read_per_token']/mib:.1f} MiB; cache hits {r['expert_cache_hits']} misses {r['expert_cache_misses']}")
print(f"time/token {per*1e3:.0f} ms = I/O wait {io*1e3:.0f} ms + compute {compute*1e3:.0f} ms; "
      f"{per/max(io, compute):.2f}x max(I/O, compute); {r['tokens_per_second']:.2f} tok/s")
print(f"expert bytes read per second of decoding {r['expert_read_bytes_per_token']/per/1e9:.3f} GB/s; "
      f"direct reads {r['direct_reads']}, buffered {r['buffered_reads']}; "
      f"peak RSS {r['peak_rss_bytes']/mib:.0f} MiB of budget {p['budget']/mib:.0f} MiB")
PY
done
echo "(dd iflag=direct: $dd_gbs)"
