#!/usr/bin/env bash
# Builds llama.cpp's llama-bench and llama-quantize (CPU backend, native instructions) into
# target/llamacpp-bench/build, once, and prints the folder of llama.cpp's source (its
# convert_hf_to_gguf.py and gguf-py live there) on stdout.
#
# llama.cpp comes from the llama-cpp-python sdist on PyPI, which vendors it:
# `pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==VERSION`, then cmake +
# ninja from tools/python-venv.sh llamacpp (bench/requirements-llamacpp.txt). The first build
# takes about 10 minutes on 2 cores; later calls only print the folder.
#
#   bench/llamacpp_build.sh
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_CPP_PYTHON=0.3.36
work=target/llamacpp-bench
tools_py=$(tools/python-venv.sh llamacpp) || exit 2
tools_bin=$(dirname "$tools_py")
mkdir -p "$work"

src=$work/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp
if [ ! -f "$src/CMakeLists.txt" ]; then
  "$tools_py" -m pip download -q --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$work/sdist" >&2
  tar xzf "$work/sdist/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$work"
fi
# On CPUs with AMX, this llama.cpp's AMX buffer type aborts while it creates the context of
# a DeepSeek-shaped model (GGML_ASSERT(*cur_backend_id != -1) in
# ggml_backend_sched_split_graph), so AMX is compiled out: llama.cpp then runs its
# AVX-512/AVX2 kernels on weights repacked at load (q4_0_8x8), as on CPUs without AMX. minirun
# uses no AMX either.
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
echo "$src"
