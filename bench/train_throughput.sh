#!/usr/bin/env bash
# Training throughput, tokens/s: dormouse's trainer (Rust, candle, CPU) against a PyTorch
# reference of the same model and the same training step (bench/torch_reference.py), on the
# same presets, batch and window length, one after the other (never at the same time).
#
# Usage: bench/train_throughput.sh [--steps N] [--warmup-steps W] [--threads T]
#                                  [--batch B] [--seq S] [--rounds R] [PRESET...]
#   PRESETs default to: nano small. Steps default to 20 (timed), warmup 3 (reference only),
#   threads to nproc (reference only: candle takes every core), batch 8, seq 256, rounds 1.
#   With R rounds each preset runs R times on each side, alternating, and the table takes each
#   side's best (a shared machine's noise only ever slows a run down) and shows the range.
# Environment:
#   PYTHON        the reference's interpreter (default: target/bench-venv, which
#                 tools/python-venv.sh creates on first use from bench/requirements-reference.txt:
#                 about 5.4 GiB, PyPI's torch wheel for Linux brings the CUDA libraries along)
#   RUST_RESULTS  a file of dormouse JSON lines to use instead of building and running the Rust
#                 example (to redo the table, or to test this script without cargo)
# Prints each JSON line as it comes, then a markdown table:
#   preset | dormouse tok/s | reference tok/s | ratio (dormouse/reference) | goal >= 1.0x met?
#   | largest |loss difference| over the steps both ran (same initialisation and batches)
set -euo pipefail
cd "$(dirname "$0")/.."

steps=20
warmup=3
threads=$(nproc)
batch=8
seq=256
rounds=1
presets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --warmup-steps) warmup=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    *) presets+=("$1"); shift ;;
  esac
done
[ ${#presets[@]} -gt 0 ] || presets=(nano small)

if [ -n "${PYTHON:-}" ]; then
  python=$PYTHON
else
  python=$(tools/python-venv.sh reference) || exit 2
fi
if [ ! -x "$python" ] || ! "$python" -c 'import torch, numpy' 2>/dev/null; then
  cat >&2 <<EOF
The PyTorch reference needs an interpreter with torch and numpy; $python has none.
With PYTHON unset, tools/python-venv.sh reference installs bench/requirements-reference.txt into
target/bench-venv (rm -rf target/bench-venv to start over); or point PYTHON at an interpreter that has them.
EOF
  exit 2
fi

results=$(mktemp)
trap 'rm -f "$results"' EXIT

# The last line of stdout that is a JSON object.
json_line() { grep '^{' | tail -n 1; }

if [ -n "${RUST_RESULTS:-}" ]; then
  grep '^{' "$RUST_RESULTS" >> "$results"
else
  cargo build --release -q -p dormouse --example train_throughput
fi

for preset in "${presets[@]}"; do
  for round in $(seq "$rounds"); do
    if [ -z "${RUST_RESULTS:-}" ]; then
      echo "dormouse (candle): $preset, $steps steps of $batch x $seq (round $round of $rounds)" >&2
      # Element-wise operations on the calling thread, as `dormouse train` runs them.
      line=$(CANDLE_NUM_THREADS="${CANDLE_NUM_THREADS:-1}" \
        cargo run --release -q -p dormouse --example train_throughput -- \
        --preset "$preset" --batch "$batch" --seq "$seq" --steps "$steps" | json_line)
      echo "$line"
      echo "$line" >> "$results"
    fi
    echo "reference ($python): $preset, $steps steps of $batch x $seq, $threads threads" >&2
    line=$("$python" bench/torch_reference.py --preset "$preset" --batch "$batch" --seq "$seq" \
      --steps "$steps" --warmup-steps "$warmup" --threads "$threads" | json_line)
    echo "$line"
    echo "$line" >> "$results"
  done
done

python3 - "$results" "${presets[@]}" <<'EOF'
import json, sys

path, presets = sys.argv[1], sys.argv[2:]
rust, ref = {}, {}
with open(path) as f:
    for line in f:
        r = json.loads(line)
        (rust if r["impl"].startswith("dormouse") else ref).setdefault(r["preset"], []).append(r)

def best(runs):
    return max(runs, key=lambda r: r["tokens_per_s"] or 0) if runs else None

def tps(runs):
    if not runs:
        return "n/a"
    rates = [r["tokens_per_s"] for r in runs]
    spread = f" ({min(rates):,.0f}-{max(rates):,.0f})" if len(rates) > 1 else ""
    return f"{max(rates):,.0f}{spread}"

def loss_gap(d, t):
    pairs = list(zip(d.get("losses") or [], t.get("losses") or []))
    return f"{max(abs(a - b) for a, b in pairs):.1e} ({len(pairs)} steps)" if pairs else "n/a"

print()
print("| preset | dormouse tok/s | reference tok/s | ratio (dormouse/reference) | goal >= 1.0x met? "
      "| largest loss difference |")
print("|---|---:|---:|---:|---|---:|")
impls = set()
for p in presets:
    d, t = best(rust.get(p)), best(ref.get(p))
    for r in (d, t):
        if r:
            impls.add(r["impl"])
            if r.get("params") != (d or t).get("params"):
                print(f"warning: {p}: parameter counts differ: {d and d.get('params')} vs "
                      f"{t and t.get('params')}", file=sys.stderr)
    if d and t and t["tokens_per_s"]:
        ratio = d["tokens_per_s"] / t["tokens_per_s"]
        print(f"| {p} | {tps(rust[p])} | {tps(ref[p])} | {ratio:.2f}x | "
              f"{'yes' if ratio >= 1.0 else 'no'} | {loss_gap(d, t)} |")
    else:
        print(f"| {p} | {tps(rust.get(p))} | {tps(ref.get(p))} | n/a | n/a | n/a |")
print()
print("implementations: " + "; ".join(sorted(impls)))
EOF
