#!/usr/bin/env python3
"""PyTorch reference for dormouse's training step, to measure training throughput side by side.

Library: PyTorch (CPU), pinned in bench/requirements-reference.txt (torch 2.15.0). PyPI only
serves the CUDA build of torch for Linux (the CPU-only wheel index is not reachable here); its
CPU kernels (MKL sgemm, oneDNN, OpenMP) are the same as the CPU-only build's, it just drags in
about 5 GiB of unused CUDA libraries. No GPU is used. bench/train_throughput.sh runs it in
target/bench-venv, which `tools/python-venv.sh reference` creates from that file on first use.

The model is the one in crates/dormouse/src/model.rs, tensor for tensor (same names, same
shapes, so the parameter count is the same): byte embedding [256, d_model]; per block, Engram
read first where the config says (h + sigmoid(gate(h)) * proj(memory)), then pre-norm causal
MHA with RoPE (rotate-half) and a SwiGLU MLP, RMSNorm built as x / sqrt(mean(x^2) + eps) * w;
final RMSNorm; LM head tied to the embedding. The Engram rows are hashed on the host per batch
with mulxor-v1 (numpy, vectorised, wrapping u64), as the Rust trainer does, and that time is
inside the step time.

The training step is the one in crates/dormouse/src/train.rs and optim.rs: next-byte
cross-entropy, backward, global gradient-norm clipping, AdamW (beta1 0.9, beta2 0.95, eps 1e-8, decoupled weight decay
on rank > 1 parameters only, warmup + cosine learning rate), then the EMA teacher update
(decay 0.99). Parameters are initialised exactly as `seeded_model` (init.rs) does (SplitMix64
streams of rng.rs, vectorised) and the batches are the ones `Corpus::batch` (data.rs) draws for each step, so with the same
seed the losses follow the Rust trainer's step for step (up to float rounding): checked against
`dormouse train` on nano, whose first 8 losses and gradient norms it reproduces to about
1e-6. The JSON line carries the first and last loss for that comparison. Warmup and timed steps
are one run, steps 0 .. W+N-1; the cosine schedule ends at W+N (within the 50 warmup steps of
the learning rate that does not matter).

Attention: `--attn sdpa` (default) uses torch's fused scaled_dot_product_attention, what a
PyTorch user would write; `--attn manual` spells it out as model.rs does (scores, -inf causal
mask, softmax, matmul). `--compile` wraps the loss in torch.compile (inductor, needs a C
compiler); its compile time lands in the warmup steps, reported as first_step_s / warmup_s.

Usage:
    tools/python-venv.sh reference bench/torch_reference.py --preset small --batch 8 --seq 256 \
        --steps 20 --warmup-steps 3 --threads 2

Prints one JSON line on stdout (notes go to stderr): impl, preset, params, batch, seq, steps,
tokens_per_s (batch x seq x steps over the timed steps' total time: batch drawing, hashing,
forward, backward, clipping, AdamW, EMA), threads, first_step_s (step 0, with any compile),
warmup_steps, warmup_s, step_ms_median, tokens_per_s_median (from the median step: steadier
when something else takes the CPU), attn, optimizer, loss_first, loss_last, losses (every
step's, warmup included).
"""

import argparse
import json
import math
import os
import pathlib
import statistics
import sys
import time
import tomllib

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
CORPUS = REPO / "crates" / "dormouse" / "data" / "kjv.txt"

# config.rs defaults (the `small` preset): a key missing from the TOML takes these.
CONFIG_DEFAULTS = {
    "d_model": 384,
    "n_layers": 3,
    "n_heads": 6,
    "mlp_hidden": 1216,
    "max_seq_len": 512,
    "rope_theta": 10000.0,
    "norm_eps": 1e-5,
    "vocab_size": 256,
    "tie_embeddings": True,
    "use_engram": True,
    "engram_orders": [2, 3],
    "engram_rows": 49152,
    "engram_dim": 32,
    "engram_layers": [0],
    "engram_hash": "mulxor-v1",
    "engram_ram": False,
    "engram_slots": 1000000,
}

# train.rs TrainSettings defaults.
LR, WARMUP, MIN_LR, WEIGHT_DECAY, GRAD_CLIP, EMA_DECAY, SEED, EVAL_BYTES = (
    3e-3, 50, 3e-4, 0.01, 1.0, 0.99, 1, 65_536)
VOCAB = 256
INIT_STD = 0.02


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="small",
                   help="crates/dormouse/configs/<preset>.toml (nano, small)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=20, help="timed training steps")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads")
    p.add_argument("--attn", choices=["sdpa", "manual"], default="sdpa")
    p.add_argument("--compile", action="store_true", help="torch.compile the loss")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--log-steps", action="store_true",
                   help="print each step's loss, lr and grad norm to stderr (as the train log)")
    return p.parse_args()


# Importable (bench/torch_generate.py reuses the model): the arguments are parsed only when
# this file is the program; an importer sets the thread variables itself before importing.
ARGS = None
if __name__ == "__main__":
    ARGS = parse_args()
    # Thread counts must be in the environment before torch (OpenMP, MKL) is loaded.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402


def note(*parts):
    print(*parts, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- SplitMix64 (rng.rs)

M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def _mix(z):
    """SplitMix64's output function; works on Python ints and numpy uint64 arrays."""
    if isinstance(z, int):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def stream_state(seed, purpose, step):
    """The starting state of `stream(seed, purpose, step)`."""
    base = _mix((seed ^ (purpose * 0xD1B54A32D192ED03 & M64)) + GAMMA & M64)
    return base ^ (step * GAMMA & M64)


def stream_u64(state, count):
    """The first `count` next_u64() draws of a SplitMix64 at `state`, vectorised: the k-th
    draw mixes state + (k + 1) * GAMMA."""
    k = np.arange(1, count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _mix(np.uint64(state) + k * np.uint64(GAMMA))


def stream_f64(state, count):
    return (stream_u64(state, count) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


# ---------------------------------------------------------------- mulxor-v1 (engram/hash.rs)

HASH_SEED = np.uint64(0x9E3779B97F4A7C15)
ORDER_SALT = 0xD6E8FEB86659FD93
PRIME = np.uint64(0x100000001B3)
PAD_BYTE = 0


def engram_rows(inputs, orders, rows):
    """`rows_for` for a batch of windows with no history: [orders][B, T] int64 row indices.
    `inputs` is uint8 [B, T]; bytes before the start are PAD_BYTE."""
    b, t = inputs.shape
    pad = max(orders) - 1
    context = np.concatenate(
        [np.full((b, pad), PAD_BYTE, dtype=np.uint64), inputs.astype(np.uint64)], axis=1)
    out = []
    with np.errstate(over="ignore"):
        for n in orders:
            h = np.full((b, t), HASH_SEED ^ np.uint64(n * ORDER_SALT & M64), dtype=np.uint64)
            for j in range(n):  # oldest byte first: position t reads context[pad+t-n+1 ..= pad+t]
                first = pad - n + 1 + j
                h = (h ^ context[:, first:first + t]) * PRIME
            h ^= h >> np.uint64(32)
            out.append((h % np.uint64(rows)).astype(np.int64))
    return out


def mulxor_v1(ngram, rows):
    return int(engram_rows(np.frombuffer(ngram, dtype=np.uint8)[None, :], [len(ngram)], rows)
               [0][0, -1])


# The values engram/hash.rs pins (tests::pinned_values_of_mulxor_v1).
assert mulxor_v1(b"ab", 1 << 32) == 0xE786388B, "mulxor-v1 disagrees with engram/hash.rs"
assert mulxor_v1(b"abc", 1000) == 873, "mulxor-v1 disagrees with engram/hash.rs"


# ---------------------------------------------------------------- the model (model.rs)

class Cfg:
    """A model config from a TOML file (`path`), or from an already parsed table (`table`,
    e.g. an export header's [config], with `path` only naming it in errors)."""

    def __init__(self, path, table=None):
        if table is None:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        else:
            raw = table
        unknown = set(raw) - set(CONFIG_DEFAULTS)
        if unknown:
            raise SystemExit(f"{path}: unknown keys {sorted(unknown)}")
        for key, default in CONFIG_DEFAULTS.items():
            setattr(self, key, raw.get(key, default))
        if self.engram_ram:
            raise SystemExit("engram_ram (host-RAM sidecar) is not modelled by this reference")
        if self.engram_hash != "mulxor-v1":
            raise SystemExit(f"unknown engram_hash {self.engram_hash!r}")
        self.head_dim = self.d_model // self.n_heads

    def reads_engram(self, i):
        return self.use_engram and i in self.engram_layers


def expected_params(c):
    """The parameter count, from the config, as model.rs lays out its tensors."""
    d, orders = c.d_model, len(c.engram_orders) if c.use_engram else 0
    n = VOCAB * d + orders * c.engram_rows * c.engram_dim + d
    for i in range(c.n_layers):
        if c.reads_engram(i):
            n += d * orders * c.engram_dim + d + 1
        n += 2 * d + 4 * d * d + 3 * d * c.mlp_hidden
    if not c.tie_embeddings:
        n += VOCAB * d
    return n


def linear(rows, cols):
    return nn.Parameter(torch.empty(rows, cols))


class RmsNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return x / torch.sqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight


class Proj(nn.Module):
    """candle's Linear: weight [out, in], optional bias."""

    def __init__(self, fan_in, fan_out, bias=False):
        super().__init__()
        self.weight = linear(fan_out, fan_in)
        self.bias = nn.Parameter(torch.zeros(fan_out)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Attention(nn.Module):
    def __init__(self, c, attn):
        super().__init__()
        d = c.d_model
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (Proj(d, d) for _ in range(4))
        self.n_heads, self.head_dim, self.attn = c.n_heads, c.head_dim, attn

    def heads(self, x, b, t):
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(self, x, cos, sin, mask):
        b, t, d = x.shape
        q = rope(self.heads(self.q_proj(x), b, t), cos, sin)
        k = rope(self.heads(self.k_proj(x), b, t), cos, sin)
        v = self.heads(self.v_proj(x), b, t)
        if self.attn == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(2, 3) / math.sqrt(self.head_dim) + mask
            out = torch.softmax(scores, dim=-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, t, d))


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = Proj(c.d_model, c.mlp_hidden)
        self.up_proj = Proj(c.d_model, c.mlp_hidden)
        self.down_proj = Proj(c.mlp_hidden, c.d_model)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class EngramRead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.proj = Proj(len(c.engram_orders) * c.engram_dim, c.d_model)
        self.gate = Proj(c.d_model, 1, bias=True)

    def forward(self, h, memory):
        return h + self.proj(memory) * torch.sigmoid(self.gate(h))


class Block(nn.Module):
    def __init__(self, c, i, attn):
        super().__init__()
        self.engram = EngramRead(c) if c.reads_engram(i) else None
        self.attn_norm = RmsNorm(c.d_model, c.norm_eps)
        self.attn = Attention(c, attn)
        self.mlp_norm = RmsNorm(c.d_model, c.norm_eps)
        self.mlp = Mlp(c)

    def forward(self, h, memory, cos, sin, mask):
        if self.engram is not None and memory is not None:
            h = self.engram(h, memory)
        h = h + self.attn(self.attn_norm(h), cos, sin, mask)
        return h + self.mlp(self.mlp_norm(h))


class Table(nn.Module):
    def __init__(self, rows, dim):
        super().__init__()
        self.table = nn.Parameter(torch.empty(rows, dim))


class Dormouse(nn.Module):
    def __init__(self, c, attn):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(VOCAB, c.d_model)
        self.engram = nn.Module()
        if c.use_engram:
            for n in c.engram_orders:
                self.engram.add_module(f"order{n}", Table(c.engram_rows, c.engram_dim))
        self.blocks = nn.ModuleList(Block(c, i, attn) for i in range(c.n_layers))
        self.norm = RmsNorm(c.d_model, c.norm_eps)
        self.lm_head = None if c.tie_embeddings else Proj(c.d_model, VOCAB)
        half = c.head_dim // 2
        inv_freq = torch.tensor(
            [1.0 / c.rope_theta ** (2.0 * i / c.head_dim) for i in range(half)],
            dtype=torch.float32)
        angles = torch.arange(c.max_seq_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, ids, rows):
        """Logits [B, T, 256] for byte ids [B, T] and the Engram rows of each order."""
        b, t = ids.shape
        h = self.embed(ids)
        memory = None
        if self.c.use_engram:
            tables = [getattr(self.engram, f"order{n}").table for n in self.c.engram_orders]
            memory = torch.cat([F.embedding(r, tab) for r, tab in zip(rows, tables)], dim=-1)
        cos, sin = self.cos[:t], self.sin[:t]
        mask = torch.full((t, t), float("-inf")).triu(1)
        for block in self.blocks:
            h = block(h, memory, cos, sin, mask)
        h = self.norm(h)
        if self.lm_head is not None:
            return self.lm_head(h)
        return h @ self.embed.weight.t()


def seeded_init(model, seed):
    """init.rs `seeded_model`: the i-th variable in name order draws from
    stream(seed, purpose::MODEL_INIT=2, i): tables and embedding N(0, 0.02) by Box-Muller, norms 1,
    biases 0, other matrices uniform in +-1/sqrt(fan_in) (fan_in = the last dimension)."""
    named = sorted(model.named_parameters(), key=lambda kv: kv[0].encode())
    with torch.no_grad():
        for i, (name, p) in enumerate(named):
            state, n = stream_state(seed, 2, i), p.numel()
            if name.endswith("norm.weight"):
                values = np.ones(n)
            elif name.endswith(".bias"):
                values = np.zeros(n)
            elif name.endswith(".table") or name == "embed.weight":
                f = stream_f64(state, 2 * n)
                u1 = np.maximum(f[0::2], np.finfo(np.float64).tiny)
                values = INIT_STD * np.sqrt(-2.0 * np.log(u1)) * np.cos(2 * np.pi * f[1::2])
            else:
                bound = 1.0 / math.sqrt(p.shape[-1])
                values = (2.0 * stream_f64(state, n) - 1.0) * bound
            p.copy_(torch.from_numpy(values.astype(np.float32)).view(p.shape))
    return [name for name, _ in named]


# ---------------------------------------------------------------- the training step (train.rs)

def lr_at(step, steps):
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = min((step - WARMUP) / max(steps - WARMUP, 1), 1.0)
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1.0 + math.cos(math.pi * progress))


class Batches:
    """`Corpus::batch`: windows of seq + 1 bytes from the training part (all but the last
    EVAL_BYTES), starts drawn from stream(seed, purpose::BATCHES=1, step) (data.rs)."""

    def __init__(self, data, seq, batch, seed):
        self.data, self.seq, self.batch, self.seed = data, seq, batch, seed
        self.starts = len(data) - EVAL_BYTES - seq
        if self.starts <= 0:
            raise SystemExit("the corpus is too short for this --seq")

    def __call__(self, step):
        draws = stream_u64(stream_state(self.seed, 1, step), self.batch)
        starts = (draws % np.uint64(self.starts)).astype(np.int64)
        return self.data[starts[:, None] + np.arange(self.seq + 1)[None, :]]


def main():
    a = ARGS
    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    cfg = Cfg(REPO / "crates" / "dormouse" / "configs" / f"{a.preset}.toml")
    if a.seq > cfg.max_seq_len:
        raise SystemExit(f"--seq {a.seq} is past max_seq_len {cfg.max_seq_len}")
    model = Dormouse(cfg, a.attn)
    seeded_init(model, a.seed)
    params = sum(p.numel() for p in model.parameters())
    expected = expected_params(cfg)
    if params != expected:
        raise SystemExit(f"parameter count {params} != model.rs layout {expected}")
    note(f"{a.preset}: {params} parameters (model.rs layout: {expected}), torch "
         f"{torch.__version__}, {torch.get_num_threads()} threads, attn={a.attn}, "
         f"compile={a.compile}")

    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY},
              {"params": no_decay, "weight_decay": 0.0}]
    try:
        optim = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95), eps=1e-8, fused=True)
        optim_kind = "fused"
    except (RuntimeError, ValueError, TypeError):
        optim = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95), eps=1e-8, foreach=True)
        optim_kind = "foreach"
    params_list = list(model.parameters())
    ema = [p.detach().clone() for p in params_list]

    def loss_fn(ids, targets, rows):
        logits = model(ids, rows)
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    if a.compile:
        loss_fn = torch.compile(loss_fn)

    data = np.fromfile(CORPUS, dtype=np.uint8)
    batches = Batches(data, a.seq, a.batch, a.seed)
    total_steps = a.warmup_steps + a.steps

    def step(i):
        windows = batches(i)
        inputs = windows[:, :-1]
        rows = [torch.from_numpy(r) for r in engram_rows(inputs, cfg.engram_orders,
                                                         cfg.engram_rows)] \
            if cfg.use_engram else None
        ids = torch.from_numpy(inputs.astype(np.int64))
        targets = torch.from_numpy(windows[:, 1:].astype(np.int64))
        optim.zero_grad(set_to_none=True)
        loss = loss_fn(ids, targets, rows)
        value = loss.item()
        if not math.isfinite(value):
            raise SystemExit(f"the loss became {value} at step {i}")
        loss.backward()
        grads = [p.grad for p in params_list if p.grad is not None]
        with torch.no_grad():
            norm = torch.linalg.vector_norm(
                torch.stack(torch._foreach_norm(grads))).item()
            if GRAD_CLIP > 0 and norm > GRAD_CLIP:
                torch._foreach_mul_(grads, GRAD_CLIP / norm)
            lr = lr_at(i, total_steps)
            for g in optim.param_groups:
                g["lr"] = lr
            optim.step()
            torch._foreach_lerp_(ema, [p.detach() for p in params_list], 1.0 - EMA_DECAY)
        if a.log_steps:
            note(json.dumps({"step": i, "loss": value, "lr": lr, "grad_norm": norm}))
        return value

    losses, times = [], []
    warm_t0 = time.perf_counter()
    first_step_s = None
    for i in range(total_steps):
        t0 = time.perf_counter()
        losses.append(step(i))
        dt = time.perf_counter() - t0
        if i == 0:
            first_step_s = dt
        if i == a.warmup_steps - 1:
            warmup_s = time.perf_counter() - warm_t0
        if i >= a.warmup_steps:
            times.append(dt)
    if a.warmup_steps == 0:
        warmup_s = 0.0
    timed = sum(times)
    tokens = a.batch * a.seq * a.steps
    record = {
        "impl": f"torch {torch.__version__}" + (" compile" if a.compile else ""),
        "preset": a.preset,
        "params": params,
        "batch": a.batch,
        "seq": a.seq,
        "steps": a.steps,
        "tokens_per_s": round(tokens / timed, 1) if timed > 0 else None,
        "threads": a.threads,
        "first_step_s": round(first_step_s, 4) if first_step_s is not None else None,
        "warmup_steps": a.warmup_steps,
        "warmup_s": round(warmup_s, 4),
        "step_ms_median": round(1000 * statistics.median(times), 2) if times else None,
        # From the median step: steadier than the mean when something else takes the CPU.
        "tokens_per_s_median": (round(a.batch * a.seq / statistics.median(times), 1)
                                if times else None),
        "attn": a.attn,
        "optimizer": f"AdamW {optim_kind}",
        "loss_first": round(losses[0], 5) if losses else None,
        "loss_last": round(losses[-1], 5) if losses else None,
        "losses": [round(v, 7) for v in losses],
    }
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
