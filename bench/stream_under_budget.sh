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

big=$(find "$WORK/artifact" -name '*.affinetile' -size +100M | sort | head -1)
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
  run "$budget" | python3 -c '
import json, sys
r = json.load(sys.stdin)
p = r["plan"]
steps = r["decode_steps"]
per = r["decode_seconds"] / max(steps, 1)
io = r["decode_io_seconds"] / max(steps, 1)
compute = per - io
print(f"budget {p[\"budget\"]/2**20:.0f} MiB, floor {p[\"floor\"]/2**20:.0f} MiB, weights {p[\"everything\"]/2**30:.2f} GiB ({p[\"everything\"]/p[\"budget\"]:.1f}x the budget), mode {p[\"mode\"]}")
print(f"expert bytes/token {r[\"expert_read_bytes_per_token\"]/2**20:.1f} MiB; plan without cache hits {p[\"uncached_read_per_token\"]/2**20:.1f} MiB; hits {r[\"expert_cache_hits\"]} misses {r[\"expert_cache_misses\"]}")
print(f"time/token {per*1e3:.0f} ms = I/O wait {io*1e3:.0f} ms + compute {compute*1e3:.0f} ms; ratio to max(I/O, compute) {per/max(io, compute):.2f}x; {r[\"tokens_per_second\"]:.2f} tok/s")
print(f"read throughput while waiting {r[\"expert_read_bytes_per_token\"]/max(io,1e-9)/1e9:.2f} GB/s; peak RSS {r[\"peak_rss_bytes\"]/2**20:.0f} MiB of budget {p[\"budget\"]/2**20:.0f} MiB")
'
done
echo "(dd iflag=direct: $dd_gbs)"
