# Shared by bench/generate_throughput.sh and bench/serve_load.sh; source it, don't run it.
#
#   build_cli               cargo build --release -q -p dormouse-cli, unless SKIP_BUILD=1
#                           (then target/release/dormouse is used as it is)
#   make_export WORKDIR [CKPT_DIR CKPT_NAME]
#                           prints the path of a bf16 export of a small model: of the run
#                           CKPT_DIR/CKPT_NAME if given, else of a `small` run trained for 3
#                           steps in WORKDIR (seconds; as fast to run as a trained one, but its
#                           greedy text is mostly spaces: a weak check of two implementations
#                           agreeing, a trained run is a strict one)
# Both expect to run from the repository root and log to stderr.

build_cli() {
  if [ "${SKIP_BUILD:-0}" = 1 ]; then
    echo "SKIP_BUILD=1: using target/release/dormouse as it is" >&2
  else
    echo "building: cargo build --release -q -p dormouse-cli" >&2
    cargo build --release -q -p dormouse-cli
  fi
  if [ ! -x target/release/dormouse ]; then
    echo "target/release/dormouse is missing (build it, or run without SKIP_BUILD=1)" >&2
    return 1
  fi
}

make_export() {
  local work=$1 ckpt_dir=${2:-} ckpt_name=${3:-}
  local out="$work/small.bf16.dmexp"
  if [ -n "$ckpt_dir" ]; then
    [ -n "$ckpt_name" ] || ckpt_name=latest
    echo "exporting $ckpt_dir/$ckpt_name (bf16)" >&2
  else
    ckpt_dir="$work/ckpt"
    ckpt_name=latest
    echo "training small for 3 steps in $ckpt_dir" >&2
    target/release/dormouse train --preset small --steps 3 --eval-bytes 4096 --ckpt-dir "$ckpt_dir" \
      --ckpt-name "$ckpt_name" > "$work/train.log" 2>&1 \
      || { cat "$work/train.log" >&2; return 1; }
  fi
  target/release/dormouse export run --ckpt-dir "$ckpt_dir" --ckpt-name "$ckpt_name" --dtype bf16 \
    --out "$out" >&2 || return 1
  echo "$out"
}
