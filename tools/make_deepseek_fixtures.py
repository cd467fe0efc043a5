#!/usr/bin/env python3
"""Make the tiny DeepSeek-V3 checkpoints and mlx-lm oracle outputs used by minirun-runtime's tests.

What it makes
-------------
Under crates/minirun-runtime/tests/data/deepseek-v3/ (or --out), one directory per variant
of the SAME tiny random-weight DeepSeek-V3 model (model_type deepseek_v3: 3 layers, layer 0
dense, layers 1-2 MoE with 8 routed experts in 2 groups + 1 shared expert, MLA attention
with q_lora_rank 64 / kv_lora_rank 64, YaRN rope, vocab 512, hidden 128):

  mlx-affine4-g64   MLX layout, mlx_lm.utils.quantize_model(group_size=64, bits=4, "affine")
  mlx-affine8-g32   MLX layout, affine, 8 bits, group 32
  mlx-affine4-g128  MLX layout, affine, 4 bits, group 128
  mlx-mxfp4         MLX layout, mode "mxfp4" (group 32, 4 bits, E8M0 scales)
  hf-fp8-f32scales  Hugging Face / DeepSeek layout, F8_E4M3 weights with F32
                    `weight_scale_inv` per 128x128 block (scale = amax / 448)
  hf-fp8-e8m0       the same, scales stored as F8_E8M0 (power of two >= amax / 448)
  hf-bf16           Hugging Face / DeepSeek layout, unquantized BF16

plus one variant of a second model config (CONFIG with ALT_OVERRIDES: plain q_proj instead
of the q LoRA, one expert group, norm_topk_prob false, plain RoPE instead of YaRN), built
from the same per-name random weights, so it takes the code paths the others never do:

  mlx-affine8-g64-alt  MLX layout, affine, 8 bits, group 64

Each directory is a complete checkpoint (config.json, model.safetensors,
model.safetensors.index.json, tokenizer.json, tokenizer_config.json,
special_tokens_map.json, LICENSE) plus the oracle: oracle.json and logits-<prompt>.f32
(raw little-endian float32, positions x vocab, row-major).  The oracle is mlx-lm 0.32.2
itself, run with float32 activations: MLX variants are loaded back with
mlx_lm.utils.load (float parameters, including quantization scales/biases, are then
upcast to float32); HF variants are dequantized exactly in numpy float32 by this script
and loaded into an unquantized float32 mlx-lm model.  Logits come from a KV-cached
one-token-at-a-time pass (mlx-lm's absorbed-MLA decode path); the full-prompt prefill
pass is checked against them (max |delta| < 1e-4).  A README.md describing every
variant, its tensors and the exact quantization definitions is generated too.

All weights are drawn from seeded numpy generators (one per tensor, keyed by the seed
and the tensor's name), so two runs give byte-identical files.  If any variant's oracle
has a top-1/top-2 logit gap below MIN_TOP1_MARGIN (or an MoE routing decision closer
than MIN_ROUTER_MARGIN), the next seed is tried; the seed used is recorded.

How to rerun
------------
From the repository root (Linux; the versions are pinned and checked):

    tools/python-venv.sh oracle tools/make_deepseek_fixtures.py

(tools/python-venv.sh makes target/oracle-venv from tools/requirements-oracle.txt on first use.)

Options: --out DIR (default: the test-data directory above), --seed-start N.
The script refuses to run with mlx != 0.32.4 or mlx-lm != 0.32.2.

The other fixture generators import this module (as `common`) for its version check, writers,
tokenizer and prompts, tensor lists and weight drawing, MLX building, oracle passes and seed
search.
"""

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import struct
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

REQUIRED_MLX = "0.32.4"
REQUIRED_MLX_LM = "0.32.2"

SEED_START = 1000
MAX_SEED_TRIES = 200
MIN_TOP1_MARGIN = 2e-3
MIN_ROUTER_MARGIN = 1e-4
PREFILL_DECODE_TOL = 1e-4
N_GREEDY = 32
FP8_BLOCK = 128
E4M3_MAX = 448.0
# Gain of lm_head: logits std is roughly this value (final hidden is RMS-normalised).
LM_HEAD_GAIN = 4.0

BOS = "<|begin\u2581of\u2581sentence|>"
EOS = "<|end\u2581of\u2581sentence|>"
USER = "<|User|>"
ASSISTANT = "<|Assistant|>"
SPECIAL_TOKENS = [BOS, EOS, USER, ASSISTANT]  # ids 0, 1, 2, 3

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}"
    "{% elif message['role'] == 'user' %}{{ '<|User|>' + message['content'] }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '<|Assistant|>' + message['content'] + eos_token }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|Assistant|>' }}{% endif %}"
)

TRAINING_TEXT = """\
The harbour town woke slowly on the first cold morning of the year. Fishing boats rocked
against the wooden pier, their ropes creaking while gulls circled above the market. A baker
opened her shutters and the smell of warm bread drifted down the narrow street, past the
library, the post office and the small blue house where the old clockmaker lived.

The clockmaker had repaired watches for forty years. He kept a notebook for every clock
that crossed his bench: the owner, the fault, the parts he replaced and the hours he spent.
Numbers filled the pages in neat columns, and he liked to say that a careful record was
worth more than a clever guess. Children from the school often stopped at his window to
watch the tiny gears turn under his magnifying glass.

One afternoon a traveller arrived with a strange device wrapped in a grey cloth. It was
neither a clock nor a compass, but it ticked, and a thin needle pointed towards the sea no
matter how the box was turned. The traveller asked whether it could be opened without
breaking it. The clockmaker studied the hinges, measured the screws, and wrote three
questions in his notebook before he touched anything at all.

By evening the device lay open on the bench. Inside there was a spring, a small magnet and
a folded map of the coast, drawn by hand in faded ink. The traveller laughed, thanked him,
and paid with a silver coin. The next day the whole town talked about the map, and the
children wrote stories about hidden islands, lost ships and a lighthouse that only shone
when nobody was looking.
"""

SENTENCE = "The clockmaker opened the map by the sea."
RAW_IDS = [0, 511, 17, 256, 3, 100, 42, 480, 1, 255, 128, 64, 300, 7, 511, 2, 399, 222, 33, 450]
CHAT_MESSAGES = [
    {"role": "system", "content": "You are a tiny test model."},
    {"role": "user", "content": "Hello there!"},
    {"role": "assistant", "content": "Hi."},
    {"role": "user", "content": "Count to three."},
]


def cc0_license(script):
    """The LICENSE of a directory of fixtures that `script` generated."""
    return ("The random test weights, tokenizer and oracle outputs in this directory were "
            f"generated by {script} and are released under CC0 1.0 (public domain) for testing.\n")


LICENSE_TEXT = cc0_license("tools/make_deepseek_fixtures.py")

CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 128,
    "initializer_range": 0.02,
    "intermediate_size": 256,
    "kv_lora_rank": 64,
    "max_position_embeddings": 256,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 128,
    "moe_layer_freq": 1,
    "n_group": 2,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 3,
    "num_key_value_heads": 4,
    "num_nextn_predict_layers": 0,
    "pretraining_tp": 1,
    "q_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 4.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 64,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "v_head_dim": 32,
    "vocab_size": 512,
}

# The shape the other generators' tiny GQA decoders (Llama, Qwen3, Qwen3-MoE) share: this
# tokenizer's vocab and BOS / EOS ids, hidden 128, 4 query and 2 key/value heads of 32.
TINY_DECODER = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 128,
    "initializer_range": 0.02,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 512,
}


def tiny_config(keys):
    """TINY_DECODER with `keys` added (or changed), sorted by key as Hugging Face writes a
    config.json."""
    return dict(sorted({**TINY_DECODER, **keys}.items()))


FP8_QUANT_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
}

# The second model config: CONFIG with these fields changed.  n_shared_experts stays 1:
# mlx-lm 0.32.2 builds shared experts whenever n_shared_experts is not None (0 fails in
# nn.Linear with a zero input width), and this runtime's config reader wants an integer.
ALT_OVERRIDES = {
    "q_lora_rank": None,  # plain q_proj [heads * (nope + rope), hidden]
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": False,
    "rope_scaling": None,  # plain RoPE
}

MLX_VARIANTS = [
    # name, group_size, bits, mode
    ("mlx-affine4-g64", 64, 4, "affine"),
    ("mlx-affine8-g32", 32, 8, "affine"),
    ("mlx-affine4-g128", 128, 4, "affine"),
    ("mlx-mxfp4", 32, 4, "mxfp4"),
    ("mlx-affine8-g64-alt", 64, 8, "affine"),
]
HF_VARIANTS = ["hf-fp8-f32scales", "hf-fp8-e8m0", "hf-bf16"]
# Variants of a config other than CONFIG; they are built last.
CONFIG_OVERRIDES = {"mlx-affine8-g64-alt": ALT_OVERRIDES}
ALL_VARIANTS = ([v[0] for v in MLX_VARIANTS if v[0] not in CONFIG_OVERRIDES] + HF_VARIANTS
                + list(CONFIG_OVERRIDES))


def variant_config(variant):
    return {**CONFIG, **CONFIG_OVERRIDES.get(variant, {})}

# Blocks of the base weights that are forced to zero (in every variant whose model has the
# tensor): they give the FP8 variants all-zero 128x128 blocks (one full, one partial).
ZERO_BLOCKS = [
    ("model.layers.0.mlp.down_proj.weight", (slice(0, 128), slice(128, 256))),
    ("model.layers.2.self_attn.q_b_proj.weight", (slice(128, 192), slice(0, 64))),
]


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def check_versions():
    try:
        import mlx.core as mx
        import mlx_lm
    except ImportError as e:
        die(f"mlx / mlx-lm not importable ({e}); see tools/requirements-oracle.txt")
    if mx.__version__ != REQUIRED_MLX or mlx_lm.__version__ != REQUIRED_MLX_LM:
        die(
            f"need mlx=={REQUIRED_MLX} and mlx-lm=={REQUIRED_MLX_LM}, found mlx=={mx.__version__} "
            f"and mlx-lm=={mlx_lm.__version__} (fixtures depend on the exact wheels)"
        )


# ----------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------


def write_bytes(path, data):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def write_files(vdir, files):
    """files: name -> bytes, written under vdir (the tokenizer files and LICENSE)."""
    for fname, data in files.items():
        write_bytes(Path(vdir) / fname, data)


def write_json(path, obj, indent=2):
    text = json.dumps(obj, indent=indent, ensure_ascii=False)
    # Put lists of plain numbers (token ids, shapes) on one line.
    text = re.sub(r"\[\s+([-0-9.eE+]+(?:,\s+[-0-9.eE+]+)*)\s+\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)
    write_bytes(path, (text + "\n").encode("utf-8"))


def sha256_file(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def f32_to_bf16_bits(a):
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even (no NaNs here)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def bf16_tensor(a):
    """A safetensors entry (dtype, shape, raw bytes) of float32 `a` rounded to BF16."""
    return ("BF16", a.shape, f32_to_bf16_bits(a).astype("<u2").tobytes())


def _e4m3fn_table():
    """Value of every F8_E4M3 (e4m3fn) byte, decoded from the bit layout (NaN for 0x7f/0xff)."""
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 0x7
        if e == 0xF and m == 0x7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * (m / 8.0) * 2.0 ** -6
        else:
            t[b] = s * (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return t.astype(np.float32)


E4M3_TABLE = _e4m3fn_table()


# ----------------------------------------------------------------------------------------
# Safetensors: a writer and an independent reader
# ----------------------------------------------------------------------------------------

ST_ITEMSIZE = {"F64": 8, "I64": 8, "F32": 4, "BF16": 2, "F16": 2, "U32": 4, "I32": 4, "U16": 2,
               "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E8M0": 1, "BOOL": 1}


def write_safetensors(path, tensors, metadata):
    """tensors: name -> (dtype string, shape tuple, raw little-endian bytes).

    Layout: 8-byte LE header length, JSON header (keys sorted, `__metadata__` first) padded
    with spaces to a multiple of 8, then the data with tensors ordered by descending element
    size and then by name, so every tensor's offset is aligned to its element size.
    """
    order = sorted(tensors, key=lambda n: (-ST_ITEMSIZE[tensors[n][0]], n))
    offsets = {}
    pos = 0
    for name in order:
        dtype, shape, raw = tensors[name]
        assert len(raw) == int(np.prod(shape, dtype=np.int64)) * ST_ITEMSIZE[dtype], name
        offsets[name] = (pos, pos + len(raw))
        pos += len(raw)
    header = {"__metadata__": metadata}
    for name in sorted(tensors):
        dtype, shape, _ = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets[name])}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for name in order:
            f.write(tensors[name][2])


def write_hf_checkpoint(vdir, tensors, config, files):
    """A one-shard Hugging Face checkpoint under vdir: model.safetensors (`tensors` as for
    write_safetensors), model.safetensors.index.json, config.json and `files` (write_files)."""
    vdir = Path(vdir)
    vdir.mkdir(parents=True, exist_ok=True)
    write_safetensors(vdir / "model.safetensors", tensors, {"format": "pt"})
    total = sum(len(t[2]) for t in tensors.values())
    write_json(vdir / "model.safetensors.index.json", {
        "metadata": {"total_size": total},
        "weight_map": {n: "model.safetensors" for n in sorted(tensors)},
    })
    write_json(vdir / "config.json", config)
    write_files(vdir, files)


def read_safetensors(path):
    """Independent strict reader: returns (metadata, {name: (dtype, shape, raw bytes)})."""
    buf = Path(path).read_bytes()
    if len(buf) < 8:
        raise ValueError("file too short")
    (hlen,) = struct.unpack("<Q", buf[:8])
    if 8 + hlen > len(buf):
        raise ValueError("header length past end of file")
    header = json.loads(buf[8:8 + hlen].decode("utf-8"))
    metadata = header.pop("__metadata__", None)
    data = buf[8 + hlen:]
    spans = []
    out = {}
    for name, info in header.items():
        dtype, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in ST_ITEMSIZE:
            raise ValueError(f"{name}: unknown dtype {dtype}")
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - start != n * ST_ITEMSIZE[dtype] or start < 0 or end > len(data):
            raise ValueError(f"{name}: bad data_offsets {start}..{end}")
        spans.append((start, end))
        out[name] = (dtype, tuple(shape), data[start:end])
    spans.sort()
    covered = 0
    for start, end in spans:
        if start != covered:
            raise ValueError("tensor data has gaps or overlaps")
        covered = end
    if covered != len(data):
        raise ValueError("trailing bytes after tensor data")
    return metadata, out


def decode_tensor_f32(dtype, shape, raw):
    """Exact float32 value of a stored float tensor (no ml_dtypes involved)."""
    if dtype == "F32":
        a = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    elif dtype == "BF16":
        a = bf16_bits_to_f32(np.frombuffer(raw, dtype="<u2"))
    elif dtype == "F8_E4M3":
        a = E4M3_TABLE[np.frombuffer(raw, dtype=np.uint8)]
    elif dtype == "F8_E8M0":
        b = np.frombuffer(raw, dtype=np.uint8)
        if np.any(b == 255):
            raise ValueError("E8M0 NaN byte")
        a = np.ldexp(np.float32(1.0), b.astype(np.int32) - 127).astype(np.float32)
    else:
        raise ValueError(f"not a float dtype: {dtype}")
    if np.any(~np.isfinite(a)):
        raise ValueError("non-finite value")
    return a.reshape(shape)


# ----------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------


def make_tokenizer_files():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=CONFIG["vocab_size"],
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TRAINING_TEXT], trainer=trainer)
    if tok.get_vocab_size(with_added_tokens=True) != CONFIG["vocab_size"]:
        die(f"tokenizer vocab is {tok.get_vocab_size(with_added_tokens=True)}, not 512")
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, t
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, 0)],
    )
    tokenizer_json = tok.to_str(pretty=True).encode("utf-8") + b"\n"
    tokenizer_config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": BOS,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS,
        "legacy": True,
        "model_max_length": CONFIG["max_position_embeddings"],
        "pad_token": EOS,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    special_map = {"bos_token": BOS, "eos_token": EOS, "pad_token": EOS}
    enc = lambda o: (json.dumps(o, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    return {
        "tokenizer.json": tokenizer_json,
        "tokenizer_config.json": enc(tokenizer_config),
        "special_tokens_map.json": enc(special_map),
        "LICENSE": LICENSE_TEXT.encode("utf-8"),
    }


# ----------------------------------------------------------------------------------------
# Base weights (HF / DeepSeek layout, float32)
# ----------------------------------------------------------------------------------------


def decoder_specs(cfg, layer_specs):
    """(name, shape, kind, fan_in) of every tensor of a Hugging Face decoder: the embedding,
    per layer its two RMSNorms and layer_specs(prefix, layer), the final norm and, unless the
    embeddings are tied, the LM head."""
    H = cfg["hidden_size"]
    specs = [("model.embed_tokens.weight", (cfg["vocab_size"], H), "embed", H)]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}"
        specs += [
            (f"{p}.input_layernorm.weight", (H,), "norm", None),
            (f"{p}.post_attention_layernorm.weight", (H,), "norm", None),
        ]
        specs += layer_specs(p, l)
    specs.append(("model.norm.weight", (H,), "norm", None))
    if not cfg.get("tie_word_embeddings"):
        specs.append(("lm_head.weight", (cfg["vocab_size"], H), "lm_head", H))
    return specs


def gqa_attention_specs(p, cfg, head_dim, qk_norm=False):
    """Layer p's q/k/v/o projections (no biases) and, with qk_norm, Qwen3's per-head
    q_norm / k_norm [head_dim]."""
    H, D = cfg["hidden_size"], head_dim
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    specs = [
        (f"{p}.self_attn.q_proj.weight", (nh * D, H), "matrix", H),
        (f"{p}.self_attn.k_proj.weight", (nkv * D, H), "matrix", H),
        (f"{p}.self_attn.v_proj.weight", (nkv * D, H), "matrix", H),
        (f"{p}.self_attn.o_proj.weight", (H, nh * D), "matrix", nh * D),
    ]
    if qk_norm:
        specs += [
            (f"{p}.self_attn.q_norm.weight", (D,), "norm", None),
            (f"{p}.self_attn.k_norm.weight", (D,), "norm", None),
        ]
    return specs


def mlp_specs(p, hidden, inter):
    """A SiLU-gated MLP's gate/up/down projections under prefix p (`{p}.gate_proj.weight`...)."""
    H, I = hidden, inter
    return [
        (f"{p}.gate_proj.weight", (I, H), "matrix", H),
        (f"{p}.up_proj.weight", (I, H), "matrix", H),
        (f"{p}.down_proj.weight", (H, I), "matrix", I),
    ]


def experts_specs(p, hidden, inter, n_experts):
    """Per-expert MLPs `{p}.mlp.experts.{e}.*_proj.weight` (Hugging Face layout)."""
    return [s for e in range(n_experts) for s in mlp_specs(f"{p}.mlp.experts.{e}", hidden, inter)]


def hf_param_specs(cfg):
    """(name, shape, kind, fan_in) for every tensor of the HF layout."""
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    qk_head = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]

    def layer_specs(p, l):
        if cfg["q_lora_rank"] is None:
            specs = [(f"{p}.self_attn.q_proj.weight", (nh * qk_head, H), "matrix", H)]
        else:
            specs = [
                (f"{p}.self_attn.q_a_proj.weight", (cfg["q_lora_rank"], H), "matrix", H),
                (f"{p}.self_attn.q_a_layernorm.weight", (cfg["q_lora_rank"],), "norm", None),
                (f"{p}.self_attn.q_b_proj.weight", (nh * qk_head, cfg["q_lora_rank"]), "matrix",
                 cfg["q_lora_rank"]),
            ]
        specs += [
            (f"{p}.self_attn.kv_a_proj_with_mqa.weight",
             (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], H), "matrix", H),
            (f"{p}.self_attn.kv_a_layernorm.weight", (cfg["kv_lora_rank"],), "norm", None),
            (f"{p}.self_attn.kv_b_proj.weight",
             (nh * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), cfg["kv_lora_rank"]), "matrix",
             cfg["kv_lora_rank"]),
            (f"{p}.self_attn.o_proj.weight", (H, nh * cfg["v_head_dim"]), "matrix",
             nh * cfg["v_head_dim"]),
        ]
        if l < cfg["first_k_dense_replace"]:
            return specs + mlp_specs(f"{p}.mlp", H, cfg["intermediate_size"])
        I = cfg["moe_intermediate_size"]
        E = cfg["n_routed_experts"]
        return specs + [
            (f"{p}.mlp.gate.weight", (E, H), "router", H),
            (f"{p}.mlp.gate.e_score_correction_bias", (E,), "bias", None),
        ] + experts_specs(p, H, I, E) + mlp_specs(f"{p}.mlp.shared_experts", H,
                                                   I * cfg["n_shared_experts"])

    return decoder_specs(cfg, layer_specs)


def draw_weights(seed, specs, tied_embeddings=False, router_gain=1.0):
    """float32 weights of `specs` [(name, shape, kind, fan_in)]: one numpy generator per tensor,
    keyed by the seed and the name, draws z ~ N(0, 1); a "norm" is 1 + 0.1 z, a "bias" 0.1 z,
    the "embed" z (scaled like the LM head when the embeddings are tied: they are the head
    too), the "lm_head" LM_HEAD_GAIN z / sqrt(fan_in), a "router" router_gain z / sqrt(fan_in)
    and anything else z / sqrt(fan_in)."""
    out = {}
    for name, shape, kind, fan_in in specs:
        rng = np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])
        z = rng.standard_normal(shape)
        if kind == "norm":
            a = 1.0 + 0.1 * z
        elif kind == "bias":
            a = 0.1 * z
        elif kind == "embed":
            a = z * (LM_HEAD_GAIN / math.sqrt(fan_in) if tied_embeddings else 1.0)
        elif kind == "lm_head":
            a = LM_HEAD_GAIN * z / math.sqrt(fan_in)
        elif kind == "router":
            a = router_gain * z / math.sqrt(fan_in)
        else:
            a = z / math.sqrt(fan_in)
        out[name] = a.astype(np.float32)
    return out


def make_base_weights(seed, cfg):
    out = draw_weights(seed, hf_param_specs(cfg))
    for name, idx in ZERO_BLOCKS:
        if name in out:
            out[name][idx] = 0.0
    return out


def is_fp8_weight(name):
    """DeepSeek's FP8 checkpoints quantize every Linear except the router, embedding, lm_head."""
    return (
        name.endswith("_proj.weight") or name.endswith("_proj_with_mqa.weight")
    ) and name.startswith("model.layers.")


def stack_experts(w):
    """Per-expert `{pre}.mlp.experts.{e}.{proj}.weight` -> mlx-lm's stacked
    `{pre}.mlp.switch_mlp.{proj}.weight` [experts, ...]; every other tensor unchanged."""
    out, experts = {}, {}
    for name, a in w.items():
        if ".mlp.experts." in name:
            pre, rest = name.split(".mlp.experts.")
            e, proj, _ = rest.split(".")
            experts.setdefault((pre, proj), {})[int(e)] = a
        else:
            out[name] = a
    for (pre, proj), by_e in experts.items():
        out[f"{pre}.mlp.switch_mlp.{proj}.weight"] = np.stack([by_e[e] for e in sorted(by_e)])
    return out


def hf_to_mlx(w, cfg):
    """HF / DeepSeek layout -> mlx-lm's DeepSeek-V3 parameter layout (my own conversion)."""
    nh = cfg["num_attention_heads"]
    nope, vdim = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    out = {}
    for name, a in stack_experts(w).items():
        if name.endswith("self_attn.kv_b_proj.weight"):
            pre = name[: -len("kv_b_proj.weight")]
            kv = a.reshape(nh, nope + vdim, a.shape[-1])
            out[pre + "embed_q.weight"] = np.ascontiguousarray(kv[:, :nope, :].transpose(0, 2, 1))
            out[pre + "unembed_out.weight"] = np.ascontiguousarray(kv[:, nope:, :])
        else:
            out[name] = a
    return out


# ----------------------------------------------------------------------------------------
# FP8 block quantization (DeepSeek layout)
# ----------------------------------------------------------------------------------------


def to_e4m3_bytes(x):
    import ml_dtypes

    x = np.clip(x.astype(np.float32), -E4M3_MAX, E4M3_MAX)
    return x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def e8m0_exponent(amax):
    """Smallest integer e with 448 * 2**e >= amax (exact comparisons in float64)."""
    e = math.ceil(math.log2(float(amax) / E4M3_MAX))
    while E4M3_MAX * 2.0 ** e < amax:
        e += 1
    while E4M3_MAX * 2.0 ** (e - 1) >= amax:
        e -= 1
    return e


def fp8_block_quantize(w, scale_fmt):
    """w: float32 [R, C] -> (e4m3 bytes [R, C], scale array, zero-block count).

    scale_fmt "f32": scale = float32(amax) / float32(448) in float32; codes = e4m3(w / scale)
    (float32 division, then round-to-nearest-even to e4m3fn, clipped to +-448); returns float32
    scales.  scale_fmt "e8m0": scale = 2**e with e the smallest integer such that
    448 * 2**e >= amax; codes = e4m3(w * 2**-e); returns uint8 bytes e + 127.
    An all-zero block gets scale 1.0 (byte 127) and zero codes.
    """
    R, C = w.shape
    br, bc = -(-R // FP8_BLOCK), -(-C // FP8_BLOCK)
    codes = np.zeros((R, C), dtype=np.uint8)
    scales = np.zeros((br, bc), dtype=np.float32 if scale_fmt == "f32" else np.uint8)
    zero_blocks = 0
    for i in range(br):
        for j in range(bc):
            sl = (slice(i * FP8_BLOCK, (i + 1) * FP8_BLOCK), slice(j * FP8_BLOCK, (j + 1) * FP8_BLOCK))
            blk = w[sl]
            amax = np.float32(np.max(np.abs(blk)))
            if amax == 0:
                zero_blocks += 1
                scales[i, j] = 1.0 if scale_fmt == "f32" else 127
                codes[sl] = to_e4m3_bytes(np.zeros_like(blk))
                continue
            if scale_fmt == "f32":
                s = np.float32(amax / np.float32(E4M3_MAX))
                codes[sl] = to_e4m3_bytes(blk / s)
                scales[i, j] = s
            else:
                e = e8m0_exponent(amax)
                assert -127 <= e <= 127
                codes[sl] = to_e4m3_bytes(blk * np.float32(2.0 ** -e))
                scales[i, j] = e + 127
    return codes, scales, zero_blocks


def fp8_dequantize(codes_f32, scale_f32):
    """e4m3 value * block scale, in float32 (exact: both factors have few mantissa bits)."""
    R, C = codes_f32.shape
    s = np.repeat(np.repeat(scale_f32, FP8_BLOCK, axis=0), FP8_BLOCK, axis=1)[:R, :C]
    return (codes_f32 * s).astype(np.float32)


# ----------------------------------------------------------------------------------------
# Building the variants
# ----------------------------------------------------------------------------------------


def new_mlx_model(cfg):
    import mlx.core as mx
    from mlx_lm.utils import _get_classes

    mx.random.seed(0)
    model_cls, args_cls = _get_classes(cfg)
    return model_cls(args_cls.from_dict(cfg))


def load_exact_weights(model, weights):
    """Set every parameter of `model` from `weights` (numpy float32), checking names/shapes."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    params = dict(tree_flatten(model.parameters()))
    if set(params) != set(weights):
        missing = sorted(set(params) - set(weights))
        extra = sorted(set(weights) - set(params))
        die(f"parameter mismatch: missing {missing[:5]} extra {extra[:5]}")
    for k, v in params.items():
        if tuple(v.shape) != weights[k].shape:
            die(f"{k}: model shape {v.shape} vs weights {weights[k].shape}")
    model.load_weights([(k, mx.array(v)) for k, v in weights.items()], strict=True)
    mx.eval(model.parameters())


def build_mlx_variant(vdir, weights, cfg, group_size, bits, mode, tok_files):
    """As mlx_lm.convert does it: a model of `cfg` holding `weights` (mlx-lm's names, float32),
    every float parameter cast to bfloat16 (torch_dtype) unless the model's own cast_predicate
    keeps it (DeepSeek-V3: e_score_correction_bias stays float32), then quantize_model, which
    applies the model's own quant_predicate where it has one (qwen3_moe: the router at 8 bits);
    saved with save_model / save_config, plus `tok_files`."""
    import mlx.core as mx
    from mlx.utils import tree_map_with_path
    from mlx_lm.utils import quantize_model, save_config, save_model

    model = new_mlx_model(cfg)
    load_exact_weights(model, weights)
    keep = getattr(model, "cast_predicate", lambda _path: True)

    def to_bf16(k, v):
        if keep(k) and mx.issubdtype(v.dtype, mx.floating):
            return v.astype(mx.bfloat16)
        return v

    model.update(tree_map_with_path(to_bf16, model.parameters()))
    model, qcfg = quantize_model(model, dict(cfg), group_size, bits, mode=mode)
    save_model(vdir, model)
    save_config(qcfg, config_path=Path(vdir) / "config.json")
    write_files(vdir, tok_files)


def build_hf_variant(vdir, variant, base, cfg, tok_files):
    tensors = {}
    info = {"zero_blocks": []}
    for name, a in base.items():
        if variant != "hf-bf16" and is_fp8_weight(name):
            fmt = "f32" if variant == "hf-fp8-f32scales" else "e8m0"
            codes, scales, nzero = fp8_block_quantize(a, fmt)
            if nzero:
                info["zero_blocks"].append((name, nzero))
            # Sanity: the dequantized weight is close to the float32 original.
            sc_f32 = scales if fmt == "f32" else np.ldexp(np.float32(1), scales.astype(np.int32) - 127)
            deq = fp8_dequantize(E4M3_TABLE[codes], sc_f32)
            rel = np.max(np.abs(deq - a)) / max(float(np.max(np.abs(a))), 1e-30)
            assert rel < 0.07, (name, rel)
            tensors[name] = ("F8_E4M3", a.shape, codes.tobytes())
            if fmt == "f32":
                tensors[name + "_scale_inv"] = ("F32", scales.shape, scales.astype("<f4").tobytes())
            else:
                tensors[name + "_scale_inv"] = ("F8_E8M0", scales.shape, scales.tobytes())
        elif name.endswith("e_score_correction_bias"):
            tensors[name] = ("F32", a.shape, a.astype("<f4").tobytes())
        else:
            tensors[name] = bf16_tensor(a)
    c = dict(cfg)
    if variant != "hf-bf16":
        q = dict(FP8_QUANT_CONFIG)
        if variant == "hf-fp8-e8m0":
            q["scale_fmt"] = "ue8m0"
        c["quantization_config"] = q
    write_hf_checkpoint(vdir, tensors, c, tok_files)
    return info


def hf_weights_f32(vdir):
    """Read an HF variant back and dequantize it exactly in float32 (not via mlx-lm's bf16)."""
    _, tensors = read_safetensors(Path(vdir) / "model.safetensors")
    out = {}
    for name, (dtype, shape, raw) in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        a = decode_tensor_f32(dtype, shape, raw)
        if dtype == "F8_E4M3":
            sd, ss, sr = tensors[name + "_scale_inv"]
            assert ss == (-(-shape[0] // FP8_BLOCK), -(-shape[1] // FP8_BLOCK)), name
            a = fp8_dequantize(a, decode_tensor_f32(sd, ss, sr))
        out[name] = a
    return out


def upcast_f32(model):
    """Every floating parameter of an mlx model to float32 (quantized codes stay as they are)."""
    import mlx.core as mx
    from mlx.utils import tree_map

    def up(v):
        return v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v

    model.update(tree_map(up, model.parameters()))


def load_oracle_model(vdir, variant, cfg, to_mlx=lambda w: w, packed=("uint32",)):
    """The model and tokenizer an oracle runs: an `mlx-` variant loaded back with
    mlx_lm.utils.load and upcast to float32, an HF one decoded exactly (hf_weights_f32, then
    to_mlx to mlx-lm's names) into an unquantized float32 model of `cfg`. Checks that every
    parameter is float32 or a quantized tensor's packed dtype (`packed`, names of mx dtypes)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load, load_tokenizer

    if variant.startswith("mlx-"):
        model, tokenizer = load(str(vdir))
        upcast_f32(model)
    else:
        model = new_mlx_model(cfg)
        load_exact_weights(model, to_mlx(hf_weights_f32(vdir)))
        tokenizer = load_tokenizer(Path(vdir))
    mx.eval(model.parameters())
    allowed = [mx.float32] + [getattr(mx, d) for d in packed]
    for k, v in tree_flatten(model.parameters()):
        assert v.dtype in allowed, (k, v.dtype)
    return model, tokenizer


def mlx_lm_params_f32(vdir):
    """mlx-lm's own loading of a checkpoint directory: parameter name -> float32 numpy array."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load

    model, _ = load(str(vdir))
    return {k: np.array(v.astype(mx.float32)) for k, v in tree_flatten(model.parameters())}


def oracle_model(vdir, variant, cfg):
    import mlx.core as mx

    model, tokenizer = load_oracle_model(vdir, variant, cfg, lambda w: hf_to_mlx(w, cfg),
                                         packed=("uint32", "uint8"))
    # The model mlx-lm built (for MLX variants: from the written config.json) is this config's.
    for k in ALT_OVERRIDES:
        assert getattr(model.args, k) == cfg[k], (variant, k, getattr(model.args, k))
    # mxfp4's QuantizedEmbedding dequantizes to bfloat16 (its scales are uint8); check that
    # this is exact (fp4 value * 2**e fits bf16), so the activations stay exactly float32.
    emb = model.model.embed_tokens
    if hasattr(emb, "scales"):
        kw = dict(group_size=emb.group_size, bits=emb.bits, mode=emb.mode)
        d_default = mx.dequantize(emb["weight"], emb["scales"], emb.get("biases"), **kw)
        d_f32 = mx.dequantize(emb["weight"], emb["scales"], emb.get("biases"), dtype=mx.float32, **kw)
        assert mx.array_equal(d_default.astype(mx.float32), d_f32).item(), variant
    # The (possibly quantized) routed experts must compute in float32 too.
    moe = model.model.layers[1].mlp
    probe = mx.ones((1, 1, cfg["hidden_size"]), dtype=mx.float32)
    inds = mx.array([[[0, 5]]], dtype=mx.uint32)
    assert moe.switch_mlp(probe, inds).dtype == mx.float32, variant
    assert moe.shared_experts(probe).dtype == mx.float32, variant
    return model, tokenizer


# ----------------------------------------------------------------------------------------
# Running the oracle
# ----------------------------------------------------------------------------------------

ROUTER_LOG = []


def hook_calls(cls, record):
    """Let record(module, x) see the input of every call of a module class first (the call
    itself is unchanged); hooking a class twice does nothing."""
    if getattr(cls, "_fixture_hooked", False):
        return
    orig = cls.__call__

    def hooked(self, x):
        record(self, x)
        return orig(self, x)

    cls.__call__ = hooked
    cls._fixture_hooked = True


def install_router_hook():
    """Record the router logits of every MoE call (the call itself is unchanged)."""
    import mlx.core as mx
    from mlx_lm.models import deepseek_v3

    def record(self, x):
        gates = (x @ self.weight.T).astype(mx.float32)
        ROUTER_LOG.append((np.array(gates).reshape(-1, gates.shape[-1]),
                           np.array(self.e_score_correction_bias.astype(mx.float32)),
                           self.n_group, self.topk_group, self.top_k))

    hook_calls(deepseek_v3.MoEGate, record)


def router_margin(entries):
    """Smallest gap of any routing decision (group choice and top-k cut) in float64."""
    best = math.inf
    for gates, bias, n_group, topk_group, top_k in entries:
        s = 1.0 / (1.0 + np.exp(-gates.astype(np.float64))) + bias.astype(np.float64)
        for row in s:
            g = row.reshape(n_group, -1)
            group_score = np.sort(g, axis=-1)[:, -2:].sum(-1)  # mlx-lm: sum of each group's top 2
            order = np.argsort(-group_score, kind="stable")
            if n_group > topk_group:
                best = min(best, group_score[order[topk_group - 1]] - group_score[order[topk_group]])
            masked = g.copy()
            masked[order[topk_group:]] = 0.0  # dropped groups are filled with 0.0, as in mlx-lm
            cand = np.sort(masked.ravel())[::-1]
            best = min(best, cand[top_k - 1] - cand[top_k])
    return float(best)


def topk_router_margin(entries):
    """Smallest gap at the top-k cut of plain top-k routing: entries (router logits [rows, E],
    top_k); the softmax keeps their order, so the gap is measured on the logits (float64)."""
    best = math.inf
    for gates, top_k in entries:
        for row in gates.astype(np.float64):
            s = np.sort(row)[::-1]
            best = min(best, s[top_k - 1] - s[top_k])
    return float(best)


def top1_margin(row):
    t = np.partition(row, -2)[-2:]
    return float(t[1] - t[0])


def decode_prompt(model, ids):
    """The oracle pass of one prompt: its logits [positions, vocab] from a KV-cached
    one-token-at-a-time pass, greedy_32 continuing it through the same cache, the smallest
    top-1/top-2 gap of all of those and of a full-prompt pass without the cache, and the max
    |delta| between the full-prompt and the cached logits."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    rows = []
    for t in ids:
        out = model(mx.array([[t]], dtype=mx.int32), cache=cache)
        assert out.dtype == mx.float32
        rows.append(np.array(out[0, -1]))
    decode = np.stack(rows).astype(np.float32)
    margins = [top1_margin(r) for r in decode]
    greedy = []
    last = decode[-1]
    for i in range(N_GREEDY):
        margins.append(top1_margin(last))
        nxt = int(np.argmax(last))
        greedy.append(nxt)
        if i == N_GREEDY - 1:
            break
        out = model(mx.array([[nxt]], dtype=mx.int32), cache=cache)
        last = np.array(out[0, -1]).astype(np.float32)

    cache2 = make_prompt_cache(model)
    full = model(mx.array([ids], dtype=mx.int32), cache=cache2)
    assert full.dtype == mx.float32
    prefill = np.array(full[0]).astype(np.float32)
    margins += [top1_margin(r) for r in prefill]
    delta = float(np.max(np.abs(prefill - decode)))
    return decode, greedy, min(margins), delta


def run_prompt(model, ids, router_log=ROUTER_LOG, margin_of=router_margin):
    """decode_prompt, plus the smallest routing margin (margin_of) of what the router hook
    recorded in router_log during the passes (DeepSeek-V3's by default)."""
    router_log.clear()
    decode, greedy, margin, delta = decode_prompt(model, ids)
    return decode, greedy, margin, delta, margin_of(router_log)


# The per-prompt keys of oracle.json summarised over all prompts, and how.
SUMMARY = [("min_top1_margin", min), ("prefill_vs_decode_max_abs", max)]
ROUTED_SUMMARY = SUMMARY + [("min_router_margin", min)]


def oracle_prompts(tokenizer):
    """The prompts every oracle runs, [(name, text or None, token ids)], and the chat record."""
    rendered = tokenizer.apply_chat_template(CHAT_MESSAGES, tokenize=False, add_generation_prompt=True)
    # mlx_lm.generate encodes a chat-templated prompt with add_special_tokens=False (the
    # template already starts with the BOS text).
    chat_ids = list(tokenizer.encode(rendered, add_special_tokens=False))
    sent_ids = list(tokenizer.encode(SENTENCE))
    prompts = [
        ("sentence", SENTENCE, sent_ids),
        ("ids", None, list(RAW_IDS)),
        ("chat", rendered, chat_ids),
    ]
    return prompts, {"messages": CHAT_MESSAGES, "rendered": rendered, "token_ids": chat_ids}


def oracle_record(model, tokenizer, vdir, variant, vocab, run, summary=SUMMARY):
    """Runs every prompt through run(model, ids) -> (logits, greedy_32, min top-1 margin,
    prefill-vs-decode delta, {further per-prompt keys}), writes logits-<prompt>.f32 under vdir
    and returns the oracle.json record, with `summary`'s keys summarised over the prompts."""
    import mlx.core as mx
    import mlx_lm

    prompts, chat = oracle_prompts(tokenizer)
    result = {
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "variant": variant,
        "activations": "float32",
        "prompts": [],
    }
    for name, text, ids in prompts:
        logits, greedy, margin, delta, more = run(model, ids)
        fname = f"logits-{name}.f32"
        write_bytes(Path(vdir) / fname, logits.astype("<f4").tobytes())
        entry = {"name": name}
        if text is not None:
            entry["text"] = text
        entry.update({
            "token_ids": [int(i) for i in ids],
            "logits_file": fname,
            "positions": len(ids),
            "vocab": vocab,
            "greedy_32": greedy,
            "min_top1_margin": margin,
            "prefill_vs_decode_max_abs": delta,
            **more,
        })
        result["prompts"].append(entry)
    result["chat"] = chat
    for key, pick in summary:
        result[key] = pick(p[key] for p in result["prompts"])
    return result


def check_oracle(label, res, min_router=None):
    """Dies when the full-prompt and cached passes disagree; returns why the seed is rejected
    (a top-1 gap below MIN_TOP1_MARGIN, a routing margin below min_router), else None."""
    if res["prefill_vs_decode_max_abs"] >= PREFILL_DECODE_TOL:
        die(f"{label}: prefill vs decode max |delta| {res['prefill_vs_decode_max_abs']:.3g}")
    if res["min_top1_margin"] < MIN_TOP1_MARGIN:
        return f"{label}: min_top1_margin {res['min_top1_margin']:.3g}"
    if min_router is not None and res["min_router_margin"] < min_router:
        return f"{label}: min_router_margin {res['min_router_margin']:.3g}"
    return None


def routed_prompt(model, ids):
    logits, greedy, margin, delta, rmargin = run_prompt(model, ids)
    return logits, greedy, margin, delta, {"min_router_margin": rmargin,
                                           "logits_std": float(np.std(logits))}


def run_oracle(vdir, variant, cfg):
    install_router_hook()
    model, tokenizer = oracle_model(vdir, variant, cfg)
    return oracle_record(model, tokenizer, vdir, variant, cfg["vocab_size"], routed_prompt,
                         ROUTED_SUMMARY)


def build_all(root, seed, tok_files):
    """Build every variant + oracle for `seed` under `root`. Returns (ok, results, reason)."""
    results = {}
    for variant in ALL_VARIANTS:
        cfg = variant_config(variant)
        base = make_base_weights(seed, cfg)
        vdir = Path(root) / variant
        extra = {}
        if variant.startswith("mlx-"):
            _, gs, bits, mode = next(v for v in MLX_VARIANTS if v[0] == variant)
            build_mlx_variant(vdir, hf_to_mlx(base, cfg), cfg, gs, bits, mode, tok_files)
        else:
            extra = build_hf_variant(vdir, variant, base, cfg, tok_files)
            if variant != "hf-bf16":
                assert sorted(n for n, _ in extra["zero_blocks"]) == sorted(n for n, _ in ZERO_BLOCKS)
        res = run_oracle(vdir, variant, cfg)
        res["seed"] = seed
        results[variant] = (res, extra)
        if (reason := check_oracle(variant, res, MIN_ROUTER_MARGIN)) is not None:
            return False, results, reason
    return True, results, None


def verify_output(out, cfg):
    """Independent checks of the written files."""
    from safetensors import safe_open

    for variant in ALL_VARIANTS:
        path = Path(out) / variant / "model.safetensors"
        _, mine = read_safetensors(path)
        # The `safetensors` package (0.8.0 knows F8_E8M0) must agree with our reader.
        with safe_open(str(path), framework="numpy") as f:
            assert set(f.keys()) == set(mine), variant
            for k in f.keys():
                sl = f.get_slice(k)
                assert (sl.get_dtype(), tuple(sl.get_shape())) == mine[k][:2], (variant, k)
        idx = json.loads((Path(out) / variant / "model.safetensors.index.json").read_text())
        assert set(idx["weight_map"]) == set(mine), variant
    # mlx-lm's own loader (its sanitize splits kv_b_proj, stacks experts and, for FP8,
    # dequantizes through bfloat16) must agree with our float32 HF -> MLX conversion.
    for variant, rel in [("hf-bf16", 0.0), ("hf-fp8-f32scales", 2.0 ** -8)]:
        theirs = mlx_lm_params_f32(Path(out) / variant)
        ours = hf_to_mlx(hf_weights_f32(Path(out) / variant), cfg)
        assert set(theirs) == set(ours), variant
        for k, a in ours.items():
            assert theirs[k].shape == a.shape, (variant, k)
            assert np.all(np.abs(theirs[k] - a) <= rel * np.abs(a)), (variant, k)


# ----------------------------------------------------------------------------------------
# README
# ----------------------------------------------------------------------------------------


def collapse_name(name):
    parts = name.split(".")
    out = []
    for i, p in enumerate(parts):
        if p.isdigit() and i > 0 and parts[i - 1] == "layers":
            out.append("{L}")
        elif p.isdigit() and i > 0 and parts[i - 1] == "experts":
            out.append("{e}")
        else:
            out.append(p)
    return ".".join(out)


def layers_of(names):
    ls = sorted({int(n.split(".")[2]) for n in names if n.startswith("model.layers.")})
    return ",".join(map(str, ls))


def tensor_table(vdir):
    _, tensors = read_safetensors(Path(vdir) / "model.safetensors")
    groups = {}
    for name, (dtype, shape, _) in tensors.items():
        groups.setdefault((collapse_name(name), dtype, shape), []).append(name)
    rows = []
    for (pattern, dtype, shape), names in sorted(groups.items()):
        where = ""
        if "{L}" in pattern:
            where = "L=" + layers_of(names)
        if "{e}" in pattern:
            where += " e=0..7"
        rows.append(f"| `{pattern}` | {dtype} | {list(shape)} | {where.strip()} |")
    return len(tensors), rows


README_HEAD = """\
# DeepSeek-V3 test fixtures (generated)

Generated by `tools/make_deepseek_fixtures.py` (do not edit by hand; rerun the script).
Rerun from the repository root:

    tools/python-venv.sh oracle tools/make_deepseek_fixtures.py

Made with mlx {mlx} (mlx-cpu wheel), mlx-lm {mlx_lm}, numpy {numpy}, ml_dtypes {ml_dtypes},
tokenizers {tokenizers}, transformers {transformers}, safetensors {safetensors}
(Python {python}). The script refuses other mlx / mlx-lm versions. Output is deterministic.

All weights are random test data (seed {seed}; one numpy PCG64 generator per tensor, seeded
with `[seed, crc32(name)]`), released CC0 (see each LICENSE).{rejected}

## The model

One tiny DeepSeek-V3 (`model_type` deepseek_v3), identical in every variant but
`mlx-affine8-g64-alt` (see below) up to quantization: vocab 512, hidden 128, 3 layers
(layer 0 dense MLP with intermediate 256, layers 1-2 MoE: 8 routed experts of intermediate
128 in 2 groups, topk_group 1,
2 experts per token, sigmoid scoring + `e_score_correction_bias` (noaux_tc), norm_topk_prob,
routed_scaling_factor 2.5, 1 shared expert of intermediate 128), MLA attention with 4 heads,
q_lora_rank 64, kv_lora_rank 64, qk_nope 32, qk_rope 16, v 32, YaRN rope (factor 4,
original_max_position_embeddings 64, beta_fast 32, beta_slow 1, mscale = mscale_all_dim = 1,
so YaRN's input scale is 1 and the softmax scale is `48**-0.5 * (0.1*ln(4)+1)**2` =
{softmax_scale!r}), rms_norm_eps 1e-6 (the q_a / kv_a layernorms use 1e-6 too), no biases,
untied lm_head. Rope is applied to the 16 rope dims of q and of the shared k_pe in mlx's
"traditional" (interleaved) form: pair `(2i, 2i+1)` is rotated by `pos / freqs[i]` with
mlx-lm's YaRN `freqs` = `{rope_freqs}` (float32).

Base weights (float32, HF layout): norms `1 + 0.1*N(0,1)`, `e_score_correction_bias`
`0.1*N(0,1)`, embed_tokens `N(0,1)`, lm_head `{gain}*N(0,1)/sqrt(128)`, every other matrix
(router included) `N(0,1)/sqrt(fan_in)`. Two blocks are forced to zero in every variant so the
FP8 variants contain all-zero 128x128 blocks: `model.layers.0.mlp.down_proj.weight[0:128, 128:256]`
(a full block) and `model.layers.2.self_attn.q_b_proj.weight[128:192, 0:64]` (a partial
64x64 block).

**The second config** (`mlx-affine8-g64-alt` only): the same `config.json` except
`q_lora_rank` null (the query is a plain `self_attn.q_proj.weight` `[192, 128]` =
`[heads*(nope+rope), hidden]`, no q_a_proj / q_a_layernorm / q_b_proj), `n_group` 1 and
`topk_group` 1 (no group-limited routing: the 2 experts are the top 2 of all 8 on
`sigmoid(logit) + bias`), `norm_topk_prob` false (each chosen expert's weight is its
`sigmoid(logit)` times 2.5, not renormalised over the 2), and `rope_scaling` null (plain
RoPE: mlx's traditional rope with base 10000, pair `(2i, 2i+1)` rotated by
`pos * 10000**(-2i/16)`, softmax scale `48**-0.5` = {alt_softmax_scale!r}). Everything else is
unchanged, `first_k_dense_replace` 1 and `n_shared_experts` 1 included (mlx-lm {mlx_lm} builds
shared experts whenever `n_shared_experts` is not null, and `0` makes it fail in
`nn.Linear` with a zero input width, so only null would give none). The weights come from the
same per-name generators, so every tensor the two configs share has the same float32 values;
`q_proj` is drawn as `N(0,1)/sqrt(128)` from its own name. Only the layer-0 `down_proj` zero
block applies (there is no `q_b_proj`).

## Variants

| variant | what | files total (bytes) | model.safetensors (bytes) | tensors |
|---|---|---|---|---|
"""

README_NUMERICS = """\

## Exact numeric definitions of what is stored

**MLX affine** (`mlx-affine4-g64`, `mlx-affine8-g32`, `mlx-affine4-g128`,
`mlx-affine8-g64-alt`). A quantized
module `P` with float weight `[..., out, in]` stores `P.weight` U32 `[..., out, in*bits/32]`
(element 0 of each 32/bits-element run in the lowest bits of its uint32, little-endian),
`P.scales` BF16 `[..., out, in/group]`, `P.biases` BF16 `[..., out, in/group]`; the value is
`w = q * scale + bias` per group. The oracle upcasts scales and biases to float32 (exact) and
evaluates `q * scale + bias` in float32. Scales can be negative (mlx picks the group's
larger-magnitude edge as the bias), and an all-zero group stores `scale = bf16(-1e-7)`,
`bias = 0`, `q = 0`. Weights were cast to bfloat16 before quantizing (as mlx-lm's converter
does), so the quantizer saw bf16 values.

**MLX mxfp4** (`mlx-mxfp4`): group 32, `P.weight` U32 `[..., out, in/8]` holding 8 FP4 (E2M1)
codes per uint32, element 0 in the low nibble; code -> value LUT
`[0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6]`; `P.scales` U8
`[..., out, in/32]` is an E8M0 exponent: `w = lut[code] * 2**(byte - 127)`. No biases.
mlx 0.32.4 chose `e = ceil(log2(amax/6))` (0 for an all-zero group).

**Which MLX modules are quantized**: mlx-lm's `quantize_model` quantizes every module that has
`to_quantized` (Linear, Embedding, SwitchLinear, MultiLinear) *if the weight's last dimension
is divisible by the group size*; DeepSeek-V3 has no extra predicate. So `embed_tokens` and
`lm_head` are quantized; the router `mlp.gate` (a plain Module, not a Linear) is never
quantized and stays BF16 `[8, 128]`; `e_score_correction_bias` stays F32; norms stay BF16.
`self_attn.embed_q.weight` is `[H=4, kv_lora=64, nope=32]` (last dim 32) and
`self_attn.unembed_out.weight` is `[H=4, v=32, kv_lora=64]` (last dim 64): see the tables
below for which group sizes left which of them (and `q_b_proj`, in-dim 64) as plain BF16
(the second config's `q_proj` has in-dim 128).
`config.json` lists the base `quantization` `{{group_size, bits, mode}}` (and an identical
`quantization_config`); no per-layer overrides are written, modules left unquantized are just
the ones without a `.scales` tensor.

**MLX layout names**: HF `self_attn.kv_b_proj.weight` `[H*(nope+v), kv_lora]` viewed as
`[H, nope+v, kv_lora]` becomes `self_attn.embed_q.weight = kv[:, :nope, :].transpose(0, 2, 1)`
`[H, kv_lora, nope]` and `self_attn.unembed_out.weight = kv[:, nope:, :]` `[H, v, kv_lora]`
(decode, `L == 1`: `q_lat = q_nope @ embed_q.weight^T` per head, attention with the
kv_a-normalised latent as both key and value, then `out @ unembed_out.weight^T`; prefill:
`k_nope = latent @ embed_q.weight`, `v = latent @ unembed_out.weight^T`; in both the rope part
`scale * q_pe . k_pe` is added to `scale * q_nope . k_nope`). HF
`mlp.experts.{{e}}.{{gate,up,down}}_proj.weight` are stacked along a new leading expert
axis into `mlp.switch_mlp.{{gate,up,down}}_proj.*` `[8, out, in]`.

**HF FP8** (`hf-fp8-f32scales`, `hf-fp8-e8m0`): every `*_proj.weight` /
`kv_a_proj_with_mqa.weight` inside `model.layers.*` (attention projections including
`kv_b_proj`, dense MLP, routed experts, shared experts) is F8_E4M3 (e4m3fn: bias 7, no
infinities, 0x7f/0xff NaN, max 448) with `*.weight_scale_inv` of shape
`[ceil(rows/128), ceil(cols/128)]` (edge blocks are partial: q_a_proj has 64 rows,
kv_a_proj_with_mqa 80 rows, q_b_proj 64 columns). Dequantization:
`w[r, c] = e4m3(code[r, c]) * scale_inv[r // 128, c // 128]` (the stored "scale_inv" is the
multiplier, as in DeepSeek's checkpoints). The router `mlp.gate.weight`, `embed_tokens`,
`lm_head` and norms are BF16, `e_score_correction_bias` is F32.
- `hf-fp8-f32scales`: per block `amax = max|w|` (float32); `scale = float32(amax) / 448` in
  float32; `code = e4m3_rne(clip(float32(w / scale), -448, 448))`; stored F32 `scale`.
- `hf-fp8-e8m0`: `scale = 2**e` with `e` the smallest integer such that `448 * 2**e >= amax`;
  `code = e4m3_rne(w * 2**-e)`; stored as F8_E8M0 (one byte `e + 127`, value
  `2**(byte - 127)`, byte 255 would be NaN). `quantization_config` also carries
  `"scale_fmt": "ue8m0"` (as DeepSeek-V3.1 does).
- All-zero blocks (see above) get scale 1.0 (F32 `1.0` / E8M0 byte 127) and zero codes.

**HF BF16** (`hf-bf16`): everything BF16 (round-to-nearest-even from the float32 base)
except `e_score_correction_bias` F32.

The HF safetensors files were written by the script (the `safetensors` package does not know
F8_E8M0): 8-byte LE header length, JSON header with `__metadata__ {{"format": "pt"}}` then
the tensors by name, padded with spaces to a multiple of 8, data ordered by descending
element size then name (so every tensor is aligned to its element size). MLX variants were
written by mlx (`mx.save_safetensors`, `__metadata__ {{"format": "mlx"}}`). Every variant has a
`model.safetensors.index.json` mapping all tensors to `model.safetensors`.

Checks run by the script on the written files: every `model.safetensors` is parsed by the
script's own strict reader and by the `safetensors` package (names, dtypes, shapes agree);
`mlx_lm.utils.load` on `hf-bf16` yields exactly our float32 HF -> MLX conversion, and on
`hf-fp8-f32scales` agrees with our exact dequantization to within bf16 rounding (mlx-lm's
sanitize dequantizes FP8 through bfloat16). mlx-lm {mlx_lm} cannot load `hf-fp8-e8m0`
correctly: `mx.load` returns F8_E8M0 tensors as raw uint8 and its sanitize then multiplies by
the byte values (e.g. 118) instead of `2**(byte-127)`; the oracle does not use that path.

## Tokenizer (same files in every variant)

Byte-level BPE (GPT-2 style ByteLevel pre-tokenizer with its regex, no prefix space) trained
with `tokenizers` on a fixed English text; vocab exactly 512: ids 0-3 are the special tokens
`<|begin▁of▁sentence|>` (BOS), `<|end▁of▁sentence|>` (EOS), `<|User|>`, `<|Assistant|>`,
then the 256 byte symbols, then 252 merges. The post-processor prepends BOS when special
tokens are added. `tokenizer_config.json` has `tokenizer_class` PreTrainedTokenizerFast and
the chat template

    {template}

## Oracle

`oracle.json` per variant: versions, `seed`, and per prompt the `token_ids`, `logits_file`
(raw little-endian float32, `positions x 512`, row-major: the logits at every prompt
position), `greedy_32` (32 argmax tokens continuing after the prompt, no EOS stop),
`min_top1_margin`, `prefill_vs_decode_max_abs`, `min_router_margin` (smallest gap of any
MoE routing decision: between the two groups' top-2 sums, and between the 2nd and 3rd
expert of the chosen group, on `sigmoid(logit) + bias`; with one group only the latter, over
all 8 experts), `logits_std`; plus `chat`
(`messages`, `rendered` = `apply_chat_template(..., tokenize=False, add_generation_prompt=True)`,
`token_ids` = that string encoded with `add_special_tokens=False`, as mlx-lm's generate does).

Prompts: `sentence` = `tokenizer.encode(text)` (BOS prepended by the post-processor);
`ids` = 20 fixed ids (including 0, 1, 2, 3, 511, twice 511); `chat` = the chat ids above.

How the logits were computed: mlx-lm {mlx_lm} `deepseek_v3.Model` on the CPU with float32
activations. MLX variants: `mlx_lm.utils.load(dir)`, then every floating parameter (BF16
weights, quantization scales/biases, norms) upcast to float32; packed U32 weights and U8
mxfp4 scales untouched (mxfp4's quantized embedding dequantizes to bf16, which is exact for
fp4 * 2**e; checked). HF variants: dequantized in numpy float32 exactly as defined above,
converted to the MLX layout and loaded into an unquantized float32 model (mlx-lm's own
sanitize would dequantize FP8 through bfloat16, which is not used). Logits: KV cache, one
token at a time (mlx-lm's absorbed-MLA `L == 1` path), then greedy decoding continues in
the same cache. The full-prompt prefill pass (`L > 1` path) was checked against the decode
logits: max |delta| < {tol}. A seed was rejected if any variant had a top-1 margin below
{min_margin} (over every prompt position of both passes and every greedy step) or a routing
margin below {min_router}.

## Per-variant oracle summary

| variant | min_top1_margin | prefill_vs_decode_max_abs | min_router_margin | logits std (sentence) |
|---|---|---|---|---|
"""

VARIANT_WHAT = {
    "mlx-affine4-g64": "MLX layout, affine 4-bit, group 64, BF16 scales/biases",
    "mlx-affine8-g32": "MLX layout, affine 8-bit, group 32, BF16 scales/biases",
    "mlx-affine4-g128": "MLX layout, affine 4-bit, group 128, BF16 scales/biases",
    "mlx-mxfp4": "MLX layout, mxfp4 (4-bit E2M1, group 32, U8 E8M0 scales)",
    "hf-fp8-f32scales": "HF/DeepSeek layout, F8_E4M3 128x128 blocks, F32 weight_scale_inv",
    "hf-fp8-e8m0": "HF/DeepSeek layout, F8_E4M3 128x128 blocks, F8_E8M0 weight_scale_inv",
    "hf-bf16": "HF/DeepSeek layout, unquantized BF16",
    "mlx-affine8-g64-alt": ("Second config (plain q_proj, 1 expert group, norm_topk_prob false, "
                            "plain RoPE); MLX layout, affine 8-bit, group 64, BF16 scales/biases"),
}


def write_readme(out, seed, rejected, results):
    import importlib.metadata as md
    import platform

    import mlx.core as mx
    import mlx_lm

    vers = {n: md.version(n) for n in ["numpy", "ml_dtypes", "tokenizers", "transformers", "safetensors"]}
    rej = ""
    if rejected:
        rej = (f" Seeds {rejected[0][0]}..{rejected[-1][0]} were tried first and rejected (some variant's"
               " top-1 or routing margin was too small).")
    from mlx_lm.models.rope_utils import initialize_rope

    rope = initialize_rope(CONFIG["qk_rope_head_dim"], CONFIG["rope_theta"], True,
                           scaling_config=CONFIG["rope_scaling"],
                           max_position_embeddings=CONFIG["max_position_embeddings"])
    rope_freqs = "[" + ", ".join(repr(float(x)) for x in np.array(rope._freqs)) + "]"
    qk = CONFIG["qk_nope_head_dim"] + CONFIG["qk_rope_head_dim"]
    mscale = 0.1 * CONFIG["rope_scaling"]["mscale_all_dim"] * math.log(CONFIG["rope_scaling"]["factor"]) + 1.0
    text = README_HEAD.format(mlx=mx.__version__, mlx_lm=mlx_lm.__version__, python=platform.python_version(),
                              seed=seed, rejected=rej, gain=LM_HEAD_GAIN, rope_freqs=rope_freqs,
                              softmax_scale=qk ** -0.5 * mscale * mscale, alt_softmax_scale=qk ** -0.5,
                              **vers)
    tables = []
    for variant in ALL_VARIANTS:
        vdir = Path(out) / variant
        files = sorted(p for p in vdir.iterdir() if p.is_file())
        total = sum(p.stat().st_size for p in files)
        n, rows = tensor_table(vdir)
        text += (f"| `{variant}` | {VARIANT_WHAT[variant]} | {total} | "
                 f"{(vdir / 'model.safetensors').stat().st_size} | {n} |\n")
        cfg = json.loads((vdir / "config.json").read_text())
        q = cfg.get("quantization_config")
        t = [f"### `{variant}`", "", VARIANT_WHAT[variant] + ".", ""]
        if q is not None:
            t += [f"`quantization_config`: `{json.dumps(q, sort_keys=True)}`", ""]
        t += ["Files:", "", "| file | bytes | sha256 |", "|---|---|---|"]
        t += [f"| {p.name} | {p.stat().st_size} | `{sha256_file(p)}` |" for p in files]
        t += ["", f"Tensors ({n}; `{{L}}` = layer index, `{{e}}` = expert index):", "",
              "| name | dtype | shape | where |", "|---|---|---|---|"] + rows + [""]
        tables.append("\n".join(t))
    text += README_NUMERICS.format(template=CHAT_TEMPLATE, mlx_lm=mlx_lm.__version__, tol=PREFILL_DECODE_TOL,
                                   min_margin=MIN_TOP1_MARGIN, min_router=MIN_ROUTER_MARGIN)
    for variant in ALL_VARIANTS:
        r = results[variant]
        std = next(p["logits_std"] for p in r["prompts"] if p["name"] == "sentence")
        text += (f"| `{variant}` | {r['min_top1_margin']:.4g} | {r['prefill_vs_decode_max_abs']:.3g} | "
                 f"{r['min_router_margin']:.4g} | {std:.3f} |\n")
    text += "\n## Per-variant files and tensors\n\n" + "\n".join(tables)
    write_bytes(Path(out) / "README.md", text.encode("utf-8"))


# ----------------------------------------------------------------------------------------
# The command line and the seed search (the other generators' too)
# ----------------------------------------------------------------------------------------


def start(description, default_out, seed_start, license_text=None):
    """Parses --out / --seed-start, checks the pinned versions and makes the tokenizer files
    (with `license_text` as LICENSE, if given). Returns (args, tok_files)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", default=default_out)
    ap.add_argument("--seed-start", type=int, default=seed_start)
    args = ap.parse_args()
    check_versions()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tok_files = make_tokenizer_files()
    if license_text is not None:
        tok_files["LICENSE"] = license_text.encode("utf-8")
    return args, tok_files


def search_seeds(seed_start, build, keep, prefix=None):
    """Tries seeds from seed_start on: build(tmp, seed) -> (ok, results, reason) in a fresh
    temporary directory; for the first seed that passes, keep(tmp, seed, results, rejected)
    while the directory still exists (rejected: [(seed, reason)] of the seeds before)."""
    rejected = []
    for seed in range(seed_start, seed_start + MAX_SEED_TRIES):
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            ok, results, reason = build(tmp, seed)
            if not ok:
                print(f"seed {seed} rejected: {reason}", file=sys.stderr)
                rejected.append((seed, reason))
                continue
            keep(tmp, seed, results, rejected)
            return
    die(f"no seed in {MAX_SEED_TRIES} tries passed the margins")


def replace_tree(out):
    """A search_seeds `keep` that makes `out` a copy of the temporary tree, with each variant's
    oracle.json (results: variant -> its oracle record)."""
    out = Path(out)

    def keep(tmp, seed, results, _rejected):
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(tmp, out)
        for variant, res in results.items():
            write_json(out / variant / "oracle.json", res)
        print(f"seed {seed}: wrote {', '.join(results)} under {out}")

    return keep


def main():
    repo = Path(__file__).resolve().parents[1]
    args, tok_files = start(__doc__.split("\n")[0],
                            str(repo / "crates/minirun-runtime/tests/data/deepseek-v3"), SEED_START)
    out = Path(args.out)

    def keep(tmp, seed, results, rejected):
        final = {}
        for variant, (res, _extra) in results.items():
            res["seed_search"] = {"first_tried": args.seed_start, "rejected": len(rejected)}
            write_json(Path(tmp) / variant / "oracle.json", res)
            final[variant] = res
        out.mkdir(parents=True, exist_ok=True)
        for variant in ALL_VARIANTS:
            dst = out / variant
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(Path(tmp) / variant, dst)
        write_readme(out, seed, rejected, final)
        verify_output(out, dict(CONFIG))
        print(f"wrote {out} (seed {seed})")

    search_seeds(args.seed_start, lambda tmp, seed: build_all(tmp, seed, tok_files), keep,
                 prefix="deepseek-fixtures-")


if __name__ == "__main__":
    main()
