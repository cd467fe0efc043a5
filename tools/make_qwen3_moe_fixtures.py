#!/usr/bin/env python3
"""Make tiny Qwen3-MoE checkpoints and their mlx-lm oracle for minirun-runtime's tests.

What it makes
-------------
Under crates/minirun-runtime/tests/data/qwen3-moe/ (or --out), one directory per variant of the
SAME tiny random-weight Qwen3-MoE model (model_type qwen3_moe: 4 layers, layer 2 dense through
`mlp_only_layers`, the others sparse (`decoder_sparse_step` 1) with 8 experts, top 2; GQA with 4
query and 2 key/value heads of 32, per-head q/k RMSNorm, RoPE theta 1e6; vocab 512, hidden 128):

  mlx-affine4-g64   MLX layout as mlx-community publishes it (stacked `switch_mlp` experts),
                    mlx_lm.utils.quantize_model(group_size=64, bits=4, "affine"), the router
                    at 8 bits (mlx-lm's own quant_predicate for this architecture)
  mlx-affine8-g32-alt  MLX layout, affine 8 bits, group 32, of a second config: norm_topk_prob
                    false, tied embeddings, no dense layer
  hf-bf16           Hugging Face layout (per-expert `mlp.experts.E.*_proj`), unquantized BF16
  hf-fp8            the same layout as Qwen publishes its FP8 checkpoints: every `*_proj.weight`
                    of the layers F8_E4M3 with a BF16 `weight_scale_inv` per 128 x 128 block
                    (scale = bf16(amax / 448), codes = e4m3(w / scale)); the router, norms,
                    embedding and head BF16

Each directory is a complete checkpoint (config.json, model.safetensors,
model.safetensors.index.json, tokenizer files, LICENSE) plus the oracle: oracle.json and
logits-<prompt>.f32 (raw little-endian float32, positions x vocab, row-major). The oracle is
mlx-lm 0.32.2 itself with float32 activations: MLX variants are loaded back with
mlx_lm.utils.load and their float parameters upcast to float32; the HF variant is decoded
exactly in numpy float32 and loaded into an unquantized float32 mlx-lm model. Logits come from a
KV-cached one-token-at-a-time pass; the full-prompt pass is checked against them (max |delta| <
1e-4). The tokenizer is the tiny DeepSeek-V3 fixture's (a byte-level BPE over the same
training text): the architecture does not depend on it.

Weights are drawn from seeded numpy generators (one per tensor, keyed by the seed and the
tensor's name), so two runs give byte-identical files. A seed whose oracle has a top-1/top-2
gap below MIN_TOP1_MARGIN, or a top-k cut whose router logits are closer than MIN_ROUTER_MARGIN,
is skipped (both thresholds are tools/make_deepseek_fixtures.py's, whose writers, oracle passes
and seed search this script uses).

How to rerun
------------
From the repository root (Linux; the versions are pinned and checked):

    tools/python-venv.sh oracle tools/make_qwen3_moe_fixtures.py
"""

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_deepseek_fixtures as common  # noqa: E402  (writers, tokenizer, oracle, seed search)

DEFAULT_OUT = "crates/minirun-runtime/tests/data/qwen3-moe"
SEED_START = 3000

LICENSE_TEXT = common.cc0_license("tools/make_qwen3_moe_fixtures.py")

# config.json: common.TINY_DECODER (the shape the tiny GQA fixtures share) plus Qwen3-MoE's keys.
CONFIG = common.tiny_config({
    "architectures": ["Qwen3MoeForCausalLM"],
    "decoder_sparse_step": 1,
    "intermediate_size": 256,
    "max_position_embeddings": 256,
    "max_window_layers": 4,
    "mlp_only_layers": [2],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 64,
    "norm_topk_prob": True,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "use_sliding_window": False,
})

ALT_OVERRIDES = {
    "norm_topk_prob": False,
    "tie_word_embeddings": True,
    "mlp_only_layers": [],
}

# name, group_size, bits, config overrides
MLX_VARIANTS = [
    ("mlx-affine4-g64", 64, 4, {}),
    ("mlx-affine8-g32-alt", 32, 8, ALT_OVERRIDES),
]
HF_VARIANTS = ["hf-bf16", "hf-fp8"]

FP8_QUANT_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [common.FP8_BLOCK, common.FP8_BLOCK],
}


def variant_config(variant):
    for name, _, _, overrides in MLX_VARIANTS:
        if name == variant:
            return {**CONFIG, **overrides}
    return dict(CONFIG)


def is_sparse(cfg, layer):
    return (layer not in cfg["mlp_only_layers"] and cfg["num_experts"] > 0
            and (layer + 1) % cfg["decoder_sparse_step"] == 0)


def hf_param_specs(cfg):
    """(name, shape, kind, fan_in) for every tensor of the Hugging Face layout: Qwen3's
    attention, then a sparse layer's router and experts or a dense layer's MLP."""
    H = cfg["hidden_size"]

    def layer_specs(p, l):
        specs = common.gqa_attention_specs(p, cfg, cfg["head_dim"], qk_norm=True)
        if not is_sparse(cfg, l):
            return specs + common.mlp_specs(f"{p}.mlp", H, cfg["intermediate_size"])
        E = cfg["num_experts"]
        return specs + [(f"{p}.mlp.gate.weight", (E, H), "router", H)] + common.experts_specs(
            p, H, cfg["moe_intermediate_size"], E)

    return common.decoder_specs(cfg, layer_specs)


def make_base_weights(seed, cfg):
    # Routers 4x sharper than a plain matrix, so top-k decisions are clear.
    return common.draw_weights(seed, hf_param_specs(cfg), cfg["tie_word_embeddings"],
                               router_gain=4.0)


def is_fp8_weight(name):
    """Qwen's FP8 checkpoints quantize every projection of the layers (not the router)."""
    return name.startswith("model.layers.") and name.endswith("_proj.weight")


def fp8_bf16_block_quantize(w):
    """w: float32 [R, C] -> (e4m3 bytes, bf16 scale bits [R/128, C/128]); scale = bf16(amax /
    448) (round to nearest even), codes = e4m3(w / scale) in float32. No block is all zero."""
    B = common.FP8_BLOCK
    R, C = w.shape
    br, bc = -(-R // B), -(-C // B)
    codes = np.zeros((R, C), dtype=np.uint8)
    scales = np.zeros((br, bc), dtype=np.uint16)
    for i in range(br):
        for j in range(bc):
            sl = (slice(i * B, (i + 1) * B), slice(j * B, (j + 1) * B))
            amax = np.float32(np.max(np.abs(w[sl])))
            assert amax > 0
            bits = common.f32_to_bf16_bits(np.array([amax / np.float32(common.E4M3_MAX)]))[0]
            scale = common.bf16_bits_to_f32(np.array([bits], dtype=np.uint16))[0]
            codes[sl] = common.to_e4m3_bytes(w[sl] / scale)
            scales[i, j] = bits
    return codes, scales


def build_hf_variant(vdir, variant, base, cfg, tok_files):
    tensors = {}
    for name, a in base.items():
        if variant == "hf-fp8" and is_fp8_weight(name):
            codes, scales = fp8_bf16_block_quantize(a)
            deq = common.fp8_dequantize(common.E4M3_TABLE[codes], common.bf16_bits_to_f32(scales))
            rel = np.max(np.abs(deq - a)) / float(np.max(np.abs(a)))
            assert rel < 0.07, (name, rel)
            tensors[name] = ("F8_E4M3", a.shape, codes.tobytes())
            tensors[name + "_scale_inv"] = ("BF16", scales.shape, scales.astype("<u2").tobytes())
        else:
            tensors[name] = common.bf16_tensor(a)
    c = dict(cfg)
    if variant == "hf-fp8":
        c["quantization_config"] = dict(FP8_QUANT_CONFIG)
    common.write_hf_checkpoint(vdir, tensors, c, tok_files)


def oracle_model(vdir, variant, cfg):
    model, tokenizer = common.load_oracle_model(vdir, variant, cfg, common.stack_experts)
    for k in ALT_OVERRIDES:
        assert getattr(model.args, k) == cfg[k], (variant, k)
    return model, tokenizer


ROUTER_LOG = []


def install_router_hook():
    """Record the router logits of every MoE call (the call itself is unchanged). The softmax
    keeps their order, so a top-k decision's margin is measured on them."""
    import mlx.core as mx
    from mlx_lm.models import qwen3_moe

    def record(self, x):
        gates = self.gate(x).astype(mx.float32)
        ROUTER_LOG.append((np.array(gates).reshape(-1, gates.shape[-1]), self.top_k))

    common.hook_calls(qwen3_moe.Qwen3MoeSparseMoeBlock, record)


def run_prompt(model, ids):
    logits, greedy, margin, delta, rmargin = common.run_prompt(model, ids, ROUTER_LOG,
                                                               common.topk_router_margin)
    return logits, greedy, margin, delta, {"min_router_margin": rmargin}


def run_oracle(vdir, variant, cfg):
    install_router_hook()
    model, tokenizer = oracle_model(vdir, variant, cfg)
    return common.oracle_record(model, tokenizer, vdir, variant, cfg["vocab_size"], run_prompt,
                                common.ROUTED_SUMMARY)


def build_all(root, seed, tok_files):
    results = {}
    for variant in [v[0] for v in MLX_VARIANTS] + HF_VARIANTS:
        cfg = variant_config(variant)
        base = make_base_weights(seed, cfg)
        vdir = Path(root) / variant
        if variant.startswith("mlx-"):
            _, gs, bits, _ = next(v for v in MLX_VARIANTS if v[0] == variant)
            common.build_mlx_variant(vdir, common.stack_experts(base), cfg, gs, bits, "affine",
                                     tok_files)
        else:
            build_hf_variant(vdir, variant, base, cfg, tok_files)
        res = run_oracle(vdir, variant, cfg)
        res["seed"] = seed
        results[variant] = res
        if (reason := common.check_oracle(variant, res, common.MIN_ROUTER_MARGIN)) is not None:
            return False, results, reason
    return True, results, None


def main():
    args, tok_files = common.start(__doc__.split("\n")[0], DEFAULT_OUT, SEED_START, LICENSE_TEXT)
    common.search_seeds(args.seed_start, lambda tmp, seed: build_all(tmp, seed, tok_files),
                        common.replace_tree(args.out))


if __name__ == "__main__":
    main()
