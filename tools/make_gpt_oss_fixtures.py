#!/usr/bin/env python3
"""Make tiny gpt-oss checkpoints and their mlx-lm and transformers oracles for minirun-runtime's tests.

What it makes
-------------
Under crates/minirun-runtime/tests/data/gpt-oss/ (or --out), one directory per variant of the
SAME tiny random-weight gpt-oss model (model_type gpt_oss: 4 layers alternating
sliding_attention (window 8) and full_attention; 4 query and 2 key/value heads of 32 with
q/k/v/o biases and one learned attention sink per query head; YaRN RoPE (theta 150000, factor
32, original context 4096); every layer a mixture of 8 experts, top 2, softmax over the two
chosen router logits, each expert the clamped "SwiGLU-OAI" of width 64 with biases; vocab
512, hidden 128):

  openai-mxfp4      OpenAI's own layout, as openai/gpt-oss-20b publishes it: per layer
                    `self_attn.{q,k,v,o}_proj.{weight,bias}`, `self_attn.sinks`,
                    `mlp.router.{weight,bias}` BF16; the experts as
                    `mlp.experts.gate_up_proj_blocks` U8 [E, 2I, H/32, 16] +
                    `gate_up_proj_scales` U8 [E, 2I, H/32] + `gate_up_proj_bias` BF16 [E, 2I],
                    `mlp.experts.down_proj_blocks` U8 [E, H, I/32, 16] + `down_proj_scales` U8
                    [E, H, I/32] + `down_proj_bias` BF16 [E, H]; config `quantization_config`
                    {"quant_method": "mxfp4", ...}; rope_scaling "truncate": true
  openai-mxfp4-untruncated  the same file, rope_scaling "truncate": false (what OpenAI
                    publishes: YaRN's correction range is not rounded to whole dimensions)
  mlx-mxfp4         MLX's layout, as mlx-community publishes gpt-oss: what mlx-lm's own loader
                    (`sanitize`) makes of openai-mxfp4, then mlx_lm.utils.quantize_model(
                    group_size=64, bits=8, mode="affine") with gpt_oss's quant_predicate, saved
                    with mlx_lm.utils.save_model / save_config. The experts stay MXFP4 (stacked
                    `mlp.experts.{gate,up,down}_proj.{weight U32, scales U8, bias BF16}`, the
                    SAME codes and scales as openai-mxfp4); attention, router, embedding and
                    lm_head become affine 8-bit group 64 (`weight` U32, `scales`/`biases` BF16),
                    each listed in config "quantization" as mlx writes a mixed quantization;
                    norms, sinks and the linear layers' biases stay BF16. (mlx-lm's
                    gpt_oss quant_predicate gives the routers {"group_size": 64, "bits": 8}
                    with no "mode" key, which mlx reads as affine.)

Each directory is a complete checkpoint (config.json, model.safetensors,
model.safetensors.index.json, tokenizer files, LICENSE) plus its oracle: oracle.json and
logits-<prompt>.f32 (raw little-endian float32, positions x vocab, row-major), with the same
schema as the other fixture generators' (plus an "oracle" key naming who computed it):

  openai-mxfp4      oracle.json: mlx-lm 0.32.2 (an unquantized float32 mlx-lm gpt_oss.Model
                    holding the exactly decoded float32 weights; it also records, as
                    mlx_lm_mxfp4_load_max_abs_delta, how far mlx-lm's own MXFP4 loading of
                    the directory is from it); oracle-transformers.json +
                    logits-transformers-<prompt>.f32: transformers' GptOssForCausalLM, float32,
                    eager attention, eager experts, loaded from this very directory by
                    `from_pretrained` with Mxfp4Config(dequantize=True) (its parameters are
                    checked equal to this script's own decoding); the max |delta| between the
                    two is recorded in oracle-transformers.json (max_abs_delta_vs_mlx_lm)
  openai-mxfp4-untruncated  oracle.json: transformers only (mlx-lm 0.32.2 ignores "truncate"
                    and always floors/ceils the correction range); records its max |delta|
                    from the truncated variant's transformers logits (max_abs_delta_vs_truncated)
  mlx-mxfp4         oracle.json: mlx-lm 0.32.2, the directory loaded back with
                    mlx_lm.utils.load and its float parameters upcast to float32

Logits come from a KV-cached one-token-at-a-time pass; greedy_32 continues the prompt 32
tokens through the same cache; the full-prompt pass is checked against the cached logits
(max |delta| < 1e-4). The prompts are the Qwen3/DeepSeek fixtures' (sentence, ids, chat) and
"long", 86 tokens of text, so the window of 8 is crossed many times. The tokenizer is the
tiny DeepSeek-V3 fixture's (the architecture does not depend on it).

Weights are drawn from seeded numpy generators (one per tensor, keyed by the seed and the
tensor's name), so two runs give byte-identical files. Non-expert tensors are float32 draws
rounded to BF16, and those BF16 values are what the oracles use. Expert weights are drawn as
MXFP4 directly: a 4-bit E2M1 code per weight and an E8M0 scale byte per 32 weights, so each
weight's value is known exactly (gate_up scales 2^-5..2^-3, down scales 2^-8..2^-6: gate
values have a standard deviation near 3, so the clamp at 7 is exercised, by about 1% of gate
and 2% of up values; the transformers oracle records the counts as swiglu_clamp_counts). A seed
whose oracles (both, where there are two) have a top-1/top-2 gap below MIN_TOP1_MARGIN, or a
router top-k cut closer than MIN_ROUTER_MARGIN, is skipped.

What was checked against the two implementations
------------------------------------------------
- MXFP4: E2M1 by nibble 0..15 = 0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6;
  a scale byte s means 2^(s-127); within a byte the earlier column is the LOW nibble
  (transformers' integrations/mxfp4.py `_convert_moe_packed_tensors` puts `blk & 0x0F` at even
  and `blk >> 4` at odd columns; mlx-lm's sanitize views the 16 bytes as four little-endian
  uint32 words, whose lowest nibble is element 0 in mlx's mxfp4). Both loaders are run on
  openai-mxfp4 and agree with this script's own decoding: transformers' dequantized
  parameters bit for bit, mlx-lm's quantized model within float32 rounding.
- gate/up interleaving: row 2i of gate_up_proj is gate row i, row 2i+1 is up row i (and
  likewise for gate_up_proj_bias): mlx-lm's sanitize takes `[..., ::2, :]` as gate_proj and
  `[..., 1::2, :]` as up_proj; transformers dequantizes to [E, 2I, H], transposes to its
  parameter layout gate_up_proj [E, H, 2I] and takes `gate_up[..., ::2]` as the gate.
  transformers' down_proj parameter is [E, I, H] (the checkpoint's [E, H, I] transposed).
- The activation: both compute (clip(up, -7, 7) + 1) * g * sigmoid(1.702 g) with
  g = min(gate, 7); mlx-lm's SwigluOAI hard-codes limit 7.0 and alpha 1.702 (it does not read
  swiglu_limit), transformers reads swiglu_limit / swiglu_alpha from the config.
- Routing: top-k of router logits (with bias), softmax over the k chosen logits only.
- Sinks: one logit per query head joins the softmax denominator of every query and is then
  dropped (weights over the real keys sum to less than 1); no value is attached to it.
- Sliding window: key j is visible to query i iff j <= i and i - j < sliding_window, in both
  (mlx-lm: create_causal_mask `linds < rinds + window_size` and a RotatingKVCache of
  max_size sliding_window; transformers: sliding_window_overlay `kv_idx > q_idx - window`
  and a DynamicSlidingWindowLayer keeping window - 1 past tokens plus the new one). So a
  window of 8 sees the current token and the 7 before it.
- YaRN: both scale q and k by mscale = 0.1 ln(32) + 1 (mlx on the inputs, transformers on
  cos/sin); transformers' inv_freq is checked against this script's own formula, truncated
  or not as the config says.

How to rerun
------------
From the repository root (Linux; the versions are pinned and checked):

    tools/python-venv.sh oracle tools/make_gpt_oss_fixtures.py

The transformers oracle runs as a subprocess of the same script in the torch-oracle
environment (`tools/python-venv.sh torch-oracle` makes it on first use; about 5.6 GiB):

    tools/python-venv.sh torch-oracle tools/make_gpt_oss_fixtures.py --transformers-oracle JOB.json

Options: --out DIR (default: the test-data directory above), --seed-start N.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_deepseek_fixtures as common  # noqa: E402  (writers, tokenizer, prompts, versions)

DEFAULT_OUT = "crates/minirun-runtime/tests/data/gpt-oss"
SEED_START = 4000
MAX_SEED_TRIES = 200
MIN_TOP1_MARGIN = 2e-3
MIN_ROUTER_MARGIN = 1e-4
PREFILL_DECODE_TOL = 1e-4
ORACLE_AGREEMENT_TOL = 1e-3  # mlx-lm vs transformers on the same file, float32
MIN_TRUNCATE_DELTA = 1e-3  # truncated vs untruncated YaRN must be told apart
REQUIRED_TRANSFORMERS = "5.24.0"

LICENSE_TEXT = (
    "The random test weights, tokenizer and oracle outputs in this directory were generated by "
    "tools/make_gpt_oss_fixtures.py and are released under CC0 1.0 (public domain) for testing.\n"
)

LONG_TEXT = (
    "In spring the traveller came back with a second box, heavier than the first. The "
    "clockmaker cleared his bench, opened his notebook at a fresh page and wrote the date. "
    "Inside the box a row of tiny bells rang."
)

LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]

# The keys (and order) of OpenAI's gpt-oss-20b config.json, with the tiny model's values.
CONFIG = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 1,
    "experts_per_token": 2,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 128,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 64,
    "layer_types": LAYER_TYPES,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 8,
    "output_router_logits": False,
    "pad_token_id": 1,
    "quantization_config": {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    },
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": True,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 8,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.55.0.dev0",
    "use_cache": True,
    "vocab_size": 512,
}

OPENAI = "openai-mxfp4"
OPENAI_UNTRUNCATED = "openai-mxfp4-untruncated"
MLX = "mlx-mxfp4"
VARIANTS = [OPENAI, OPENAI_UNTRUNCATED, MLX]

# E2M1 value of each 4-bit code.
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)
MXFP4_BLOCK = 32
# Inclusive range of the E8M0 scale exponents drawn for each expert projection.
EXPERT_SCALE_EXP = {"gate_up_proj": (-5, -3), "down_proj": (-8, -6)}
SWIGLU_ALPHA = 1.702


def variant_config(variant):
    cfg = json.loads(json.dumps(CONFIG))
    if variant == OPENAI_UNTRUNCATED:
        cfg["rope_scaling"]["truncate"] = False
    return cfg


# ----------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------


def param_specs(cfg):
    """(name, shape, kind, fan_in) of every tensor of OpenAI's layout (experts: their value
    shapes, [E, rows, cols], stored as _blocks/_scales)."""
    H, D = cfg["hidden_size"], cfg["head_dim"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    E, I = cfg["num_local_experts"], cfg["intermediate_size"]
    specs = [("model.embed_tokens.weight", (cfg["vocab_size"], H), "embed", H)]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}"
        specs += [
            (f"{p}.input_layernorm.weight", (H,), "norm", None),
            (f"{p}.post_attention_layernorm.weight", (H,), "norm", None),
            (f"{p}.self_attn.q_proj.weight", (nh * D, H), "matrix", H),
            (f"{p}.self_attn.q_proj.bias", (nh * D,), "bias", None),
            (f"{p}.self_attn.k_proj.weight", (nkv * D, H), "matrix", H),
            (f"{p}.self_attn.k_proj.bias", (nkv * D,), "bias", None),
            (f"{p}.self_attn.v_proj.weight", (nkv * D, H), "matrix", H),
            (f"{p}.self_attn.v_proj.bias", (nkv * D,), "bias", None),
            (f"{p}.self_attn.o_proj.weight", (H, nh * D), "matrix", nh * D),
            (f"{p}.self_attn.o_proj.bias", (H,), "bias", None),
            (f"{p}.self_attn.sinks", (nh,), "sinks", None),
            (f"{p}.mlp.router.weight", (E, H), "router", H),
            (f"{p}.mlp.router.bias", (E,), "router_bias", None),
            (f"{p}.mlp.experts.gate_up_proj", (E, 2 * I, H), "mxfp4", H),
            (f"{p}.mlp.experts.gate_up_proj_bias", (E, 2 * I), "expert_bias", None),
            (f"{p}.mlp.experts.down_proj", (E, H, I), "mxfp4", I),
            (f"{p}.mlp.experts.down_proj_bias", (E, H), "expert_bias", None),
        ]
    specs.append(("model.norm.weight", (H,), "norm", None))
    specs.append(("lm_head.weight", (cfg["vocab_size"], H), "lm_head", H))
    return specs


def pack_mxfp4(codes):
    """codes uint8 [..., rows, cols] (0..15) -> blocks uint8 [..., rows, cols/32, 16]: two codes
    a byte, the earlier column in the low nibble."""
    *pre, rows, cols = codes.shape
    c = codes.reshape(*pre, rows, cols // MXFP4_BLOCK, MXFP4_BLOCK // 2, 2)
    return (c[..., 0] | (c[..., 1] << 4)).astype(np.uint8)


def decode_mxfp4(blocks, scales):
    """Exact float32 value of OpenAI's _blocks [..., rows, G, 16] / _scales [..., rows, G]."""
    lo = blocks & 0x0F
    hi = blocks >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], MXFP4_BLOCK)
    vals = FP4_VALUES[codes] * np.ldexp(np.float32(1.0), scales.astype(np.int32) - 127)[..., None]
    return vals.reshape(*blocks.shape[:-2], blocks.shape[-2] * MXFP4_BLOCK).astype(np.float32)


def make_tensors(seed, cfg):
    """OpenAI-layout tensors: name -> (safetensors dtype, shape, raw bytes)."""
    out = {}
    for name, shape, kind, fan_in in param_specs(cfg):
        rng = np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])
        if kind == "mxfp4":
            proj = name.rsplit(".", 1)[1]
            lo, hi = EXPERT_SCALE_EXP[proj]
            codes = rng.integers(0, 16, size=shape, dtype=np.uint8)
            sshape = shape[:-1] + (shape[-1] // MXFP4_BLOCK,)
            scales = (127 + rng.integers(lo, hi + 1, size=sshape)).astype(np.uint8)
            blocks = pack_mxfp4(codes)
            out[name + "_blocks"] = ("U8", blocks.shape, blocks.tobytes())
            out[name + "_scales"] = ("U8", scales.shape, scales.tobytes())
            continue
        z = rng.standard_normal(shape)
        if kind == "norm":
            a = 1.0 + 0.1 * z
        elif kind == "embed":
            a = z
        elif kind == "lm_head":
            a = common.LM_HEAD_GAIN * z / math.sqrt(fan_in)
        elif kind == "router":
            a = 4.0 * z / math.sqrt(fan_in)  # sharp routing, so top-k decisions are clear
        elif kind == "router_bias":
            a = 0.5 * z
        elif kind == "bias":
            a = 0.2 * z
        elif kind == "expert_bias":
            a = 0.5 * z
        elif kind == "sinks":
            a = z
        else:
            a = z / math.sqrt(fan_in)
        bits = common.f32_to_bf16_bits(a.astype(np.float32))
        out[name] = ("BF16", shape, bits.astype("<u2").tobytes())
    return out


def exact_weights(vdir):
    """Read an OpenAI-layout directory back: name -> exact float32 value (experts decoded to
    gate_up_proj [E, 2I, H] and down_proj [E, H, I])."""
    _, tensors = common.read_safetensors(Path(vdir) / "model.safetensors")
    out = {}
    for name, (dtype, shape, raw) in tensors.items():
        if name.endswith("_scales"):
            continue
        if name.endswith("_blocks"):
            base = name[: -len("_blocks")]
            sd, ss, sr = tensors[base + "_scales"]
            assert dtype == "U8" and sd == "U8" and ss == shape[:-1], name
            blocks = np.frombuffer(raw, dtype=np.uint8).reshape(shape)
            scales = np.frombuffer(sr, dtype=np.uint8).reshape(ss)
            out[base] = decode_mxfp4(blocks, scales)
        else:
            out[name] = common.decode_tensor_f32(dtype, shape, raw)
    return out


def openai_to_mlx(w):
    """Exact OpenAI-layout float32 weights -> an unquantized mlx-lm gpt_oss model's parameters
    (what mlx-lm's sanitize does, on values instead of packed codes)."""
    out = {}
    for name, a in w.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            pre = name[: -len("gate_up_proj")]
            out[pre + "gate_proj.weight"] = np.ascontiguousarray(a[:, 0::2, :])
            out[pre + "up_proj.weight"] = np.ascontiguousarray(a[:, 1::2, :])
        elif name.endswith("mlp.experts.gate_up_proj_bias"):
            pre = name[: -len("gate_up_proj_bias")]
            out[pre + "gate_proj.bias"] = np.ascontiguousarray(a[:, 0::2])
            out[pre + "up_proj.bias"] = np.ascontiguousarray(a[:, 1::2])
        elif name.endswith("mlp.experts.down_proj"):
            out[name + ".weight"] = a
        elif name.endswith("mlp.experts.down_proj_bias"):
            out[name[: -len("_bias")] + ".bias"] = a
        else:
            out[name] = a
    return out


def write_tokenizer(vdir, tok_files):
    for fname, data in tok_files.items():
        common.write_bytes(Path(vdir) / fname, data)


def build_openai_variant(vdir, tensors, cfg, tok_files):
    Path(vdir).mkdir(parents=True, exist_ok=True)
    common.write_safetensors(Path(vdir) / "model.safetensors", tensors, {"format": "pt"})
    total = sum(len(t[2]) for t in tensors.values())
    common.write_json(Path(vdir) / "model.safetensors.index.json", {
        "metadata": {"total_size": total},
        "weight_map": {n: "model.safetensors" for n in sorted(tensors)},
    })
    common.write_json(Path(vdir) / "config.json", cfg)
    write_tokenizer(vdir, tok_files)


def build_mlx_variant(vdir, openai_dir, tok_files):
    """What mlx_lm.convert --quantize --q-bits 8 --q-group-size 64 does with OpenAI's
    checkpoint: mlx-lm's loader keeps the experts' MXFP4 codes and scales (sanitize), then the
    still-unquantized linear layers and the embedding are quantized affine 8-bit group 64."""
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model

    model, config = load_model(Path(openai_dir))
    model, qcfg = quantize_model(model, config, 64, 8, mode="affine",
                                 quant_predicate=model.quant_predicate)
    save_model(vdir, model)
    save_config(qcfg, config_path=Path(vdir) / "config.json")
    write_tokenizer(vdir, tok_files)


# ----------------------------------------------------------------------------------------
# mlx-lm oracle
# ----------------------------------------------------------------------------------------

ROUTER_LOG = []


def install_router_hook():
    """Record the router logits of every MoE call (the call itself is unchanged)."""
    from mlx_lm.models import gpt_oss

    block = gpt_oss.MLPBlock
    if getattr(block, "_fixture_hooked", False):
        return
    orig = block.__call__

    def hooked(self, x):
        import mlx.core as mx

        g = self.router(x).astype(mx.float32)
        ROUTER_LOG.append((np.array(g).reshape(-1, g.shape[-1]), self.num_experts_per_tok))
        return orig(self, x)

    block.__call__ = hooked
    block._fixture_hooked = True


def router_margin(entries):
    best = math.inf
    for gates, top_k in entries:
        for row in gates.astype(np.float64):
            s = np.sort(row)[::-1]
            best = min(best, s[top_k - 1] - s[top_k])
    return float(best)


def new_mlx_model(cfg):
    import mlx.core as mx
    from mlx_lm.utils import _get_classes

    mx.random.seed(0)
    model_cls, args_cls = _get_classes(cfg)
    return model_cls(args_cls.from_dict(cfg))


def upcast_params(model):
    import mlx.core as mx
    from mlx.utils import tree_map

    def up(v):
        return v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v

    model.update(tree_map(up, model.parameters()))


def mlx_oracle_model(vdir, variant, cfg):
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load, load_tokenizer

    if variant == MLX:
        model, tokenizer = load(str(vdir))
        upcast_params(model)
    else:
        model = new_mlx_model(cfg)
        common.load_exact_weights(model, openai_to_mlx(exact_weights(vdir)))
        tokenizer = load_tokenizer(Path(vdir))
    assert model.model.layer_types == LAYER_TYPES
    assert model.args.sliding_window == cfg["sliding_window"]
    mx.eval(model.parameters())
    for k, v in tree_flatten(model.parameters()):
        assert v.dtype in (mx.float32, mx.uint32, mx.uint8), (k, v.dtype)
    # The (quantized) experts must compute in float32.
    probe = mx.ones((1, 1, cfg["hidden_size"]), dtype=mx.float32)
    inds = mx.array([[[0, 5]]], dtype=mx.uint32)
    assert model.model.layers[0].mlp.experts(probe, inds).dtype == mx.float32, variant
    return model, tokenizer


def make_prompts(tokenizer):
    rendered = tokenizer.apply_chat_template(common.CHAT_MESSAGES, tokenize=False,
                                             add_generation_prompt=True)
    chat_ids = [int(i) for i in tokenizer.encode(rendered, add_special_tokens=False)]
    sent_ids = [int(i) for i in tokenizer.encode(common.SENTENCE)]
    long_ids = [int(i) for i in tokenizer.encode(LONG_TEXT)]
    assert 70 <= len(long_ids) <= 90, len(long_ids)
    prompts = [
        {"name": "sentence", "text": common.SENTENCE, "token_ids": sent_ids},
        {"name": "ids", "text": None, "token_ids": [int(i) for i in common.RAW_IDS]},
        {"name": "chat", "text": rendered, "token_ids": chat_ids},
        {"name": "long", "text": LONG_TEXT, "token_ids": long_ids},
    ]
    chat = {"messages": common.CHAT_MESSAGES, "rendered": rendered, "token_ids": chat_ids}
    return prompts, chat


def prompt_entry(p, fname, vocab, greedy, margin, delta, rmargin):
    entry = {"name": p["name"]}
    if p["text"] is not None:
        entry["text"] = p["text"]
    entry.update({
        "token_ids": p["token_ids"],
        "logits_file": fname,
        "positions": len(p["token_ids"]),
        "vocab": vocab,
        "greedy_32": greedy,
        "min_top1_margin": margin,
        "prefill_vs_decode_max_abs": delta,
        "min_router_margin": rmargin,
    })
    return entry


def summarize(result):
    for key, pick in [("min_top1_margin", min), ("prefill_vs_decode_max_abs", max),
                      ("min_router_margin", min)]:
        result[key] = pick(p[key] for p in result["prompts"])
    return result


def run_mlx_oracle(vdir, variant, cfg):
    """Returns (oracle dict, prompts, chat, {prompt: decode logits})."""
    import mlx.core as mx
    import mlx_lm

    install_router_hook()
    model, tokenizer = mlx_oracle_model(vdir, variant, cfg)
    prompts, chat = make_prompts(tokenizer)
    result = {"oracle": "mlx-lm", "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__,
              "variant": variant, "activations": "float32", "prompts": []}
    logits_by = {}
    for p in prompts:
        ROUTER_LOG.clear()
        logits, greedy, margin, delta, _ = common.run_prompt(model, p["token_ids"])
        rmargin = router_margin(ROUTER_LOG)
        fname = f"logits-{p['name']}.f32"
        common.write_bytes(Path(vdir) / fname, logits.astype("<f4").tobytes())
        logits_by[p["name"]] = logits
        result["prompts"].append(prompt_entry(p, fname, cfg["vocab_size"], greedy, margin,
                                              delta, rmargin))
    result["chat"] = chat
    return summarize(result), prompts, chat, logits_by


def mlx_quantized_load_delta(vdir, prompts, logits_by):
    """mlx-lm's own loader on the OpenAI layout (experts kept MXFP4, sanitize splitting the
    interleaved gate/up rows): its full-prompt logits against the exact float32 oracle's."""
    import mlx.core as mx
    from mlx_lm.utils import load

    model, _ = load(str(vdir))
    upcast_params(model)
    worst = 0.0
    for p in prompts:
        out = model(mx.array([p["token_ids"]], dtype=mx.int32))
        worst = max(worst, float(np.max(np.abs(np.array(out[0]) - logits_by[p["name"]]))))
    return worst


# ----------------------------------------------------------------------------------------
# transformers oracle (runs in the torch-oracle environment)
# ----------------------------------------------------------------------------------------


def yarn_inv_freq(cfg):
    """YaRN inverse frequencies in float64, truncating the correction range or not."""
    rs = cfg["rope_scaling"]
    dim, base = cfg["head_dim"], float(cfg["rope_theta"])
    orig = rs["original_max_position_embeddings"]

    def corr_dim(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr_dim(rs["beta_fast"]), corr_dim(rs["beta_slow"])
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    pos = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extra = 1 - ramp
    return (1 / (rs["factor"] * pos)) * (1 - extra) + (1 / pos) * extra


def transformers_oracle(job_path):
    import torch
    import transformers
    from transformers import GptOssForCausalLM, Mxfp4Config

    if transformers.__version__ != REQUIRED_TRANSFORMERS:
        common.die(f"need transformers=={REQUIRED_TRANSFORMERS}, found {transformers.__version__}")
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    job = json.loads(Path(job_path).read_text())
    for item in job["dirs"]:
        vdir = Path(item["dir"])
        cfg = json.loads((vdir / "config.json").read_text())
        model = GptOssForCausalLM.from_pretrained(
            str(vdir), dtype=torch.float32, attn_implementation="eager",
            experts_implementation="eager", quantization_config=Mxfp4Config(dequantize=True))
        model.eval()
        assert model.config._experts_implementation == "eager"
        assert list(model.config.layer_types) == LAYER_TYPES
        # The loaded parameters are exactly this script's decoding of the file.
        exact = exact_weights(vdir)
        params = dict(model.named_parameters())
        seen = set()
        for name, a in exact.items():
            want = a
            if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
                want = np.swapaxes(a, -1, -2)  # transformers keeps [E, in, out]
            got = params[name].detach()
            assert got.dtype == torch.float32, (name, got.dtype)
            assert tuple(got.shape) == want.shape, (name, got.shape, want.shape)
            assert np.array_equal(got.numpy(), want), f"{vdir.name}: {name} differs"
            seen.add(name)
        assert seen == set(params), sorted(set(params) - seen)
        inv = model.model.rotary_emb.inv_freq.double().numpy()
        d = float(np.max(np.abs(inv - yarn_inv_freq(cfg)) / yarn_inv_freq(cfg)))
        assert d < 1e-6, (vdir.name, d)

        router_log, clamp = [], {"gate_values": 0, "gate_above": 0, "up_outside": 0}

        def router_hook(mod, _inp, out):
            router_log.append((out[0].detach().double().numpy(), mod.top_k))

        for layer in model.model.layers:
            layer.mlp.router.register_forward_hook(router_hook)
            experts = layer.mlp.experts
            orig = experts._apply_gate

            def counted(gate_up, _orig=orig, _lim=experts.limit):
                g, u = gate_up[..., ::2], gate_up[..., 1::2]
                clamp["gate_values"] += g.numel()
                clamp["gate_above"] += int((g > _lim).sum())
                clamp["up_outside"] += int((u.abs() > _lim).sum())
                return _orig(gate_up)

            experts._apply_gate = counted

        result = {"oracle": "transformers", "transformers": transformers.__version__,
                  "torch": torch.__version__.split("+")[0], "variant": item["variant"],
                  "activations": "float32", "prompts": []}
        for p in job["prompts"]:
            ids = p["token_ids"]
            router_log.clear()
            with torch.no_grad():
                cache = transformers.DynamicCache(config=model.config)
                rows = []
                for t in ids:
                    out = model(input_ids=torch.tensor([[t]]), cache=cache, use_cache=True)
                    rows.append(out.logits[0, -1].numpy().copy())
                decode = np.stack(rows).astype(np.float32)
                margins = [common.top1_margin(r) for r in decode]
                greedy, last = [], decode[-1]
                for i in range(common.N_GREEDY):
                    margins.append(common.top1_margin(last))
                    nxt = int(np.argmax(last))
                    greedy.append(nxt)
                    if i == common.N_GREEDY - 1:
                        break
                    out = model(input_ids=torch.tensor([[nxt]]), cache=cache, use_cache=True)
                    last = out.logits[0, -1].numpy().astype(np.float32)
                full = model(input_ids=torch.tensor([ids]), use_cache=False)
                prefill = full.logits[0].numpy().astype(np.float32)
            margins += [common.top1_margin(r) for r in prefill]
            delta = float(np.max(np.abs(prefill - decode)))
            rmargin = router_margin(router_log)
            fname = f"{item['logits_prefix']}{p['name']}.f32"
            common.write_bytes(vdir / fname, decode.astype("<f4").tobytes())
            result["prompts"].append(prompt_entry(p, fname, cfg["vocab_size"], greedy,
                                                  min(margins), delta, rmargin))
        result["chat"] = job["chat"]
        summarize(result)
        result["swiglu_clamp_counts"] = clamp
        common.write_json(item["result"], result)


def torch_python():
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([str(root / "tools" / "python-venv.sh"), "torch-oracle"], check=True,
                         stdout=subprocess.PIPE, text=True)
    return out.stdout.strip()


def run_transformers(items, prompts, chat, tmp):
    job = Path(tmp) / "transformers-job.json"
    common.write_json(job, {"dirs": items, "prompts": prompts, "chat": chat})
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    subprocess.run([torch_python(), os.path.abspath(__file__), "--transformers-oracle", str(job)],
                   check=True, env=env)
    return [json.loads(Path(it["result"]).read_text()) for it in items]


# ----------------------------------------------------------------------------------------
# Building everything for one seed
# ----------------------------------------------------------------------------------------


def read_logits(vdir, entry):
    a = np.fromfile(Path(vdir) / entry["logits_file"], dtype="<f4")
    return a.reshape(entry["positions"], entry["vocab"])


def check(res, label):
    if res["prefill_vs_decode_max_abs"] >= PREFILL_DECODE_TOL:
        common.die(f"{label}: prefill vs decode |delta| {res['prefill_vs_decode_max_abs']:.3g}")
    if res["min_top1_margin"] < MIN_TOP1_MARGIN:
        return f"{label}: min_top1_margin {res['min_top1_margin']:.3g}"
    if res["min_router_margin"] < MIN_ROUTER_MARGIN:
        return f"{label}: min_router_margin {res['min_router_margin']:.3g}"
    return None


def build_all(root, seed, tok_files):
    """Returns (ok, {variant: {oracle file name: dict}}, reason)."""
    root = Path(root)
    tensors = make_tensors(seed, CONFIG)
    for v in (OPENAI, OPENAI_UNTRUNCATED):
        build_openai_variant(root / v, tensors, variant_config(v), tok_files)
    build_mlx_variant(root / MLX, root / OPENAI, tok_files)
    for v in VARIANTS:
        size = (root / v / "model.safetensors").stat().st_size
        assert size < 1_500_000, (v, size)

    out = {v: {} for v in VARIANTS}
    res, prompts, chat, logits_by = run_mlx_oracle(root / OPENAI, OPENAI, variant_config(OPENAI))
    res["seed"] = seed
    res["mlx_lm_mxfp4_load_max_abs_delta"] = mlx_quantized_load_delta(root / OPENAI, prompts,
                                                                      logits_by)
    if res["mlx_lm_mxfp4_load_max_abs_delta"] >= ORACLE_AGREEMENT_TOL:
        common.die(f"mlx-lm's MXFP4 load of {OPENAI} disagrees with the exact decoding: "
                   f"{res['mlx_lm_mxfp4_load_max_abs_delta']:.3g}")
    out[OPENAI]["oracle.json"] = res
    if (reason := check(res, f"{OPENAI} (mlx-lm)")) is not None:
        return False, out, reason
    res, _, _, _ = run_mlx_oracle(root / MLX, MLX, variant_config(OPENAI))
    res["seed"] = seed
    out[MLX]["oracle.json"] = res
    if (reason := check(res, f"{MLX} (mlx-lm)")) is not None:
        return False, out, reason

    items = [
        {"dir": str(root / OPENAI), "variant": OPENAI, "logits_prefix": "logits-transformers-",
         "result": str(root / "t-openai.json")},
        {"dir": str(root / OPENAI_UNTRUNCATED), "variant": OPENAI_UNTRUNCATED,
         "logits_prefix": "logits-", "result": str(root / "t-untruncated.json")},
    ]
    t_trunc, t_untrunc = run_transformers(items, prompts, chat, root)
    for it in items:
        os.remove(it["result"])
    os.remove(root / "transformers-job.json")
    mlx_res = out[OPENAI]["oracle.json"]
    worst = 0.0
    for pm, pt in zip(mlx_res["prompts"], t_trunc["prompts"]):
        d = float(np.max(np.abs(read_logits(root / OPENAI, pm) - read_logits(root / OPENAI, pt))))
        pt["max_abs_delta_vs_mlx_lm"] = d
        worst = max(worst, d)
        if pm["greedy_32"] != pt["greedy_32"]:
            common.die(f"{OPENAI}: greedy continuations differ for {pm['name']}")
    t_trunc["max_abs_delta_vs_mlx_lm"] = worst
    t_trunc["seed"] = seed
    if worst >= ORACLE_AGREEMENT_TOL:
        common.die(f"{OPENAI}: mlx-lm and transformers differ by {worst:.3g}")
    out[OPENAI]["oracle-transformers.json"] = t_trunc
    worst = 0.0
    for pa, pb in zip(t_trunc["prompts"], t_untrunc["prompts"]):
        d = float(np.max(np.abs(read_logits(root / OPENAI, pa)
                                - read_logits(root / OPENAI_UNTRUNCATED, pb))))
        pb["max_abs_delta_vs_truncated"] = d
        worst = max(worst, d)
    t_untrunc["max_abs_delta_vs_truncated"] = worst
    t_untrunc["seed"] = seed
    if worst <= MIN_TRUNCATE_DELTA:
        common.die(f"truncated and untruncated YaRN differ by only {worst:.3g}")
    out[OPENAI_UNTRUNCATED]["oracle.json"] = t_untrunc
    for label, r in [(f"{OPENAI} (transformers)", t_trunc),
                     (f"{OPENAI_UNTRUNCATED} (transformers)", t_untrunc)]:
        if (reason := check(r, label)) is not None:
            return False, out, reason
    return True, out, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--seed-start", type=int, default=SEED_START)
    ap.add_argument("--transformers-oracle", metavar="JOB",
                    help="(internal) run the transformers oracle of a job file; torch-oracle env")
    args = ap.parse_args()
    if args.transformers_oracle:
        transformers_oracle(args.transformers_oracle)
        return
    common.check_versions()
    tok_files = common.make_tokenizer_files()
    tok_files["LICENSE"] = LICENSE_TEXT.encode("utf-8")
    for seed in range(args.seed_start, args.seed_start + MAX_SEED_TRIES):
        with tempfile.TemporaryDirectory() as tmp:
            ok, results, reason = build_all(tmp, seed, tok_files)
            if not ok:
                print(f"seed {seed} rejected: {reason}", file=sys.stderr)
                continue
            out = Path(args.out)
            if out.exists():
                shutil.rmtree(out)
            shutil.copytree(tmp, out)
        for variant, files in results.items():
            for fname, res in files.items():
                common.write_json(out / variant / fname, res)
        print(f"seed {seed}: wrote {', '.join(results)} under {out}")
        for variant, files in results.items():
            for fname, res in files.items():
                print(f"  {variant}/{fname}: min_top1_margin {res['min_top1_margin']:.4g}, "
                      f"min_router_margin {res['min_router_margin']:.4g}, prefill_vs_decode "
                      f"{res['prefill_vs_decode_max_abs']:.3g}")
        return
    common.die(f"no seed in {MAX_SEED_TRIES} tries passed the margins")


if __name__ == "__main__":
    main()
