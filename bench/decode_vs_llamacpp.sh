#!/usr/bin/env bash
# minirun against llama.cpp on the same DeepSeek-V3-shaped random model, side by side in one
# run: decode and prompt tokens/s on 1 and 2 threads.
#
#   1. llama.cpp is built from the llama-cpp-python sdist on PyPI (it vendors llama.cpp):
#      `pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==VERSION`, then
#      cmake + ninja from tools/python-venv.sh llamacpp (bench/requirements-llamacpp.txt), the
#      targets llama-bench and llama-quantize only, CPU backend, native instructions.
#   2. The weights: bench/mlx_decode.py build writes the MLX affine 4-bit checkpoint minirun
#      runs (the same one bench/decode_vs_mlx.sh uses: target/decode-bench/checkpoint, reused);
#      bench/mlx_decode.py hf writes the same draws unquantized (BF16, Hugging Face layout).
#   3. llama.cpp's own convert_hf_to_gguf.py (from the same sdist, run with
#      tools/python-venv.sh torch-oracle, which has torch and transformers) turns the BF16
#      checkpoint into a GGUF. The synthetic byte-level BPE tokenizer is unknown to its table
#      of pre-tokenizer hashes, so it is declared as gpt-2 (a byte-level BPE with the GPT-2
#      pre-tokenizer regex, which is what it is). `llama-quantize --pure ... Q4_0` then makes
#      every tensor 4-bit (about the bytes per token of MLX affine 4-bit).
#   4. `llama-bench -p PROMPT_TOKENS -n TOKENS -t 1,2 -r RUNS` (prompt processing of
#      PROMPT_TOKENS tokens, generation of TOKENS tokens) beside `minirun bench model` on the
#      MLX artifact with the same -p, -n and -r, 1 and 2 threads, f32 and 8-bit activations.
#      Both time the same way: a warm-up, then the mean of RUNS passes, each from an empty
#      cache. One `minirun run` per setting besides, for its greedy ids.
# Everything lives under target/ (target/llamacpp-bench, target/decode-bench); nothing is
# installed elsewhere. The first run downloads about 6 GiB of Python wheels (torch) and builds
# llama.cpp (about 10 minutes on 2 cores).
#
#   bench/decode_vs_llamacpp.sh [--tokens N] [--prompt-tokens N] [--runs R]
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON=0.3.36
work=target/llamacpp-bench
decode=target/decode-bench
tokens=32
prompt_tokens=19
runs=3
seed=1
prompt="The clockmaker opened the map by the sea and wrote three questions in his notebook."
while [ $# -gt 0 ]; do
  case "$1" in
    --tokens) tokens=$2; shift 2 ;;
    --prompt-tokens) prompt_tokens=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

oracle=$(tools/python-venv.sh oracle) || exit 2
torch=$(tools/python-venv.sh torch-oracle) || exit 2
tools_py=$(tools/python-venv.sh llamacpp) || exit 2
tools_bin=$(dirname "$tools_py")
mkdir -p "$work" "$decode"

# 1. llama.cpp
src=$work/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp
if [ ! -f "$src/CMakeLists.txt" ]; then
  "$tools_py" -m pip download -q --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$work/sdist"
  tar xzf "$work/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$work"
fi
# On CPUs with AMX, this llama.cpp's AMX buffer type aborts while it creates the context of
# this model (GGML_ASSERT(*cur_backend_id != -1) in ggml_backend_sched_split_graph), so AMX is
# compiled out: llama.cpp then runs its AVX-512/AVX2 kernels on weights repacked at load
# (q4_0_8x8), as on CPUs without AMX. minirun uses no AMX either.
no_amx=""
if [ "$(uname -m)" = x86_64 ]; then
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
build_key="release native $no_amx"
if [ ! -x "$work/build/bin/llama-bench" ] || [ ! -x "$work/build/bin/llama-quantize" ] ||
   [ "$(cat "$work/build.key" 2>/dev/null)" != "$build_key" ]; then
  echo "building llama.cpp (llama-bench, llama-quantize) into $work/build" >&2
  rm -rf "$work/build"
  PATH="$tools_bin:$PATH" cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" > "$work/cmake.log"
  PATH="$tools_bin:$PATH" cmake --build "$work/build" -j "$(nproc)" \
    --target llama-bench llama-quantize >> "$work/cmake.log"
  printf '%s\n' "$build_key" > "$work/build.key"
fi

# 2. the weights, quantized by MLX for minirun and unquantized for llama.cpp's converter
ckpt=$decode/checkpoint
key="seed=$seed shape="
if [ -d "$ckpt" ] && [ "$(cat "$decode/checkpoint.key" 2>/dev/null)" != "$key" ]; then
  echo "$ckpt was built with other options; rebuilding it" >&2
  rm -rf "$ckpt" "$decode/artifact"
fi
if [ ! -d "$ckpt" ]; then
  "$oracle" bench/mlx_decode.py build --out "$ckpt" --seed "$seed" > "$decode/build.json"
  printf '%s\n' "$key" > "$decode/checkpoint.key"
fi
hf=$work/hf-bf16
if [ ! -d "$hf" ]; then
  "$oracle" bench/mlx_decode.py hf --out "$hf" --seed "$seed" > "$work/hf.json"
fi

# 3. GGUF: BF16 by llama.cpp's converter, then every tensor Q4_0
gguf_bf16=$work/model-bf16.gguf
gguf_q4=$work/model-q4_0.gguf
if [ ! -f "$gguf_q4" ]; then
  PYTHONPATH="$src:$src/gguf-py" "$torch" - "$hf" "$gguf_bf16.partial" <<'PY'
import sys
import conversion.base as base
import convert_hf_to_gguf

# The synthetic tokenizer is a byte-level BPE with GPT-2's pre-tokenizer; its hash is in no
# table of the converter's.
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = ["convert_hf_to_gguf.py", sys.argv[1], "--outtype", "bf16", "--outfile", sys.argv[2]]
convert_hf_to_gguf.main()
PY
  mv "$gguf_bf16.partial" "$gguf_bf16"
  "$work/build/bin/llama-quantize" --pure "$gguf_bf16" "$gguf_q4.partial" Q4_0 > "$work/quantize.log" 2>&1
  mv "$gguf_q4.partial" "$gguf_q4"
  rm -f "$gguf_bf16"
fi

# 4. minirun
echo "building: cargo build --release -p minirun-cli" >&2
cargo build --release -q -p minirun-cli
bin=target/release/minirun
art=$decode/artifact
if [ ! -f "$art/index.json" ] || [ "$bin" -nt "$art/index.json" ]; then
  rm -rf "$art"
  "$bin" pack --source "$ckpt" --out "$art" > "$decode/pack.out"
fi
for threads in 1 2; do
  for activations in f32 int8; do
    "$bin" bench model "$art" --unverified --json -p "$prompt_tokens" -n "$tokens" -r "$runs" \
      --threads "$threads" --activations "$activations" \
      > "$work/minirun-bench-$threads-$activations.json"
    # One real run too: its greedy ids across thread counts and arithmetics.
    "$bin" run "$art" --unverified --json --prompt "$prompt" --max-tokens "$((tokens + 1))" \
      --ignore-eos --threads "$threads" --activations "$activations" \
      > "$work/minirun-$threads-$activations.json"
  done
done

# 5. llama.cpp
"$work/build/bin/llama-bench" -m "$gguf_q4" -p "$prompt_tokens" -n "$tokens" -t 1,2 -r "$runs" \
  -o json > "$work/llama-bench.json" 2> "$work/llama-bench.err"

"$oracle" - "$work" "$runs" "$tokens" "$prompt_tokens" "$gguf_q4" "$art" <<'PY'
import json, os, pathlib, sys

work, runs, tokens, prompt_tokens = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
gguf, art = pathlib.Path(sys.argv[5]), pathlib.Path(sys.argv[6])
llama = json.loads((work / "llama-bench.json").read_text())
def llama_rate(threads, kind):
    for r in llama:
        if r["n_threads"] == threads and (r["n_prompt"] > 0) == (kind == "prompt"):
            return r["avg_ts"]
    return float("nan")
def minirun_rate(threads, activations, kind):
    doc = json.loads((work / f"minirun-bench-{threads}-{activations}.json").read_text())
    want = f"pp{prompt_tokens}" if kind == "prompt" else f"tg{tokens}"
    return next(t["mean_tokens_per_second"] for t in doc["tests"] if t["test"] == want)
size = lambda p: sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and ".minirun" not in f.parts)
print(f"\nllama.cpp: {llama[0].get('build_commit', '?')} ({llama[0].get('cpu_info', '')}), {gguf.stat().st_size / 1e6:.0f} MB Q4_0 GGUF (--pure)")
print(f"minirun: MLX affine 4-bit artifact, {size(art) / 1e6:.0f} MB")
print(f"\n| threads | what | llama.cpp Q4_0 tok/s | minirun f32 tok/s | ratio | minirun int8 tok/s | ratio |")
print("|---:|---|---:|---:|---:|---:|---:|")
for threads in (1, 2):
    for kind, label in (("decode", f"decode (tg{tokens})"), ("prompt", f"prompt (pp{prompt_tokens})")):
        ref = llama_rate(threads, kind)
        f32 = minirun_rate(threads, "f32", kind)
        i8 = minirun_rate(threads, "int8", kind)
        print(f"| {threads} | {label} | {ref:.1f} | {f32:.1f} | {f32 / ref:.2f}x | {i8:.1f} | {i8 / ref:.2f}x |")
print(f"\nboth: mean tokens/s of {runs} passes after a warm-up, each pass from an empty cache")
ids = {(t, a): json.loads((work / f"minirun-{t}-{a}.json").read_text())["generated_token_ids"] for t in (1, 2) for a in ("f32", "int8")}
for a in ("f32", "int8"):
    print(f"minirun {a}: the same greedy ids on 1 and 2 threads: {ids[(1, a)] == ids[(2, a)]}")
same = next((i for i, (x, y) in enumerate(zip(ids[(1, 'f32')], ids[(1, 'int8')])) if x != y), len(ids[(1, 'f32')]))
print(f"greedy ids, int8 against f32: the first {same} of {len(ids[(1, 'f32')])} agree")
PY
