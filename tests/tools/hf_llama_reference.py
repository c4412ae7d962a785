"""An independent Llama, written from Hugging Face's documented conventions
(transformers' modeling_llama.py: LlamaRMSNorm, rotate_half /
apply_rotary_pos_emb, repeat_kv for GQA, SiLU-gated MLP, causal softmax
attention scaled by 1/sqrt(head_dim), lm_head or the tied embedding) and the
safetensors format (8-byte little-endian header length, JSON header,
little-endian data), in float64 numpy. It shares no code with wlb4d: it reads
the directory `wlb4d-ckpt export-hf` writes as any HF user's tool would.

    model = HFLlama(directory)
    logits = model.logits(token_ids)       # [T][vocab], positions 0..T-1
    loss_sum, targets = model.loss(token_ids)
"""
import json
import os
import struct

import numpy as np

_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": None}


def read_safetensors(path):
    """{name: float64 array} of one safetensors file (every rule of the format checked)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} runs past the file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    out, spans = {}, []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        shape = info["shape"]
        count = int(np.prod(shape)) if shape else 1
        dt = info["dtype"]
        if dt == "BF16":
            raw = np.frombuffer(data[begin:end], dtype="<u2").astype(np.uint32) << 16
            arr = raw.view(np.float32)
        elif dt in _DTYPES:
            arr = np.frombuffer(data[begin:end], dtype=_DTYPES[dt])
        else:
            raise ValueError(f"{path}: {name}: dtype {dt} not handled")
        if arr.size != count:
            raise ValueError(f"{path}: {name}: {arr.size} elements for shape {shape}")
        out[name] = arr.astype(np.float64).reshape(shape)
        spans.append((begin, end))
    spans.sort()
    pos = 0
    for begin, end in spans:
        if begin != pos:
            raise ValueError(f"{path}: data not contiguous at byte {pos}")
        pos = end
    if pos != len(data):
        raise ValueError(f"{path}: {len(data) - pos} bytes after the last tensor")
    return out, header.get("__metadata__", {})


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: (dtype, float array)} as the format describes (dtype F32, F16 or BF16; BF16 rounded to
    nearest even), header padded with spaces to a multiple of 8 bytes."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        arr = np.asarray(arr, dtype=np.float64)
        if dtype == "F32":
            raw = arr.astype("<f4").tobytes()
        elif dtype == "F16":
            raw = arr.astype("<f2").tobytes()
        elif dtype == "BF16":
            bits = arr.astype(np.float32).view(np.uint32).astype(np.uint64)
            raw = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")).tobytes()
        else:
            raise ValueError(dtype)
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_hf_weights(directory):
    """All tensors of an HF model directory (single file or sharded with an index)."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights = {}
    for name in files:
        tensors, meta = read_safetensors(os.path.join(directory, name))
        if meta.get("format") != "pt":
            raise ValueError(f"{name}: __metadata__.format is {meta.get('format')!r}, transformers needs 'pt'")
        weights.update(tensors)
    return weights


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


class HFLlama:
    def __init__(self, directory):
        with open(os.path.join(directory, "config.json")) as f:
            self.cfg = json.load(f)
        c = self.cfg
        assert c["model_type"] == "llama" and c["architectures"] == ["LlamaForCausalLM"]
        self.scaling = c.get("rope_scaling") or None
        if self.scaling is not None:
            kind = self.scaling.get("rope_type", self.scaling.get("type"))
            assert kind == "llama3", f"this reference implements llama3 RoPE scaling, not {kind}"
        self.w = read_hf_weights(directory)
        self.d = c["hidden_size"]
        self.h = c["num_attention_heads"]
        self.hkv = c["num_key_value_heads"]
        self.hd = c.get("head_dim") or self.d // self.h
        self.eps = c["rms_norm_eps"]
        self.theta = c["rope_theta"]
        self.layers = c["num_hidden_layers"]
        self.vocab = c["vocab_size"]
        head = "model.embed_tokens.weight" if c.get("tie_word_embeddings") else "lm_head.weight"
        self.head = self.w[head]
        assert self.w["model.embed_tokens.weight"].shape == (self.vocab, self.d)
        assert self.head.shape == (self.vocab, self.d)

    def rms_norm(self, x, weight):
        return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps))

    def inv_freq(self):
        """RoPE frequencies; with llama3 scaling as transformers' _compute_llama3_parameters
        (modeling_rope_utils.py) states it, vectorised with np.where as there."""
        inv_freq = 1.0 / (self.theta ** (np.arange(0, self.hd, 2, dtype=np.float64) / self.hd))
        if self.scaling is None:
            return inv_freq
        r = self.scaling
        factor, low, high = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
        old = r["original_max_position_embeddings"]
        low_freq_wavelen, high_freq_wavelen = old / low, old / high
        wavelen = 2 * np.pi / inv_freq
        llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * llama / factor + smooth * llama
        medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return np.where(medium, smoothed, llama)

    def rope(self, x, pos):  # x [H][T][hd]
        inv_freq = self.inv_freq()
        freqs = np.outer(pos, inv_freq)
        emb = np.concatenate([freqs, freqs], axis=-1)
        return x * np.cos(emb)[None] + rotate_half(x) * np.sin(emb)[None]

    def logits(self, ids):
        ids = np.asarray(ids)
        T = len(ids)
        pos = np.arange(T, dtype=np.float64)
        x = self.w["model.embed_tokens.weight"][ids]
        mask = np.triu(np.full((T, T), -np.inf), k=1)
        rep = self.h // self.hkv
        for layer in range(self.layers):
            p = f"model.layers.{layer}."
            a = self.rms_norm(x, self.w[p + "input_layernorm.weight"])
            q = (a @ self.w[p + "self_attn.q_proj.weight"].T).reshape(T, self.h, self.hd).transpose(1, 0, 2)
            k = (a @ self.w[p + "self_attn.k_proj.weight"].T).reshape(T, self.hkv, self.hd).transpose(1, 0, 2)
            v = (a @ self.w[p + "self_attn.v_proj.weight"].T).reshape(T, self.hkv, self.hd).transpose(1, 0, 2)
            q, k = self.rope(q, pos), self.rope(k, pos)
            k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)  # repeat_kv: head h uses kv head h // rep
            s = q @ k.transpose(0, 2, 1) / np.sqrt(self.hd) + mask
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            s /= s.sum(axis=-1, keepdims=True)
            o = (s @ v).transpose(1, 0, 2).reshape(T, self.h * self.hd)
            x = x + o @ self.w[p + "self_attn.o_proj.weight"].T
            m = self.rms_norm(x, self.w[p + "post_attention_layernorm.weight"])
            g = m @ self.w[p + "mlp.gate_proj.weight"].T
            u = m @ self.w[p + "mlp.up_proj.weight"].T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ self.w[p + "mlp.down_proj.weight"].T
        return self.rms_norm(x, self.w["model.norm.weight"]) @ self.head.T

    def loss(self, ids):
        """(sum of next-token cross-entropies in nats, number of targets) of one sequence."""
        if len(ids) < 2:
            return 0.0, 0
        z = self.logits(ids)[:-1]
        z = z - z.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        return float(-logp[np.arange(len(ids) - 1), np.asarray(ids[1:])].sum()), len(ids) - 1

    def greedy(self, prompt, n):
        ids = list(prompt)
        for _ in range(n):
            ids.append(int(np.argmax(self.logits(ids)[-1])))
        return ids[len(prompt):]
