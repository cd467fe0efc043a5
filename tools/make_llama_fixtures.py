#!/usr/bin/env python3
"""Make tiny Llama 3.x checkpoints and their mlx-lm oracle for minirun-runtime's tests.

What it makes
-------------
Under crates/minirun-runtime/tests/data/llama/ (or --out), one directory per variant of the
SAME tiny random-weight dense Llama model (model_type llama: 3 layers, GQA with 4 query and 2
key/value heads of 32, half-split RoPE with theta 500000 and Llama 3.1's `rope_scaling`
{rope_type llama3, factor 8, low_freq_factor 1, high_freq_factor 4,
original_max_position_embeddings 128}, SiLU-gated MLP of 192, RMSNorm eps 1e-5; vocab 512,
hidden 128):

  mlx-affine4-g64      MLX layout as mlx-community publishes it,
                       mlx_lm.utils.quantize_model(group_size=64, bits=4, "affine")
  mlx-affine8-g32-alt  MLX layout, affine 8 bits, group 32, of a second config (Llama 3.0 /
                       Llama 2 style): no `head_dim` key (mlx-lm takes hidden / heads),
                       `rope_scaling` null and rope_theta 10000 (plain RoPE), tied embeddings
  hf-bf16              Hugging Face layout, unquantized BF16

The rope_scaling of the other two is chosen so that mlx-lm's Llama3RoPE changes the tiny head's
frequencies where the prompts reach: of the 16 frequency pairs, pairs 0-1 keep theirs (wavelength
below 32), pairs 2-3 are smoothed (wavelength between 32 and 128) and pairs 4-15 are divided by 8
(wavelength above 128). The script checks those bands, records mlx-lm's `_freqs` in oracle.json
(`rope_freqs`) and checks that the same weights with plain RoPE give logits at least
MIN_ROPE_SCALING_EFFECT away (`rope_scaling_effect_max_abs`).

Each directory is a complete checkpoint (config.json, model.safetensors,
model.safetensors.index.json, tokenizer files, LICENSE) plus the oracle: oracle.json and
logits-<prompt>.f32 (raw little-endian float32, positions x vocab, row-major). The oracle is
mlx-lm 0.32.2 itself with float32 activations: MLX variants are loaded back with
mlx_lm.utils.load and their float parameters upcast to float32; the HF variant is decoded
exactly in numpy float32 and loaded into an unquantized float32 mlx-lm model (mlx-lm's own
loader is checked to give the same float32 values). Logits come from a KV-cached
one-token-at-a-time pass; the full-prompt pass is checked against them (max |delta| < 1e-4).
The tokenizer is the tiny DeepSeek-V3 fixture's (a byte-level BPE over the same training text):
the architecture does not depend on it.

Weights are drawn from seeded numpy generators (one per tensor, keyed by the seed and the
tensor's name), so two runs give byte-identical files. A seed whose oracle has a top-1/top-2
gap below MIN_TOP1_MARGIN (tools/make_deepseek_fixtures.py's, whose writers, oracle passes and
seed search this script uses) is skipped.

tools/make_qwen3_fixtures.py (dense Qwen3) runs on this script's machinery with its own config
and tensor list.

How to rerun
------------
From the repository root (Linux; the versions are pinned and checked):

    tools/python-venv.sh oracle tools/make_llama_fixtures.py
"""

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_deepseek_fixtures as common  # noqa: E402  (writers, tokenizer, oracle, seed search)

# The same weights with plain RoPE must move some logit of the sentence prompt this far: a
# runtime that ignored rope_scaling would miss the 2e-4 oracle tolerance by far.
MIN_ROPE_SCALING_EFFECT = 1e-2

# config.json: common.TINY_DECODER (the shape the tiny GQA fixtures share) plus Llama 3.1's keys.
CONFIG = common.tiny_config({
    "architectures": ["LlamaForCausalLM"],
    "intermediate_size": 192,
    "max_position_embeddings": 1024,
    "mlp_bias": False,
    "model_type": "llama",
    "num_hidden_layers": 3,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 128,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
})

ALT_OVERRIDES = {
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}
# Keys the second config leaves out (mlx-lm's default applies: head_dim = hidden / heads).
ALT_DROPS = ["head_dim"]


@dataclass
class Arch:
    """What differs between the dense architectures this machinery builds."""
    name: str              # for messages and the LICENSE
    default_out: str
    seed_start: int
    config: dict
    # variant -> (layout "mlx" | "hf", group_size, bits, config overrides, keys dropped)
    variants: dict
    param_specs: Callable  # cfg -> [(name, shape, kind, fan_in)] of the HF layout
    # Extra oracle checks and records: (model, cfg, variant, common.decode_prompt, sentence
    # ids) -> dict
    extra_oracle: Optional[Callable] = None
    license_text: str = ""


def dense_variants(alt_overrides, alt_drops=()):
    """The variants of a dense fixture: the config as MLX affine 4-bit group 64, a second config
    (these overrides, these keys dropped) as MLX affine 8-bit group 32, the config as HF BF16."""
    return {
        "mlx-affine4-g64": ("mlx", 64, 4, {}, []),
        "mlx-affine8-g32-alt": ("mlx", 32, 8, alt_overrides, list(alt_drops)),
        "hf-bf16": ("hf", None, None, {}, []),
    }


def variant_config(arch, variant):
    _, _, _, overrides, drops = arch.variants[variant]
    cfg = {**arch.config, **overrides}
    for k in drops:
        cfg.pop(k, None)
    return cfg


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def llama_param_specs(cfg):
    """(name, shape, kind, fan_in) for every tensor of the Hugging Face layout (also mlx-lm's:
    llama's names are the same in both)."""
    assert not cfg.get("attention_bias") and not cfg.get("mlp_bias")
    H, I, D = cfg["hidden_size"], cfg["intermediate_size"], head_dim(cfg)
    return common.decoder_specs(cfg, lambda p, _l: common.gqa_attention_specs(p, cfg, D)
                                + common.mlp_specs(f"{p}.mlp", H, I))


def make_base_weights(arch, seed, cfg):
    return common.draw_weights(seed, arch.param_specs(cfg), cfg["tie_word_embeddings"])


def build_hf_variant(vdir, base, cfg, tok_files):
    tensors = {name: common.bf16_tensor(a) for name, a in base.items()}
    common.write_hf_checkpoint(vdir, tensors, dict(cfg), tok_files)


def check_model_args(model, cfg, variant):
    """The model mlx-lm built (for MLX variants: from the written config.json) is this
    config's: every key it reads has the config's value, a dropped key its default."""
    import inspect

    fields = inspect.signature(type(model.args)).parameters
    for k, v in cfg.items():
        if k in fields:
            assert getattr(model.args, k) == v, (variant, k, getattr(model.args, k), v)
    attn = model.model.layers[0].self_attn
    assert (attn.n_heads, attn.n_kv_heads) == (cfg["num_attention_heads"],
                                               cfg["num_key_value_heads"]), variant
    assert attn.scale == head_dim(cfg) ** -0.5, variant


def run_oracle(arch, vdir, variant, cfg):
    # The HF names are mlx-lm's names here: no conversion.
    model, tokenizer = common.load_oracle_model(vdir, variant, cfg)
    check_model_args(model, cfg, variant)
    result = common.oracle_record(model, tokenizer, vdir, variant, cfg["vocab_size"],
                                  lambda m, ids: (*common.decode_prompt(m, ids), {}))
    if arch.extra_oracle is not None:
        sent_ids = next(p["token_ids"] for p in result["prompts"] if p["name"] == "sentence")
        result.update(arch.extra_oracle(model, cfg, variant, common.decode_prompt, sent_ids))
    return result


# ----------------------------------------------------------------------------------------
# Llama 3's rope_scaling
# ----------------------------------------------------------------------------------------


def plain_freqs(cfg):
    """mlx-lm's unscaled frequencies, `base ** (arange(0, dims, 2) / dims)` in float32."""
    import mlx.core as mx

    d = head_dim(cfg)
    return np.array(cfg["rope_theta"] ** (mx.arange(0, d, 2) / d))


def llama3_bands(cfg):
    """Per frequency pair, which of Llama3RoPE's three rules applies ("keep", "smooth",
    "scale"), from the float32 wavelengths mlx-lm compares."""
    s = cfg["rope_scaling"]
    wavelens = np.float32(2 * math.pi) * plain_freqs(cfg)
    old = s["original_max_position_embeddings"]
    low_wl, high_wl = old / s["low_freq_factor"], old / s["high_freq_factor"]
    bands = []
    for w in wavelens.astype(np.float64):
        # Far from the edges, where float32 rounding could not move a pair across.
        assert min(abs(w - low_wl), abs(w - high_wl)) > 1e-3 * w, (w, low_wl, high_wl)
        bands.append("scale" if w > low_wl else "smooth" if w > high_wl else "keep")
    return bands


def llama_extra_oracle(model, cfg, variant, run_prompt_fn, sent_ids):
    """For a config with rope_scaling: mlx-lm built its Llama3RoPE, whose frequencies differ
    from plain RoPE's in the bands expected, and the logits with plain RoPE differ by at least
    MIN_ROPE_SCALING_EFFECT. Without: mlx's plain nn.RoPE."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models.rope_utils import Llama3RoPE, initialize_rope

    d = head_dim(cfg)
    ropes = [layer.self_attn.rope for layer in model.model.layers]
    if cfg.get("rope_scaling") is None:
        assert all(type(r) is nn.RoPE and not r.traditional for r in ropes), variant
        return {}
    assert all(type(r) is Llama3RoPE and not r.traditional for r in ropes), variant
    freqs = np.array(ropes[0]._freqs.astype(mx.float32))
    plain = plain_freqs(cfg)
    bands = llama3_bands(cfg)
    assert {"keep", "smooth", "scale"} <= set(bands), bands
    for f, p, b in zip(freqs, plain, bands):
        if b == "keep":
            assert f == p, (f, p)
        elif b == "scale":
            assert abs(f / p - cfg["rope_scaling"]["factor"]) < 1e-5, (f, p)
        else:
            assert p < f < p * cfg["rope_scaling"]["factor"], (f, p)
    scaled_logits, _, _, _ = run_prompt_fn(model, sent_ids)
    saved = ropes[:]
    try:
        for layer in model.model.layers:
            layer.self_attn.rope = initialize_rope(d, cfg["rope_theta"], False, None,
                                                   cfg["max_position_embeddings"])
        plain_logits, _, _, _ = run_prompt_fn(model, sent_ids)
    finally:
        for layer, r in zip(model.model.layers, saved):
            layer.self_attn.rope = r
    effect = float(np.max(np.abs(scaled_logits - plain_logits)))
    if effect < MIN_ROPE_SCALING_EFFECT:
        common.die(f"{variant}: rope_scaling moves the logits by only {effect:.3g}")
    return {"rope_freqs": [float(x) for x in freqs], "rope_bands": bands,
            "rope_scaling_effect_max_abs": effect}


# ----------------------------------------------------------------------------------------
# Building and checking everything
# ----------------------------------------------------------------------------------------


def verify_hf_load(arch, vdir, cfg):
    """mlx-lm's own loader on the HF variant gives exactly our float32 decode."""
    theirs = common.mlx_lm_params_f32(vdir)
    ours = common.hf_weights_f32(vdir)
    assert set(theirs) == set(ours), arch.name
    for k, a in ours.items():
        assert np.array_equal(theirs[k], a), (arch.name, k)


def build_all(arch, root, seed, tok_files):
    results = {}
    for variant, (layout, gs, bits, _, _) in arch.variants.items():
        cfg = variant_config(arch, variant)
        base = make_base_weights(arch, seed, cfg)
        vdir = Path(root) / variant
        if layout == "mlx":
            # As mlx_lm.convert does it; these dense models have no quant_predicate of their
            # own: every Linear and the Embedding whose input width the group divides.
            common.build_mlx_variant(vdir, base, cfg, gs, bits, "affine", tok_files)
        else:
            build_hf_variant(vdir, base, cfg, tok_files)
            verify_hf_load(arch, vdir, cfg)
        res = run_oracle(arch, vdir, variant, cfg)
        res["seed"] = seed
        results[variant] = res
        if (reason := common.check_oracle(variant, res)) is not None:
            return False, results, reason
    return True, results, None


def main_for(arch):
    args, tok_files = common.start(f"Make tiny {arch.name} fixtures and their oracle.",
                                   arch.default_out, arch.seed_start, arch.license_text)
    common.search_seeds(args.seed_start, lambda tmp, seed: build_all(arch, tmp, seed, tok_files),
                        common.replace_tree(args.out))


LLAMA = Arch(
    name="Llama",
    default_out="crates/minirun-runtime/tests/data/llama",
    seed_start=4000,
    config=CONFIG,
    variants=dense_variants(ALT_OVERRIDES, ALT_DROPS),
    param_specs=llama_param_specs,
    extra_oracle=llama_extra_oracle,
    license_text=common.cc0_license("tools/make_llama_fixtures.py"),
)


if __name__ == "__main__":
    main_for(LLAMA)
