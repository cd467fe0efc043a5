"""An MLX affine-quantized DeepSeek-V3 checkpoint as a BF16 GGUF, through llama.cpp's own converter.

    mlx_to_gguf.py MLX_DIR OUT.gguf

Run with PYTHONPATH naming llama.cpp's source folder and its gguf-py (bench/stream_under_budget.sh
does), in an environment with torch (tools/python-venv.sh torch-oracle). llama.cpp's converter
reads Hugging Face checkpoints; this one hands it the MLX checkpoint's tensors in Hugging Face's
names and shapes, each dequantized only when the converter writes it, so no unquantized copy of
the checkpoint is ever on disk:
  - every affine-quantized matrix (`X.weight` packed in uint32, `X.scales`, `X.biases`, one scale
    and bias per group of `group_size` columns) becomes `scale * code + bias` per group,
    computed in f32 as minirun computes it and rounded once to BF16;
  - the stacked experts `mlp.switch_mlp.P.weight` ([experts, rows, columns]) become one
    `mlp.experts.E.P.weight` per expert, which the converter stacks again;
  - the attention's `embed_q` ([heads, kv_lora, nope]) and `unembed_out` ([heads, v, kv_lora]),
    mlx-lm's split of `kv_b_proj`, are joined back into `kv_b_proj` ([heads * (nope + v), kv_lora]).
The synthetic byte-level BPE tokenizer is unknown to the converter's table of pre-tokenizer
hashes, so it is declared as gpt-2 (a byte-level BPE with the GPT-2 pre-tokenizer regex, which is
what it is). The GGUF is written to OUT.gguf.partial and renamed when complete.
"""

import os
import re
import sys

import torch

import conversion.base as base
import convert_hf_to_gguf


def dequantize(codes, scales, biases, bits, group_size):
    """`scale * code + bias` per group; codes packed little-endian in uint32 words."""
    per_word = 32 // bits
    words = codes.view(torch.int32)
    # Scalar shifts only: the converter's lazy tensors take no eager tensor operands.
    mask = (1 << bits) - 1
    values = torch.stack([(words >> (bits * j)) & mask for j in range(per_word)], dim=-1)
    columns = words.shape[-1] * per_word
    grouped = values.reshape(*words.shape[:-1], columns // group_size, group_size).to(torch.float32)
    weight = grouped * scales.to(torch.float32).unsqueeze(-1) + biases.to(torch.float32).unsqueeze(-1)
    return weight.reshape(*words.shape[:-1], columns).to(torch.bfloat16)


class SharedStack:
    """One stacked expert tensor that every expert's slice shares: read and dequantized once, not
    once per expert, and let go when the last expert has taken its slice."""

    def __init__(self, load, experts):
        self.load, self.experts, self.taken, self.stack = load, experts, 0, None

    def expert(self, e):
        if self.stack is None:
            self.stack = self.load()
        piece = self.stack[e]
        self.taken += 1
        if self.taken == self.experts:
            self.stack = None
        return piece


def hugging_face_tensors(tensors, hparams, bits, group_size):
    """The converter's name -> loader map, rewritten from MLX's layout into Hugging Face's."""
    out = {}
    for name, load in tensors.items():
        if name.endswith((".scales", ".biases")) or ".self_attn.embed_q." in name:
            continue
        stem = name[: -len(".weight")] if name.endswith(".weight") else None
        quantized = stem is not None and f"{stem}.scales" in tensors
        if quantized:
            s, b = tensors[f"{stem}.scales"], tensors[f"{stem}.biases"]
            load = lambda w=load, s=s, b=b: dequantize(w(), s(), b(), bits, group_size)
        switch = re.fullmatch(r"(model\.layers\.\d+\.mlp)\.switch_mlp\.(\w+)\.weight", name)
        if switch:
            stacked = SharedStack(load, hparams["n_routed_experts"])
            for expert in range(stacked.experts):
                out[f"{switch[1]}.experts.{expert}.{switch[2]}.weight"] = (
                    lambda stacked=stacked, e=expert: stacked.expert(e)
                )
            continue
        attention = re.fullmatch(r"(model\.layers\.\d+\.self_attn)\.unembed_out\.weight", name)
        if attention:
            embed_q = tensors[f"{attention[1]}.embed_q.weight"]

            def kv_b(embed_q=embed_q, unembed_out=load):
                k = embed_q().to(torch.bfloat16).transpose(1, 2)  # [heads, nope, kv_lora]
                v = unembed_out()  # [heads, v, kv_lora]
                joined = torch.cat([k, v], dim=1)
                return joined.reshape(joined.shape[0] * joined.shape[1], joined.shape[2])

            out[f"{attention[1]}.kv_b_proj.weight"] = kv_b
            continue
        out[name] = load
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    source, target = sys.argv[1], sys.argv[2]
    original_dequant = base.ModelBase.dequant_model

    def dequant_mlx(self):
        quantization = self.hparams.pop("quantization", None)
        self.hparams.pop("quantization_config", None)
        if quantization is None or quantization.get("mode", "affine") != "affine":
            sys.exit(f"{source}: not an MLX affine-quantized checkpoint (config.json 'quantization')")
        self.model_tensors = hugging_face_tensors(
            self.model_tensors, self.hparams, quantization["bits"], quantization["group_size"]
        )
        original_dequant(self)

    base.ModelBase.dequant_model = dequant_mlx
    # The converter reads no U32 tensors (torch's uint32 is partial); MLX packs its codes in them,
    # and only their bits matter here.
    base.LazyTorchTensor._dtype_str_map.setdefault("U32", torch.int32)
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    partial = target + ".partial"
    sys.argv = ["convert_hf_to_gguf.py", source, "--outtype", "bf16", "--outfile", partial]
    convert_hf_to_gguf.main()
    os.replace(partial, target)


if __name__ == "__main__":
    main()
