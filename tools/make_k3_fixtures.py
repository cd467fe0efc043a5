#!/usr/bin/env python3
"""Make tiny Kimi K3 checkpoints and their mlx-lm oracle, for minirun-runtime's K3 tests.

What it makes
-------------
Under crates/minirun-runtime/tests/data/kimi-k3/ (or --out), one directory per variant of the
SAME tiny random-weight Kimi K3 text model, built by mlx-lm 0.32.2's `kimi_k3` with every
feature of the real one on: 6 layers, KDA at 1-indexed 1, 2, 3, 5 and NoPE MLA with output gate
at 4 and 6, attention-residual blocks of 2, layer 0 a dense SiTU MLP, latent MoE (16 experts,
top 4, latent width 64, with its norm), 2 shared experts, sigmoid routing with correction bias,
routed_scaling_factor 2.5 (the real one is 1.0: raised so an implementation that drops it is
caught), vocab 512, hidden 128:

  mlx-affine4-g64   mlx_lm.utils.quantize_model(group_size=64, bits=4, mode="affine") with the
                    model's own quant_predicate (the router affine 8-bit, res_proj unquantized)
  mlx-mxfp4         the same with mode "mxfp4" (group 32)
  mlx-k3mix         only the routed experts (switch_mlp) mxfp4, everything else bf16: what the
                    published K3 quantizes

Each directory is a complete MLX checkpoint (config.json with text_config, model.safetensors,
tokenizer files, LICENSE) plus the oracle: oracle.json (prompt ids, greedy continuation,
margins, the full-pass vs step-by-step check) and logits.f32 (little-endian float32, prompt
positions x vocab). The oracle is mlx-lm itself with float32 activations: each variant is loaded
back with mlx_lm.utils.load_model and every floating parameter upcast to float32 (mlx's CPU
GatherMM only runs in float32), so the oracle computes on exactly the stored weights. Logits come
from the full-prompt pass; a one-token-at-a-time pass through the cache (KDA conv and recurrent
state, MLA latent cache) must agree within 1e-4, or the script fails.

How to rerun
------------
From the repository root (Linux; the versions are pinned and checked):

    tools/python-venv.sh oracle tools/make_k3_fixtures.py

Options: --out DIR, --seed N (default 0). The script refuses to run with mlx != 0.32.4 or
mlx-lm != 0.32.2. The first forward of a fresh machine compiles mlx's CPU kernels (about 25 s).
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_deepseek_fixtures as common  # noqa: E402  (tokenizer files and version checks)

TEXT_CONFIG = {
    "model_type": "kimi_linear",
    "vocab_size": 512,
    "hidden_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 256,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 4096,
    "linear_attn_config": {
        "kda_layers": [1, 2, 3, 5],
        "full_attn_layers": [4, 6],
        "num_heads": 4,
        "head_dim": 64,
        "short_conv_kernel_size": 4,
        "gate_lower_bound": -5.0,
        "use_full_rank_gate": True,
    },
    "hidden_act": "situ",
    "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0,
    "attn_res_block_size": 2,
    "q_lora_rank": 64,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "mla_use_nope": True,
    "mla_use_output_gate": True,
    "num_experts": 16,
    "num_experts_per_token": 4,
    "num_shared_experts": 2,
    "moe_intermediate_size": 64,
    "moe_router_activation_func": "sigmoid",
    "moe_renormalize": True,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "use_grouped_topk": True,
    "num_expert_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "routed_expert_hidden_size": 64,
    "latent_moe_use_norm": True,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
}

CONFIG = {"model_type": "kimi_k3", "tie_word_embeddings": False, "text_config": TEXT_CONFIG}

PROMPT = [0, 17, 42, 99, 7, 300, 5, 9, 11, 250, 33, 128]
GREEDY_TOKENS = 32
STEPWISE_TOLERANCE = 1e-4


def variants(model):
    """(name, group_size, bits, mode, predicate) for quantize_model."""
    own = model.quant_predicate

    def experts_only(path, module):
        return "switch_mlp" in path and {"group_size": 32, "bits": 4, "mode": "mxfp4"}

    return [
        ("mlx-affine4-g64", 64, 4, "affine", own),
        ("mlx-mxfp4", 32, 4, "mxfp4", own),
        ("mlx-k3mix", 32, 4, "mxfp4", experts_only),
    ]


def new_model(seed):
    import mlx.core as mx
    from mlx_lm.models import kimi_k3

    mx.random.seed(seed)
    model = kimi_k3.Model(kimi_k3.ModelArgs.from_dict(json.loads(json.dumps(CONFIG))))
    mx.eval(model.parameters())
    return model


def to_bf16(model):
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    keep = model.cast_predicate

    def cast(path, value):
        if mx.issubdtype(value.dtype, mx.floating) and keep(path):
            return value.astype(mx.bfloat16)
        return value

    flat = [(k, cast(k, v)) for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(flat))


def upcast_f32(model):
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    flat = []
    for k, v in tree_flatten(model.parameters()):
        is_float = mx.issubdtype(v.dtype, mx.floating)
        flat.append((k, v.astype(mx.float32) if is_float else v))
    model.update(tree_unflatten(flat))


def oracle(vdir):
    import mlx.core as mx
    import numpy as np
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(vdir))
    upcast_f32(model)
    ids = mx.array([PROMPT])
    full = model(ids, cache=model.make_cache())[0].astype(mx.float32)
    cache = model.make_cache()
    steps = [model(mx.array([[t]]), cache=cache)[0, -1].astype(mx.float32) for t in PROMPT]
    stepwise = mx.stack(steps)
    full_np, step_np = np.array(full), np.array(stepwise)
    delta = float(np.abs(full_np - step_np).max())
    if not delta <= STEPWISE_TOLERANCE:
        common.die(f"{vdir}: step-by-step logits differ from the full pass by {delta}")
    greedy = []
    cache = model.make_cache()
    logits = model(ids, cache=cache)[0, -1]
    for _ in range(GREEDY_TOKENS):
        token = int(mx.argmax(logits).item())
        greedy.append(token)
        logits = model(mx.array([[token]]), cache=cache)[0, -1]
    ordered = np.sort(full_np, axis=-1)
    margins = (ordered[:, -1] - ordered[:, -2]).tolist()
    return full_np, {
        "prompt_token_ids": PROMPT,
        "greedy_token_ids": greedy,
        "top1_margins": margins,
        "stepwise_max_abs_delta": delta,
        "activations": "float32 (every floating parameter upcast after loading)",
    }


def build(out, seed):
    from mlx_lm.utils import quantize_model, save_config, save_model

    tok_files = common.make_tokenizer_files()
    for name, group, bits, mode, predicate in variants(new_model(seed)):
        model = new_model(seed)
        to_bf16(model)
        config = json.loads(json.dumps(CONFIG))
        model, config = quantize_model(
            model, config, group, bits, mode=mode, quant_predicate=predicate
        )
        vdir = Path(out) / name
        vdir.mkdir(parents=True, exist_ok=True)
        save_model(vdir, model)
        save_config(config, vdir / "config.json")
        for fname, data in tok_files.items():
            common.write_bytes(vdir / fname, data)
        logits, record = oracle(vdir)
        record["variant"] = name
        record["seed"] = seed
        common.write_bytes(vdir / "logits.f32", logits.astype("<f4").tobytes())
        common.write_json(vdir / "oracle.json", record)
        print(
            f"{name}: greedy {record['greedy_token_ids'][:8]}..., "
            f"min top-1 margin {min(record['top1_margins']):.4f}, "
            f"step-by-step delta {record['stepwise_max_abs_delta']:.2e}",
            file=sys.stderr,
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = Path(__file__).resolve().parent.parent
    parser.add_argument(
        "--out", default=str(here / "crates/minirun-runtime/tests/data/kimi-k3")
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    common.check_versions()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    build(args.out, args.seed)


if __name__ == "__main__":
    main()
