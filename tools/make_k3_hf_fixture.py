#!/usr/bin/env python3
"""Rewrite the tiny Kimi K3 checkpoint `mlx-k3mix` under Kimi K3's Hugging Face tensor names.

What it makes
-------------
crates/minirun-runtime/tests/data/kimi-k3/hf-k3mix/ (or --out): the same weights as `mlx-k3mix`
(routed experts MXFP4, everything else bf16), stored as the upstream Kimi K3 checkpoint names
them, which is also how the published Kimi K3 artifact names its tensors:

  self_attn.qkv_proj                 -> self_attn.q_proj, k_proj, v_proj (its row thirds)
  self_attn.qkv_conv.conv [3P, K, 1] -> self_attn.q_conv1d, k_conv1d, v_conv1d [P, 1, K], float32
  self_attn.A_log [heads]            -> [head_dim], zero after the heads (as published)
  self_attn.embed_q, unembed_out     -> self_attn.kv_b_proj [heads * (nope + v), kv_lora]
  mlp.* (MoE layers)                 -> block_sparse_moe.*, the bias under block_sparse_moe.gate.
  mlp.switch_mlp.{gate,up,down}_proj -> block_sparse_moe.experts.E.{w1,w3,w2} (weight, scales)
  *_res_proj.weight, *_res_norm.weight -> *_res.proj_weight, *_res.norm_weight

Every rewrite is exact (row slices, a transpose, bf16 widened to float32, zero padding). The script
checks it: mlx-lm's `load_model` maps these names back (`kimi_k3.sanitize`), and the float32
logits of the prompt must equal `mlx-k3mix`'s logits.f32 bit for bit; so mlx-k3mix's oracle.json
and logits.f32 are this checkpoint's oracle too, and are copied beside it.

How to rerun
------------
From the repository root, after tools/make_k3_fixtures.py:

    tools/python-venv.sh oracle tools/make_k3_hf_fixture.py
"""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_deepseek_fixtures as common  # noqa: E402  (version checks)
import make_k3_fixtures as k3  # noqa: E402  (the oracle pass)

COPIED = ["LICENSE", "config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "oracle.json", "logits.f32"]


def rewrite(weights, text):
    import mlx.core as mx

    out = {}
    lin = text["linear_attn_config"]
    heads, head_dim = lin["num_heads"], lin["head_dim"]
    projection = heads * head_dim
    nope, v_dim = text["qk_nope_head_dim"], text["v_head_dim"]
    taken = set()

    def take(name):
        taken.add(name)
        return weights[name]

    for layer in range(text["num_hidden_layers"]):
        lp = f"language_model.model.layers.{layer}"
        ap = f"{lp}.self_attn"
        if f"{ap}.qkv_proj.weight" in weights:
            qkv = take(f"{ap}.qkv_proj.weight")
            for i, p in enumerate("qkv"):
                out[f"{ap}.{p}_proj.weight"] = qkv[i * projection:(i + 1) * projection]
            conv = take(f"{ap}.qkv_conv.conv.weight").astype(mx.float32)
            for i, p in enumerate("qkv"):
                part = conv[i * projection:(i + 1) * projection]
                out[f"{ap}.{p}_conv1d.weight"] = mx.contiguous(mx.moveaxis(part, 1, 2))
            a_log = take(f"{ap}.A_log")
            out[f"{ap}.A_log"] = mx.concatenate(
                [a_log, mx.zeros((head_dim - heads,), dtype=a_log.dtype)]
            )
        if f"{ap}.embed_q.weight" in weights:
            wk = take(f"{ap}.embed_q.weight")  # [heads, kv_lora, nope]
            wv = take(f"{ap}.unembed_out.weight")  # [heads, v, kv_lora]
            n = wk.shape[0]
            key_rows = mx.swapaxes(wk, 1, 2)  # [heads, nope, kv_lora]
            kv_b = mx.concatenate([key_rows, wv], axis=1)  # [heads, nope + v, kv_lora]
            out[f"{ap}.kv_b_proj.weight"] = mx.contiguous(kv_b.reshape(n * (nope + v_dim), -1))
        mp = f"{lp}.mlp"
        if f"{mp}.switch_mlp.gate_proj.weight" in weights:
            bp = f"{lp}.block_sparse_moe"
            for src, dst in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
                for suffix in ("weight", "scales"):
                    stacked = take(f"{mp}.switch_mlp.{src}.{suffix}")
                    for e in range(stacked.shape[0]):
                        out[f"{bp}.experts.{e}.{dst}.{suffix}"] = stacked[e]
            out[f"{bp}.gate.e_score_correction_bias"] = take(f"{mp}.e_score_correction_bias")
            for name in list(weights):
                if name.startswith(f"{mp}.") and name not in taken:
                    out[bp + name[len(mp):]] = take(name)
    for name, value in weights.items():
        if name in taken:
            continue
        for src in ("self_attention_res", "mlp_res", "output_attn_res"):
            for kind in ("proj", "norm"):
                if name.endswith(f"{src}_{kind}.weight"):
                    name = name[: -len(f"{src}_{kind}.weight")] + f"{src}.{kind}_weight"
        out[name] = value
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = Path(__file__).resolve().parent.parent
    data = here / "crates/minirun-runtime/tests/data/kimi-k3"
    parser.add_argument("--source", default=str(data / "mlx-k3mix"))
    parser.add_argument("--out", default=str(data / "hf-k3mix"))
    args = parser.parse_args()
    common.check_versions()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import mlx.core as mx
    import numpy as np

    source, out = Path(args.source), Path(args.out)
    weights = mx.load(str(source / "model.safetensors"))
    text = json.loads((source / "config.json").read_text())["text_config"]
    out.mkdir(parents=True, exist_ok=True)
    rewritten = rewrite(weights, text)
    mx.save_safetensors(str(out / "model.safetensors"), dict(sorted(rewritten.items())),
                        metadata={"format": "mlx"})
    for name in COPIED:
        shutil.copyfile(source / name, out / name)
    logits, _ = k3.oracle(str(out))
    want = np.fromfile(source / "logits.f32", dtype="<f4").reshape(logits.shape)
    if not np.array_equal(logits.view(np.uint32), want.view(np.uint32)):
        common.die(f"{out}: logits differ from {source}'s by {np.abs(logits - want).max()}")
    print(f"{len(rewritten)} tensors -> {out}; logits equal {source.name}'s bit for bit")


if __name__ == "__main__":
    main()
