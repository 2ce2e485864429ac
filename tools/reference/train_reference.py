#!/usr/bin/python3
"""Independent float64 torch reference for LoRA training (issue 14, proof 1 and 3).

Usage:
  train_reference.py LUMEN_BIN OUT_DIR [--cases tiny-llama,tiny-qwen3,tiny-gemma2]
                     [--keep-models DIR] [--fd-entries N]

For each case it runs `LUMEN_BIN synth <case> --format hf --seed 1 -o TMP/<case>`,
reads config.json and model.safetensors, and writes

  OUT_DIR/<case>/case.json            how the golden was made and every convention
  OUT_DIR/<case>/golden.safetensors   F64 tensors: LoRA A/B, per-token log-probs,
                                      losses and LoRA gradients of seven objectives,
                                      base/PEFT logits
  OUT_DIR/<case>/peft/                a PEFT-layout adapter (F32) holding the same A/B

The model is written here from the formulas (HF config semantics as spelled
out in docs/design/families.md; objectives from the DPO, IPO, ORPO and SimPO
papers as TRL computes them): no transformers, no peft. Every op runs in
float64 with torch autograd; the LoRA A/B values are rounded to f32 first so
an f32 implementation holds exactly the same adapter. The script checks its
own gradients against central finite differences and the adapter-off logits
against tools/reference/forward_ref.py (the numpy forward reference), and
refuses to write a golden when either check fails.
"""

import argparse
import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

MADE_BY = "tools/reference/train_reference.py"
CASES = ("tiny-llama", "tiny-qwen3", "tiny-gemma2")
TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
TARGET_MODULE = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
                 "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
                 "down": "mlp.down_proj"}
METHODS = ("sft", "dpo", "dpo_ls", "orpo", "simpo", "ipo", "hinge")

LORA_RANK = 4
LORA_ALPHA = 8
LORA_SEED = 7
LORA_A_STD = 0.05
LORA_B_STD = 0.02
DATA_SEED = 11
# Finite-difference step of the fourth-order central stencil: the losses are
# O(1..30), so roundoff is ~1e-16 * 30 / h and truncation ~h^4; 1e-3 puts both
# near 1e-12 (a second-order stencil at 1e-6 gave 1e-6 relative error on
# gradients of 1e-3 from roundoff alone).
FD_STEP = 1e-3
PROMPT_LEN, CHOSEN_LEN, REJECTED_LEN, N_PAIRS = 6, 7, 5, 2
HP = {
    "dpo": {"beta": 0.1, "label_smoothing": 0.0},
    "dpo_ls": {"beta": 0.1, "label_smoothing": 0.1},
    "orpo": {"lambda": 0.1},
    "simpo": {"beta": 2.0, "gamma": 0.5},
    "ipo": {"beta": 0.1},
    "hinge": {"beta": 0.1},
    "sft": {},
}

# ----------------------------------------------------------------------------
# safetensors (format: u64 LE header length, JSON header, raw LE data)
# ----------------------------------------------------------------------------

_ST_DTYPES = {"F64": ("<f8", 8), "F32": ("<f4", 4), "F16": ("<f2", 2)}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack_from("<Q", raw, 0)
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} past the end of the file")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info["dtype"]
        if dt not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name}: dtype {dt} not supported here")
        np_dt, size = _ST_DTYPES[dt]
        b, e = info["data_offsets"]
        shape = tuple(info["shape"])
        if e - b != size * int(np.prod(shape, dtype=np.int64)) or e > len(data):
            raise ValueError(f"{path}: tensor {name}: bad data_offsets {b}..{e}")
        out[name] = np.frombuffer(data[b:e], dtype=np_dt).reshape(shape).copy()
    return out


def write_safetensors(path, tensors, dtype):
    """tensors: name -> array; all written as dtype ('F64' or 'F32'), names sorted."""
    np_dt, size = _ST_DTYPES[dtype]
    header, blobs, off = {"__metadata__": {"format": "pt", "made_by": MADE_BY}}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(np.asarray(tensors[name], dtype=np.float64).astype(np_dt))
        b = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ----------------------------------------------------------------------------
# Model config
# ----------------------------------------------------------------------------

# Keys whose value does not change the math of a training forward here.
_INERT_KEYS = {"architectures", "model_type", "torch_dtype", "max_position_embeddings",
               "bos_token_id", "eos_token_id", "pad_token_id", "transformers_version",
               "initializer_range", "use_cache", "attention_dropout"}
_COMMON_KEYS = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "rope_theta",
                "tie_word_embeddings", "head_dim", "rope_scaling", "attention_bias"}
_FAMILY_KEYS = {
    "llama": {"hidden_act", "mlp_bias"},
    "qwen3": {"hidden_act", "use_sliding_window", "sliding_window", "max_window_layers",
              "layer_types"},
    "gemma2": {"hidden_act", "hidden_activation", "query_pre_attn_scalar", "sliding_window",
               "attn_logit_softcapping", "final_logit_softcapping", "layer_types"},
}
_ARCH = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3", "Gemma2ForCausalLM": "gemma2"}


class Spec:
    """Everything the forward needs, derived from config.json (asserts on the unknown)."""

    def __init__(self, c):
        arch = c.get("architectures", [None])[0]
        if arch not in _ARCH:
            raise ValueError(f"config: architecture {arch!r} not handled by {MADE_BY}")
        fam = self.family = _ARCH[arch]
        unknown = set(c) - _INERT_KEYS - _COMMON_KEYS - _FAMILY_KEYS[fam]
        if unknown:
            raise ValueError(f"config: keys this reference does not understand: {sorted(unknown)}")
        if c.get("rope_scaling") is not None:
            raise ValueError("config: rope_scaling is not handled by this reference")
        if c.get("attention_bias", False) or c.get("mlp_bias", False):
            raise ValueError("config: biases are not handled by this reference")
        self.V, self.H, self.F = c["vocab_size"], c["hidden_size"], c["intermediate_size"]
        self.L, self.nH = c["num_hidden_layers"], c["num_attention_heads"]
        self.nKV = c.get("num_key_value_heads", self.nH)
        assert self.nH % self.nKV == 0
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        self.theta = float(c.get("rope_theta", 10000.0))
        hd = c.get("head_dim")
        if fam == "llama":
            self.d = hd if hd is not None else self.H // self.nH
        else:
            # qwen3 and gemma2: the class defaults (128, 256) apply when absent.
            assert hd is not None, "config: head_dim absent (class default not exercised here)"
            self.d = hd
        self.tied = bool(c.get("tie_word_embeddings", fam == "gemma2"))
        self.norm_offset = 1.0 if fam == "gemma2" else 0.0
        self.qk_norm = fam == "qwen3"
        self.sandwich = fam == "gemma2"
        self.attn_scale = self.d ** -0.5
        self.attn_softcap = None
        self.final_softcap = None
        self.embed_scale = 1.0
        if fam == "gemma2":
            act = c.get("hidden_activation", "gelu_pytorch_tanh")
            assert c.get("hidden_act", act) == act, "config: hidden_act and hidden_activation disagree"
            self.attn_scale = float(c.get("query_pre_attn_scalar", 256)) ** -0.5
            self.attn_softcap = c.get("attn_logit_softcapping", 50.0)
            self.final_softcap = c.get("final_logit_softcapping", 30.0)
            # HF: normalizer = torch.tensor(hidden_size ** 0.5, dtype=embedding dtype);
            # the models here are f32, so the f32-rounded sqrt(H).
            self.embed_scale = float(np.float32(self.H ** 0.5))
        else:
            act = c.get("hidden_act", "silu")
        if act not in ("silu", "gelu_pytorch_tanh"):
            raise ValueError(f"config: activation {act!r} not handled")
        self.act = act
        # Which layers slide (families.md section 4).
        self.window = [None] * self.L
        lt = c.get("layer_types")
        if lt is not None:
            assert len(lt) == self.L and set(lt) <= {"sliding_attention", "full_attention"}, lt
        if fam == "qwen3":
            if c.get("use_sliding_window", False):
                W = c["sliding_window"]
                for i in range(self.L):
                    slides = (lt[i] == "sliding_attention") if lt is not None else (
                        i >= c.get("max_window_layers", 28))
                    self.window[i] = W if slides else None
        elif fam == "gemma2":
            W = c.get("sliding_window", 4096)
            if W is not None:
                for i in range(self.L):
                    slides = (lt[i] == "sliding_attention") if lt is not None else (i % 2 == 0)
                    self.window[i] = W if slides else None
        self.in_out = {"q": (self.H, self.nH * self.d), "k": (self.H, self.nKV * self.d),
                       "v": (self.H, self.nKV * self.d), "o": (self.nH * self.d, self.H),
                       "gate": (self.H, self.F), "up": (self.H, self.F), "down": (self.F, self.H)}


# ----------------------------------------------------------------------------
# Forward (float64 torch; written from the formulas)
# ----------------------------------------------------------------------------

class Model:
    def __init__(self, config, tensors):
        self.spec = s = Spec(config)
        self.w = {k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in tensors.items()}
        need = ["model.embed_tokens.weight", "model.norm.weight"]
        if not s.tied:
            need.append("lm_head.weight")
        for i in range(s.L):
            p = f"model.layers.{i}."
            need += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
            need += [p + TARGET_MODULE[t] + ".weight" for t in TARGETS]
            if s.qk_norm:
                need += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
            if s.sandwich:
                need += [p + "pre_feedforward_layernorm.weight", p + "post_feedforward_layernorm.weight"]
        missing = [n for n in need if n not in self.w]
        if missing:
            raise ValueError(f"model.safetensors: missing tensors {missing}")
        extra = set(self.w) - set(need)
        if extra:
            raise ValueError(f"model.safetensors: tensors this reference does not use: {sorted(extra)}")
        for i in range(s.L):
            for t in TARGETS:
                K, N = s.in_out[t]
                W = self.w[f"model.layers.{i}.{TARGET_MODULE[t]}.weight"]
                assert tuple(W.shape) == (N, K), (i, t, W.shape)

    def rms_norm(self, x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.spec.eps) * (self.spec.norm_offset + w)

    def rope(self, x):
        """x [T, heads, d]; HF rotate_half: channel i pairs with i + d/2."""
        T, d = x.shape[0], x.shape[-1]
        inv = self.spec.theta ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2.0 / d)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        # Angles in float64, cos/sin then in the working dtype (families.md section 3).
        cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :].to(x.dtype)
        sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :].to(x.dtype)
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def act(self, g):
        if self.spec.act == "silu":
            return g * torch.sigmoid(g)
        return 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3)))

    def lin(self, x, layer, t, lora, scale):
        y = x @ self.w[f"model.layers.{layer}.{TARGET_MODULE[t]}.weight"].T
        if lora is not None and scale != 0.0:
            A, B = lora[(layer, t)]
            y = y + scale * ((x @ A.T) @ B.T)
        return y

    def attention(self, h, layer, lora, scale):
        s = self.spec
        T = h.shape[0]
        q = self.lin(h, layer, "q", lora, scale).view(T, s.nH, s.d)
        k = self.lin(h, layer, "k", lora, scale).view(T, s.nKV, s.d)
        v = self.lin(h, layer, "v", lora, scale).view(T, s.nKV, s.d)
        if s.qk_norm:
            q = self.rms_norm(q, self.w[f"model.layers.{layer}.self_attn.q_norm.weight"])
            k = self.rms_norm(k, self.w[f"model.layers.{layer}.self_attn.k_norm.weight"])
        q, k = self.rope(q), self.rope(k)
        g = s.nH // s.nKV
        k = k.repeat_interleave(g, dim=1)  # query head j uses kv head j // g
        v = v.repeat_interleave(g, dim=1)
        sc = torch.einsum("ihd,jhd->hij", q, k) * s.attn_scale
        if s.attn_softcap is not None:
            sc = s.attn_softcap * torch.tanh(sc / s.attn_softcap)
        i = torch.arange(T)[:, None]
        j = torch.arange(T)[None, :]
        allowed = j <= i
        if s.window[layer] is not None:
            allowed = allowed & (i - j < s.window[layer])
        sc = sc.masked_fill(~allowed[None], float("-inf"))
        p = torch.softmax(sc, -1)
        o = torch.einsum("hij,jhd->ihd", p, v).reshape(T, s.nH * s.d)
        return self.lin(o, layer, "o", lora, scale)

    def forward(self, ids, lora=None, scale=0.0):
        """ids: list of int -> logits [T, V] float64."""
        s = self.spec
        x = self.w["model.embed_tokens.weight"][torch.tensor(ids)] * s.embed_scale
        for l in range(s.L):
            p = f"model.layers.{l}."
            a = self.attention(self.rms_norm(x, self.w[p + "input_layernorm.weight"]), l, lora, scale)
            if s.sandwich:
                a = self.rms_norm(a, self.w[p + "post_attention_layernorm.weight"])
                h = self.rms_norm(x + a, self.w[p + "pre_feedforward_layernorm.weight"])
            else:
                h = self.rms_norm(x + a, self.w[p + "post_attention_layernorm.weight"])
            x = x + a
            m = self.lin(self.act(self.lin(h, l, "gate", lora, scale)) * self.lin(h, l, "up", lora, scale),
                         l, "down", lora, scale)
            if s.sandwich:
                m = self.rms_norm(m, self.w[p + "post_feedforward_layernorm.weight"])
            x = x + m
        x = self.rms_norm(x, self.w["model.norm.weight"])
        out = self.w["model.embed_tokens.weight"] if s.tied else self.w["lm_head.weight"]
        logits = x @ out.T
        if s.final_softcap is not None:
            logits = s.final_softcap * torch.tanh(logits / s.final_softcap)
        return logits


# ----------------------------------------------------------------------------
# Log-probs and objectives
# ----------------------------------------------------------------------------

def response_logp(model, prompt, response, lora, scale):
    """Per-token log-probs of the response tokens: token t of the sequence
    prompt+response is scored by log_softmax(logits[t - 1])[token t]."""
    ids = list(prompt) + list(response)
    logits = model.forward(ids, lora, scale)
    lp = torch.log_softmax(logits, -1)
    P = len(prompt)
    pos = torch.arange(P - 1, len(ids) - 1)
    return lp[pos, torch.tensor(ids[P:])]


def log1mexp(x):
    """log(1 - exp(x)) for x < 0, stable on both sides of -ln 2 (Maechler 2012)."""
    return torch.where(x < -math.log(2.0), torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def objective(method, lw, lr, ref_w, ref_r):
    """lw, lr, ref_w, ref_r: lists (one per pair) of per-token log-prob tensors."""
    F = torch.nn.functional
    Sw = torch.stack([t.sum() for t in lw])
    Sr = torch.stack([t.sum() for t in lr])
    dt = Sw.dtype
    Aw = Sw / torch.tensor([float(len(t)) for t in lw], dtype=dt)
    Ar = Sr / torch.tensor([float(len(t)) for t in lr], dtype=dt)
    rSw = torch.stack([t.sum() for t in ref_w])
    rSr = torch.stack([t.sum() for t in ref_r])
    rAw = rSw / torch.tensor([float(len(t)) for t in ref_w], dtype=dt)
    rAr = rSr / torch.tensor([float(len(t)) for t in ref_r], dtype=dt)
    nll = -torch.cat(lw).sum() / sum(len(t) for t in lw)
    hp = HP[method]
    if method == "sft":
        return nll, {}
    if method in ("dpo", "dpo_ls"):
        z = hp["beta"] * ((Sw - rSw) - (Sr - rSr))
        ls = hp["label_smoothing"]
        return (-(1 - ls) * F.logsigmoid(z) - ls * F.logsigmoid(-z)).mean(), {"z": z}
    if method == "orpo":
        log_odds = (Aw - Ar) - (log1mexp(Aw) - log1mexp(Ar))
        return nll + hp["lambda"] * (-F.logsigmoid(log_odds)).mean(), {"log_odds": log_odds}
    if method == "simpo":
        return (-F.logsigmoid(hp["beta"] * (Aw - Ar) - hp["gamma"])).mean(), {}
    if method == "ipo":
        h = (Aw - rAw) - (Ar - rAr)
        return ((h - 1.0 / (2.0 * hp["beta"])) ** 2).mean(), {"h": h}
    if method == "hinge":
        h = (Sw - rSw) - (Sr - rSr)
        margin = 1.0 - hp["beta"] * h
        return torch.relu(margin).mean(), {"margin": margin}
    raise ValueError(method)


# ----------------------------------------------------------------------------
# One case
# ----------------------------------------------------------------------------

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def make_lora(spec):
    """A [r, in] ~ N(0, 0.05^2), B [out, r] ~ N(0, 0.02^2), layer-major then target
    order q,k,v,o,gate,up,down, A before B, from torch.Generator seed LORA_SEED;
    rounded to f32 so an f32 adapter holds the same numbers."""
    g = torch.Generator().manual_seed(LORA_SEED)
    lora = {}
    for l in range(spec.L):
        for t in TARGETS:
            K, N = spec.in_out[t]
            A = (torch.randn(LORA_RANK, K, generator=g, dtype=torch.float64) * LORA_A_STD).float().double()
            B = (torch.randn(N, LORA_RANK, generator=g, dtype=torch.float64) * LORA_B_STD).float().double()
            lora[(l, t)] = (A.requires_grad_(True), B.requires_grad_(True))
    return lora


def make_pairs(V):
    g = torch.Generator().manual_seed(DATA_SEED)

    def ids(n):
        return [int(x) for x in torch.randint(3, V, (n,), generator=g)]  # 0..2 special

    pairs = []
    for _ in range(N_PAIRS):
        pairs.append({"prompt": ids(PROMPT_LEN), "chosen": ids(CHOSEN_LEN), "rejected": ids(REJECTED_LEN)})
    return pairs


def all_losses(model, pairs, lora, scale, ref):
    lw = [response_logp(model, p["prompt"], p["chosen"], lora, scale) for p in pairs]
    lr = [response_logp(model, p["prompt"], p["rejected"], lora, scale) for p in pairs]
    return lw, lr, {m: objective(m, lw, lr, ref[0], ref[1]) for m in METHODS}


def fd_check(model, pairs, lora, scale, ref, grads, n_entries, rng):
    """Fourth-order central differences (float64, step FD_STEP) of every loss on
    n_entries entries, alternately of an A and a B, of randomly drawn (layer,
    target)s. Returns (max relative error, entries, per-method max)."""
    keys = list(lora)
    picks = []
    for e in range(n_entries):
        l, t = keys[rng.randrange(len(keys))]
        which = e % 2
        M = lora[(l, t)][which]
        picks.append((l, t, which, rng.randrange(M.shape[0]), rng.randrange(M.shape[1])))
    h = FD_STEP
    per = {m: 0.0 for m in METHODS}
    for (l, t, which, r, c) in picks:
        M = lora[(l, t)][which]
        old = M.data[r, c].item()
        f = {}
        with torch.no_grad():
            for k in (-2, -1, 1, 2):
                M.data[r, c] = old + k * h
                f[k] = {m: v[0].item() for m, v in all_losses(model, pairs, lora, scale, ref)[2].items()}
            M.data[r, c] = old
        for m in METHODS:
            fd = (-f[2][m] + 8 * f[1][m] - 8 * f[-1][m] + f[-2][m]) / (12 * h)
            an = grads[m][(l, t)][which][r, c].item()
            rel = abs(fd - an) / max(abs(fd), abs(an), 1e-12)
            per[m] = max(per[m], rel)
    return max(per.values()), len(picks), per


def f32_deviation(model, pairs, lora, scale, losses, grads):
    """The same formulas run in float32 torch (weights, adapter and every op in
    f32; RoPE angles in f64). Informative: how far an f32 implementation lands
    from the f64 golden. Per method: relative loss error, and the largest
    max|g32 - g64| / max|g64| over the gradient tensors."""
    m32 = Model.__new__(Model)
    m32.spec, m32.w = model.spec, {k: v.float() for k, v in model.w.items()}
    l32 = {k: (A.detach().float().requires_grad_(True), B.detach().float().requires_grad_(True))
           for k, (A, B) in lora.items()}
    with torch.no_grad():
        ref = ([response_logp(m32, p["prompt"], p["chosen"], None, 0.0) for p in pairs],
               [response_logp(m32, p["prompt"], p["rejected"], None, 0.0) for p in pairs])
    _, _, L32 = all_losses(m32, pairs, l32, scale, ref)
    params = [x for ab in l32.values() for x in ab]
    out = {}
    for m in METHODS:
        gs = torch.autograd.grad(L32[m][0], params, retain_graph=True)
        it = iter(gs)
        worst = 0.0
        for key in l32:
            for j in range(2):
                g32 = next(it).double()
                g64 = grads[m][key][j]
                worst = max(worst, ((g32 - g64).abs().max() / g64.abs().max()).item())
        out[m] = {"loss_rel": abs(L32[m][0].item() - losses[m][0].item()) / abs(losses[m][0].item()),
                  "grad_rel_to_tensor_absmax": worst}
    return out


def crosscheck_forward_ref(model_dir, ids, base_logits):
    """Max |diff| between this forward (adapter off) and forward_ref.py's numpy forward."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import forward_ref  # the repo's numpy reference (a different implementation)
    except ImportError:
        return None
    m = forward_ref.Model.from_dir(model_dir)
    other = np.asarray(m.forward(list(ids)), dtype=np.float64)
    return float(np.max(np.abs(other - base_logits)))


def run_case(lumen, case, out_dir, tmp, fd_entries):
    model_dir = os.path.join(tmp, case)
    cmd = [lumen, "synth", case, "--format", "hf", "--seed", "1", "-o", model_dir]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    st = os.path.join(model_dir, "model.safetensors")
    model = Model(config, read_safetensors(st))
    spec = model.spec
    scale = LORA_ALPHA / LORA_RANK
    pairs = make_pairs(spec.V)
    lora = make_lora(spec)

    # The sequences must exceed the sliding window where one applies.
    windows = [w for w in spec.window if w is not None]
    for p in pairs:
        for k in ("chosen", "rejected"):
            if windows:
                assert len(p["prompt"]) + len(p[k]) > max(windows), "a sequence does not exceed the window"

    with torch.no_grad():
        ref_w = [response_logp(model, p["prompt"], p["chosen"], None, 0.0) for p in pairs]
        ref_r = [response_logp(model, p["prompt"], p["rejected"], None, 0.0) for p in pairs]
        # Scale 0 with the adapter present is the adapter-off model, exactly.
        z = response_logp(model, pairs[0]["prompt"], pairs[0]["chosen"], lora, 0.0)
        assert torch.equal(z, ref_w[0])
        # The golden must exercise the window: without it the log-probs change.
        if windows:
            saved = spec.window
            spec.window = [None] * spec.L
            nowin = response_logp(model, pairs[0]["prompt"], pairs[0]["chosen"], None, 0.0)
            spec.window = saved
            assert (nowin - ref_w[0]).abs().max() > 1e-6, "the sliding window changes nothing"
    ref = (ref_w, ref_r)
    lw, lr, losses = all_losses(model, pairs, lora, scale, ref)

    params = [m for ab in lora.values() for m in ab]
    grads = {}
    for m in METHODS:
        gs = torch.autograd.grad(losses[m][0], params, retain_graph=True)
        it = iter(gs)
        grads[m] = {key: (next(it), next(it)) for key in lora}

    # Guards: no objective sits in a flat region, every gradient is non-trivial.
    assert (losses["hinge"][1]["margin"] > 0.1).all(), losses["hinge"][1]["margin"]
    for m in METHODS:
        for key, (gA, gB) in grads[m].items():
            assert gA.abs().max() > 0 and gB.abs().max() > 0, (m, key)

    rng = __import__("random").Random(1234)
    fd_rel, fd_n, fd_per = fd_check(model, pairs, lora, scale, ref, grads, fd_entries, rng)

    f32dev = f32_deviation(model, pairs, lora, scale, losses, grads)

    # Logits of the first chosen sequence, without and with the adapter.
    seq0 = pairs[0]["prompt"] + pairs[0]["chosen"]
    with torch.no_grad():
        base_logits = model.forward(seq0).numpy()
        peft_logits = model.forward(seq0, lora, scale).numpy()
        # Merged weights W + s B A give the same logits as the unmerged adapter.
        merged = Model.__new__(Model)
        merged.spec, merged.w = spec, dict(model.w)
        for (l, t), (A, B) in lora.items():
            n = f"model.layers.{l}.{TARGET_MODULE[t]}.weight"
            merged.w[n] = model.w[n] + scale * (B @ A)
        merge_diff = float(np.max(np.abs(merged.forward(seq0).numpy() - peft_logits)))
    assert merge_diff < 1e-10, merge_diff
    xref = crosscheck_forward_ref(model_dir, seq0, base_logits)
    if xref is not None:
        assert xref < 1e-9, f"{case}: forward differs from forward_ref.py by {xref}"

    print(f"{case}: family {spec.family}, L {spec.L}, H {spec.H}, nH {spec.nH}, nKV {spec.nKV}, d {spec.d}, "
          f"V {spec.V}, windows {spec.window}, tied {spec.tied}")
    print(f"  losses: " + ", ".join(f"{m} {losses[m][0].item():.10g}" for m in METHODS))
    print(f"  FD check (4th-order central, step {FD_STEP}): {fd_n} entries x {len(METHODS)} losses, "
          f"max relative error {fd_rel:.3e} (" + ", ".join(f"{m} {v:.1e}" for m, v in fd_per.items()) + ")")
    print(f"  forward vs forward_ref.py: max |diff| {xref if xref is not None else 'n/a'}; "
          f"merged vs unmerged: {merge_diff:.3e}")
    print("  f32 torch vs f64: loss rel max {:.1e}, grad (per-tensor absmax-relative) max {:.1e}".format(
        max(v["loss_rel"] for v in f32dev.values()), max(v["grad_rel_to_tensor_absmax"] for v in f32dev.values())))
    if fd_rel > 1e-6:
        raise SystemExit(f"{case}: finite-difference check failed ({fd_rel:.3e} > 1e-6)")

    # ---- write
    cdir = os.path.join(out_dir, case)
    os.makedirs(os.path.join(cdir, "peft"), exist_ok=True)
    g = {}
    for (l, t), (A, B) in lora.items():
        g[f"lora.{l}.{t}.A"] = A.detach().numpy()
        g[f"lora.{l}.{t}.B"] = B.detach().numpy()
    for i in range(N_PAIRS):
        g[f"logp.{i}.chosen"] = lw[i].detach().numpy()
        g[f"logp.{i}.rejected"] = lr[i].detach().numpy()
        g[f"ref_logp.{i}.chosen"] = ref_w[i].numpy()
        g[f"ref_logp.{i}.rejected"] = ref_r[i].numpy()
    for m in METHODS:
        g[f"loss.{m}"] = np.array([losses[m][0].item()])
        for (l, t), (gA, gB) in grads[m].items():
            g[f"grad.{m}.{l}.{t}.A"] = gA.numpy()
            g[f"grad.{m}.{l}.{t}.B"] = gB.numpy()
    g["base_logits"] = base_logits
    g["peft_logits"] = peft_logits
    write_safetensors(os.path.join(cdir, "golden.safetensors"), g, "F64")

    peft = {}
    for (l, t), (A, B) in lora.items():
        n = f"base_model.model.model.layers.{l}.{TARGET_MODULE[t]}"
        peft[n + ".lora_A.weight"] = A.detach().numpy()
        peft[n + ".lora_B.weight"] = B.detach().numpy()
    write_safetensors(os.path.join(cdir, "peft", "adapter_model.safetensors"), peft, "F32")
    adapter_config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": LORA_RANK, "lora_alpha": LORA_ALPHA,
        "target_modules": [TARGET_MODULE[t].split(".")[1] for t in TARGETS],
        "lora_dropout": 0.0, "bias": "none", "use_rslora": False, "fan_in_fan_out": False,
        "base_model_name_or_path": case, "inference_mode": True, "modules_to_save": None,
        "layers_to_transform": None, "init_lora_weights": True,
    }
    with open(os.path.join(cdir, "peft", "adapter_config.json"), "w") as f:
        json.dump(adapter_config, f, indent=2, sort_keys=True)
        f.write("\n")

    case_json = {
        "made_by": MADE_BY,
        "command": f"/usr/bin/python3 {MADE_BY} LUMEN_BIN OUT_DIR",
        "synth_command": ["lumen", "synth", case, "--format", "hf", "--seed", "1", "-o", "<model_dir>"],
        "model_sha256": {"model.safetensors": sha256(st),
                         "config.json": sha256(os.path.join(model_dir, "config.json"))},
        "config": config,
        "derived": {"family": spec.family, "head_dim": spec.d, "sliding_window_per_layer": spec.window,
                    "tied": spec.tied, "attn_scale": spec.attn_scale, "embed_scale": spec.embed_scale,
                    "attn_softcap": spec.attn_softcap, "final_softcap": spec.final_softcap},
        "lora": {"rank": LORA_RANK, "alpha": LORA_ALPHA, "scale": scale, "rslora": False, "dropout": 0.0,
                 "targets": list(TARGETS), "target_modules": {t: TARGET_MODULE[t] for t in TARGETS},
                 "layers": list(range(spec.L)),
                 "init": f"torch.Generator seed {LORA_SEED}; per layer, per target in the order above: "
                         f"A [r, in] = randn * {LORA_A_STD}, then B [out, r] = randn * {LORA_B_STD}; "
                         f"rounded to f32 (values stored F64 but f32-exact)",
                 "shapes": {t: {"A": [LORA_RANK, spec.in_out[t][0]], "B": [spec.in_out[t][1], LORA_RANK]}
                            for t in TARGETS}},
        "pairs": pairs,
        "hyperparameters": HP,
        "conventions": {
            "sequence": "each sequence is prompt + response, positions 0..T-1, its own causal mask "
                        "(no packing); token t of the response, at sequence index P + t, is scored "
                        "by log_softmax(logits[P + t - 1])[token]",
            "logp.{i}.chosen|rejected": "[n] per response token, adapter on (scale alpha/r)",
            "ref_logp.{i}.chosen|rejected": "[n] per response token, adapter off (the reference model)",
            "S": "sum of a sequence's response log-probs; A = S / n (mean)",
            "sft": "sum of -logp over all chosen tokens of both pairs / their count (2 x 7 = 14)",
            "dpo": "mean over pairs of -(1-ls) logsigmoid(z) - ls logsigmoid(-z), "
                   "z = beta ((S_w - refS_w) - (S_r - refS_r)); dpo_ls has ls = 0.1",
            "orpo": "nll (as sft) + lambda * mean over pairs of -logsigmoid(log_odds), "
                    "log_odds = (A_w - A_r) - (log1mexp(A_w) - log1mexp(A_r)), log1mexp(x) = log(1 - e^x)",
            "simpo": "mean over pairs of -logsigmoid(beta (A_w - A_r) - gamma)",
            "ipo": "mean over pairs of (h - 1/(2 beta))^2, h = (A_w - refA_w) - (A_r - refA_r)",
            "hinge": "mean over pairs of relu(1 - beta h), h = (S_w - refS_w) - (S_r - refS_r); "
                     "every pair is in the sloped region (checked)",
            "grad.{m}.{l}.{t}.A|B": "d loss.{m} / d A (B), same shape as lora.{l}.{t}.A (B); the "
                                    "reference log-probs are constants",
            "base_logits": "[T, V] logits of pairs[0].prompt + pairs[0].chosen, adapter off",
            "peft_logits": "[T, V] the same sequence with the adapter in peft/ applied (W x + s B (A x))",
            "targets": "q,k,v,o = self_attn.{q,k,v,o}_proj; gate,up,down = mlp.{gate,up,down}_proj",
        },
        "checks": {"fd_entries": fd_n, "fd_step": FD_STEP, "fd_max_relative_error": fd_rel,
                   "fd_max_relative_error_per_method": fd_per, "fd_stencil": "4th-order central",
                   "forward_ref_max_abs_diff": xref, "merged_vs_unmerged_max_abs_diff": merge_diff,
                   "f32_torch_deviation (informative)": f32dev},
        "losses": {m: losses[m][0].item() for m in METHODS},
    }
    with open(os.path.join(cdir, "case.json"), "w") as f:
        json.dump(case_json, f, indent=1, sort_keys=True)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("lumen")
    ap.add_argument("out_dir")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--keep-models", help="write the synth models here instead of a temp dir")
    ap.add_argument("--fd-entries", type=int, default=12)
    a = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        base = a.keep_models or tmp
        for case in a.cases.split(","):
            run_case(a.lumen, case, a.out_dir, base, a.fd_entries)


if __name__ == "__main__":
    main()
