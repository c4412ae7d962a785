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
decay on matrices only, global-norm clip; fp32.

Tokens: wlb4d runs with --data.shuffle=false, so its stream is the dataset's
document order; the fixed packer concatenates the documents and cuts every
train.max_seq_len tokens, train.micro_batches micro-batches per step. Each
piece (a document, or the part of it inside one micro-batch) is its own
document for the mask, the positions (restarting at 0) and the labels (a
piece's last token has no target) — exactly batch.cpp's rule, rebuilt here
from /doc_offsets. PyTorch 1.13 has no fused attention for CPU, so it computes
the full T×T scores and masks them (document-causal); wlb4d's kernel skips the
masked pairs. Hence both FLOP counts are printed:
  full:   6·N_mm + 12·L·d·T per token (every T×T pair, what PyTorch computes)
  causal: 6·N_mm·tokens + 12·L·d·pairs, pairs = Σ_pieces n(n+1)/2 (what wlb4d
          prints: model::model_flops)
N_mm = parameters used in matmuls (LM head included, embedding lookup excluded).

  /usr/bin/python3 bench/torch_compare.py inputs/bench-quickstart.ini --rounds 3 --steps 4
  /usr/bin/python3 bench/torch_compare.py --self-test   # parity checks (ctest torch_compare_selftest)

Without torch or h5py it prints a `skipped:` line and exits 0 (77 under
--self-test, ctest's skip code).
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


def pairs_of(pieces, full):
    T = sum(pieces)
    return T * T if full else sum(n * (n + 1) // 2 for n in pieces)


# ---------------------------------------------------------------- PyTorch model
def build_torch(m, seed, same_init=True):
    import torch
    import torch.nn as nn
    import torch.nn.functional as Fn

    d, H, Hkv = m["d_model"], m["heads"], m["kv_heads"]
    D = d // H

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
                k, v = k.repeat_interleave(H // Hkv, 0), v.repeat_interleave(H // Hkv, 0)
            s = torch.matmul(q, k.transpose(1, 2)) * (1.0 / math.sqrt(D))          # full T×T
            s = s.masked_fill(mask, float("-inf"))
            o = torch.matmul(torch.softmax(s, dim=-1), v).transpose(0, 1).reshape(T, H * D)
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
            return Fn.cross_entropy(logits, labels, ignore_index=-1, reduction="sum")

    torch.manual_seed(seed)
    model = Llama()
    resid = 1.0 / math.sqrt(2.0 * m["layers"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() != 2:
                continue  # norm weights: 1 (RMSNorm's init)
            std = m["init_std"] * (resid if name.endswith(("wo.weight", "w_down.weight")) else 1.0)
            if same_init:
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


def wlb4d_normal(seed, name, n):
    """wlb4d's layout-independent init (params.cpp init_normal): Box-Muller on
    two splitmix64 draws keyed by (seed, FNV-1a of the name, global index), so
    the PyTorch model starts from wlb4d's very weights (row-major = global index
    on one rank). fp64; the caller rounds std·value to fp32, as wlb4d does."""
    import numpy as np
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
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


def torch_inputs(ids, pieces, theta, D):
    """ids, labels, RoPE cos/sin [T][1][D/2] and the mask [T][T] (True = masked) of a micro-batch."""
    import torch
    T = len(ids)
    piece = torch.repeat_interleave(torch.arange(len(pieces)), torch.tensor(pieces))
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
    i = torch.arange(T)
    mask = (piece[:, None] != piece[None, :]) | (i[None, :] > i[:, None])
    return ids_t, labels, cos, sin, mask, int(tgt.sum())


def lr_at(o, step, total):  # optim/adamw.cpp lr_at
    if o["warmup_steps"] > 0 and step < o["warmup_steps"]:
        return o["lr"] * (step + 1) / o["warmup_steps"]
    decay = total - 1 - o["warmup_steps"]
    if decay <= 0:
        return o["lr"]
    p = min(1.0, max(0.0, (step - o["warmup_steps"]) / decay))
    return o["min_lr"] + 0.5 * (o["lr"] - o["min_lr"]) * (1 + math.cos(math.pi * p))


_INIT = {}


def run_torch(m, opt, batches, seed, threads):
    """Trains len(batches) steps; returns per-step (seconds, loss)."""
    import torch
    torch.set_num_threads(threads)
    key = (seed, tuple(sorted((k, v) for k, v in m.items())))
    if key in _INIT:  # later rounds: the same initial weights, without recomputing the RNG
        model = build_torch(m, seed, same_init=False)
        model.load_state_dict(_INIT[key])
    else:
        model = build_torch(m, seed)
        _INIT[key] = {k: v.clone() for k, v in model.state_dict().items()}
    dec = [p for p in model.parameters() if p.dim() == 2]
    nodec = [p for p in model.parameters() if p.dim() != 2]
    adam = torch.optim.AdamW([{"params": dec, "weight_decay": opt["weight_decay"]},
                              {"params": nodec, "weight_decay": 0.0}],
                             lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
    D = m["d_model"] // m["heads"]
    prepared = [[torch_inputs(ids, pieces, m["rope_theta"], D) for ids, pieces in step] for step in batches]
    out = []
    for s, step in enumerate(prepared):
        t0 = time.perf_counter()
        for g in adam.param_groups:
            g["lr"] = lr_at(opt, s, len(prepared))
        adam.zero_grad(set_to_none=False)
        n_tgt = sum(mb[5] for mb in step)
        loss_sum = 0.0
        for ids, labels, cos, sin, mask, _ in step:
            loss = model(ids, labels, cos, sin, mask) / n_tgt
            loss.backward()
            loss_sum += float(loss)
        if opt["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), opt["grad_clip"])
        adam.step()
        out.append((time.perf_counter() - t0, loss_sum))
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
    batches, data_vocab = packed_steps(h5path, steps, M, S)
    m = deck_model(cp, data_vocab)
    return cp, m, batches, M, S


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
    return 1 if fails else 0


def compare(args):
    import torch
    overrides = args.overrides
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
    blas = re.findall(r"BLAS_INFO=[^,\s]+|USE_MKLDNN=[^,\s]+|CPU capability usage: \S+", torch.__config__.show())
    blas.append("GEMM library loaded: " + torch_blas())
    print(f"deck {args.deck}: layers {m['layers']}, d_model {m['d_model']}, heads {m['heads']}, kv_heads {m['kv_heads']}, "
          f"ffn {m['ffn_hidden']} (SwiGLU), vocab {m['vocab']} (data {m['data_vocab']}), eps {m['norm_eps']:g}, "
          f"rope_theta {m['rope_theta']:g}; {M} x {S} tokens per step, fixed packer, document-causal mask")
    print(f"threads {args.threads}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')} (wlb4d's BLAS); "
          f"PyTorch {torch.__version__}: {', '.join(blas) or 'see torch.__config__.show()'}")
    print(f"FLOPs per step (one formula for both columns, model_flops): 6*N_mm*tokens + 12*L*H*D*pairs, N_mm = {n_mm}\n"
          f"  full T x T attention (PyTorch computes this): 6*N_mm + 12*L*d*T per token = {f_full:.4g} FLOP/step\n"
          f"  causal pairs (what wlb4d prints, the mask's pairs): {f_causal:.4g} FLOP/step")
    hdr = f"{'round':>5} {'wlb4d tok/s':>12} {'torch tok/s':>12} {'ratio':>6}  {'wlb4d GF/s full|causal':>24}  {'torch GF/s full|causal':>24}"
    print(hdr)
    ratios, l1 = [], None
    skip = 1 if steps > 1 else 0  # the first step warms caches and BLAS (bench.sh does the same)
    for k in range(args.rounds):
        wl, mm, _ = run_wlb4d(args, args.deck, overrides, steps, work, f"r{k}")
        if mm and mm[0] != n_mm:
            raise SystemExit(f"torch_compare: wlb4d's N_mm {mm[0]} differs from this model's {n_mm}")
        tr, model = run_torch(m, opt, batches, seed, args.threads)
        tw = statistics.median(t for t, *_ in wl[skip:])
        tt = statistics.median(t for t, _ in tr[skip:])
        ratios.append(tt / tw)
        l1 = (wl[0][1], tr[0][1])
        lw_all, lt_all = [x[1] for x in wl], [x[1] for x in tr]
        print(f"{k:>5} {tokens / tw:>12.1f} {tokens / tt:>12.1f} {tt / tw:>6.2f}  "
              f"{f_full / tw * 1e-9:>11.2f} | {f_causal / tw * 1e-9:>10.2f}  {f_full / tt * 1e-9:>11.2f} | {f_causal / tt * 1e-9:>10.2f}",
              flush=True)
    print(f"ratio wlb4d/PyTorch tokens/s: mean {statistics.mean(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}] "
          f"over {args.rounds} rounds, median step time of steps {skip}-{steps - 1}")
    worst = max(abs(a - b) / abs(a) for a, b in zip(lw_all, lt_all))
    print(f"same initial weights (wlb4d's init_normal): worst relative loss difference over the {steps} steps {worst:.2e}")
    ok = loss_agrees(*l1, 1e-2)
    print(f"step-1 loss: wlb4d {l1[0]:.5f}, PyTorch {l1[1]:.5f}, ln(data vocab) {math.log(m['data_vocab']):.5f}: "
          f"{'agree' if ok else 'DIFFER'} within 1e-2 relative")
    return 0 if ok else 1


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
    try:
        import torch  # noqa: F401
        import h5py  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e.name} is not installed (apt-get install python3-torch python3-h5py)")
        return 77 if args.self_test else 0
    if args.self_test:
        os.makedirs(args.workdir, exist_ok=True)
        return self_test(args)
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
