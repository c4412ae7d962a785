#!/usr/bin/python3
"""wlb4d against PyTorch on the same Llama model, the same tokens.

Builds the model of a wlb4d deck in PyTorch (the deck as `wlb4d DECK
--print-config` resolves it), trains both on the same packed micro-batches of
the deck's HDF5 dataset, alternating wlb4d and PyTorch runs (k rounds, the
same steps each), and prints one table with tokens/s side by side, the ratio,
and GFLOP/s under ONE FLOP formula (model_flops below) for both columns.

The model (lib/include/wlb4d/model/transformer.hpp, params.hpp): embedding →
L × [RMSNorm → attention (RoPE half-split, GQA: query head h reads KV head
h / (heads/kv_heads), scale 1/sqrt(D), document-causal mask) → residual →
RMSNorm → SwiGLU MLP → residual] → RMSNorm → LM head (untied from the
embedding, no biases). Init: wlb4d's own weights, recomputed here from its
counter-based RNG (params.cpp init_normal: N(0, init_std), wo and w_down
scaled by 1/sqrt(2·layers), norm weights 1), so the losses agree step by step
to fp32 accuracy, not only ≈ ln(vocab) at step 1. Loss: Σ CE over the
step's target tokens / their count; padded vocabulary columns (model.vocab_size
above the dataset's) are masked out of the softmax, as wlb4d does. AdamW with
the deck's lr schedule (linear warm-up, cosine to min_lr), betas, eps, weight
decay on matrices only, global-norm clip; fp32 (--precision bf16: below).

Tokens: wlb4d runs with --data.shuffle=false, so its stream is the dataset's
document order; the fixed packer concatenates the documents and cuts every
train.max_seq_len tokens, train.micro_batches micro-batches per step. Each
piece (a document, or the part of it inside one micro-batch) is its own
document for the mask, the positions (restarting at 0) and the labels (a
piece's last token has no target) — exactly batch.cpp's rule, rebuilt here
from /doc_offsets. PyTorch 1.13 has no fused attention for CPU, so it computes
the full T×T scores and masks them (document-causal; --attention masked, the
default where torch has no SDPA); wlb4d's kernel skips the masked pairs. Hence both FLOP counts are printed:
  full:   6·N_mm + 12·L·d·T per token (every T×T pair, what PyTorch computes)
  causal: 6·N_mm·tokens + 12·L·d·pairs, pairs = Σ_pieces n(n+1)/2 (what wlb4d
          prints: model::model_flops)
N_mm = parameters used in matmuls (LM head included, embedding lookup excluded).

  /usr/bin/python3 bench/torch_compare.py inputs/bench-quickstart.ini --rounds 3 --steps 4
  /usr/bin/python3 bench/torch_compare.py --self-test   # parity checks (ctest torch_compare_selftest)

GPU mode (a CUDA PyTorch ≥ 2.0; the lent GPU machine's gpu-check.sh runs it
beside the bundle's wlb4d, docs/gpu.md):
  --device cuda          model, micro-batches, AdamW on GPU 0; the timed region
                         of every step is bracketed by torch.cuda.synchronize();
                         the first step (CUDA context, cuBLAS handles, kernel
                         selection) is left out of the rates, as on the CPU.
  --precision bf16       torch.autocast(device, bfloat16) around forward + loss:
                         GEMM operands bf16, fp32 master weights, AdamW state,
                         norms and cross-entropy (the logits are widened before
                         it) — wlb4d's train.precision = bf16, which the wlb4d
                         column gets too. Default fp32 (fp32 GEMMs: PyTorch
                         leaves TF32 off for matmuls).
  --attention sdpa       F.scaled_dot_product_attention on [1][H][T][D] with
                         the micro-batch's document-causal boolean attn_mask
                         (True = attend; the masked path's mask negated, one
                         construction: doc_causal_mask), KV heads expanded for
                         GQA, so CUDA can pick a fused backend that takes a
                         mask (memory-efficient; flash takes none). masked: the full T×T
                         scores and masked_fill. Default sdpa where torch has
                         it, else masked. Same losses either way.
  --peak-tflops X        MFU = causal-pairs FLOP/s / X for both columns; without
                         it, on CUDA, the device table row of
                         torch.cuda.get_device_name(0) from `wlb4d-plan
                         --devices NAME` (next to --wlb4d): bf16 peak for
                         --precision bf16, fp32 otherwise.
  --batches FILE.npz     the packed micro-batches from FILE (written by
                         --write-batches where h5py is), so the GPU machine's
                         Python needs torch and numpy only, no h5py; wlb4d
                         still reads the deck's HDF5 dataset itself.
  --write-batches FILE.npz   writes --steps steps of the deck's packed
                         micro-batches (needs h5py and numpy, not torch); the
                         GPU bundle carries one (scripts/gpu-bundle.sh).

  python3 torch_compare.py inputs/bench-gpt2-small.ini --device cuda --precision bf16 \
      --batches data/peer-gpt2-small.npz --steps 4 --rounds 1 --wlb4d bin/wlb4d \
      --mpiexec bin/mpiexec --data.train=data/sotu-train.h5 --comm.backend=nccl

Without torch (or h5py where the batches come from the HDF5 file) it prints a
`skipped:` line and exits 0 (77 under --self-test, ctest's skip code).
"""
import argparse
import atexit
import configparser
import csv
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def model_flops(layers, heads, head_dim, n_mm, tokens, pairs):
    """The one FLOP formula of both columns (model::model_flops):
    6·N_mm per token (forward + backward of every matmul) + 12·L·H·D per
    attended query/key pair (QKᵀ and PV, forward 4, backward 8 FLOP per pair
    and head dimension). pairs = T² per micro-batch for full attention, Σ n(n+1)/2
    over the pieces for the document-causal mask."""
    return 6.0 * n_mm * tokens + 12.0 * layers * heads * head_dim * pairs


def matmul_params(m, vocab):
    """N_mm of the deck's model (transformer.cpp matmul_params): per layer
    wq, wk, wv, wo, w_gate, w_up, w_down, plus the LM head."""
    d, D = m["d_model"], m["d_model"] // m["heads"]
    q, kv, F = m["heads"] * D, m["kv_heads"] * D, m["ffn_hidden"]
    per_layer = q * d + 2 * kv * d + d * q + 3 * F * d
    return m["layers"] * per_layer + vocab * d


def print_config(wlb4d, deck, overrides):
    out = subprocess.run([wlb4d, deck, "--print-config"] + overrides, check=True, capture_output=True, text=True).stdout
    cp = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=None)
    cp.read_string(out)
    return cp


def deck_model(cp, data_vocab):
    g = lambda k: cp.get("model", k)
    m = {k: int(g(k)) for k in ("layers", "d_model", "heads", "kv_heads", "ffn_hidden", "vocab_size")}
    m.update(rope_theta=float(g("rope_theta")), norm_eps=float(g("norm_eps")), init_std=float(g("init_std")))
    m["vocab"] = m["vocab_size"] if m["vocab_size"] > 0 else data_vocab
    m["data_vocab"] = data_vocab
    return m


def packed_steps(h5path, steps, micro_batches, seq_len):
    """The fixed packer on the stream in file order: per step, per micro-batch,
    (token ids, piece lengths). A document continues into the next
    micro-batch (and step), as the packer's carry does."""
    import h5py
    import numpy as np
    with h5py.File(h5path, "r") as f:
        offs = f["doc_offsets"][:].astype(np.int64)
        need = steps * micro_batches * seq_len
        if offs[-1] < need:
            raise SystemExit(f"torch_compare: {h5path} has {offs[-1]} tokens, fewer than {need} "
                             f"({steps} steps x {micro_batches} x {seq_len}); use fewer --steps")
        toks = f["tokens"][:need].astype(np.int64)
        vocab = int(f.attrs["vocab_size"])
    out, mb_start = [], 0
    # Document boundaries inside [0, need), cut at every micro-batch boundary.
    cuts = sorted(set(int(o) for o in offs if 0 < o < need) | set(range(0, need + 1, seq_len)))
    for s in range(steps):
        step = []
        for _ in range(micro_batches):
            a, b = mb_start, mb_start + seq_len
            bounds = [c for c in cuts if a <= c <= b]
            step.append((toks[a:b], [y - x for x, y in zip(bounds, bounds[1:])]))
            mb_start = b
        out.append(step)
    return out, vocab


def save_batches(path, batches, vocab, micro_batches, seq_len, source):
    """The packed micro-batches as an .npz (tokens int32, piece lengths, and
    the packing they came from), for a machine whose Python has no h5py."""
    import numpy as np
    flat = [mb for step in batches for mb in step]
    np.savez_compressed(path, tokens=np.concatenate([np.asarray(ids) for ids, _ in flat]).astype(np.int32),
                        pieces=np.array([n for _, p in flat for n in p], dtype=np.int32),
                        counts=np.array([len(p) for _, p in flat], dtype=np.int32),
                        data_vocab=vocab, micro_batches=micro_batches, seq_len=seq_len,
                        steps=len(batches), source=os.path.basename(source))


def load_batches(path, steps, micro_batches, seq_len):
    """save_batches' file back as packed_steps returns it; refuses a file of
    another packing (micro_batches, max_seq_len) or with fewer steps."""
    import numpy as np
    z = np.load(path)
    have = (int(z["steps"]), int(z["micro_batches"]), int(z["seq_len"]))
    if have[1:] != (micro_batches, seq_len) or have[0] < steps:
        raise SystemExit(f"torch_compare: {path} holds {have[0]} steps x {have[1]} x {have[2]} tokens; "
                         f"the deck needs {steps} x {micro_batches} x {seq_len}")
    toks, pieces, counts = z["tokens"].astype(np.int64), z["pieces"].tolist(), z["counts"].tolist()
    out, t, p = [], 0, 0
    for _ in range(steps):
        step = []
        for _ in range(micro_batches):
            n = counts[len(out) * micro_batches + len(step)]
            step.append((toks[t:t + seq_len], pieces[p:p + n]))
            t, p = t + seq_len, p + n
        out.append(step)
    return out, int(z["data_vocab"])


def pairs_of(pieces, full):
    T = sum(pieces)
    return T * T if full else sum(n * (n + 1) // 2 for n in pieces)


# ---------------------------------------------------------------- PyTorch model
def build_torch(m, seed, same_init=True, attention="masked", sdpa=None, init_device=None):
    """The Llama model from wlb4d's initial weights. attention: "masked"
    (full T×T scores, masked_fill with the mask True = masked) or "sdpa"
    (sdpa(q, k, v, attn_mask) with the mask True = attend; sdpa defaults to
    F.scaled_dot_product_attention, the self-test passes a shim on a torch
    without it). init_device (a CUDA device): wlb4d's RNG runs there
    (wlb4d_normal_torch) instead of in numpy, which takes about half a minute
    for GPT-2 small's 162 M values."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as Fn

    d, H, Hkv = m["d_model"], m["heads"], m["kv_heads"]
    D = d // H
    sdpa_fn = sdpa or getattr(Fn, "scaled_dot_product_attention", None)
    if attention == "sdpa" and sdpa_fn is None:
        raise SystemExit(f"torch_compare: --attention sdpa needs torch >= 2.0 (this is {torch.__version__})")

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + m["norm_eps"]) * self.weight

    def rope(x, cos, sin):  # x [T][H][D], half-split pairing (layers.hpp)
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.mlp_norm = RMSNorm(), RMSNorm()
            self.wq = nn.Linear(d, H * D, bias=False)
            self.wk = nn.Linear(d, Hkv * D, bias=False)
            self.wv = nn.Linear(d, Hkv * D, bias=False)
            self.wo = nn.Linear(H * D, d, bias=False)
            self.w_gate = nn.Linear(d, m["ffn_hidden"], bias=False)
            self.w_up = nn.Linear(d, m["ffn_hidden"], bias=False)
            self.w_down = nn.Linear(m["ffn_hidden"], d, bias=False)

        def forward(self, h, cos, sin, mask):
            T = h.shape[0]
            n = self.attn_norm(h)
            q = rope(self.wq(n).view(T, H, D), cos, sin).transpose(0, 1)          # [H][T][D]
            k = rope(self.wk(n).view(T, Hkv, D), cos, sin).transpose(0, 1)        # [Hkv][T][D]
            v = self.wv(n).view(T, Hkv, D).transpose(0, 1)
            if Hkv != H:  # GQA: query head h reads KV head h // (H/Hkv)
                # Expanded for SDPA too rather than enable_gqa (torch >= 2.5),
                # which not every fused backend takes together with an attn_mask.
                k, v = k.repeat_interleave(H // Hkv, 0), v.repeat_interleave(H // Hkv, 0)
            if attention == "sdpa":
                # RoPE's fp32 cos/sin promote q and k out of autocast's bf16:
                # one dtype for the three operands (v's: bf16 under autocast),
                # [1][H][T][D] because the fused CUDA backends take 4-D only.
                q, k = q.to(v.dtype), k.to(v.dtype)
                o = sdpa_fn(q[None], k[None], v[None], attn_mask=mask)[0]
            else:
                s = torch.matmul(q, k.transpose(1, 2)) * (1.0 / math.sqrt(D))      # full T×T
                s = s.masked_fill(mask, float("-inf"))
                o = torch.matmul(torch.softmax(s, dim=-1), v)
            o = o.transpose(0, 1).reshape(T, H * D)
            a = h + self.wo(o)
            n2 = self.mlp_norm(a)
            return a + self.w_down(Fn.silu(self.w_gate(n2)) * self.w_up(n2))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(m["vocab"], d)
            self.layers = nn.ModuleList(Layer() for _ in range(m["layers"]))
            self.final_norm = RMSNorm()
            self.lm_head = nn.Linear(d, m["vocab"], bias=False)  # untied

        def forward(self, ids, labels, cos, sin, mask):
            h = self.embed(ids)
            for layer in self.layers:
                h = layer(h, cos, sin, mask)
            logits = self.lm_head(self.final_norm(h))[:, : m["data_vocab"]]  # padded columns: not in the softmax
            logits = logits.float()  # cross-entropy in fp32 under bf16 autocast, as wlb4d's bf16 mode
            return Fn.cross_entropy(logits, labels, ignore_index=-1, reduction="sum")

    torch.manual_seed(seed)
    model = Llama()
    resid = 1.0 / math.sqrt(2.0 * m["layers"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() != 2:
                continue  # norm weights: 1 (RMSNorm's init)
            std = m["init_std"] * (resid if name.endswith(("wo.weight", "w_down.weight")) else 1.0)
            if same_init and init_device is not None:
                p.copy_((std * wlb4d_normal_torch(seed, wlb4d_name(name), p.numel(), init_device)).float().view(p.shape))
            elif same_init:
                w = (std * wlb4d_normal(seed, wlb4d_name(name), p.numel())).astype("float32")
                p.copy_(torch.from_numpy(w).view(p.shape))
            else:
                p.normal_(0.0, std)
    return model


def wlb4d_name(torch_name):
    """The wlb4d registry name of a parameter (params.cpp param_shapes)."""
    n = torch_name[: -len(".weight")] if torch_name.endswith(".weight") else torch_name
    if n in ("embed", "lm_head"):
        return n + ".weight"
    return re.sub(r"^layers\.(\d+)\.(wq|wk|wv|wo)$", r"layers.\1.attn.\2",
                  re.sub(r"^layers\.(\d+)\.(w_gate|w_up|w_down)$", r"layers.\1.mlp.\2", n))


def _splitmix64(x):  # core/hash.hpp, on numpy uint64 (wrapping arithmetic)
    import numpy as np
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _fnv1a(name):
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _splitmix64_torch(x):
    """_splitmix64 on int64 tensors: the same bits, since int64 + and *
    wrap like uint64's; >> is arithmetic on int64, so the sign-filled top bits
    are masked off to make it logical."""
    def i64(c):  # a uint64 constant as the int64 with its bits
        return c - (1 << 64) if c >= 1 << 63 else c

    def shr(v, k):
        return (v >> k) & ((1 << (64 - k)) - 1)
    x = x + i64(0x9E3779B97F4A7C15)
    x = (x ^ shr(x, 30)) * i64(0xBF58476D1CE4E5B9)
    x = (x ^ shr(x, 27)) * i64(0x94D049BB133111EB)
    return x ^ shr(x, 31)


def wlb4d_normal_torch(seed, name, n, device):
    """wlb4d_normal computed with torch on device (fp64 result there)."""
    import numpy as np
    import torch
    with np.errstate(over="ignore"):
        key = int(_splitmix64(np.uint64(seed) ^ _splitmix64(np.array([_fnv1a(name)], dtype=np.uint64)))[0])
    key = key - (1 << 64) if key >= 1 << 63 else key
    i = torch.arange(n, dtype=torch.int64, device=device)
    mant = (1 << 53) - 1  # >> 11 of a uint64: its top 53 bits
    u1 = (((_splitmix64_torch(key + 2 * i) >> 11) & mant).double() + 0.5) / 9007199254740992.0
    u2 = ((_splitmix64_torch(key + 2 * i + 1) >> 11) & mant).double() / 9007199254740992.0
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)


def wlb4d_normal(seed, name, n):
    """wlb4d's layout-independent init (params.cpp init_normal): Box-Muller on
    two splitmix64 draws keyed by (seed, FNV-1a of the name, global index), so
    the PyTorch model starts from wlb4d's very weights (row-major = global index
    on one rank). fp64; the caller rounds std·value to fp32, as wlb4d does."""
    import numpy as np
    h = _fnv1a(name)
    with np.errstate(over="ignore"):
        key = _splitmix64(np.uint64(seed) ^ _splitmix64(np.array([h], dtype=np.uint64)))[0]
        out = np.empty(n, dtype=np.float64)
        chunk = 1 << 22
        for a in range(0, n, chunk):
            i = np.arange(a, min(n, a + chunk), dtype=np.uint64)
            u1 = ((_splitmix64(key + np.uint64(2) * i) >> np.uint64(11)).astype(np.float64) + 0.5) / 9007199254740992.0
            u2 = (_splitmix64(key + np.uint64(2) * i + np.uint64(1)) >> np.uint64(11)).astype(np.float64) / 9007199254740992.0
            out[a: a + len(i)] = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return out


def doc_causal_mask(pieces):
    """[T][T] bool, True = masked: key j is hidden from query i unless both
    are in one piece and j <= i. The one construction both attention paths use."""
    import torch
    T = sum(pieces)
    piece = torch.repeat_interleave(torch.arange(len(pieces)), torch.tensor(pieces))
    i = torch.arange(T)
    return (piece[:, None] != piece[None, :]) | (i[None, :] > i[:, None])


def attention_mask(pieces, attention):
    """The mask the attention path takes: masked_fill's (True = masked) for
    "masked", its negation for SDPA (a boolean attn_mask is True = attend)."""
    mask = doc_causal_mask(pieces)
    return ~mask if attention == "sdpa" else mask


def sdpa_shim(q, k, v, attn_mask=None):
    """F.scaled_dot_product_attention's contract (default scale 1/sqrt(D),
    boolean attn_mask True = attend) in plain ops, so that a torch without
    SDPA (Debian's 1.13) still runs the sdpa branch: its mask and its operands."""
    import torch
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    s = s.masked_fill(~attn_mask, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def torch_inputs(ids, pieces, theta, D, attention="masked"):
    """ids, labels, RoPE cos/sin [T][1][D/2] and the attention path's mask [T][T] of a micro-batch."""
    import torch
    T = len(ids)
    start = torch.repeat_interleave(torch.cumsum(torch.tensor([0] + pieces[:-1]), 0), torch.tensor(pieces))
    pos = (torch.arange(T) - start).double()
    ids_t = torch.as_tensor(ids)
    labels = torch.full((T,), -1, dtype=torch.long)
    last = torch.cumsum(torch.tensor(pieces), 0) - 1
    tgt = torch.ones(T, dtype=torch.bool)
    tgt[last] = False
    labels[:-1][tgt[:-1]] = ids_t[1:][tgt[:-1]]
    inv = theta ** (-2.0 * torch.arange(D // 2, dtype=torch.float64) / D)
    ang = pos[:, None] * inv[None, :]
    cos, sin = ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]
    return ids_t, labels, cos, sin, attention_mask(pieces, attention), int(tgt.sum())


def lr_at(o, step, total):  # optim/adamw.cpp lr_at
    if o["warmup_steps"] > 0 and step < o["warmup_steps"]:
        return o["lr"] * (step + 1) / o["warmup_steps"]
    decay = total - 1 - o["warmup_steps"]
    if decay <= 0:
        return o["lr"]
    p = min(1.0, max(0.0, (step - o["warmup_steps"]) / decay))
    return o["min_lr"] + 0.5 * (o["lr"] - o["min_lr"]) * (1 + math.cos(math.pi * p))


_INIT = {}


def run_torch(m, opt, batches, seed, threads, device="cpu", precision="fp32", attention="masked", sdpa=None):
    """Trains len(batches) steps; returns per-step (seconds, loss). On CUDA
    each step's time lies between two torch.cuda.synchronize() calls, so it
    is the device's work, not the launch queue's."""
    import contextlib
    import torch
    torch.set_num_threads(threads)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    key = (seed, tuple(sorted((k, v) for k, v in m.items())))
    if key in _INIT:  # later rounds: the same initial weights, without recomputing the RNG
        model = build_torch(m, seed, same_init=False, attention=attention, sdpa=sdpa)
        model.load_state_dict(_INIT[key])
    else:
        model = build_torch(m, seed, attention=attention, sdpa=sdpa, init_device=dev if cuda else None)
        _INIT[key] = {k: v.clone() for k, v in model.state_dict().items()}
    model.to(dev)  # fp32 parameters: the master weights AdamW updates
    dec = [p for p in model.parameters() if p.dim() == 2]
    nodec = [p for p in model.parameters() if p.dim() != 2]
    adam = torch.optim.AdamW([{"params": dec, "weight_decay": opt["weight_decay"]},
                              {"params": nodec, "weight_decay": 0.0}],
                             lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
    D = m["d_model"] // m["heads"]
    prepared = [[tuple(x.to(dev) if torch.is_tensor(x) else x
                       for x in torch_inputs(ids, pieces, m["rope_theta"], D, attention))
                 for ids, pieces in step] for step in batches]
    # bf16: autocast around forward + loss only; backward replays its casts,
    # gradients land in the fp32 parameters (wlb4d's train.precision = bf16).
    cast = ((lambda: torch.autocast(device_type=dev.type, dtype=torch.bfloat16)) if precision == "bf16"
            else contextlib.nullcontext)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out = []
    for s, step in enumerate(prepared):
        sync()
        t0 = time.perf_counter()
        for g in adam.param_groups:
            g["lr"] = lr_at(opt, s, len(prepared))
        adam.zero_grad(set_to_none=False)
        n_tgt = sum(mb[5] for mb in step)
        parts = []
        for ids, labels, cos, sin, mask, _ in step:
            with cast():
                loss = model(ids, labels, cos, sin, mask) / n_tgt
            loss.backward()
            parts.append(loss.detach())  # read after the step: no device sync per micro-batch
        if opt["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), opt["grad_clip"])
        adam.step()
        sync()
        dt = time.perf_counter() - t0
        out.append((dt, sum(float(x) for x in parts)))
    return out, model


def torch_blas():
    """The BLAS PyTorch's fp32 GEMMs actually run (Debian's torch is built with
    BLAS_INFO=generic: libblas.so.3, i.e. whatever the alternatives point to)
    and, for OpenBLAS, the kernel it picked (OPENBLAS_CORETYPE applies to both columns)."""
    import ctypes
    import torch
    a = torch.ones(64, 64)
    (a @ a).sum()
    libs = sorted({ln.split()[-1] for ln in open("/proc/self/maps")
                   if re.search(r"blas|mkl|dnnl", ln.split()[-1], re.I)})
    core = ""
    for lib in libs:
        if "openblas" in os.path.basename(lib):
            try:
                f = ctypes.CDLL(lib).openblas_get_corename
                f.restype = ctypes.c_char_p
                core = f" (OpenBLAS core {f().decode()})"
            except (OSError, AttributeError):
                pass
    return " ".join(os.path.basename(x) for x in libs) + core


def torch_matmul_params(model):
    return sum(mod.weight.numel() for mod in model.modules() if type(mod).__name__ == "Linear")


# ---------------------------------------------------------------- wlb4d
def run_wlb4d(args, deck, overrides, steps, workdir, tag):
    csvf = os.path.join(args.csvdir, f"wlb4d-{tag}.csv")
    if os.path.exists(csvf):
        os.remove(csvf)
    cmd = ([args.wlb4d] if args.ranks == 0 else [args.mpiexec, "-n", "1", args.wlb4d]) + [
        deck, f"--train.steps={steps}", "--data.shuffle=false", f"--log.csv_file={csvf}",
        "--train.eval_every=0", "--checkpoint.at_end=false", "--checkpoint.resume=never",
        "--checkpoint.every=0"] + overrides
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), KOKKOS_NUM_THREADS=str(args.threads),
               OPENBLAS_NUM_THREADS=str(args.threads))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir)
    if r.returncode != 0:
        raise SystemExit(f"torch_compare: wlb4d failed ({' '.join(cmd)}):\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    rows = list(csv.DictReader(open(csvf)))
    log = r.stdout + r.stderr
    mm = re.search(r"model: (\d+) matmul parameters .*?vocabulary (\d+)", log)
    res = [(float(x["t_total"]), float(x["loss"]), int(float(x["tokens"])), float(x["gflops"]))
           for x in sorted(rows, key=lambda x: int(x["step"]))]
    return res, (int(mm.group(1)), int(mm.group(2))) if mm else None, log


def opt_of(cp):
    o = {k: float(cp.get("optim", k)) for k in ("lr", "min_lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip")}
    o["warmup_steps"] = int(cp.get("optim", "warmup_steps"))
    return o


def setup(args, deck, overrides, steps):
    cp = print_config(args.wlb4d, deck, overrides)
    data = cp.get("data", "train")
    h5path = data if os.path.isabs(data) else os.path.join(args.workdir, data)
    M, S = int(cp.get("train", "micro_batches")), int(cp.get("train", "max_seq_len"))
    if getattr(args, "batches", None):
        batches, data_vocab = load_batches(args.batches, steps, M, S)
    else:
        batches, data_vocab = packed_steps(h5path, steps, M, S)
    m = deck_model(cp, data_vocab)
    return cp, m, batches, M, S


def device_peak(args, torch):
    """(TFLOP/s, where from) at --precision for MFU, or (None, why not):
    --peak-tflops, else on CUDA the device table row of the GPU's name
    (`wlb4d-plan --devices NAME`: key,name,fp32,tf32,bf16,memory_gb)."""
    if args.peak_tflops:
        return args.peak_tflops, "--peak-tflops"
    if args.device != "cuda":
        return None, "no --peak-tflops"
    name = torch.cuda.get_device_name(0)
    plan = os.path.join(os.path.dirname(args.wlb4d), "wlb4d-plan")
    try:
        r = subprocess.run([plan, "--devices", name], capture_output=True, text=True)
    except OSError as e:
        return None, f"{plan}: {e.strerror}"
    rows = [ln.split(",") for ln in r.stdout.splitlines()[1:] if ln.strip()]
    if r.returncode != 0 or not rows:
        return None, f"'{name}' is not in wlb4d's device table ({(r.stderr or r.stdout).strip()})"
    key, dev_name, fp32, _tf32, bf16 = rows[0][:5]
    peak = float(bf16 if args.precision == "bf16" else fp32)
    return peak, f"device table {key} ({dev_name}), {args.precision} peak"


def loss_agrees(a, b, tol):
    return abs(a - b) <= tol * max(abs(a), abs(b))


def self_test(args):
    """Parity of the two sides on a tiny deck (1 rank, 3 steps): N_mm and the
    vocabulary of the PyTorch model against wlb4d's start-up line; the
    tokens and FLOPs of every step from this script's packing and formula
    against wlb4d's timing CSV (gflops × t_total = its model::model_flops);
    the full-attention formula against 6·N_mm + 12·L·d·T per token; the
    step-1 losses within 1e-2 (both ≈ ln(vocab) at init)."""
    fails = []
    def check(ok, what):
        print(("ok:   " if ok else "FAIL: ") + what)
        if not ok:
            fails.append(what)
    work = args.workdir
    h5 = os.path.join(work, "selftest-train.h5")
    if not os.path.exists(h5):
        subprocess.run([args.prep, "--input", os.path.join(ROOT, "tests/data/tiny.jsonl"), "--output", h5],
                       check=True, capture_output=True)
    deck = os.path.join(ROOT, "inputs/ci-tiny.ini")
    # model.vocab_size padded above the dataset's: the masked columns count in N_mm, not in the loss
    overrides = [f"--data.train={h5}", "--model.vocab_size=300"]
    steps = 3
    cp, m, batches, M, S = setup(args, deck, overrides, steps)
    wl, mm, log = run_wlb4d(args, deck, overrides, steps, work, "selftest")
    tr, model = run_torch(m, opt_of(cp), batches, int(cp.get("train", "seed")), args.threads)
    D = m["d_model"] // m["heads"]
    n_mm = matmul_params(m, m["vocab"])
    check(mm is not None, "wlb4d prints 'model: N matmul parameters ... vocabulary V'")
    if mm:
        check(torch_matmul_params(model) == mm[0], f"PyTorch model N_mm {torch_matmul_params(model)} = wlb4d's {mm[0]}")
        check(n_mm == mm[0], f"this script's N_mm formula {n_mm} = wlb4d's {mm[0]}")
        check(m["vocab"] == mm[1], f"vocabulary {m['vocab']} = wlb4d's {mm[1]}")
    for s, (step, (t, loss, tokens, gfl)) in enumerate(zip(batches, wl)):
        tok = sum(sum(p) for _, p in step)
        check(tok == tokens, f"step {s}: tokens {tok} = wlb4d's {tokens}")
        mine = model_flops(m["layers"], m["heads"], D, n_mm, tok, sum(pairs_of(p, False) for _, p in step))
        theirs = gfl * 1e9 * t
        # the CSV rounds gflops and t_total: agreement to their printed digits
        check(abs(mine - theirs) <= 2e-3 * mine, f"step {s}: causal-pairs FLOPs {mine:.6g} = wlb4d's {theirs:.6g}")
    full = model_flops(m["layers"], m["heads"], D, n_mm, S, S * S) / S
    check(abs(full - (6 * n_mm + 12 * m["layers"] * m["d_model"] * S)) < 1e-6 * full,
          f"full attention: {full:.6g} FLOP per token = 6*N_mm + 12*L*d*T")
    print(f"step-1 loss: wlb4d {wl[0][1]:.5f}, PyTorch {tr[0][1]:.5f}, ln(data vocab {m['data_vocab']}) "
          f"{math.log(m['data_vocab']):.5f}")
    check(loss_agrees(wl[0][1], tr[0][1], 1e-2), "step-1 losses agree within 1e-2 relative")
    # The same initial weights (wlb4d_normal), tokens, mask and AdamW: every
    # step's loss agrees to fp32 accuracy, not only the step at init.
    for s, ((_, lw, *_), (_, lt)) in enumerate(zip(wl, tr)):
        check(loss_agrees(lw, lt, 1e-4), f"step {s}: loss wlb4d {lw:.6f} = PyTorch {lt:.6f} within 1e-4 relative")

    # --batches: the .npz written where h5py is gives back the same micro-batches.
    npz = os.path.join(work, "selftest-batches.npz")
    save_batches(npz, batches, m["data_vocab"], M, S, h5)
    back, back_vocab = load_batches(npz, steps, M, S)
    same = back_vocab == m["data_vocab"] and all(
        list(a[0]) == list(b[0]) and list(a[1]) == list(b[1]) for sa, sb in zip(batches, back) for a, b in zip(sa, sb))
    check(same, f"--batches {os.path.basename(npz)}: the same {steps} x {M} micro-batches as the HDF5 file")

    # The MFU peak of --device cuda: the device table row of the GPU's name
    # through wlb4d-plan --devices (a stand-in for torch.cuda's name here).
    class _Cuda:
        @staticmethod
        def get_device_name(_):
            return "NVIDIA H100 80GB HBM3"
    fake = type("torch", (), {"cuda": _Cuda})
    for prec in ("fp32", "bf16"):
        pk, why = device_peak(argparse.Namespace(peak_tflops=0.0, device="cuda", precision=prec, wlb4d=args.wlb4d), fake)
        plan = subprocess.run([os.path.join(os.path.dirname(args.wlb4d), "wlb4d-plan"), "--devices"],
                              capture_output=True, text=True).stdout.splitlines()
        row = next((r.split(",") for r in plan[1:] if r.startswith("h100,")), None)
        want = row and float(row[4 if prec == "bf16" else 2])
        check(pk is not None and pk == want, f"MFU peak at {prec} for 'NVIDIA H100 80GB HBM3': {pk} TFLOP/s ({why}) "
              f"= the device table's h100 row {want}")

    # The CUDA init (wlb4d's RNG in torch int64, on the device) gives the
    # numpy path's fp32 weights; fp64 log/cos may differ in the last bit.
    import numpy as np
    init_same = all(np.array_equal((0.02 * wlb4d_normal(seed, nm, n)).astype(np.float32),
                                   (0.02 * wlb4d_normal_torch(seed, nm, n, "cpu")).float().numpy())
                    for seed, nm, n in [(1234, "embed.weight", 65536), (2 ** 40 + 7, "layers.1.attn.wq", 4096)])
    check(init_same, "wlb4d_normal_torch (the --device cuda init) = wlb4d_normal in fp32, bit for bit")

    # The SDPA path's mask: the masked path's negated (a boolean attn_mask is
    # True = attend), and both equal the document-causal rule pair by pair.
    import torch
    mask_ok = True
    for pieces in [[3, 1, 2]] + [p for st in batches for _, p in st]:
        T, doc = sum(pieces), [j for j, n in enumerate(pieces) for _ in range(n)]
        rule = torch.tensor([[doc[i] != doc[j] or j > i for j in range(T)] for i in range(T)])
        mk, sd = attention_mask(pieces, "masked"), attention_mask(pieces, "sdpa")
        mask_ok &= bool(torch.equal(mk, rule) and torch.equal(sd, ~mk) and sd.dtype == torch.bool)
    check(mask_ok, "SDPA attn_mask (True = attend) = not the masked path's mask = the document-causal rule")

    # The SDPA branch against the masked one: the same losses to fp32 accuracy
    # (the tolerance of wlb4d against PyTorch above: both are fp32 renderings
    # of one computation, summed in another order).
    real = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    shim = None if real else sdpa_shim
    if not real:
        print(f"note: torch {torch.__version__} has no F.scaled_dot_product_attention; the sdpa branch runs "
              f"through sdpa_shim (its contract in plain ops): mask, operand casts and layout are tested, "
              f"the fused kernels are not")
    seed = int(cp.get("train", "seed"))
    ts, _ = run_torch(m, opt_of(cp), batches, seed, args.threads, attention="sdpa", sdpa=shim)
    for s, ((_, lm), (_, ls)) in enumerate(zip(tr, ts)):
        check(loss_agrees(lm, ls, 1e-4), f"step {s}: loss masked {lm:.6f} = sdpa{'' if real else ' (shim)'} "
              f"{ls:.6f} within 1e-4 relative")

    # bf16 autocast against fp32. Rounding both operands of a GEMM to bf16
    # (u = 2^-8, 8 significand bits) changes each product by at most (2u + u²)
    # relative; along the forward path autocast rounds n = 6 GEMM stages per
    # layer (q/k/v, QKᵀ, PV, wo, gate/up, down) plus the LM head, and n
    # independent such errors add like a random walk: √n·2u relative on the
    # logits (tests/unit/model/test_bf16.cpp's argument). Cross-entropy moves
    # by (p − y)·Δz, under the logits' relative error times the loss while
    # the logits are smaller than the loss (they are, near init), so the
    # step-1 loss is within √n·2u relative; every later step adds at most as
    # much again through the update its gradient made: (s + 1)·√n·2u.
    u = 2.0 ** -8
    n = 6 * m["layers"] + 1
    tb, _ = run_torch(m, opt_of(cp), batches, seed, args.threads, precision="bf16", attention="sdpa", sdpa=shim)
    check(tb[0][1] != tr[0][1], f"bf16 autocast really rounds: step-1 loss {tb[0][1]:.6f} != fp32's {tr[0][1]:.6f}")
    for s, ((_, l32), (_, l16)) in enumerate(zip(tr, tb)):
        bound = (s + 1) * math.sqrt(n) * (2 * u + u * u)
        rel = abs(l16 - l32) / abs(l32)
        check(rel <= bound, f"step {s}: loss bf16 {l16:.6f} vs fp32 {l32:.6f}: relative {rel:.2e} <= "
              f"(s+1)*sqrt({n})*(2u+u^2) = {bound:.2e}")
    return 1 if fails else 0


def compare(args):
    import torch
    overrides = args.overrides
    if args.precision == "bf16" and not any(o.startswith("--train.precision=") for o in overrides):
        overrides = overrides + ["--train.precision=bf16"]  # both columns in bf16
    steps = args.steps
    work = args.workdir
    cp, m, batches, M, S = setup(args, args.deck, overrides, steps)
    D = m["d_model"] // m["heads"]
    n_mm = matmul_params(m, m["vocab"])
    opt = opt_of(cp)
    seed = int(cp.get("train", "seed"))
    tokens = M * S
    full = sum(pairs_of(p, True) for _, p in batches[0])
    causal = statistics.mean(sum(pairs_of(p, False) for _, p in st) for st in batches)
    f_full = model_flops(m["layers"], m["heads"], D, n_mm, tokens, full)
    f_causal = model_flops(m["layers"], m["heads"], D, n_mm, tokens, causal)
    print(f"deck {args.deck}: layers {m['layers']}, d_model {m['d_model']}, heads {m['heads']}, kv_heads {m['kv_heads']}, "
          f"ffn {m['ffn_hidden']} (SwiGLU), vocab {m['vocab']} (data {m['data_vocab']}), eps {m['norm_eps']:g}, "
          f"rope_theta {m['rope_theta']:g}; {M} x {S} tokens per step, fixed packer, document-causal mask")
    if args.device == "cuda":
        print(f"device cuda: {torch.cuda.get_device_name(0)}; PyTorch {torch.__version__}, CUDA {torch.version.cuda}, "
              f"cuDNN {torch.backends.cudnn.version()}; precision {args.precision}, attention {args.attention}"
              + (f"; batches from {args.batches}" if args.batches else ""))
    else:
        blas = re.findall(r"BLAS_INFO=[^,\s]+|USE_MKLDNN=[^,\s]+|CPU capability usage: \S+", torch.__config__.show())
        blas.append("GEMM library loaded: " + torch_blas())
        print(f"threads {args.threads}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')} (wlb4d's BLAS); "
              f"PyTorch {torch.__version__}: {', '.join(blas) or 'see torch.__config__.show()'}")
        if (args.precision, args.attention) != ("fp32", "masked"):
            print(f"precision {args.precision}, attention {args.attention}")
    peak, peak_why = device_peak(args, torch)
    print(f"FLOPs per step (one formula for both columns, model_flops): 6*N_mm*tokens + 12*L*H*D*pairs, N_mm = {n_mm}\n"
          f"  full T x T attention (PyTorch's masked path computes this): 6*N_mm + 12*L*d*T per token = {f_full:.4g} FLOP/step\n"
          f"  causal pairs (what wlb4d prints, the mask's pairs): {f_causal:.4g} FLOP/step")
    if peak or args.device == "cuda":
        print(f"MFU: causal-pairs FLOP/s over {peak:g} TFLOP/s ({peak_why})" if peak else f"MFU: not printed ({peak_why})")
    hdr = f"{'round':>5} {'wlb4d tok/s':>12} {'torch tok/s':>12} {'ratio':>6}  {'wlb4d GF/s full|causal':>24}  {'torch GF/s full|causal':>24}"
    if peak:
        hdr += f"  {'MFU wlb4d':>9} {'MFU torch':>9}"
    print(hdr)
    ratios, l1 = [], None
    skip = 1 if steps > 1 else 0  # the first step warms caches and BLAS (bench.sh does the same)
    for k in range(args.rounds):
        wl, mm, _ = run_wlb4d(args, args.deck, overrides, steps, work, f"r{k}")
        if mm and mm[0] != n_mm:
            raise SystemExit(f"torch_compare: wlb4d's N_mm {mm[0]} differs from this model's {n_mm}")
        tr, model = run_torch(m, opt, batches, seed, args.threads, args.device, args.precision, args.attention)
        tw = statistics.median(t for t, *_ in wl[skip:])
        tt = statistics.median(t for t, _ in tr[skip:])
        ratios.append(tt / tw)
        l1 = (wl[0][1], tr[0][1])
        lw_all, lt_all = [x[1] for x in wl], [x[1] for x in tr]
        row = (f"{k:>5} {tokens / tw:>12.1f} {tokens / tt:>12.1f} {tt / tw:>6.2f}  "
               f"{f_full / tw * 1e-9:>11.2f} | {f_causal / tw * 1e-9:>10.2f}  {f_full / tt * 1e-9:>11.2f} | {f_causal / tt * 1e-9:>10.2f}")
        if peak:
            row += f"  {100 * f_causal / tw / (peak * 1e12):>8.2f}% {100 * f_causal / tt / (peak * 1e12):>8.2f}%"
        print(row, flush=True)
    print(f"ratio wlb4d/PyTorch tokens/s: mean {statistics.mean(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}] "
          f"over {args.rounds} rounds, median step time of steps {skip}-{steps - 1}")
    worst = max(abs(a - b) / abs(a) for a, b in zip(lw_all, lt_all))
    print(f"same initial weights (wlb4d's init_normal): worst relative loss difference over the {steps} steps {worst:.2e}")
    ok = loss_agrees(*l1, 1e-2)
    print(f"step-1 loss: wlb4d {l1[0]:.5f}, PyTorch {l1[1]:.5f}, ln(data vocab) {math.log(m['data_vocab']):.5f}: "
          f"{'agree' if ok else 'DIFFER'} within 1e-2 relative")
    return 0 if ok else 1


def write_batches(args):
    """--write-batches: the deck's packed micro-batches into an .npz (h5py
    here; torch not needed), for --batches on a machine without h5py."""
    cp = print_config(args.wlb4d, args.deck, args.overrides)
    data = cp.get("data", "train")
    h5path = data if os.path.isabs(data) else os.path.join(args.workdir, data)
    M, S = int(cp.get("train", "micro_batches")), int(cp.get("train", "max_seq_len"))
    batches, vocab = packed_steps(h5path, args.steps, M, S)
    save_batches(args.write_batches, batches, vocab, M, S, h5path)
    print(f"torch_compare: {args.steps} steps x {M} x {S} tokens of {h5path} -> {args.write_batches} "
          f"({os.path.getsize(args.write_batches)} bytes)")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("deck", nargs="?", default=os.path.join(ROOT, "inputs/bench-quickstart.ini"))
    ap.add_argument("--wlb4d", default=os.path.join(ROOT, "build/app/wlb4d"))
    ap.add_argument("--prep", default=None, help="wlb4d-prep (self-test; default: next to --wlb4d)")
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--ranks", type=int, default=1, help="1: run wlb4d under mpiexec -n 1; 0: as a singleton")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads and wlb4d's OMP/OpenBLAS threads")
    ap.add_argument("--workdir", default=None, help="where relative data paths resolve (default: cwd); --self-test's files")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the PyTorch model trains")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: autocast around forward + loss, fp32 masters and AdamW (both columns)")
    ap.add_argument("--attention", choices=("masked", "sdpa"), default=None,
                    help="default: sdpa where torch has F.scaled_dot_product_attention, else masked")
    ap.add_argument("--peak-tflops", type=float, default=0.0,
                    help="peak for MFU (default on CUDA: wlb4d-plan --devices NAME, at --precision)")
    ap.add_argument("--batches", default=None, help="packed micro-batches from this .npz instead of the HDF5 file")
    ap.add_argument("--write-batches", default=None, metavar="FILE.npz",
                    help="write --steps steps of packed micro-batches to FILE.npz and exit (h5py, no torch)")
    args, extra = ap.parse_known_args()
    args.overrides = extra  # --section.key=value: passed to wlb4d (and to --print-config)
    # Relative data paths resolve in --workdir (default: here); wlb4d's timing
    # CSVs go there under --self-test, else to a temporary folder.
    args.workdir = os.path.abspath(args.workdir or os.getcwd())
    if args.self_test:
        args.csvdir = args.workdir
    else:
        args.csvdir = tempfile.mkdtemp(prefix="torch_compare-")
        atexit.register(shutil.rmtree, args.csvdir, True)
    args.prep = args.prep or os.path.join(os.path.dirname(args.wlb4d), "wlb4d-prep")
    # Before torch loads OpenBLAS: its pthread pool must match --threads too.
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    # h5py only where the batches come from the HDF5 file; torch not to write them.
    needs = ([] if args.write_batches else ["torch"]) + ([] if args.batches and not args.self_test else ["h5py"])
    try:
        for mod in needs + ["numpy"]:
            __import__(mod)
    except ImportError as e:
        print(f"skipped: {e.name} is not installed (apt-get install python3-torch python3-h5py)")
        return 77 if args.self_test else 0
    if args.write_batches:
        return write_batches(args)
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"skipped: --device cuda, but this PyTorch ({torch.__version__}) sees no CUDA device")
        return 77 if args.self_test else 0
    has_sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    args.attention = args.attention or ("sdpa" if has_sdpa else "masked")
    if args.attention == "sdpa" and not has_sdpa and not args.self_test:
        raise SystemExit(f"torch_compare: --attention sdpa needs torch >= 2.0 (this is {torch.__version__})")
    if args.self_test:
        os.makedirs(args.workdir, exist_ok=True)
        return self_test(args)
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
