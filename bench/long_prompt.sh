#!/usr/bin/env bash
# A long prompt against Kimi K3's tokenizer and against `minirun serve`.
#
# 1. Tokenizer: one word ("lock") repeated to 10 kB, 40 kB, 80 kB and 1 MiB is one split piece,
#    the byte-pair merge's worst case. minirun's encoder (crates/minirun-text, the `bpe`
#    crate's linear-time merges) and tiktoken 0.12.0 (quadratic in a piece) encode it on the
#    K3 tokenizer fixture's vocabulary, in --rounds interleaved rounds (the order alternates);
#    tiktoken skips 1 MiB (hours). Prints seconds per size (median over rounds, range) and the
#    median of the rounds' ratios tiktoken / minirun.
# 2. Server: Kimi K3's tiny fixture packed, its tokenizer a tiktoken.model, served with
#    --max-concurrent 2; completions stream one after another while a single-word prompt as
#    long as the 1 MiB body cap allows is posted. Prints how long its refusal took and the
#    gaps between streamed tokens before and while it was in flight.
#
# Usage: bench/long_prompt.sh [--rounds N]   (default 3)
# Needs tools/python-venv.sh oracle (tiktoken; installed on first use). Every figure names the
# CPU it ran on (lscpu) and the load average at the start and the end.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
cargo build --release -q -p minirun-cli
cargo build --release -q -p minirun-text --example encode_long_word
vocab=crates/minirun-runtime/tests/data/kimi-k3/tiktoken/tiktoken.model
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); load at start: $(cut -d' ' -f1-3 /proc/loadavg)"

work=$(mktemp -d)
server=
cleanup() {
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then kill -TERM "$server"; wait "$server" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

sizes=(10000 40000 80000)
for round in $(seq "$rounds"); do
  minirun() { target/release/examples/encode_long_word "$vocab" lock "${sizes[@]}" 1048576 | sed "s/^/minirun $round /"; }
  tiktoken() { tools/python-venv.sh oracle bench/long_prompt.py tiktoken "$vocab" lock "${sizes[@]}" | sed "s/^/tiktoken $round /"; }
  if [ $((round % 2)) -eq 1 ]; then minirun; tiktoken; else tiktoken; minirun; fi
done > "$work/tokenizer.txt"
python3 - "$work/tokenizer.txt" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    engine, round_, doc = line.split(" ", 2)
    doc = json.loads(doc)
    runs.setdefault((engine, doc["bytes"]), {})[round_] = doc["seconds"]
print(f"{'bytes':>9} {'minirun s (range)':>26} {'tiktoken s (range)':>26} {'tiktoken/minirun':>17}")
for size in sorted({b for _, b in runs}):
    m, t = runs.get(("minirun", size), {}), runs.get(("tiktoken", size), {})
    cell = lambda r: f"{statistics.median(r.values()):.4f} ({min(r.values()):.4f}-{max(r.values()):.4f})" if r else "skipped"
    ratio = statistics.median(t[k] / m[k] for k in t if k in m) if t else None
    print(f"{size:>9} {cell(m):>26} {cell(t):>26} {ratio and f'{ratio:.0f}x' or '-':>17}")
PY

artifact="$work/k3"
target/release/minirun pack --source crates/minirun-runtime/tests/data/kimi-k3/mlx-k3mix --out "$artifact" > /dev/null 2>&1
rm "$artifact"/tokenizer.json "$artifact"/tokenizer_config.json "$artifact"/special_tokens_map.json
python3 -c 'import base64,sys; sys.stdout.write("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))' > "$artifact/tiktoken.model"
target/release/minirun serve "$artifact" --unverified --port 0 --max-concurrent 2 2> "$work/serve.err" &
server=$!
base=
for _ in $(seq 600); do
  base=$(sed -n 's/.*on \(http:\/\/[^/]*\)\/v1.*/\1/p' "$work/serve.err")
  [ -n "$base" ] && break
  sleep 0.1
done
[ -n "$base" ] || { cat "$work/serve.err" >&2; exit 1; }
# The largest prompt the body cap (1 MiB, JSON included) lets through.
python3 bench/long_prompt.py serve "$base" 1048512
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
