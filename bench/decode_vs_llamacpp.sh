#!/usr/bin/env bash
# minirun against llama.cpp on the same random weights, in interleaved rounds that noise cannot
# flatter: decode and prompt tokens/s on 1 and 2 threads, per format.
#
#   format  model                    minirun runs                  llama.cpp runs
#   q4_0    DeepSeek-V3-shaped       MLX affine 4-bit (group 64)   Q4_0 (llama-quantize --pure)
#   q8_0    DeepSeek-V3-shaped       MLX affine 8-bit (group 64)   Q8_0 (llama-quantize --pure)
#   mxfp4   gpt-oss-shaped           OpenAI's layout: MXFP4 experts, BF16 elsewhere, as
#                                    published; llama.cpp's converter keeps the same MXFP4
#                                    codes and scales and the same BF16 values
#
#   1. bench/llamacpp_build.sh builds llama.cpp (llama-bench and llama-quantize, CPU backend,
#      native instructions) from the llama-cpp-python sdist on PyPI, which vendors it.
#   2. The weights: bench/mlx_decode.py build writes the MLX affine checkpoints minirun runs
#      (4-bit: the one bench/decode_vs_mlx.sh uses, target/decode-bench/checkpoint; 8-bit:
#      target/llamacpp-bench/checkpoint-q8_0); bench/mlx_decode.py hf writes the same
#      draws unquantized (BF16, Hugging Face layout). bench/gpt_oss_bench.py build writes the
#      gpt-oss checkpoint (target/llamacpp-bench/checkpoint-mxfp4), which both engines take.
#   3. llama.cpp's own convert_hf_to_gguf.py (from the same sdist, run with
#      tools/python-venv.sh torch-oracle, which has torch and transformers) turns the BF16
#      checkpoint into a GGUF. The synthetic byte-level BPE tokenizer is unknown to its table
#      of pre-tokenizer hashes, so it is declared as gpt-2 (a byte-level BPE with the GPT-2
#      pre-tokenizer regex, which is what it is). `llama-quantize --pure` then makes every
#      tensor Q4_0 or Q8_0 (about the bytes per weight of MLX affine 4-bit or 8-bit). The
#      gpt-oss checkpoint is converted with --outtype bf16 and not quantized further.
#   4. bench/llamacpp_rounds.py measures (see its --help): ROUNDS rounds, each timing minirun
#      f32, minirun int8 and llama.cpp for every format and thread count in an order rotated
#      each round, `minirun bench model` and `llama-bench` with the same -p, -n and -r (both:
#      a warm-up, then the mean of R passes, each from an empty cache). The foreign load
#      (other processes' CPU and the hypervisor's steal, in cores) is recorded beside every
#      command; a round above --max-foreign is left out. minirun's greedy ids must be the
#      same on every thread count, before and after the rounds, or the script exits 1.
#      Each round also measures the memory read rate on each thread count (`minirun bench
#      memory`), so that each decode row shows how much of it minirun's weight bytes per token
#      use, and the ceiling over llama.cpp's rate that memory allows any engine.
# Everything lives under target/ (target/llamacpp-bench, target/decode-bench); nothing is
# installed elsewhere. The first run downloads about 6 GiB of Python wheels (torch) and builds
# llama.cpp (about 10 minutes on 2 cores).
#
#   bench/decode_vs_llamacpp.sh [--formats q4_0,q8_0,mxfp4] [--rounds N] [--runs R] [--threads 1,2]
#                               [--tokens N] [--prompt-tokens N] [--max-foreign CORES]
# The table goes to stdout and ends with one JSON line ({"cpu": ..., "rows": [...]});
# progress, one line per round and format, to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

work=target/llamacpp-bench
decode=target/decode-bench
tokens=32
prompt_tokens=19
runs=3
rounds=9
threads=1,2
formats=q4_0,q8_0,mxfp4
max_foreign=0.1
seed=1
prompt="The clockmaker opened the map by the sea and wrote three questions in his notebook."
while [ $# -gt 0 ]; do
  case "$1" in
    --tokens) tokens=$2; shift 2 ;;
    --prompt-tokens) prompt_tokens=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --formats) formats=$2; shift 2 ;;
    --max-foreign) max_foreign=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

oracle=$(tools/python-venv.sh oracle) || exit 2
torch=$(tools/python-venv.sh torch-oracle) || exit 2
mkdir -p "$work" "$decode"

# 1. llama.cpp
src=$(bench/llamacpp_build.sh)

# 2. the weights, quantized by MLX for minirun and unquantized for llama.cpp's converter
IFS=, read -ra wanted <<<"$formats"
for format in "${wanted[@]}"; do
  case "$format" in
    q4_0|q8_0|mxfp4) ;;
    *) echo "unknown format $format (q4_0, q8_0 and mxfp4 are measured)" >&2; exit 2 ;;
  esac
done
# The MLX checkpoint minirun runs for a format (bits, folder) and the artifact packed from it.
# The 4-bit pair is bench/decode_vs_mlx.sh's, under the same key.
checkpoint_bits() { case "$1" in q4_0) echo 4 ;; q8_0) echo 8 ;; mxfp4) echo mxfp4 ;; esac; }
checkpoint_dir() { case "$1" in q4_0) echo "$decode/checkpoint" ;; *) echo "$work/checkpoint-$1" ;; esac; }
artifact_dir() { case "$1" in q4_0) echo "$decode/artifact" ;; *) echo "$work/artifact-$1" ;; esac; }
for format in "${wanted[@]}"; do
  bits=$(checkpoint_bits "$format")
  dir=$(checkpoint_dir "$format")
  key="seed=$seed shape="
  [ "$bits" = 4 ] || key="$key bits=$bits"
  if [ -d "$dir" ] && [ "$(cat "$dir.key" 2>/dev/null)" != "$key" ]; then
    echo "$dir was built with other options; rebuilding it" >&2
    rm -rf "$dir" "$(artifact_dir "$format")"
  fi
  if [ ! -d "$dir" ] && [ "$format" = mxfp4 ]; then
    "$oracle" bench/gpt_oss_bench.py build --out "$dir" --seed "$seed" > "$dir.json"
    printf '%s\n' "$key" > "$dir.key"
  elif [ ! -d "$dir" ]; then
    "$oracle" bench/mlx_decode.py build --out "$dir" --seed "$seed" --bits "$bits" > "$dir.json"
    printf '%s\n' "$key" > "$dir.key"
  fi
done
hf=$work/hf-bf16
if [[ ",$formats," == *,q[48]_0,* ]] && [ ! -d "$hf" ]; then
  "$oracle" bench/mlx_decode.py hf --out "$hf" --seed "$seed" > "$work/hf.json"
fi

# 3. GGUF: BF16 by llama.cpp's converter, then (DeepSeek-shaped) every tensor quantized.
# to_gguf HF_DIR OUT: llama.cpp's converter, --outtype bf16 (MXFP4 experts stay MXFP4).
to_gguf() {
  [ -f "$2" ] && return
  PYTHONPATH="$src:$src/gguf-py" "$torch" - "$1" "$2.partial" <<'PY'
import sys
import conversion.base as base
import convert_hf_to_gguf

# The synthetic tokenizers are byte-level BPEs with GPT-2's pre-tokenizer; their hashes are in
# no table of the converter's.
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = ["convert_hf_to_gguf.py", sys.argv[1], "--outtype", "bf16", "--outfile", sys.argv[2]]
convert_hf_to_gguf.main()
PY
  mv "$2.partial" "$2"
}
for format in "${wanted[@]}"; do
  gguf=$work/model-$format.gguf
  [ -f "$gguf" ] && continue
  if [ "$format" = mxfp4 ]; then
    to_gguf "$(checkpoint_dir mxfp4)" "$gguf"
  else
    # The BF16 GGUF is kept for the other 8-bit or 4-bit format.
    to_gguf "$hf" "$work/model-bf16.gguf"
    "$work/build/bin/llama-quantize" --pure "$work/model-bf16.gguf" "$gguf.partial" "${format^^}" \
      > "$work/quantize-$format.log" 2>&1
    mv "$gguf.partial" "$gguf"
  fi
done

# 4. minirun: an artifact per format, then the rounds
echo "building: cargo build --release -p minirun-cli" >&2
cargo build --release -q -p minirun-cli
bin=target/release/minirun
sides=()
for format in "${wanted[@]}"; do
  ckpt=$(checkpoint_dir "$format")
  art=$(artifact_dir "$format")
  if [ ! -f "$art/index.json" ] || [ "$bin" -nt "$art/index.json" ]; then
    rm -rf "$art"
    "$bin" pack --source "$ckpt" --out "$art" > "$art.pack.out"
  fi
  sides+=(--format "$format" "$art" "$work/model-$format.gguf")
done

python3 bench/llamacpp_rounds.py --work "$work" --minirun "$bin" \
  --llama-bench "$work/build/bin/llama-bench" "${sides[@]}" --threads "$threads" \
  --rounds "$rounds" --runs "$runs" --tokens "$tokens" --prompt-tokens "$prompt_tokens" \
  --prompt "$prompt" --max-foreign "$max_foreign"
