#!/usr/bin/python3
"""The LoRA training loop a user would write in plain torch: the baseline that
`lumen bench train` is compared against (issue 16, "Measurement").

A Llama as plain nn.Modules (RMSNorm, RoPE, GQA attention, SwiGLU MLP, LM
head), frozen base weights, LoRA rank 8 alpha 16 on q, k, v, o, gate, up and
down of every layer, AdamW on the LoRA parameters, global-norm clip 1.0. No
lumen code, no fusion, no memory tricks: what HF transformers + PEFT + TRL do
on the CPU, written out so that Debian's python3-torch (1.13, no
transformers) runs it.

  /usr/bin/python3 tools/reference/torch_lora_train.py --layers 2 --seq 512 \\
      --method orpo --steps 3 --threads 2 [--autocast bf16]

prints one JSON line: step time (median over --steps after one warm-up
step), peak RSS of this process (ru_maxrss; the model is built inside it),
losses, and the settings.

The data are lumen bench train's rows (src/lumen/train/bench_train.cc): 4
preference rows, prompt seq/2 tokens, chosen and rejected seq - seq/2 tokens
each, with the same token formula; step i trains on row i mod 4, batch 1.
  sft:  prompt + chosen, token-mean NLL over the chosen tokens
  orpo: prompt + chosen and prompt + rejected as a batch of 2 (TRL's
        concatenated forward); NLL over the chosen tokens +
        lambda * -log sigmoid(log-odds of the per-token mean log-probs),
        the loss of src/lumen/train/objective.cc.

The shapes default to lumen's synth llama-3.2-1b (engine/synth.cc): dim 2048,
32 heads of 64, 8 KV heads, ffn 8192, vocab 128256, tied embeddings, llama3
RoPE scaling; --model DIR loads a Hugging Face directory (config.json +
model.safetensors, e.g. from `lumen synth ... --format hf`) instead, which
the loss check (torch_lora_check.py) uses.

Exit status: 0 on success, 2 on bad arguments (with the reason on stderr).
"""

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # the pyenv python3 on PATH has no torch
    sys.exit("torch_lora_train.py: torch is not importable; run it with /usr/bin/python3 "
             "(Debian's python3-torch)")

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


# ----------------------------------------------------------------------------
# Model

class Config:
    def __init__(self, dim=2048, layers=16, heads=32, kv_heads=8, head_dim=0, ffn=8192,
                 vocab=128256, eps=1e-5, rope_theta=500000.0, rope_scaling=None, tied=True):
        self.dim, self.layers, self.heads, self.kv_heads = dim, layers, heads, kv_heads
        self.head_dim = head_dim or dim // heads
        self.ffn, self.vocab, self.eps = ffn, vocab, eps
        self.rope_theta, self.rope_scaling, self.tied = rope_theta, rope_scaling, tied

    @staticmethod
    def llama32_1b(layers):
        # engine/synth.cc "llama-3.2-1b"
        return Config(layers=layers, rope_scaling={
            "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})

    @staticmethod
    def from_hf(cfg):
        dim, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        return Config(dim=dim, layers=cfg["num_hidden_layers"], heads=heads,
                      kv_heads=cfg.get("num_key_value_heads", heads),
                      head_dim=cfg.get("head_dim") or dim // heads,
                      ffn=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                      eps=cfg.get("rms_norm_eps", 1e-5), rope_theta=cfg.get("rope_theta", 10000.0),
                      rope_scaling=cfg.get("rope_scaling"),
                      tied=bool(cfg.get("tie_word_embeddings", False)))

    def describe(self):
        return {"dim": self.dim, "layers": self.layers, "heads": self.heads,
                "kv_heads": self.kv_heads, "head_dim": self.head_dim, "ffn": self.ffn,
                "vocab": self.vocab, "tied": self.tied}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class LoraLinear(nn.Module):
    """y = x W^T + s (x A^T) B^T with W frozen; PEFT's init (A Kaiming-uniform
    with bound 1/sqrt(in), B zero)."""

    def __init__(self, n_out, n_in, rank, alpha):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in), requires_grad=False)
        self.lora_A = nn.Parameter(torch.empty(rank, n_in))
        self.lora_B = nn.Parameter(torch.zeros(n_out, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x):
        return F.linear(x, self.weight) + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scale


def rope_inv_freq(c):
    """[head_dim/2] inverse frequencies (HF rotate_half convention), with the
    scaling of config.json's rope_scaling (forward_ref.Rope: the project's
    numpy reference)."""
    sys.path.insert(0, HERE)
    from forward_ref import Rope  # numpy only
    inv, factor = Rope(c.head_dim, c.rope_theta, c.rope_scaling, 131072).params(0)
    if factor != 1.0:
        raise SystemExit(f"torch_lora_train.py: rope attention factor {factor} not supported")
    return torch.tensor(inv, dtype=torch.float64)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c, rank, alpha):
        super().__init__()
        self.c = c
        H, Hkv, Dh, D = c.heads, c.kv_heads, c.head_dim, c.dim
        self.q = LoraLinear(H * Dh, D, rank, alpha)
        self.k = LoraLinear(Hkv * Dh, D, rank, alpha)
        self.v = LoraLinear(Hkv * Dh, D, rank, alpha)
        self.o = LoraLinear(D, H * Dh, rank, alpha)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        H, Hkv, Dh = self.c.heads, self.c.kv_heads, self.c.head_dim
        q = self.q(x).view(B, T, H, Dh).transpose(1, 2)  # [B, H, T, Dh]
        k = self.k(x).view(B, T, Hkv, Dh).transpose(1, 2)  # [B, Hkv, T, Dh]
        v = self.v(x).view(B, T, Hkv, Dh).transpose(1, 2)
        q = q * cos.to(q.dtype) + rotate_half(q) * sin.to(q.dtype)
        k = k * cos.to(k.dtype) + rotate_half(k) * sin.to(k.dtype)
        k = k.repeat_interleave(H // Hkv, dim=1)  # HF repeat_kv
        v = v.repeat_interleave(H // Hkv, dim=1)
        if HAS_SDPA:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # HF's eager attention: softmax in f32
            s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(Dh)) + mask
            p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
            o = torch.matmul(p, v)
        return self.o(o.transpose(1, 2).reshape(B, T, H * Dh))


class Mlp(nn.Module):
    def __init__(self, c, rank, alpha):
        super().__init__()
        self.gate = LoraLinear(c.ffn, c.dim, rank, alpha)
        self.up = LoraLinear(c.ffn, c.dim, rank, alpha)
        self.down = LoraLinear(c.dim, c.ffn, rank, alpha)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, c, rank, alpha):
        super().__init__()
        self.attn_norm = RMSNorm(c.dim, c.eps)
        self.attn = Attention(c, rank, alpha)
        self.mlp_norm = RMSNorm(c.dim, c.eps)
        self.mlp = Mlp(c, rank, alpha)

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, c, rank=8, alpha=16.0):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.vocab, c.dim)
        self.embed.weight.requires_grad_(False)
        self.blocks = nn.ModuleList(Block(c, rank, alpha) for _ in range(c.layers))
        self.norm = RMSNorm(c.dim, c.eps)
        self.lm_head = None
        if not c.tied:
            self.lm_head = nn.Parameter(torch.empty(c.vocab, c.dim), requires_grad=False)
        self.register_buffer("inv_freq", rope_inv_freq(c), persistent=False)

    def forward(self, ids):  # ids [B, T] -> logits [B, T, V] (f32)
        T = ids.shape[1]
        ang = torch.arange(T, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
        ang = torch.cat((ang, ang), dim=-1)
        cos, sin = ang.cos().float(), ang.sin().float()  # [T, Dh]
        mask = None
        if not HAS_SDPA:
            mask = torch.full((T, T), float("-inf")).triu(1)
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x, cos, sin, mask)
        x = self.norm(x)
        head = self.embed.weight if self.lm_head is None else self.lm_head
        return F.linear(x, head).float()  # HF LlamaForCausalLM upcasts the logits

    def lora_parameters(self):
        return [p for n, p in self.named_parameters() if "lora_" in n]

    def init_random(self, seed):
        """Frozen base weights ~ N(0, 0.02), norms 1, from one generator."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "lora_" in name or name.endswith("norm.weight"):
                    continue
                p.normal_(0.0, 0.02, generator=g)

    def load_hf(self, tensors):
        """tensors: HF names -> numpy arrays (safetensors_np.load_model_dir)."""
        names = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
                 "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
                 "down": "mlp.down_proj"}
        own = {"model.embed_tokens.weight": self.embed.weight, "model.norm.weight": self.norm.weight}
        if self.lm_head is not None:
            own["lm_head.weight"] = self.lm_head
        for i, b in enumerate(self.blocks):
            p = f"model.layers.{i}."
            own[p + "input_layernorm.weight"] = b.attn_norm.weight
            own[p + "post_attention_layernorm.weight"] = b.mlp_norm.weight
            for t in TARGETS:
                mod = getattr(b.attn if t in ("q", "k", "v", "o") else b.mlp, t)
                own[p + names[t] + ".weight"] = mod.weight
        with torch.no_grad():
            for name, dst in own.items():
                if name not in tensors:
                    raise SystemExit(f"torch_lora_train.py: tensor {name} missing from the model")
                src = torch.from_numpy(tensors[name].astype("float32"))
                if tuple(src.shape) != tuple(dst.shape):
                    raise SystemExit(f"torch_lora_train.py: {name} has shape {tuple(src.shape)}, "
                                     f"expected {tuple(dst.shape)}")
                dst.copy_(src)


# ----------------------------------------------------------------------------
# Data and losses

def bench_rows(vocab, seq):
    """lumen bench train's 4 preference rows (bench_train.cc RunChild)."""
    half = seq // 2
    rows = []
    for r in range(4):
        prompt = [(r * 7919 + i * 31) % vocab for i in range(half)]
        chosen = [(r * 104729 + i * 17 + 3) % vocab for i in range(seq - half)]
        rejected = [(r * 1299709 + i * 13 + 5) % vocab for i in range(seq - half)]
        rows.append((prompt, chosen, rejected))
    return rows


def make_batch(method, prompt, chosen, rejected):
    """ids [B, T], labels [B, T] (-100 on the prompt: no loss there)."""
    seqs = [prompt + chosen] if method == "sft" else [prompt + chosen, prompt + rejected]
    T = max(len(s) for s in seqs)  # right padding (label -100): causal, so it changes nothing
    ids = torch.tensor([s + [0] * (T - len(s)) for s in seqs], dtype=torch.long)
    labels = ids.clone()
    labels[:, :len(prompt)] = -100
    for i, s in enumerate(seqs):
        labels[i, len(s):] = -100
    return ids, labels


def loss_fn(method, logits, labels, lam=0.1):
    """(loss, nll) as objective.cc computes them; logits [B, T, V], position t
    predicts token t + 1."""
    V = logits.shape[-1]
    logits, labels = logits[:, :-1], labels[:, 1:]
    if method == "sft":
        nll = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)
        return nll, nll
    # orpo (TRL's ORPOTrainer): NLL of the chosen, log-odds of the mean log-probs.
    nll = F.cross_entropy(logits[0], labels[0], ignore_index=-100)
    mask = labels != -100
    logp = torch.gather(logits.log_softmax(-1), -1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    A = (logp * mask).sum(-1) / mask.sum(-1)  # [2]: chosen, rejected
    log_odds = (A[0] - A[1]) - (torch.log1p(-torch.exp(A[0])) - torch.log1p(-torch.exp(A[1])))
    return nll - lam * F.logsigmoid(log_odds), nll


# ----------------------------------------------------------------------------
# Driver

def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="plain torch LoRA training loop (the baseline of lumen bench train)")
    ap.add_argument("--model", help="Hugging Face dir (config.json + model.safetensors); "
                    "default: random weights at the shape of the flags below")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--untied", action="store_true",
                    help="a separate LM head (lumen's synth llama-3.2-1b ties it to the embedding)")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--method", default="orpo")
    ap.add_argument("--lambda", dest="lam", type=float, default=0.1, help="ORPO's lambda (0.1)")
    ap.add_argument("--seq", type=int, default=512, help="tokens per sequence (512)")
    ap.add_argument("--steps", type=int, default=3, help="measured steps after one warm-up (3)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--threads", "-t", type=int, default=os.cpu_count())
    ap.add_argument("--autocast", default="off", help="off (f32) or bf16")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    def bad(msg):
        ap.error(msg)  # prints usage and the reason, exits 2

    if a.method not in ("sft", "orpo"):
        bad(f"--method {a.method!r}: choose sft or orpo")
    if a.autocast not in ("off", "bf16"):
        bad(f"--autocast {a.autocast!r}: choose off or bf16")
    for name in ("layers", "dim", "heads", "kv_heads", "head_dim", "ffn", "rank", "steps",
                 "threads"):
        if getattr(a, name) < 1:
            bad(f"--{name.replace('_', '-')} {getattr(a, name)}: must be at least 1")
    if a.seq < 4:
        bad(f"--seq {a.seq}: must be at least 4 (prompt seq/2 tokens, responses the rest)")
    if a.vocab < 2:
        bad(f"--vocab {a.vocab}: must be at least 2")
    if a.heads % a.kv_heads:
        bad(f"--heads {a.heads} is not a multiple of --kv-heads {a.kv_heads}")
    if a.head_dim % 2:
        bad(f"--head-dim {a.head_dim}: must be even (RoPE rotates pairs)")
    if not a.lr > 0:
        bad(f"--lr {a.lr}: must be positive")
    if a.model and not os.path.isfile(os.path.join(a.model, "config.json")):
        bad(f"--model {a.model}: no config.json there (expected a Hugging Face directory)")
    if a.autocast == "bf16":
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                torch.ones(2, 2) @ torch.ones(2, 2)
        except (RuntimeError, AttributeError, TypeError) as e:
            bad(f"--autocast bf16: this torch ({torch.__version__}) has no CPU bf16 autocast: {e}")
    return a


def build_model(a):
    if a.model:
        sys.path.insert(0, HERE)
        import safetensors_np
        with open(os.path.join(a.model, "config.json"), encoding="utf-8") as f:
            c = Config.from_hf(json.load(f))
        model = Llama(c, a.rank, a.alpha)
        try:
            tensors, _ = safetensors_np.load_model_dir(a.model)
        except ValueError as e:
            raise SystemExit(f"torch_lora_train.py: {e}")
        model.load_hf(tensors)
        return model
    c = Config.llama32_1b(a.layers)
    c.dim, c.heads, c.kv_heads, c.head_dim = a.dim, a.heads, a.kv_heads, a.head_dim
    c.ffn, c.vocab, c.tied = a.ffn, a.vocab, not a.untied
    model = Llama(c, a.rank, a.alpha)
    model.init_random(a.seed)
    return model


def blas_libraries():
    """The BLAS shared objects this process mapped: torch's f32 products go
    through libblas.so.3 (BLAS_INFO=generic in Debian's build), so which one
    the loader found decides the f32 speed (the reference BLAS is ~1 GFLOP/s)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = {line.split()[-1] for line in f if "blas" in line.rsplit("/", 1)[-1]}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


def main(argv):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)  # LoRA A's draws
    t0 = time.perf_counter()
    model = build_model(a)
    build_s = time.perf_counter() - t0
    rows = bench_rows(model.c.vocab, a.seq)
    opt = torch.optim.AdamW(model.lora_parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    times, losses = [], []
    for step in range(a.steps + 1):  # step 0 is the warm-up
        ids, labels = make_batch(a.method, *rows[step % len(rows)])
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            logits = model(ids)
        loss, nll = loss_fn(a.method, logits, labels, a.lam)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        del logits
        torch.nn.utils.clip_grad_norm_(model.lora_parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t)
        losses.append(float(loss))
        if not math.isfinite(losses[-1]):
            raise SystemExit(f"torch_lora_train.py: step {step}: the loss is not finite")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    out = {
        "impl": "torch", "torch": torch.__version__, "method": a.method, "seq": a.seq,
        "compute": "bf16-autocast" if a.autocast == "bf16" else "f32",
        "threads": a.threads, "steps": a.steps,
        "tokens_per_step": int(ids.numel()),
        "step_s": statistics.median(times[1:]), "warmup_s": times[0],
        "step_s_all": [round(x, 4) for x in times[1:]],
        "peak_rss_mb": round(peak_mb, 1), "build_s": round(build_s, 2),
        "loss_first": losses[0], "loss_last": losses[-1],
        "attention": "sdpa" if HAS_SDPA else "eager (explicit softmax)",
        "blas": blas_libraries(),
        "model": a.model or "random", **model.c.describe(),
        "rank": a.rank, "alpha": a.alpha,
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
