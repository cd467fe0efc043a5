#!/usr/bin/env bash
# Decode tokens/s of `minirun run` against mlx-lm on the CPU: the same ~460 MB DeepSeek-V3-shaped
# random checkpoint (affine 4-bit, group 64, BF16 scales/biases, MLX layout), the same prompt
# ids, greedy, EOS ignored, the same machine, one engine after the other (never at once).
# Goal: minirun / mlx-lm >= 1.0x.
#
#   1. cargo build --release -p minirun-cli (unless SKIP_BUILD=1)
#   2. bench/mlx_decode.py build: the checkpoint, into WORK/checkpoint (reused when present and
#      built with the same --seed and --shape; about 30 s and 4 GB of memory to build)
#   3. minirun pack --source WORK/checkpoint --out WORK/artifact (again when the checkpoint or
#      the binary is newer than the artifact)
#   4. minirun run WORK/artifact --unverified --json --prompt TEXT --max-tokens N --ignore-eos
#      --threads T, RUNS times (one process each; resident; float32 activations)
#   5. bench/mlx_decode.py time: mlx-lm (mlx_lm.utils.load + generate_step, greedy) on
#      minirun's prompt ids, one warm-up then RUNS timed runs in one process, once with the
#      activations mlx-lm loads (BF16) and once with every float parameter upcast to F32
#   6. a markdown table (best run of each), and whether the greedy continuations agree
#
# Both engines count the same way: the clock runs from the first generated token to the N-th,
# N-1 decode steps (one forward pass + argmax each), prompt processing excluded;
# tokens/s = (N-1) / seconds.
#
# Usage: bench/decode_vs_mlx.sh [--work DIR] [--tokens N] [--runs R] [--threads T]
#                               [--prompt TEXT] [--seed S] [--shape "BUILD OPTIONS"]
#                               [--mlx "native float32"]
#   --work     default target/decode-bench (in the workspace; kept between runs)
#   --tokens   tokens generated per run (default 32, so 31 decode steps)
#   --runs     timed runs per engine, best kept (default 3)
#   --threads  minirun's worker threads (default nproc; mlx's CPU backend picks its own)
#   --prompt   default "The clockmaker opened the map by the sea and wrote three questions in
#              his notebook." (19 ids with the BOS)
#   --seed     weights' seed (default 1)
#   --shape    extra options for `mlx_decode.py build`, e.g. "--layers 3 --moe-intermediate 1024"
#              (see `bench/mlx_decode.py build --help`; default: 4 layers, hidden 2048, 64 experts)
#   --mlx      which mlx-lm activation modes to time (default "native float32"; native BF16
#              decode is slow on mlx's CPU backend: about 5 minutes for 4 runs of 32 tokens)
# Environment:
#   SKIP_BUILD=1  use target/release/minirun as it is (no cargo build)
#   PYTHON        interpreter with mlx[cpu]==0.32.4 and mlx-lm==0.32.2 (default: target/oracle-venv,
#                 which tools/python-venv.sh creates on first use from tools/requirements-oracle.txt)
# Exit status 0 whether or not the goal is met or the continuations agree (both are reported);
# 1 if an engine fails; 2 on a setup problem.
set -euo pipefail
cd "$(dirname "$0")/.."

work=target/decode-bench
tokens=32
runs=3
threads=$(nproc)
prompt="The clockmaker opened the map by the sea and wrote three questions in his notebook."
seed=1
shape=""
mlx_modes="native float32"
while [ $# -gt 0 ]; do
  case "$1" in
    --work) work=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --shape) shape=$2; shift 2 ;;
    --mlx) mlx_modes=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$tokens" -ge 2 ] 2>/dev/null || { echo "--tokens must be at least 2" >&2; exit 2; }
[ "$runs" -ge 1 ] 2>/dev/null || { echo "--runs must be at least 1" >&2; exit 2; }
for m in $mlx_modes; do
  case "$m" in native|float32) ;; *) echo "--mlx takes native and/or float32, not $m" >&2; exit 2 ;; esac
done

if [ -n "${PYTHON:-}" ]; then
  python=$PYTHON
else
  python=$(tools/python-venv.sh oracle) || exit 2
fi
if [ ! -x "$python" ] || ! "$python" -c 'import mlx.core, mlx_lm, numpy, tokenizers' 2>/dev/null; then
  cat >&2 <<EOF
mlx-lm needs an interpreter with mlx[cpu]==0.32.4 and mlx-lm==0.32.2; $python has none.
With PYTHON unset, tools/python-venv.sh oracle installs tools/requirements-oracle.txt into
target/oracle-venv (rm -rf target/oracle-venv to start over); or point PYTHON at an interpreter that has them.
EOF
  exit 2
fi

if [ "${SKIP_BUILD:-0}" = 1 ]; then
  echo "SKIP_BUILD=1: using target/release/minirun as it is" >&2
else
  echo "building: cargo build --release -p minirun-cli" >&2
  cargo build --release -p minirun-cli
fi
bin=target/release/minirun
[ -x "$bin" ] || { echo "$bin is missing (build it, or run without SKIP_BUILD=1)" >&2; exit 2; }
"$bin" run --help >/dev/null 2>&1 || { echo "$bin has no 'run' command: it is stale, rebuild it" >&2; exit 2; }

mkdir -p "$work"
ckpt=$work/checkpoint
art=$work/artifact
key="seed=$seed shape=$shape"
if [ -d "$ckpt" ] && [ "$(cat "$work/checkpoint.key" 2>/dev/null)" != "$key" ]; then
  echo "$ckpt was built with other options; rebuilding it" >&2
  rm -rf "$ckpt" "$art"
fi
if [ ! -d "$ckpt" ]; then
  echo "building the checkpoint ($key) into $ckpt" >&2
  # shellcheck disable=SC2086  # $shape is a list of options
  "$python" bench/mlx_decode.py build --out "$ckpt" --seed "$seed" $shape > "$work/build.json"
  printf '%s\n' "$key" > "$work/checkpoint.key"
else
  echo "reusing the checkpoint in $ckpt ($key)" >&2
fi
if [ ! -f "$art/index.json" ] || [ "$ckpt/config.json" -nt "$art/index.json" ] \
   || [ "$bin" -nt "$art/index.json" ]; then
  echo "packing: $bin pack --source $ckpt --out $art" >&2
  "$bin" pack --source "$ckpt" --out "$art" > "$work/pack.out"
fi

for i in $(seq 1 "$runs"); do
  "$bin" run "$art" --unverified --json --prompt "$prompt" --max-tokens "$tokens" --ignore-eos \
    --threads "$threads" > "$work/minirun.$i.json" 2> "$work/minirun.$i.err" \
    || { cat "$work/minirun.$i.err" >&2; exit 1; }
  "$python" -c 'import json,sys; r=json.load(open(sys.argv[1])); print("minirun run %s: %.3f tokens/s (%d steps in %.3f s)" % (sys.argv[2], r["tokens_per_second"], r["decode_steps"], r["decode_seconds"]))' \
    "$work/minirun.$i.json" "$i" >&2
done
ids=$("$python" -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompt_token_ids"])))' \
  "$work/minirun.1.json")
"$python" bench/mlx_decode.py tokenize "$ckpt" --prompt "$prompt" > "$work/mlx-tokenize.json"

for m in $mlx_modes; do
  echo "mlx-lm, $m activations: 1 warm-up + $runs timed runs" >&2
  "$python" bench/mlx_decode.py time "$ckpt" --activations "$m" --prompt-ids "$ids" \
    --max-tokens "$tokens" --runs "$runs" > "$work/mlx-$m.json" 2> "$work/mlx-$m.err" \
    || { cat "$work/mlx-$m.err" >&2; exit 1; }
  "$python" -c 'import json,sys; r=json.load(open(sys.argv[1])); print("mlx-lm %s: runs %s tokens/s" % (r["activations"], [round(x, 3) for x in r["runs_tokens_per_second"]]))' \
    "$work/mlx-$m.json" >&2
done

"$python" - "$work" "$runs" "$threads" "$tokens" "$prompt" $mlx_modes <<'EOF'
import json, pathlib, sys

work, runs, threads, tokens, prompt = (pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                       int(sys.argv[4]), sys.argv[5])
modes = sys.argv[6:]
mr = [json.loads((work / f"minirun.{i}.json").read_text()) for i in range(1, runs + 1)]
best = max(mr, key=lambda r: r["tokens_per_second"])
mlx = {m: json.loads((work / f"mlx-{m}.json").read_text()) for m in modes}
tok = json.loads((work / "mlx-tokenize.json").read_text())["token_ids"]
build = work / "build.json"
size = sum(p.stat().st_size for p in (work / "checkpoint").iterdir())

print(f"\nGreedy decode, {tokens} tokens after a {len(best['prompt_token_ids'])}-token prompt "
      f"({best['decode_steps']} timed decode steps), best of {runs}; checkpoint {size} bytes "
      f"on disk, artifact resident {best['resident_bytes']} bytes\n")
print("| engine | activations | tokens/s | ratio minirun / this | weight bytes per token | runs (tokens/s) |")
print("|---|---|---:|---:|---:|---|")
fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)
print(f"| minirun run ({threads} threads) | float32 | {best['tokens_per_second']:.3f} | 1.00x | "
      f"{best['weight_bytes_per_token']} | {fmt(r['tokens_per_second'] for r in mr)} |")
for m, r in mlx.items():
    ratio = best["tokens_per_second"] / r["tokens_per_second"]
    print(f"| mlx-lm {r['mlx_lm']} (mlx {r['mlx']}, CPU, ~{r['decode_cores_busy']:.1f} cores busy) "
          f"| {r['dtype']} | {r['tokens_per_second']:.3f} | {ratio:.2f}x | - | "
          f"{fmt(r['runs_tokens_per_second'])} |")
print()
for m, r in mlx.items():
    ratio = best["tokens_per_second"] / r["tokens_per_second"]
    print(f"goal minirun / mlx-lm ({r['dtype']}) >= 1.0x: {'met' if ratio >= 1.0 else 'NOT met'} ({ratio:.2f}x)")

print()
if tok != best["prompt_token_ids"]:
    print(f"note: mlx-lm's tokenizer gives other prompt ids ({tok}) than minirun "
          f"({best['prompt_token_ids']}); both engines ran minirun's")
else:
    print(f"prompt ids (the same from both tokenizers): {best['prompt_token_ids']}")
if any(r["generated_token_ids"] != best["generated_token_ids"] for r in mr):
    print("note: minirun's greedy ids changed between runs")
a = best["generated_token_ids"]
for m, r in mlx.items():
    b = r["generated_token_ids"]
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if k is None and len(a) == len(b):
        print(f"greedy ids, minirun vs mlx-lm {r['dtype']}: all {len(a)} agree")
    else:
        k = min(len(a), len(b)) if k is None else k
        print(f"greedy ids, minirun vs mlx-lm {r['dtype']}: first {k} of {len(a)} agree "
              f"(then minirun {a[k:k + 3]}..., mlx-lm {b[k:k + 3]}...)")
print(f"minirun greedy ids: {a}")
EOF
