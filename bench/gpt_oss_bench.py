#!/usr/bin/env python3
"""A gpt-oss-shaped random checkpoint in OpenAI's own layout, for benchmarks that compare
engines on the very bytes OpenAI publishes (bench/decode_vs_llamacpp.sh's mxfp4 row).

  build --out DIR [--seed N] [shape options]
      Writes a random-weight gpt-oss checkpoint (model_type gpt_oss, GptOssForCausalLM) as
      openai/gpt-oss-20b lays it out: the experts MXFP4 (`mlp.experts.gate_up_proj_blocks`
      and `_scales`, `down_proj_blocks` and `_scales`, U8), everything else BF16, attention
      with biases and sinks, layers alternating sliding and full attention, YaRN RoPE. The
      tensors are tools/make_gpt_oss_fixtures.py's (one seeded generator per tensor; expert
      weights drawn as E2M1 codes and E8M0 scales), at the shape given here; the tokenizer is
      bench/mlx_decode.py's 32000-token byte-level BPE. Built in a temporary sibling folder
      and renamed, so DIR is either absent or complete. Prints one JSON line: the config, the
      file sizes and the seconds taken.

Default shape: hidden 2048 (32 query heads and 8 key/value heads of 64), 4 layers, 32 experts
of width 2048, top 4, window 128, vocabulary 32000: about 1.2 GB, about 4 experts in 32 read
per token as in gpt-oss-20b (whose hidden size and expert width are 2880). Needs numpy and
tokenizers (tools/python-venv.sh oracle).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "bench"))
import make_gpt_oss_fixtures as gpt_oss  # noqa: E402  (tensor drawing, OpenAI layout writer)
import mlx_decode  # noqa: E402  (the 32000-token tokenizer, staging)

# At hidden 2048 the fixture's scales (sized for hidden 128) would put nearly every gate value
# past the SwiGLU clamp; four times smaller keeps the gate's spread near the fixture's.
EXPERT_SCALE_EXP = {"gate_up_proj": (-7, -5), "down_proj": (-10, -8)}


def make_config(a):
    cfg = json.loads(json.dumps(gpt_oss.CONFIG))
    layer_types = ["sliding_attention", "full_attention"] * ((a.layers + 1) // 2)
    cfg.update({
        "hidden_size": a.hidden,
        "head_dim": a.head_dim,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "num_hidden_layers": a.layers,
        "layer_types": layer_types[: a.layers],
        "num_local_experts": a.experts,
        "num_experts_per_tok": a.experts_per_tok,
        "experts_per_token": a.experts_per_tok,
        "intermediate_size": a.intermediate,
        "sliding_window": a.window,
        "vocab_size": a.vocab,
    })
    return cfg


def cmd_build(a):
    cfg = make_config(a)
    out, tmp = mlx_decode.staging(a.out)
    t0 = time.perf_counter()
    tok_files, _ = mlx_decode.make_tokenizer_files(cfg["vocab_size"], a.seed)
    gpt_oss.EXPERT_SCALE_EXP = EXPERT_SCALE_EXP
    tensors = gpt_oss.make_tensors(a.seed, cfg)
    gpt_oss.build_openai_variant(tmp, tensors, cfg, tok_files)
    del tensors
    os.replace(tmp, out)
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    print(json.dumps({
        "checkpoint": str(out),
        "seed": a.seed,
        "config": cfg,
        "files": files,
        "total_bytes": sum(files.values()),
        "seconds": round(time.perf_counter() - t0, 2),
    }))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write the random gpt-oss checkpoint")
    b.add_argument("--out", required=True)
    b.add_argument("--seed", type=int, default=1)
    b.add_argument("--layers", type=int, default=4)
    b.add_argument("--hidden", type=int, default=2048)
    b.add_argument("--head-dim", type=int, default=64)
    b.add_argument("--heads", type=int, default=32)
    b.add_argument("--kv-heads", type=int, default=8)
    b.add_argument("--experts", type=int, default=32)
    b.add_argument("--experts-per-tok", type=int, default=4)
    b.add_argument("--intermediate", type=int, default=2048, help="expert width")
    b.add_argument("--window", type=int, default=128, help="sliding window")
    b.add_argument("--vocab", type=int, default=32000)
    cmd_build(ap.parse_args())


if __name__ == "__main__":
    main()
