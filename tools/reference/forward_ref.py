#!/usr/bin/python3
"""Independent float64 numpy reference of the dense decoder-only forward pass.

Written from the papers and the Hugging Face `transformers` config semantics
(see docs/design/families.md, the spec this file and lumen's C++ forward both
follow). Families: llama, mistral, qwen2, qwen3, gemma2, gemma3 (text),
minicpm, phi3.

Usage:
  forward_ref.py MODEL_DIR --tokens "1 2 3" --out GOLDEN_DIR [-n 64]
      full causal forward over the prompt (logits for every position) and n
      greedy tokens (KV-cached decode, argmax ties -> lowest id). Writes
      GOLDEN_DIR/logits.f32 ([T, V] little-endian float32, row = position) and
      GOLDEN_DIR/golden.json.
  forward_ref.py --check GOLDEN_DIR --candidate FILE.f32 [--tol 1e-4]
      [--candidate-ids "..."]  compares a candidate logits file (and
      optionally greedy ids) against a golden; exit 1 when over tolerance.

Numerics: weights are widened exactly (F16/BF16 -> f32 -> f64) and every op
runs in float64; HF's per-op bf16/f16 rounding is not emulated (the goldens
are for f32 models). The only dtype-dependent constant is Gemma's embedding
scale, rounded to the embedding storage dtype exactly as HF does.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402

GENERATED_BY = "tools/reference/forward_ref.py"

# architectures[0] / model_type -> family
_ARCH_TO_FAMILY = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "MiniCPMForCausalLM": "minicpm",
    "Phi3ForCausalLM": "phi3",
}
_MODEL_TYPE_TO_FAMILY = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "minicpm": "minicpm",
    "phi3": "phi3",
}
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "minicpm", "phi3")

# Defaults of the HF config classes for keys a config.json may omit.
# None means "required" (the reference errors naming the key).
_COMMON_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_DEFAULTS = {
    "llama": dict(rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False, mlp_bias=False,
                  tie_word_embeddings=False, hidden_act="silu", max_position_embeddings=2048),
    "mistral": dict(rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
                    max_position_embeddings=4096 * 32, sliding_window=4096),
    "qwen2": dict(rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
                  max_position_embeddings=32768, use_sliding_window=False, sliding_window=4096,
                  max_window_layers=28),
    "qwen3": dict(rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
                  max_position_embeddings=32768, use_sliding_window=False, sliding_window=4096,
                  max_window_layers=28, attention_bias=False, head_dim=128),
    "gemma2": dict(rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True,
                   hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192, head_dim=256,
                   attention_bias=False, query_pre_attn_scalar=256, sliding_window=4096,
                   final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
    "gemma3": dict(rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                   hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072, head_dim=256,
                   attention_bias=False, query_pre_attn_scalar=256, sliding_window=4096,
                   final_logit_softcapping=None, attn_logit_softcapping=None, rope_local_base_freq=10000.0,
                   sliding_window_pattern=6),
    # MiniCPM is remote code; its scalings and tying have no trustworthy default.
    "minicpm": dict(rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu", attention_bias=False,
                    max_position_embeddings=2048, scale_emb=None, scale_depth=None, dim_model_base=None,
                    tie_word_embeddings=None),
    "phi3": dict(rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
                 max_position_embeddings=4096, partial_rotary_factor=1.0, sliding_window=None),
}


class ConfigError(ValueError):
    pass


def detect_family(config):
    archs = config.get("architectures") or []
    for a in archs:
        if a in _ARCH_TO_FAMILY:
            return _ARCH_TO_FAMILY[a]
    mt = config.get("model_type")
    if mt in _MODEL_TYPE_TO_FAMILY:
        return _MODEL_TYPE_TO_FAMILY[mt]
    raise ConfigError(f"config.json: unsupported architecture {archs!r} / model_type {mt!r} "
                      f"(supported: {', '.join(sorted(_ARCH_TO_FAMILY))})")


def _get(config, family, key):
    if key in config:
        return config[key]
    d = _DEFAULTS[family]
    if key in d and d[key] is not None:
        return d[key]
    raise ConfigError(f"config.json: missing key '{key}' (family {family})")


# ----------------------------------------------------------------------------
# RoPE
# ----------------------------------------------------------------------------

class Rope:
    """Inverse frequencies and cos/sin attention factor for one RoPE flavour.

    kind: default | linear | dynamic | llama3 | yarn | longrope.
    dim: number of rotated channels (head_dim * partial_rotary_factor).
    The HF "rotate_half" convention is used: channel i pairs with i + dim/2.
    """

    def __init__(self, dim, theta, scaling, max_pos, original_max_pos=None):
        if dim % 2 != 0 or dim <= 0:
            raise ConfigError(f"rotary dimension {dim} must be positive and even")
        self.dim = dim
        self.theta = float(theta)
        self.max_pos = int(max_pos)
        self.top_level_original_max_pos = original_max_pos  # phi3 keeps it top-level
        s = dict(scaling or {})
        kind = s.get("rope_type", s.get("type", "default")) or "default"
        if kind == "su":
            kind = "longrope"
        if kind not in ("default", "linear", "dynamic", "llama3", "yarn", "longrope"):
            raise ConfigError(f"config.json: rope_scaling type {kind!r} not supported")
        self.kind = kind
        self.s = s

    def base_inv_freq(self, theta=None):
        theta = self.theta if theta is None else theta
        exps = np.arange(0, self.dim, 2, dtype=np.float64) / self.dim
        return 1.0 / (theta ** exps)

    def params(self, seq_len):
        """(inv_freq[dim/2] float64, attention_factor) for a call whose largest position is seq_len-1."""
        s = self.s
        if self.kind == "default":
            return self.base_inv_freq(), 1.0
        if self.kind == "linear":
            return self.base_inv_freq() / float(s["factor"]), 1.0
        if self.kind == "dynamic":
            factor = float(s["factor"])
            L = max(int(seq_len), self.max_pos)
            base = self.theta * ((factor * L / self.max_pos) - (factor - 1)) ** (self.dim / (self.dim - 2))
            return self.base_inv_freq(base), 1.0
        if self.kind == "llama3":
            inv = self.base_inv_freq()
            factor = float(s["factor"])
            lo = float(s["low_freq_factor"])
            hi = float(s["high_freq_factor"])
            old = float(s["original_max_position_embeddings"])
            low_wl = old / lo
            high_wl = old / hi
            wl = 2 * math.pi / inv
            out = np.where(wl > low_wl, inv / factor, inv)
            smooth = (old / wl - lo) / (hi - lo)
            smoothed = (1 - smooth) * out / factor + smooth * out
            medium = (wl >= high_wl) & (wl <= low_wl)
            return np.where(medium, smoothed, out), 1.0
        if self.kind == "yarn":
            factor = s.get("factor")
            orig = s.get("original_max_position_embeddings") or self.max_pos
            if factor is None:
                factor = self.max_pos / orig
            factor = float(factor)
            af = s.get("attention_factor")
            mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")

            def get_mscale(scale, m=1.0):
                return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

            if af is None:
                if mscale and mscale_all:
                    af = get_mscale(factor, mscale) / get_mscale(factor, mscale_all)
                else:
                    af = get_mscale(factor)
            beta_fast = s.get("beta_fast") or 32
            beta_slow = s.get("beta_slow") or 1
            dim, base = self.dim, self.theta

            def corr_dim(rot):
                return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

            low, high = corr_dim(beta_fast), corr_dim(beta_slow)
            if s.get("truncate", True):
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, dim - 1)
            if low == high:
                high += 0.001
            ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
            extrap = 1 - ramp
            pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
            inv = (1.0 / (factor * pos_freqs)) * (1 - extrap) + (1.0 / pos_freqs) * extrap
            return inv, float(af)
        if self.kind == "longrope":
            # original context: rope_scaling's, else phi3's top-level key, else max_position_embeddings
            orig = s.get("original_max_position_embeddings") or self.top_level_original_max_pos or self.max_pos
            factor = s.get("factor") or self.max_pos / orig
            af = s.get("attention_factor")
            if af is None:
                af = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
            ext = np.asarray(s["long_factor"] if seq_len > orig else s["short_factor"], dtype=np.float64)
            if ext.shape != (self.dim // 2,):
                raise ConfigError(f"config.json: rope_scaling long/short_factor has {ext.size} entries, "
                                  f"expected {self.dim // 2}")
            return self.base_inv_freq() / ext, float(af)
        raise AssertionError(self.kind)

    def cos_sin(self, positions, seq_len):
        inv, af = self.params(seq_len)
        ang = np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]  # [T, dim/2]
        ang = np.concatenate([ang, ang], axis=1)  # HF emb = cat(freqs, freqs)
        return np.cos(ang) * af, np.sin(ang) * af


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def apply_rope(x, cos, sin, rot_dim):
    """x [T, H, D]; cos/sin [T, rot_dim]. Rotates the first rot_dim channels (rotate_half)."""
    xr, xp = x[..., :rot_dim], x[..., rot_dim:]
    c, s = cos[:, None, :], sin[:, None, :]
    out = xr * c + rotate_half(xr) * s
    return np.concatenate([out, xp], axis=-1) if rot_dim < x.shape[-1] else out


def apply_rope_interleaved(x, positions, inv_freq):
    """GGUF/llama2.c convention: pairs (2i, 2i+1) rotated by pos * inv_freq[i]. x [T, H, D]."""
    ang = np.asarray(positions, dtype=np.float64)[:, None, None] * inv_freq[None, None, :]
    c, s = np.cos(ang), np.sin(ang)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def permute_qk_for_gguf(w, n_head):
    """HF rotate_half row order -> GGUF interleaved-pair row order (llama.cpp convert's permute).

    w: [n_head * head_dim, ...] (q/k weight or bias). Within each head, HF row
    j*(d/2)+i (half j, pair i) moves to row 2*i+j.
    """
    w = np.asarray(w)
    d = w.shape[0] // n_head
    if d * n_head != w.shape[0] or d % 2:
        raise ValueError(f"permute_qk_for_gguf: {w.shape[0]} rows not divisible into {n_head} even heads")
    return w.reshape(n_head, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk_from_gguf(w, n_head):
    """Inverse of permute_qk_for_gguf: GGUF interleaved -> HF rotate_half row order."""
    w = np.asarray(w)
    d = w.shape[0] // n_head
    if d * n_head != w.shape[0] or d % 2:
        raise ValueError(f"unpermute_qk_from_gguf: {w.shape[0]} rows not divisible into {n_head} even heads")
    return w.reshape(n_head, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ----------------------------------------------------------------------------
# Elementwise pieces
# ----------------------------------------------------------------------------

def rms_norm(x, w, eps, offset=0.0):
    """x * rsqrt(mean(x^2) + eps) * (offset + w); offset 1 for Gemma."""
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * (offset + w)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def activation(name, x):
    if name in ("silu", "swish"):
        return x / (1.0 + np.exp(-x))
    if name in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if name == "gelu":
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    if name == "relu":
        return np.maximum(x, 0)
    raise ConfigError(f"config.json: activation {name!r} not supported")


def softcap(x, cap):
    return np.tanh(x / cap) * cap


# ----------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------

class LayerSpec:
    def __init__(self, sliding_window, rope):
        self.sliding_window = sliding_window  # None = full causal attention
        self.rope = rope


class Spec:
    """All config semantics resolved once; the forward reads only this."""

    def __init__(self, config):
        fam = detect_family(config)
        self.family = fam
        for k in _COMMON_REQUIRED:
            if k not in config:
                raise ConfigError(f"config.json: missing key '{k}' (family {fam})")
        g = lambda k: _get(config, fam, k)  # noqa: E731
        self.vocab = int(config["vocab_size"])
        self.hidden = int(config["hidden_size"])
        self.ffn = int(config["intermediate_size"])
        self.n_layers = int(config["num_hidden_layers"])
        self.n_heads = int(config["num_attention_heads"])
        self.n_kv = int(config.get("num_key_value_heads") or self.n_heads)
        if self.n_heads % self.n_kv:
            raise ConfigError(f"config.json: num_attention_heads {self.n_heads} not a multiple of "
                              f"num_key_value_heads {self.n_kv}")
        hd = config.get("head_dim")
        if hd is None and fam in ("qwen3", "gemma2", "gemma3"):
            hd = _DEFAULTS[fam]["head_dim"]
        self.head_dim = int(hd) if hd is not None else self.hidden // self.n_heads
        self.eps = float(g("rms_norm_eps"))
        self.max_pos = int(g("max_position_embeddings"))
        self.tie = bool(g("tie_word_embeddings"))

        gemma = fam in ("gemma2", "gemma3")
        self.norm_offset = 1.0 if gemma else 0.0
        self.sandwich = gemma  # post-attention and post-feedforward norms
        self.act = g("hidden_activation") if gemma else g("hidden_act")
        self.qk_norm = fam in ("qwen3", "gemma3")

        # biases
        if fam == "qwen2":
            self.qkv_bias, self.o_bias = True, False
        elif fam in ("llama", "qwen3", "gemma2", "gemma3", "minicpm"):
            b = bool(g("attention_bias"))
            self.qkv_bias, self.o_bias = b, b
        else:  # mistral, phi3: no biases
            self.qkv_bias, self.o_bias = False, False
        self.mlp_bias = bool(g("mlp_bias")) if fam == "llama" else False
        self.fused = fam == "phi3"

        # scalings
        self.embed_scale = 1.0  # Gemma: set by the Model, depends on storage dtype
        self.residual_scale = 1.0
        self.logit_div = 1.0
        if fam == "minicpm":
            self.embed_scale = float(g("scale_emb"))
            self.residual_scale = float(g("scale_depth")) / math.sqrt(self.n_layers)
            self.logit_div = self.hidden / float(g("dim_model_base"))
        if gemma:
            self.attn_scale = float(g("query_pre_attn_scalar")) ** -0.5
            self.attn_softcap = config.get("attn_logit_softcapping", _DEFAULTS[fam]["attn_logit_softcapping"])
            self.final_softcap = config.get("final_logit_softcapping", _DEFAULTS[fam]["final_logit_softcapping"])
        else:
            self.attn_scale = self.head_dim ** -0.5
            self.attn_softcap = None
            self.final_softcap = None

        # rope
        prf = float(config.get("partial_rotary_factor", 1.0)) if fam == "phi3" else 1.0
        self.rot_dim = int(self.head_dim * prf)
        rope_theta = float(g("rope_theta"))
        rope_scaling = config.get("rope_scaling")
        rope_params = config.get("rope_parameters")  # transformers v5 layout
        local_theta, local_scaling = None, None
        if rope_params and not rope_scaling:
            if gemma and ("full_attention" in rope_params or "sliding_attention" in rope_params):
                full = rope_params.get("full_attention", {})
                slid = rope_params.get("sliding_attention", {})
                rope_theta = float(full.get("rope_theta", rope_theta))
                rope_scaling = full
                local_theta = slid.get("rope_theta")
                local_scaling = slid
            else:
                rope_theta = float(rope_params.get("rope_theta", rope_theta))
                rope_scaling = rope_params
        orig_top = config.get("original_max_position_embeddings") if fam == "phi3" else None
        global_rope = Rope(self.rot_dim, rope_theta, rope_scaling, self.max_pos, orig_top)
        if fam == "gemma3":
            lt = float(local_theta if local_theta is not None else g("rope_local_base_freq"))
            local_rope = Rope(self.rot_dim, lt, local_scaling if local_theta is not None else None, self.max_pos)
        else:
            local_rope = global_rope

        # sliding-window layout
        sliding = [False] * self.n_layers
        window = None
        layer_types = config.get("layer_types")
        if layer_types is not None and len(layer_types) != self.n_layers:
            raise ConfigError(f"config.json: layer_types has {len(layer_types)} entries, "
                              f"num_hidden_layers is {self.n_layers}")
        if fam in ("mistral", "phi3"):
            window = g("sliding_window") if "sliding_window" in config else _DEFAULTS[fam]["sliding_window"]
            sliding = [window is not None] * self.n_layers
        elif fam in ("qwen2", "qwen3"):
            if bool(g("use_sliding_window")):
                window = config.get("sliding_window", _DEFAULTS[fam]["sliding_window"])
            if window is not None:
                if layer_types is not None:
                    sliding = [t == "sliding_attention" for t in layer_types]
                else:
                    mwl = int(g("max_window_layers"))
                    sliding = [i >= mwl for i in range(self.n_layers)]
        elif fam == "gemma2":
            window = g("sliding_window")
            if layer_types is not None:
                sliding = [t == "sliding_attention" for t in layer_types]
            else:
                sliding = [i % 2 == 0 for i in range(self.n_layers)]
        elif fam == "gemma3":
            window = g("sliding_window")
            if layer_types is not None:
                sliding = [t == "sliding_attention" for t in layer_types]
            else:
                pat = int(g("sliding_window_pattern"))
                sliding = [(i + 1) % pat != 0 for i in range(self.n_layers)]
        if window is None:
            sliding = [False] * self.n_layers
        else:
            window = int(window)
            if window <= 0:
                raise ConfigError(f"config.json: sliding_window {window} must be positive")
        self.sliding_window = window
        self.layers = [
            LayerSpec(window if sliding[i] else None, local_rope if (fam == "gemma3" and sliding[i]) else global_rope)
            for i in range(self.n_layers)
        ]

    def tensor_names(self):
        """Expected HF tensor names (for error messages and docs)."""
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        if not self.tie:
            names.append("lm_head.weight")
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight",
                      p + "self_attn.o_proj.weight", p + "mlp.down_proj.weight"]
            if self.fused:
                names += [p + "self_attn.qkv_proj.weight", p + "mlp.gate_up_proj.weight"]
            else:
                names += [p + f"self_attn.{n}_proj.weight" for n in "qkv"]
                names += [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
            if self.qkv_bias:
                names += [p + f"self_attn.{n}_proj.bias" for n in "qkv"]
            if self.o_bias:
                names.append(p + "self_attn.o_proj.bias")
            if self.mlp_bias:
                names += [p + f"mlp.{n}_proj.bias" for n in ("gate", "up", "down")]
            if self.qk_norm:
                names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
            if self.sandwich:
                names += [p + "pre_feedforward_layernorm.weight", p + "post_feedforward_layernorm.weight"]
        return names


def _round_to_dtype(value, tag):
    if tag == "BF16":
        return float(safetensors_np.bf16_bits_to_f32(safetensors_np.f32_to_bf16_bits(np.float32(value)))
                     .reshape(()))
    if tag == "F16":
        return float(np.float16(value))
    if tag == "F64":
        return float(value)
    return float(np.float32(value))


class KVCache:
    def __init__(self, n_layers):
        self.k = [None] * n_layers  # [S, n_kv, head_dim], post-RoPE
        self.v = [None] * n_layers
        self.length = 0


class Model:
    def __init__(self, config, tensors, dtype_tags=None):
        self.config = config
        self.spec = sp = Spec(config)
        missing = [n for n in sp.tensor_names() if n not in tensors]
        if missing:
            raise ConfigError(f"model tensors: missing {missing[:6]}{' ...' if len(missing) > 6 else ''} "
                              f"(family {sp.family})")
        f64 = lambda n: np.asarray(tensors[n], dtype=np.float64)  # noqa: E731
        self.embed = f64("model.embed_tokens.weight")
        if self.embed.shape != (sp.vocab, sp.hidden):
            raise ConfigError(f"model.embed_tokens.weight: shape {self.embed.shape}, "
                              f"expected {(sp.vocab, sp.hidden)}")
        self.lm_head = self.embed if sp.tie else f64("lm_head.weight")
        self.final_norm = f64("model.norm.weight")
        if sp.family in ("gemma2", "gemma3"):
            tag = (dtype_tags or {}).get("model.embed_tokens.weight", "F32")
            sp.embed_scale = _round_to_dtype(math.sqrt(sp.hidden), tag)
        qd, kd = sp.n_heads * sp.head_dim, sp.n_kv * sp.head_dim
        self.layers = []
        for i in range(sp.n_layers):
            p = f"model.layers.{i}."
            L = {}
            if sp.fused:
                qkv = f64(p + "self_attn.qkv_proj.weight")
                if qkv.shape != (qd + 2 * kd, sp.hidden):
                    raise ConfigError(f"{p}self_attn.qkv_proj.weight: shape {qkv.shape}, "
                                      f"expected {(qd + 2 * kd, sp.hidden)}")
                L["wq"], L["wk"], L["wv"] = qkv[:qd], qkv[qd:qd + kd], qkv[qd + kd:]
                gu = f64(p + "mlp.gate_up_proj.weight")
                if gu.shape != (2 * sp.ffn, sp.hidden):
                    raise ConfigError(f"{p}mlp.gate_up_proj.weight: shape {gu.shape}, "
                                      f"expected {(2 * sp.ffn, sp.hidden)}")
                L["wg"], L["wu"] = gu[:sp.ffn], gu[sp.ffn:]
            else:
                L["wq"] = f64(p + "self_attn.q_proj.weight")
                L["wk"] = f64(p + "self_attn.k_proj.weight")
                L["wv"] = f64(p + "self_attn.v_proj.weight")
                L["wg"] = f64(p + "mlp.gate_proj.weight")
                L["wu"] = f64(p + "mlp.up_proj.weight")
            L["wo"] = f64(p + "self_attn.o_proj.weight")
            L["wd"] = f64(p + "mlp.down_proj.weight")
            expect = {"wq": (qd, sp.hidden), "wk": (kd, sp.hidden), "wv": (kd, sp.hidden),
                      "wo": (sp.hidden, qd), "wg": (sp.ffn, sp.hidden), "wu": (sp.ffn, sp.hidden),
                      "wd": (sp.hidden, sp.ffn)}
            for k, shp in expect.items():
                if L[k].shape != shp:
                    raise ConfigError(f"layer {i} {k}: shape {L[k].shape}, expected {shp}")
            if sp.qkv_bias:
                L["bq"] = f64(p + "self_attn.q_proj.bias")
                L["bk"] = f64(p + "self_attn.k_proj.bias")
                L["bv"] = f64(p + "self_attn.v_proj.bias")
            if sp.o_bias:
                L["bo"] = f64(p + "self_attn.o_proj.bias")
            if sp.mlp_bias:
                L["bg"] = f64(p + "mlp.gate_proj.bias")
                L["bu"] = f64(p + "mlp.up_proj.bias")
                L["bd"] = f64(p + "mlp.down_proj.bias")
            L["attn_norm"] = f64(p + "input_layernorm.weight")
            if sp.sandwich:
                L["post_attn_norm"] = f64(p + "post_attention_layernorm.weight")
                L["pre_ffn_norm"] = f64(p + "pre_feedforward_layernorm.weight")
                L["post_ffn_norm"] = f64(p + "post_feedforward_layernorm.weight")
            else:
                L["pre_ffn_norm"] = f64(p + "post_attention_layernorm.weight")
            if sp.qk_norm:
                L["q_norm"] = f64(p + "self_attn.q_norm.weight")
                L["k_norm"] = f64(p + "self_attn.k_norm.weight")
            self.layers.append(L)

    @classmethod
    def from_dir(cls, model_dir):
        cfg_path = os.path.join(model_dir, "config.json")
        try:
            with open(cfg_path, "r", encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"{cfg_path}: {e}") from e
        tensors, tags = safetensors_np.load_model_dir(model_dir)
        return cls(config, tensors, tags)

    def new_cache(self):
        return KVCache(self.spec.n_layers)

    def forward(self, ids, cache=None, return_hidden=False):
        """Logits [T, V] for tokens `ids` placed at positions cache.length .. +T-1.

        Without a cache: positions 0..T-1, full causal attention. With a
        cache: keys/values are appended and every query attends to all cached
        keys allowed by the causal (and sliding-window) mask.
        """
        sp = self.spec
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("forward: ids must be a non-empty 1-D sequence")
        if ids.min() < 0 or ids.max() >= sp.vocab:
            raise ValueError(f"forward: token id out of range [0, {sp.vocab})")
        T = ids.size
        start = cache.length if cache is not None else 0
        pos = np.arange(start, start + T)
        seq_len = start + T  # HF: max(position_ids) + 1 for the dynamic/longrope updates
        x = self.embed[ids] * sp.embed_scale
        group = sp.n_heads // sp.n_kv
        for li, (ls, L) in enumerate(zip(sp.layers, self.layers)):
            h = rms_norm(x, L["attn_norm"], sp.eps, sp.norm_offset)
            q = h @ L["wq"].T
            k = h @ L["wk"].T
            v = h @ L["wv"].T
            if sp.qkv_bias:
                q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
            q = q.reshape(T, sp.n_heads, sp.head_dim)
            k = k.reshape(T, sp.n_kv, sp.head_dim)
            v = v.reshape(T, sp.n_kv, sp.head_dim)
            if sp.qk_norm:
                q = rms_norm(q, L["q_norm"], sp.eps, sp.norm_offset)
                k = rms_norm(k, L["k_norm"], sp.eps, sp.norm_offset)
            cos, sin = ls.rope.cos_sin(pos, seq_len)
            q = apply_rope(q, cos, sin, sp.rot_dim)
            k = apply_rope(k, cos, sin, sp.rot_dim)
            if cache is not None:
                if cache.k[li] is not None:
                    k = np.concatenate([cache.k[li], k], axis=0)
                    v = np.concatenate([cache.v[li], v], axis=0)
                cache.k[li], cache.v[li] = k, v
            S = k.shape[0]
            kpos = np.arange(S)
            allowed = kpos[None, :] <= pos[:, None]
            if ls.sliding_window is not None:
                allowed &= kpos[None, :] > pos[:, None] - ls.sliding_window
            kh = np.repeat(k, group, axis=1)  # query head j uses kv head j // group
            vh = np.repeat(v, group, axis=1)
            scores = np.einsum("thd,shd->hts", q, kh) * sp.attn_scale
            if sp.attn_softcap is not None:
                scores = softcap(scores, sp.attn_softcap)
            scores = np.where(allowed[None], scores, -np.inf)
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            o = np.einsum("hts,shd->thd", p, vh).reshape(T, sp.n_heads * sp.head_dim)
            a = o @ L["wo"].T
            if sp.o_bias:
                a = a + L["bo"]
            if sp.sandwich:
                a = rms_norm(a, L["post_attn_norm"], sp.eps, sp.norm_offset)
            x = x + a * sp.residual_scale
            h = rms_norm(x, L["pre_ffn_norm"], sp.eps, sp.norm_offset)
            gt = h @ L["wg"].T
            up = h @ L["wu"].T
            if sp.mlp_bias:
                gt, up = gt + L["bg"], up + L["bu"]
            m = (activation(sp.act, gt) * up) @ L["wd"].T
            if sp.mlp_bias:
                m = m + L["bd"]
            if sp.sandwich:
                m = rms_norm(m, L["post_ffn_norm"], sp.eps, sp.norm_offset)
            x = x + m * sp.residual_scale
        if cache is not None:
            cache.length += T
        x = rms_norm(x, self.final_norm, sp.eps, sp.norm_offset)
        if return_hidden:
            return x
        logits = (x / sp.logit_div) @ self.lm_head.T
        if sp.final_softcap is not None:
            logits = softcap(logits, sp.final_softcap)
        return logits

    def generate_greedy(self, prompt, n):
        """(prompt logits [T, V], n greedy ids, per-step top1-top2 margins, per-step logits [n, V])."""
        cache = self.new_cache()
        logits = self.forward(prompt, cache)
        step_logits = [logits[-1]]
        out = []
        for i in range(n):
            row = step_logits[-1]
            nxt = int(np.argmax(row))  # first maximum -> lowest id on ties
            out.append(nxt)
            if i + 1 < n:
                step_logits.append(self.forward([nxt], cache)[-1])
        margins = []
        for row in step_logits:
            top2 = np.sort(row)[-2:]
            margins.append(float(top2[1] - top2[0]))
        return logits, out, margins, np.stack(step_logits)


# ----------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------

def _parse_ids(text, what):
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError as e:
        raise SystemExit(f"{what}: not a list of integers: {e}")
    if not ids:
        raise SystemExit(f"{what}: empty")
    return ids


def cmd_generate(args):
    model = Model.from_dir(args.model_dir)
    sp = model.spec
    prompt = _parse_ids(args.tokens, "--tokens")
    logits, greedy, margins, step_logits = model.generate_greedy(prompt, args.n)
    os.makedirs(args.out, exist_ok=True)
    logits.astype("<f4").tofile(os.path.join(args.out, "logits.f32"))
    golden = {
        "generated_by": GENERATED_BY,
        "model_dir": args.model_dir,
        "family": sp.family,
        "prompt_ids": prompt,
        "greedy_ids": greedy,
        "logits_file": "logits.f32",
        "shape": [len(prompt), sp.vocab],
        "dtype_note": ("weights widened exactly to float64, every op in float64, logits cast to "
                       "little-endian float32 on write; HF bf16/f16 per-op rounding not emulated; "
                       "greedy via KV-cached decode, argmax ties -> lowest id"),
        "greedy_min_margin": min(margins),
        "greedy_margins": margins,
    }
    if args.save_greedy_logits:
        step_logits.astype("<f4").tofile(os.path.join(args.out, "greedy_logits.f32"))
        golden["greedy_logits_file"] = "greedy_logits.f32"
        golden["greedy_logits_note"] = "row i = logits the i-th greedy token was chosen from"
    with open(os.path.join(args.out, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"{sp.family}: {len(prompt)} prompt tokens, {args.n} greedy tokens, "
          f"min greedy margin {min(margins):.3g} -> {args.out}")
    return 0


def cmd_check(args):
    with open(os.path.join(args.check, "golden.json"), "r", encoding="utf-8") as f:
        golden = json.load(f)
    T, V = golden["shape"]
    ref = np.fromfile(os.path.join(args.check, golden["logits_file"]), dtype="<f4")
    cand = np.fromfile(args.candidate, dtype="<f4")
    if ref.size != T * V:
        print(f"golden {golden['logits_file']}: {ref.size} floats, expected {T}x{V}")
        return 2
    if cand.size != ref.size:
        print(f"{args.candidate}: {cand.size} floats, expected {T}x{V} = {T * V}")
        return 1
    ref, cand = ref.reshape(T, V).astype(np.float64), cand.reshape(T, V).astype(np.float64)
    diff = np.abs(ref - cand)
    if not np.all(np.isfinite(cand)):
        print(f"{args.candidate}: contains non-finite values")
        return 1
    per_row = diff.max(axis=1)
    worst = int(np.argmax(per_row))
    print(f"max |diff| = {diff.max():.3e} (position {worst}, id {int(np.argmax(diff[worst]))}); "
          f"tolerance {args.tol:g}")
    bad = np.nonzero(per_row > args.tol)[0]
    if bad.size:
        print(f"positions over tolerance: {bad.tolist()[:20]}{' ...' if bad.size > 20 else ''}")
    rc = 0 if diff.max() <= args.tol else 1
    if args.candidate_ids is not None:
        ids = _parse_ids(args.candidate_ids, "--candidate-ids")
        exp = golden["greedy_ids"]
        first = next((i for i, (a, b) in enumerate(zip(ids, exp)) if a != b), None)
        if first is None and len(ids) == len(exp):
            print(f"greedy ids: all {len(exp)} identical")
        else:
            if first is None:
                print(f"greedy ids: length {len(ids)} vs {len(exp)}")
            else:
                m = golden.get("greedy_margins", [None] * len(exp))[first]
                print(f"greedy ids: first difference at step {first}: {ids[first]} vs {exp[first]} "
                      f"(golden top1-top2 margin there: {m})")
            rc = 1
    return rc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", nargs="?")
    ap.add_argument("--tokens", help="prompt token ids, space or comma separated")
    ap.add_argument("--out", help="golden output directory")
    ap.add_argument("-n", type=int, default=64, help="greedy tokens to generate (default 64)")
    ap.add_argument("--save-greedy-logits", action="store_true",
                    help="also write greedy_logits.f32 ([n, V], the rows greedy ids were chosen from)")
    ap.add_argument("--check", metavar="GOLDEN_DIR", help="compare a candidate against this golden")
    ap.add_argument("--candidate", help="candidate logits file (raw LE float32 [T, V])")
    ap.add_argument("--candidate-ids", help="candidate greedy ids to compare")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    try:
        if args.check:
            if not args.candidate:
                ap.error("--check needs --candidate")
            return cmd_check(args)
        if not (args.model_dir and args.tokens and args.out):
            ap.error("MODEL_DIR, --tokens and --out are required")
        if args.n < 1:
            ap.error("-n must be >= 1")
        return cmd_generate(args)
    except (ConfigError, ValueError, OSError) as e:
        print(f"forward_ref.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
