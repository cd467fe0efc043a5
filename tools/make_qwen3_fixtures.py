#!/usr/bin/env python3
"""Make tiny dense Qwen3 checkpoints and their mlx-lm oracle for minirun-runtime's tests.

What it makes
-------------
Under crates/minirun-runtime/tests/data/qwen3/ (or --out), one directory per variant of the
SAME tiny random-weight dense Qwen3 model (model_type qwen3: 3 layers, GQA with 4 query and 2
key/value heads of 32, per-head q/k RMSNorm before a half-split RoPE with theta 1e6, no
rope_scaling, SiLU-gated MLP of 192, RMSNorm eps 1e-6; vocab 512, hidden 128):

  mlx-affine4-g64      MLX layout as mlx-community publishes it,
                       mlx_lm.utils.quantize_model(group_size=64, bits=4, "affine")
  mlx-affine8-g32-alt  MLX layout, affine 8 bits, group 32, of a second config shaped like the
                       small Qwen3 models (0.6B-4B): tied embeddings and head_dim 64, so the
                       query width 4 x 64 = 256 is not the hidden size 128 (q_proj [256, 128],
                       k/v_proj [128, 128], o_proj [128, 256], q/k_norm [64])
  hf-bf16              Hugging Face layout, unquantized BF16

Each directory is a complete checkpoint plus its oracle (oracle.json and logits-<prompt>.f32,
mlx-lm 0.32.2 itself with float32 activations), built, checked and seeded exactly as
tools/make_llama_fixtures.py describes: this script runs that script's machinery (the same
dense decoder) with Qwen3's config and tensors, and checks that mlx-lm built plain half-split
RoPE after the per-head q/k norms. Two runs give byte-identical files.

How to rerun
------------
From the repository root (Linux; the versions are pinned and checked):

    tools/python-venv.sh oracle tools/make_qwen3_fixtures.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_deepseek_fixtures as common  # noqa: E402  (config base, tensor lists, LICENSE)
import make_llama_fixtures as dense  # noqa: E402  (the dense decoder's builders and oracle)

# config.json: common.TINY_DECODER (the shape the tiny GQA fixtures share) plus dense Qwen3's keys.
CONFIG = common.tiny_config({
    "architectures": ["Qwen3ForCausalLM"],
    "intermediate_size": 192,
    "max_position_embeddings": 256,
    "max_window_layers": 3,
    "model_type": "qwen3",
    "num_hidden_layers": 3,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "use_sliding_window": False,
})

ALT_OVERRIDES = {
    "tie_word_embeddings": True,
    "head_dim": 64,
}


def qwen3_param_specs(cfg):
    """Llama's tensors plus each layer's per-head `self_attn.q_norm` / `k_norm` [head_dim]
    (the names are the same in the HF and MLX layouts)."""
    assert not cfg.get("attention_bias")
    H, I, D = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    return common.decoder_specs(cfg, lambda p, _l: common.gqa_attention_specs(p, cfg, D, True)
                                + common.mlp_specs(f"{p}.mlp", H, I))


def qwen3_extra_oracle(model, cfg, variant, run_prompt_fn, sent_ids):
    """mlx-lm built plain half-split RoPE (theta from the config) after per-head q/k norms."""
    import mlx.nn as nn

    assert cfg["rope_scaling"] is None
    for layer in model.model.layers:
        a = layer.self_attn
        assert type(a.rope) is nn.RoPE and not a.rope.traditional, variant
        assert (a.rope.dims, a.rope.base) == (cfg["head_dim"], cfg["rope_theta"]), variant
        assert a.q_norm.weight.shape == (cfg["head_dim"],) == a.k_norm.weight.shape, variant
    return {}


QWEN3 = dense.Arch(
    name="Qwen3",
    default_out="crates/minirun-runtime/tests/data/qwen3",
    seed_start=5000,
    config=CONFIG,
    variants=dense.dense_variants(ALT_OVERRIDES),
    param_specs=qwen3_param_specs,
    extra_oracle=qwen3_extra_oracle,
    license_text=common.cc0_license("tools/make_qwen3_fixtures.py"),
)


if __name__ == "__main__":
    dense.main_for(QWEN3)
