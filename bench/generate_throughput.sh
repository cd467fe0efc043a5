#!/usr/bin/env bash
# Greedy generation throughput, bytes/s: `dormouse generate` (Rust, candle, CPU) against a
# PyTorch reference of the same model and the same decoding loop on the same export
# (bench/torch_generate.py: KV cache, greedy, cache rebuilt at max_seq_len as sample.rs does),
# one after the other (never at the same time), best of --runs each; then checks that the two
# greedy texts are byte for byte identical.
#
# Usage: bench/generate_throughput.sh [--steps N] [--prompt STR] [--runs R] [--threads T]
#                                     [CKPT_DIR [CKPT_NAME]]
#   CKPT_DIR/CKPT_NAME: a training run to export (bf16); CKPT_NAME defaults to latest. Without
#   them a `small` model is trained for 3 steps in a temporary folder and exported.
#   Steps default to 256 new bytes, the prompt to "And God said", runs to 3, threads (the
#   reference's intra-op threads) to nproc.
# Environment:
#   SKIP_BUILD=1  use target/release/dormouse as it is (no cargo build)
#   PYTHON        the reference's interpreter (default: target/bench-venv, which
#                 tools/python-venv.sh creates on first use from bench/requirements-reference.txt:
#                 about 5.4 GiB, PyPI's torch wheel for Linux brings the CUDA libraries along)
#   OMP_WAIT_POLICY and the like pass through to the reference: on a machine that another job
#   keeps busy, libgomp's spin-waiting with threads = nproc can slow it several times
#   (OMP_WAIT_POLICY=PASSIVE or --threads 1 avoid that).
# Prints each run's numbers as they come (stderr), then a markdown table:
#   impl | bytes/s | ratio vs reference | goal >= 2x met?
# and whether the greedy texts are identical (else the first differing byte position).
# Exit status 0 whether or not the goal is met; 1 if the texts differ; 2 on a setup problem.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/small_export.sh
. bench/small_export.sh

steps=256
prompt="And God said"
runs=3
threads=$(nproc)
ckpt=()
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
    *) ckpt+=("$1"); shift ;;
  esac
done
[ ${#ckpt[@]} -le 2 ] || { echo "at most CKPT_DIR CKPT_NAME (see --help)" >&2; exit 2; }

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

build_cli || exit 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export_file=$(make_export "$work" "${ckpt[@]}") || exit 2

for i in $(seq 1 "$runs"); do
  target/release/dormouse generate --export "$export_file" --prompt "$prompt" --steps "$steps" \
    > "$work/rust.$i.out" 2> "$work/rust.$i.err" || { cat "$work/rust.$i.err" >&2; exit 1; }
  echo "dormouse generate run $i: $(tail -n 1 "$work/rust.$i.err")" >&2
done
for i in $(seq 1 "$runs"); do
  "$python" bench/torch_generate.py --export "$export_file" --prompt "$prompt" \
    --steps "$steps" --threads "$threads" > "$work/torch.$i.out" 2> "$work/torch.$i.err" \
    || { cat "$work/torch.$i.err" >&2; exit 1; }
  grep '^{' "$work/torch.$i.out" | tail -n 1 > "$work/torch.$i.json"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r.pop("text"); print(json.dumps(r))' \
    "$work/torch.$i.json" | sed "s/^/reference run $i: /" >&2
done

python3 - "$work" "$runs" "$threads" "$steps" "$prompt" <<'EOF'
import json, pathlib, re, sys

work, runs, threads, steps, prompt = (pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                      int(sys.argv[4]), sys.argv[5])
rust_rates, rust_texts = [], []
for i in range(1, runs + 1):
    err = (work / f"rust.{i}.err").read_text()
    m = re.search(r"(\d+) bytes in ([\d.]+) s \(([\d.]+) bytes/s\)", err)
    if not m:
        sys.exit(f"run {i} of generate printed no 'N bytes in S s (X bytes/s)' line:\n{err}")
    rust_rates.append(float(m.group(3)))
    out = (work / f"rust.{i}.out").read_bytes()
    rust_texts.append(out[:-1] if out.endswith(b"\n") else out)
ref_rates, ref_texts, impl = [], [], None
for i in range(1, runs + 1):
    r = json.loads((work / f"torch.{i}.json").read_text())
    ref_rates.append(r["bytes_per_s"])
    ref_texts.append(r["text"].encode("latin-1"))
    impl = r["impl"]

rust, ref = max(rust_rates), max(ref_rates)
ratio = rust / ref
print(f"\nGreedy generation, {steps} new bytes after {prompt!r}, best of {runs} "
      f"(all runs: dormouse {rust_rates}, reference {ref_rates})\n")
print("| impl | bytes/s | ratio vs reference | goal >= 2x met? |")
print("|---|---:|---:|---|")
print(f"| dormouse generate (Rust, candle, CPU) | {rust:.1f} | {ratio:.2f}x | "
      f"{'yes' if ratio >= 2.0 else 'no'} |")
print(f"| reference ({impl}, {threads} threads) | {ref:.1f} | 1.00x | - |")

def first_diff(a, b):
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))

status = 0
for name, texts in (("dormouse", rust_texts), ("reference", ref_texts)):
    if any(t != texts[0] for t in texts):
        print(f"\n{name}'s greedy text changed between runs")
        status = 1
a, b = rust_texts[0], ref_texts[0]
k = first_diff(a, b)
if k is None:
    print(f"\ngreedy texts identical: yes ({len(a)} bytes)")
else:
    status = 1
    show = lambda t: t[k:k + 1].hex() or "end"
    print(f"\ngreedy texts identical: no: first difference at byte {k} of the generated text "
          f"(dormouse 0x{show(a)}, reference 0x{show(b)}; lengths {len(a)}, {len(b)})")
print(f"text: {a[:120]!r}{'...' if len(a) > 120 else ''}")
sys.exit(status)
EOF
