#!/usr/bin/python3
"""Self-validation of tools/reference/forward_ref.py (no torch available).

Run: /usr/bin/python3 tools/reference/test_forward_ref.py [-v]

(a) make_tiny_hf_model(family, dir, seed) writes tiny random HF dirs of every
    family (config.json + F32 model.safetensors) for these tests only; the
    committed goldens are made from models written by `lumen synth`.
(b) invariants: KV-cached decode == full forward, a loop-by-loop naive forward
    == the vectorised one, rotate_half RoPE on HF weights == interleaved RoPE
    on GGUF-permuted weights, exact sliding-window boundary, soft-capping,
    Gemma (1+w) norms, RoPE-scaling formulas, safetensors round trips.
(c) the real trained stories260K model (llama2.c, run.c outputs) reproduced
    through the llama path after un-permuting its interleaved q/k rows.
Fixtures: env LUMEN_FIXTURES, default <repo>/../shared/fixtures; the
stories260K tests skip with a reason when it is absent.
"""

import io
import json
import math
import os
import struct
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import forward_ref as fr  # noqa: E402
import safetensors_np as stn  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.environ.get("LUMEN_FIXTURES", os.path.join(REPO, "..", "shared", "fixtures"))
STORIES = os.path.join(FIXTURES, "stories260K")


# ----------------------------------------------------------------------------
# stories260K (llama2.c legacy .bin) -> HF-style in-memory llama
# ----------------------------------------------------------------------------

def load_stories260k(path):
    """Returns (config, tensors) of the llama2.c legacy checkpoint as an HF llama.

    Layout per ../shared/fixtures/stories260K/README.md. q/k rows are stored
    in the interleaved-pair RoPE order; unpermute_qk_from_gguf turns them into
    HF rotate_half order.
    """
    with open(path, "rb") as f:
        raw = f.read()
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack("<7i", raw[:28])
    shared = vocab > 0
    vocab = abs(vocab)
    hs = dim // n_heads
    data = np.frombuffer(raw, dtype="<f4", offset=28)
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        a = data[off:off + n].reshape(shape)
        off += n
        return a

    emb = take(vocab, dim)
    rms_att = take(n_layers, dim)
    wq = take(n_layers, n_heads * hs, dim)
    wk = take(n_layers, n_kv * hs, dim)
    wv = take(n_layers, n_kv * hs, dim)
    wo = take(n_layers, dim, n_heads * hs)
    rms_ffn = take(n_layers, dim)
    w1 = take(n_layers, hidden, dim)
    w2 = take(n_layers, dim, hidden)
    w3 = take(n_layers, hidden, dim)
    rms_final = take(dim)
    take(seq_len, hs // 2)  # freq_cis_real
    take(seq_len, hs // 2)  # freq_cis_imag
    wcls = emb if shared else take(vocab, dim)
    assert off == data.size, (off, data.size)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab, "hidden_size": dim, "intermediate_size": hidden,
        "num_hidden_layers": n_layers, "num_attention_heads": n_heads, "num_key_value_heads": n_kv,
        "max_position_embeddings": seq_len, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": shared,
    }
    t = {"model.embed_tokens.weight": emb, "model.norm.weight": rms_final}
    if not shared:
        t["lm_head.weight"] = wcls
    for i in range(n_layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = rms_att[i]
        t[p + "post_attention_layernorm.weight"] = rms_ffn[i]
        t[p + "self_attn.q_proj.weight"] = fr.unpermute_qk_from_gguf(wq[i], n_heads)
        t[p + "self_attn.k_proj.weight"] = fr.unpermute_qk_from_gguf(wk[i], n_kv)
        t[p + "self_attn.v_proj.weight"] = wv[i]
        t[p + "self_attn.o_proj.weight"] = wo[i]
        t[p + "mlp.gate_proj.weight"] = w1[i]
        t[p + "mlp.down_proj.weight"] = w2[i]
        t[p + "mlp.up_proj.weight"] = w3[i]
    return config, t


def _read_ids(path):
    with open(path, "r", encoding="utf-8") as f:
        return [int(x) for x in f.read().split()]


@unittest.skipUnless(os.path.exists(os.path.join(STORIES, "stories260K.bin")),
                     f"stories260K fixture not found under {STORIES}")
class Stories260KTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.config, cls.tensors = load_stories260k(os.path.join(STORIES, "stories260K.bin"))
        cls.model = fr.Model(cls.config, cls.tensors)
        cls.expected_logits = np.fromfile(
            os.path.join(STORIES, "expected-logits-once-upon-a-time-pos0-7.f32"), dtype="<f4").reshape(8, 512)
        cls.ids = _read_ids(os.path.join(STORIES, "expected-greedy-once-upon-a-time.ids"))

    def test_logits_pos0_7_match_run_c(self):
        toks = [1, 403, 407, 261, 378, 432, 383, 286]
        self.assertEqual(self.ids[:8], toks)
        logits = self.model.forward(toks)
        diff = np.abs(logits - self.expected_logits).max()
        self.assertLessEqual(diff, 1e-4, f"max |diff| {diff}")
        # and the bound is not vacuous: rows are not all alike
        self.assertGreater(np.abs(self.expected_logits[0] - self.expected_logits[1]).max(), 1.0)

    def test_without_unpermute_the_logits_are_wrong(self):
        # Proves the interleaved->rotate_half permutation is load-bearing.
        t = dict(self.tensors)
        for i in range(self.config["num_hidden_layers"]):
            p = f"model.layers.{i}.self_attn."
            t[p + "q_proj.weight"] = fr.permute_qk_for_gguf(t[p + "q_proj.weight"], 8)
            t[p + "k_proj.weight"] = fr.permute_qk_for_gguf(t[p + "k_proj.weight"], 4)
        logits = fr.Model(self.config, t).forward([1, 403, 407, 261, 378, 432, 383, 286])
        self.assertGreater(np.abs(logits - self.expected_logits).max(), 1e-2)

    def test_greedy_once_upon_a_time_252_tokens(self):
        prompt = self.ids[:5]
        self.assertEqual(prompt, [1, 403, 407, 261, 378])
        n = len(self.ids) - 5
        _, greedy, _, _ = self.model.generate_greedy(prompt, n)
        self.assertEqual(greedy, self.ids[5:])

    def test_greedy_no_prompt_128(self):
        ids = _read_ids(os.path.join(STORIES, "expected-greedy-no-prompt-n128.ids"))
        _, greedy, _, _ = self.model.generate_greedy(ids[:1], len(ids) - 1)
        self.assertEqual(greedy, ids[1:])

    def test_cli_on_hf_dir(self):
        # Through the file path: safetensors writer/reader, config.json, CLI, --check.
        with tempfile.TemporaryDirectory() as d:
            mdir, gdir = os.path.join(d, "m"), os.path.join(d, "g")
            os.makedirs(mdir)
            with open(os.path.join(mdir, "config.json"), "w") as f:
                json.dump(self.config, f)
            stn.write_safetensors(os.path.join(mdir, "model.safetensors"), self.tensors)
            with redirect_stdout(io.StringIO()):
                rc = fr.main([mdir, "--tokens", "1 403 407 261 378 432 383 286", "--out", gdir, "-n", "8"])
            self.assertEqual(rc, 0)
            with open(os.path.join(gdir, "golden.json")) as f:
                g = json.load(f)
            self.assertEqual(g["generated_by"], "tools/reference/forward_ref.py")
            self.assertEqual(g["shape"], [8, 512])
            self.assertEqual(g["greedy_ids"], self.ids[8:16])
            cand = os.path.join(d, "cand.f32")
            self.expected_logits.astype("<f4").tofile(cand)
            with redirect_stdout(io.StringIO()) as out:
                rc = fr.main(["--check", gdir, "--candidate", cand,
                              "--candidate-ids", " ".join(map(str, self.ids[8:16]))])
            self.assertEqual(rc, 0, out.getvalue())
            (self.expected_logits + np.float32(3e-4)).astype("<f4").tofile(cand)
            with redirect_stdout(io.StringIO()):
                rc = fr.main(["--check", gdir, "--candidate", cand])
            self.assertEqual(rc, 1)



# ----------------------------------------------------------------------------
# (a) tiny random HF models of every family
# ----------------------------------------------------------------------------

def tiny_config(family, **over):
    """A small config of `family` whose features are all switched on.

    head_dim differs from hidden/heads where the family allows it; sliding
    windows are shorter than the test prompts so the masks matter.
    """
    base = {"vocab_size": 96, "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
    arch = {"llama": ("LlamaForCausalLM", "llama"), "mistral": ("MistralForCausalLM", "mistral"),
            "qwen2": ("Qwen2ForCausalLM", "qwen2"), "qwen3": ("Qwen3ForCausalLM", "qwen3"),
            "gemma2": ("Gemma2ForCausalLM", "gemma2"), "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
            "minicpm": ("MiniCPMForCausalLM", "minicpm"), "phi3": ("Phi3ForCausalLM", "phi3")}[family]
    c = dict(base, architectures=[arch[0]], model_type=arch[1])
    if family == "llama":
        c.update(attention_bias=True, mlp_bias=True, tie_word_embeddings=False, head_dim=16,
                 rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                 rope_theta=500000.0)
    elif family == "mistral":
        c.update(sliding_window=7, tie_word_embeddings=False)
    elif family == "qwen2":
        c.update(use_sliding_window=True, sliding_window=6, max_window_layers=1, tie_word_embeddings=True)
    elif family == "qwen3":
        c.update(head_dim=16, attention_bias=False, tie_word_embeddings=True, rope_theta=1000000.0)
    elif family == "gemma2":
        c.update(head_dim=16, query_pre_attn_scalar=24, sliding_window=5, attn_logit_softcapping=2.0,
                 final_logit_softcapping=3.0, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)
    elif family == "gemma3":
        c.update(num_hidden_layers=4, head_dim=16, query_pre_attn_scalar=16, sliding_window=5,
                 sliding_window_pattern=2, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                 rope_scaling={"rope_type": "linear", "factor": 8.0}, attn_logit_softcapping=None,
                 final_logit_softcapping=None, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)
    elif family == "minicpm":
        c.update(scale_emb=12.0, scale_depth=1.4, dim_model_base=16, tie_word_embeddings=True)
    elif family == "phi3":
        c.update(partial_rotary_factor=0.5, tie_word_embeddings=False, sliding_window=9)
    c.update(over)
    return c


def tiny_tensors(config, seed, fused=None):
    """Random weights for `config`, HF names. Scales keep activations O(1) so
    greedy decisions are not near-ties."""
    sp = fr.Spec(config)
    rng = np.random.default_rng(seed)
    H, F, V = sp.hidden, sp.ffn, sp.vocab
    qd, kd = sp.n_heads * sp.head_dim, sp.n_kv * sp.head_dim
    lin = lambda o, i: rng.standard_normal((o, i)) / math.sqrt(i)  # noqa: E731
    norm = lambda n: (0.2 * rng.standard_normal(n)) + (0.0 if sp.norm_offset else 1.0)  # noqa: E731
    t = {"model.embed_tokens.weight": rng.standard_normal((V, H)), "model.norm.weight": norm(H)}
    if not sp.tie:
        t["lm_head.weight"] = lin(V, H)
    for i in range(sp.n_layers):
        p = f"model.layers.{i}."
        q, k, v, g, u = lin(qd, H), lin(kd, H), lin(kd, H), lin(F, H), lin(F, H)
        if sp.fused:
            t[p + "self_attn.qkv_proj.weight"] = np.concatenate([q, k, v])
            t[p + "mlp.gate_up_proj.weight"] = np.concatenate([g, u])
        else:
            t[p + "self_attn.q_proj.weight"], t[p + "self_attn.k_proj.weight"] = q, k
            t[p + "self_attn.v_proj.weight"] = v
            t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"] = g, u
        t[p + "self_attn.o_proj.weight"] = lin(H, qd)
        t[p + "mlp.down_proj.weight"] = lin(H, F)
        t[p + "input_layernorm.weight"] = norm(H)
        t[p + "post_attention_layernorm.weight"] = norm(H)
        if sp.qkv_bias:
            for n, d in (("q", qd), ("k", kd), ("v", kd)):
                t[p + f"self_attn.{n}_proj.bias"] = 0.3 * rng.standard_normal(d)
        if sp.o_bias:
            t[p + "self_attn.o_proj.bias"] = 0.3 * rng.standard_normal(H)
        if sp.mlp_bias:
            for n, d in (("gate", F), ("up", F), ("down", H)):
                t[p + f"mlp.{n}_proj.bias"] = 0.3 * rng.standard_normal(d)
        if sp.qk_norm:
            t[p + "self_attn.q_norm.weight"] = norm(sp.head_dim)
            t[p + "self_attn.k_norm.weight"] = norm(sp.head_dim)
        if sp.sandwich:
            t[p + "pre_feedforward_layernorm.weight"] = norm(H)
            t[p + "post_feedforward_layernorm.weight"] = norm(H)
    return {k: np.asarray(v, dtype=np.float32) for k, v in t.items()}


def make_tiny_hf_model(family, directory, seed, dtype="F32", **config_overrides):
    """Writes config.json + model.safetensors of a tiny random `family` model.

    For reference self-tests only (lumen's `synth` writes the golden models).
    Returns (config, tensors).
    """
    os.makedirs(directory, exist_ok=True)
    config = tiny_config(family, **config_overrides)
    tensors = tiny_tensors(config, seed)
    with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    stn.write_safetensors(os.path.join(directory, "model.safetensors"), tensors, dtype=dtype)
    return config, tensors


def tiny_model(family, seed=0, **over):
    c = tiny_config(family, **over)
    return fr.Model(c, tiny_tensors(c, seed))


# ----------------------------------------------------------------------------
# A loop-by-loop forward: one token, one head, one key at a time, written
# separately from the vectorised Model.forward (shares only parsed weights
# and Rope.params, which RopeScalingTest checks on its own).
# ----------------------------------------------------------------------------

def naive_forward(model, ids):
    sp = model.spec
    T = len(ids)
    group = sp.n_heads // sp.n_kv
    d, r = sp.head_dim, sp.rot_dim

    def norm(vec, w):
        s = 0.0
        for e in vec:
            s += e * e
        inv = 1.0 / math.sqrt(s / len(vec) + sp.eps)
        return np.array([vec[i] * inv * (sp.norm_offset + w[i]) for i in range(len(vec))])

    def rope(vec, pos, inv_freq, af):
        out = vec.copy()
        half = r // 2
        for i in range(half):
            a = pos * inv_freq[i]
            c, s = math.cos(a) * af, math.sin(a) * af
            out[i] = vec[i] * c - vec[i + half] * s
            out[i + half] = vec[i + half] * c + vec[i] * s
        return out

    def act(x):
        if sp.act == "silu":
            return x / (1 + math.exp(-x))
        return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    xs = [model.embed[t] * sp.embed_scale for t in ids]
    for ls, L in zip(sp.layers, model.layers):
        inv_freq, af = ls.rope.params(T)
        Q, K, Vv = [], [], []
        for t in range(T):
            h = norm(xs[t], L["attn_norm"])
            q = L["wq"] @ h + (L["bq"] if sp.qkv_bias else 0)
            k = L["wk"] @ h + (L["bk"] if sp.qkv_bias else 0)
            v = L["wv"] @ h + (L["bv"] if sp.qkv_bias else 0)
            qh = [q[j * d:(j + 1) * d] for j in range(sp.n_heads)]
            kh = [k[j * d:(j + 1) * d] for j in range(sp.n_kv)]
            if sp.qk_norm:
                qh = [norm(e, L["q_norm"]) for e in qh]
                kh = [norm(e, L["k_norm"]) for e in kh]
            Q.append([rope(e, t, inv_freq, af) for e in qh])
            K.append([rope(e, t, inv_freq, af) for e in kh])
            Vv.append([v[j * d:(j + 1) * d] for j in range(sp.n_kv)])
        new = []
        for t in range(T):
            keys = [s for s in range(T) if s <= t and (ls.sliding_window is None or t - s < ls.sliding_window)]
            o = []
            for j in range(sp.n_heads):
                kv = j // group
                sc = []
                for s in keys:
                    z = float(np.dot(Q[t][j], K[s][kv])) * sp.attn_scale
                    if sp.attn_softcap is not None:
                        z = sp.attn_softcap * math.tanh(z / sp.attn_softcap)
                    sc.append(z)
                m = max(sc)
                w = [math.exp(z - m) for z in sc]
                tot = sum(w)
                acc = np.zeros(d)
                for wi, s in zip(w, keys):
                    acc += (wi / tot) * Vv[s][kv]
                o.append(acc)
            a = L["wo"] @ np.concatenate(o) + (L["bo"] if sp.o_bias else 0)
            if sp.sandwich:
                a = norm(a, L["post_attn_norm"])
            x = xs[t] + sp.residual_scale * a
            h = norm(x, L["pre_ffn_norm"])
            gt = L["wg"] @ h + (L["bg"] if sp.mlp_bias else 0)
            up = L["wu"] @ h + (L["bu"] if sp.mlp_bias else 0)
            mm = L["wd"] @ np.array([act(a_) * b_ for a_, b_ in zip(gt, up)]) + (L["bd"] if sp.mlp_bias else 0)
            if sp.sandwich:
                mm = norm(mm, L["post_ffn_norm"])
            new.append(x + sp.residual_scale * mm)
        xs = new
    rows = []
    for t in range(T):
        h = norm(xs[t], model.final_norm) / sp.logit_div
        lg = model.lm_head @ h
        if sp.final_softcap is not None:
            lg = np.array([sp.final_softcap * math.tanh(z / sp.final_softcap) for z in lg])
        rows.append(lg)
    return np.stack(rows)


# ----------------------------------------------------------------------------
# (b) invariants
# ----------------------------------------------------------------------------

class FamilyInvariantsTest(unittest.TestCase):
    def test_naive_loop_forward_equals_vectorised(self):
        rng = np.random.default_rng(1)
        for fam in fr.FAMILIES:
            with self.subTest(family=fam):
                m = tiny_model(fam, seed=3)
                ids = rng.integers(0, m.spec.vocab, 14).tolist()
                a = m.forward(ids)
                b = naive_forward(m, ids)
                self.assertLess(np.abs(a - b).max(), 1e-9)

    def test_kv_cache_decode_equals_full_forward(self):
        rng = np.random.default_rng(2)
        for fam in fr.FAMILIES:
            with self.subTest(family=fam):
                m = tiny_model(fam, seed=4)
                ids = rng.integers(0, m.spec.vocab, 40).tolist()
                full = m.forward(ids)
                for split in (1, 11, 39):
                    cache = m.new_cache()
                    rows = [m.forward(ids[:split], cache)]
                    for t in ids[split:]:
                        rows.append(m.forward([t], cache))
                    inc = np.concatenate(rows)
                    self.assertLess(np.abs(full - inc).max(), 1e-9, f"split {split}")
                # chunked prefill too
                cache = m.new_cache()
                inc = np.concatenate([m.forward(ids[a:a + 13], cache) for a in range(0, 40, 13)])
                self.assertLess(np.abs(full - inc).max(), 1e-9)

    def test_every_feature_changes_the_output(self):
        # A reference that ignores a config key would pass the tests above;
        # flipping each key must move the logits.
        rng = np.random.default_rng(5)
        cases = [
            ("mistral", {"sliding_window": None}),
            ("qwen2", {"use_sliding_window": False}),
            ("qwen2", {"max_window_layers": 3}),
            ("gemma2", {"attn_logit_softcapping": None}),
            ("gemma2", {"final_logit_softcapping": None}),
            ("gemma2", {"query_pre_attn_scalar": 16}),
            ("gemma3", {"sliding_window_pattern": 4}),
            ("gemma3", {"rope_local_base_freq": 1000000.0}),
            ("gemma3", {"rope_scaling": None}),
            ("minicpm", {"scale_depth": 1.0}),
            ("minicpm", {"dim_model_base": 48}),
            ("phi3", {"partial_rotary_factor": 1.0}),
            ("llama", {"rope_scaling": None}),
        ]
        ids = rng.integers(0, 96, 30).tolist()
        for fam, over in cases:
            with self.subTest(family=fam, change=over):
                a = tiny_model(fam, seed=6).forward(ids)
                c = tiny_config(fam, **over)
                t = tiny_tensors(tiny_config(fam), 6)
                b = fr.Model(c, t).forward(ids)
                self.assertGreater(np.abs(a - b).max(), 1e-6)

    def test_sliding_window_exact_boundary(self):
        # One layer: logits at position p depend on token p-W+1 but not on p-W
        # (HF masking_utils: kv_idx > q_idx - sliding_window).
        for fam, over in (("mistral", {}), ("gemma2", {}), ("gemma3", {}), ("phi3", {}),
                          ("qwen2", {"max_window_layers": 0})):
            with self.subTest(family=fam):
                c = tiny_config(fam, num_hidden_layers=1, **over)
                m = fr.Model(c, tiny_tensors(c, 7))
                W = m.spec.layers[0].sliding_window
                self.assertIsNotNone(W)
                rng = np.random.default_rng(8)
                ids = rng.integers(0, 96, 24).tolist()
                p = 20
                base = m.forward(ids)[p]
                out = list(ids)
                out[p - W] = (ids[p - W] + 1) % 96
                self.assertEqual(np.abs(m.forward(out)[p] - base).max(), 0.0)
                inside = list(ids)
                inside[p - W + 1] = (ids[p - W + 1] + 1) % 96
                self.assertGreater(np.abs(m.forward(inside)[p] - base).max(), 1e-6)

    def test_window_of_one_attends_to_itself_only(self):
        c = tiny_config("mistral", num_hidden_layers=1, sliding_window=1)
        m = fr.Model(c, tiny_tensors(c, 9))
        ids = [5, 6, 7, 8]
        a = m.forward(ids)
        # position t with window 1 is the same as a single token at position t
        # except for RoPE, which cancels in q.k of a token with itself
        c2 = dict(c, sliding_window=None)
        m2 = fr.Model(c2, tiny_tensors(c2, 9))
        for t in range(4):
            self.assertLess(np.abs(a[t] - m2.forward([ids[t]])[0]).max(), 1e-12)

    def test_layer_patterns(self):
        sw = lambda fam, **o: [l.sliding_window is not None for l in fr.Spec(tiny_config(fam, **o)).layers]  # noqa
        self.assertEqual(sw("gemma2", num_hidden_layers=4), [True, False, True, False])
        self.assertEqual(sw("gemma3", num_hidden_layers=12, sliding_window_pattern=6),
                         [True] * 5 + [False] + [True] * 5 + [False])
        self.assertEqual(sw("gemma3", num_hidden_layers=3,
                            layer_types=["full_attention", "sliding_attention", "full_attention"]),
                         [False, True, False])
        self.assertEqual(sw("qwen2", num_hidden_layers=4, max_window_layers=2), [False, False, True, True])
        self.assertEqual(sw("qwen2", num_hidden_layers=4, use_sliding_window=False), [False] * 4)
        self.assertEqual(sw("mistral"), [True] * 3)
        self.assertEqual(sw("llama"), [False] * 3)
        # gemma3: sliding layers use the local base and no scaling, global ones theta + linear scaling
        sp = fr.Spec(tiny_config("gemma3", num_hidden_layers=2))
        self.assertEqual((sp.layers[0].rope.theta, sp.layers[0].rope.kind), (10000.0, "default"))
        self.assertEqual((sp.layers[1].rope.theta, sp.layers[1].rope.kind), (1000000.0, "linear"))

    def test_final_softcap(self):
        ids = list(range(20))
        capped = tiny_model("gemma2", seed=10).forward(ids)
        c = tiny_config("gemma2", final_logit_softcapping=None)
        raw = fr.Model(c, tiny_tensors(tiny_config("gemma2"), 10)).forward(ids)
        self.assertLess(np.abs(capped - 3.0 * np.tanh(raw / 3.0)).max(), 1e-12)
        self.assertLessEqual(np.abs(capped).max(), 3.0)
        self.assertTrue(np.any((np.abs(capped) > 0.5) & (np.abs(capped) < 2.9)))
        self.assertGreater(np.abs(raw).max(), 3.0)  # the cap is active

    def test_attn_softcap_huge_cap_is_identity(self):
        ids = list(range(20))
        t = tiny_tensors(tiny_config("gemma2"), 11)
        a = fr.Model(tiny_config("gemma2", attn_logit_softcapping=1e9), t).forward(ids)
        b = fr.Model(tiny_config("gemma2", attn_logit_softcapping=None), t).forward(ids)
        self.assertLess(np.abs(a - b).max(), 1e-9)

    def test_rms_norm_values(self):
        x = np.array([1.0, 2.0, 3.0, 4.0])
        w = np.array([0.0, 0.5, -1.0, 1.0])
        rms = math.sqrt(7.5 + 1e-6)
        np.testing.assert_allclose(fr.rms_norm(x, w, 1e-6, 1.0), x / rms * np.array([1.0, 1.5, 0.0, 2.0]),
                                   rtol=1e-15)
        np.testing.assert_allclose(fr.rms_norm(x, w, 1e-6), x / rms * w, rtol=1e-15)

    def test_gemma_zero_norm_weights_are_identity_scale(self):
        # (1+w) with w = 0 is a plain RMSNorm; with the llama convention w = 0
        # would zero everything. A gemma model with all-zero norm weights must
        # therefore produce finite, non-degenerate logits.
        c = tiny_config("gemma2")
        t = tiny_tensors(c, 12)
        for k in t:
            if k.endswith("norm.weight"):
                t[k] = np.zeros_like(t[k])
        lg = fr.Model(c, t).forward([1, 2, 3])
        self.assertGreater(lg.std(), 1e-2)

    def test_embed_scale_rounded_to_storage_dtype(self):
        c = tiny_config("gemma2", hidden_size=40)  # sqrt(40) = 6.3245553...
        t = tiny_tensors(c, 13)
        m32 = fr.Model(c, t, {"model.embed_tokens.weight": "F32"})
        mbf = fr.Model(c, t, {"model.embed_tokens.weight": "BF16"})
        self.assertEqual(m32.spec.embed_scale, float(np.float32(math.sqrt(40))))
        self.assertEqual(mbf.spec.embed_scale, 6.3125)  # bf16 has 8 significant bits

    def test_phi3_fused_split_order(self):
        # fused qkv = [q; k; v] rows and gate_up = [gate; up]: a llama with the
        # same pieces (and phi3's rope) must agree.
        c = tiny_config("phi3", partial_rotary_factor=1.0, sliding_window=None)
        t = tiny_tensors(c, 14)
        sp = fr.Spec(c)
        qd, kd, F = sp.n_heads * sp.head_dim, sp.n_kv * sp.head_dim, sp.ffn
        lt = {k: v for k, v in t.items() if "qkv_proj" not in k and "gate_up" not in k}
        for i in range(sp.n_layers):
            p = f"model.layers.{i}."
            qkv, gu = t[p + "self_attn.qkv_proj.weight"], t[p + "mlp.gate_up_proj.weight"]
            lt[p + "self_attn.q_proj.weight"] = qkv[:qd]
            lt[p + "self_attn.k_proj.weight"] = qkv[qd:qd + kd]
            lt[p + "self_attn.v_proj.weight"] = qkv[qd + kd:]
            lt[p + "mlp.gate_proj.weight"], lt[p + "mlp.up_proj.weight"] = gu[:F], gu[F:]
        lc = dict(c, architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=c["rms_norm_eps"])
        ids = list(range(30))
        self.assertLess(np.abs(fr.Model(c, t).forward(ids) - fr.Model(lc, lt).forward(ids)).max(), 1e-12)


class PermutationTest(unittest.TestCase):
    def test_inverse(self):
        rng = np.random.default_rng(0)
        for n_head, hd in ((4, 8), (2, 16), (8, 2)):
            w = rng.standard_normal((n_head * hd, 5))
            p = fr.permute_qk_for_gguf(w, n_head)
            self.assertEqual(np.array_equal(p, w), hd == 2)  # head_dim 2: one pair, identity
            np.testing.assert_array_equal(fr.unpermute_qk_from_gguf(p, n_head), w)
            b = rng.standard_normal(n_head * hd)
            np.testing.assert_array_equal(fr.unpermute_qk_from_gguf(fr.permute_qk_for_gguf(b, n_head), n_head), b)

    def test_row_mapping(self):
        # head_dim 8: HF rows (i, i+4) become GGUF rows (2i, 2i+1)
        rows = np.arange(16)  # 2 heads
        self.assertEqual(fr.permute_qk_for_gguf(rows, 2).tolist(),
                         [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15])

    def test_rotate_half_on_hf_equals_interleaved_on_gguf(self):
        rng = np.random.default_rng(1)
        n_head, hd, n_in, T = 4, 16, 12, 9
        wq = rng.standard_normal((n_head * hd, n_in))
        wk = rng.standard_normal((2 * hd, n_in))
        x = rng.standard_normal((T, n_in))
        rope = fr.Rope(hd, 10000.0, None, 512)
        inv, _ = rope.params(T)
        pos = np.arange(T)
        cos, sin = rope.cos_sin(pos, T)
        q_hf = fr.apply_rope((x @ wq.T).reshape(T, n_head, hd), cos, sin, hd)
        k_hf = fr.apply_rope((x @ wk.T).reshape(T, 2, hd), cos, sin, hd)
        q_gg = fr.apply_rope_interleaved((x @ fr.permute_qk_for_gguf(wq, n_head).T).reshape(T, n_head, hd), pos, inv)
        k_gg = fr.apply_rope_interleaved((x @ fr.permute_qk_for_gguf(wk, 2).T).reshape(T, 2, hd), pos, inv)
        # same vectors up to the within-head row permutation ...
        np.testing.assert_allclose(fr.permute_qk_for_gguf(q_hf.reshape(T, -1).T, n_head).T,
                                   q_gg.reshape(T, -1), atol=1e-12)
        # ... hence identical attention scores
        s_hf = np.einsum("thd,shd->hts", q_hf, np.repeat(k_hf, 2, axis=1))
        s_gg = np.einsum("thd,shd->hts", q_gg, np.repeat(k_gg, 2, axis=1))
        np.testing.assert_allclose(s_hf, s_gg, atol=1e-10)


class RopeScalingTest(unittest.TestCase):
    def test_default_and_linear(self):
        r = fr.Rope(8, 10000.0, None, 512)
        inv, af = r.params(1)
        np.testing.assert_allclose(inv, [1.0, 0.1, 0.01, 0.001], rtol=1e-14)
        self.assertEqual(af, 1.0)
        inv2, _ = fr.Rope(8, 10000.0, {"type": "linear", "factor": 4.0}, 512).params(1)
        np.testing.assert_allclose(inv2, inv / 4, rtol=1e-15)

    def test_dynamic_ntk(self):
        r = fr.Rope(8, 10000.0, {"rope_type": "dynamic", "factor": 2.0}, 16)
        base_inv, _ = fr.Rope(8, 10000.0, None, 16).params(1)
        np.testing.assert_array_equal(r.params(16)[0], base_inv)  # within context: unchanged
        # seq_len 32 > 16: base' = 10000 * (2*32/16 - 1)^(8/6) = 10000 * 3^(4/3)
        np.testing.assert_allclose(r.params(32)[0], 1 / (10000 * 3 ** (4 / 3)) ** (np.arange(0, 8, 2) / 8),
                                   rtol=1e-14)

    def test_llama31_values(self):
        # Llama-3.1 rope_scaling, head_dim 128, theta 500000
        s = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 8192}
        inv, af = fr.Rope(128, 500000.0, s, 131072).params(1)
        base, _ = fr.Rope(128, 500000.0, None, 131072).params(1)
        wl = 2 * math.pi / base
        hi = wl < 8192 / 4
        lo = wl > 8192 / 1
        np.testing.assert_array_equal(inv[hi], base[hi])
        np.testing.assert_allclose(inv[lo], base[lo] / 8, rtol=1e-15)
        mid = ~hi & ~lo
        self.assertTrue(mid.any())
        self.assertTrue(np.all(inv[mid] < base[mid]) and np.all(inv[mid] > base[mid] / 8))
        # continuity at the band edges of the smooth interpolation
        i = np.nonzero(mid)[0]
        sm = (8192 / wl[i] - 1) / 3
        np.testing.assert_allclose(inv[i], (1 - sm) * base[i] / 8 + sm * base[i], rtol=1e-14)
        self.assertEqual(af, 1.0)

    def test_yarn(self):
        s = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
        inv, af = fr.Rope(128, 1000000.0, s, 131072).params(1)
        base, _ = fr.Rope(128, 1000000.0, None, 131072).params(1)
        self.assertAlmostEqual(af, 0.1 * math.log(4.0) + 1.0, places=15)
        # highest frequencies extrapolated (unchanged), lowest interpolated (/factor)
        np.testing.assert_allclose(inv[:5], base[:5], rtol=1e-15)
        np.testing.assert_allclose(inv[-5:], base[-5:] / 4, rtol=1e-15)
        # correction range (HF find_correction_range, truncate=True)
        cd = lambda rot: 128 * math.log(32768 / (rot * 2 * math.pi)) / (2 * math.log(1e6))  # noqa: E731
        low, high = math.floor(cd(32)), math.ceil(cd(1))
        ramp = np.clip((np.arange(64) - low) / (high - low), 0, 1)
        np.testing.assert_allclose(inv, base / 4 * ramp + base * (1 - ramp), rtol=1e-14)
        # explicit attention_factor and mscale variants
        self.assertEqual(fr.Rope(128, 1e6, dict(s, attention_factor=1.5), 131072).params(1)[1], 1.5)
        _, af2 = fr.Rope(128, 1e6, dict(s, mscale=1.0, mscale_all_dim=1.0), 131072).params(1)
        self.assertAlmostEqual(af2, 1.0)

    def test_longrope(self):
        short = [1.0 + 0.1 * i for i in range(4)]
        long = [2.0 + 0.5 * i for i in range(4)]
        s = {"type": "longrope", "short_factor": short, "long_factor": long}
        r = fr.Rope(8, 10000.0, s, 512, original_max_pos=128)
        base, _ = fr.Rope(8, 10000.0, None, 512).params(1)
        inv_s, af = r.params(128)
        inv_l, af_l = r.params(129)
        np.testing.assert_allclose(inv_s, base / np.array(short), rtol=1e-15)
        np.testing.assert_allclose(inv_l, base / np.array(long), rtol=1e-15)
        self.assertAlmostEqual(af, math.sqrt(1 + math.log(4.0) / math.log(128)), places=15)
        self.assertEqual(af, af_l)

    def test_attention_factor_scales_cos_and_sin(self):
        s = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
        r = fr.Rope(8, 10000.0, s, 256)
        cos, sin = r.cos_sin(np.arange(3), 3)
        np.testing.assert_allclose(cos[0], np.full(8, r.params(3)[1]), rtol=1e-15)
        np.testing.assert_allclose(cos ** 2 + sin ** 2, r.params(3)[1] ** 2, rtol=1e-14)

    def test_rope_parameters_v5_layout(self):
        c = tiny_config("gemma3", num_hidden_layers=2, rope_scaling=None)
        c.pop("rope_theta")
        c.pop("rope_local_base_freq")
        c["rope_parameters"] = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
        sp = fr.Spec(c)
        self.assertEqual((sp.layers[0].rope.theta, sp.layers[0].rope.kind), (1e4, "default"))
        self.assertEqual((sp.layers[1].rope.theta, sp.layers[1].rope.kind), (1e6, "linear"))


class FilesAndErrorsTest(unittest.TestCase):
    def test_safetensors_round_trip_and_dtypes(self):
        rng = np.random.default_rng(0)
        a = rng.standard_normal((3, 5)).astype(np.float32)
        with tempfile.TemporaryDirectory() as d:
            for tag in ("F32", "F16", "BF16"):
                p = os.path.join(d, f"{tag}.safetensors")
                stn.write_safetensors(p, {"a": a, "b.c": a[0]}, dtype=tag)
                got = stn.read_safetensors(p)
                self.assertEqual(stn.tensor_dtypes(p), {"a": tag, "b.c": tag})
                with open(p, "rb") as f:
                    n = struct.unpack("<Q", f.read(8))[0]
                self.assertEqual(n % 8, 0)
                if tag == "F32":
                    np.testing.assert_array_equal(got["a"], a)
                elif tag == "F16":
                    np.testing.assert_array_equal(got["a"], a.astype(np.float16))
                else:
                    np.testing.assert_allclose(got["a"], a, rtol=2 ** -8)
                    # exact widening: the bf16 value's f32 bits have 16 zero low bits
                    self.assertTrue(np.all(got["a"].view(np.uint32) & 0xFFFF == 0))
        # round-to-nearest-even on known bit patterns
        bits = stn.f32_to_bf16_bits(np.array([1.0, 1.00390625, 1.01171875, -2.5], dtype=np.float32))
        self.assertEqual(bits.tolist(), [0x3F80, 0x3F80, 0x3F82, 0xC020])

    def test_sharded_dir_equals_single(self):
        with tempfile.TemporaryDirectory() as d:
            one, sh = os.path.join(d, "one"), os.path.join(d, "sh")
            cfg, t = make_tiny_hf_model("qwen3", one, 3)
            os.makedirs(sh)
            names = sorted(t)
            parts = [names[: len(names) // 2], names[len(names) // 2:]]
            wm = {}
            for i, part in enumerate(parts):
                fn = f"model-{i + 1:05d}-of-00002.safetensors"
                stn.write_safetensors(os.path.join(sh, fn), {n: t[n] for n in part})
                wm.update({n: fn for n in part})
            with open(os.path.join(sh, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {}, "weight_map": wm}, f)
            with open(os.path.join(sh, "config.json"), "w") as f:
                json.dump(cfg, f)
            ids = [3, 1, 4, 1, 5]
            np.testing.assert_array_equal(fr.Model.from_dir(one).forward(ids), fr.Model.from_dir(sh).forward(ids))

    def test_bad_files_raise_named_errors(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "x.safetensors")
            with open(p, "wb") as f:
                f.write(struct.pack("<Q", 1000) + b"{}")
            with self.assertRaisesRegex(ValueError, "header length 1000"):
                stn.read_safetensors(p)
            hdr = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}).encode()
            with open(p, "wb") as f:
                f.write(struct.pack("<Q", len(hdr)) + hdr + b"\0" * 12)
            with self.assertRaisesRegex(ValueError, "'w'.*12 bytes"):
                stn.read_safetensors(p)

    def test_config_errors_name_the_problem(self):
        with self.assertRaisesRegex(fr.ConfigError, "FalconForCausalLM"):
            fr.Spec({"architectures": ["FalconForCausalLM"], "model_type": "falcon"})
        c = tiny_config("llama")
        del c["intermediate_size"]
        with self.assertRaisesRegex(fr.ConfigError, "intermediate_size"):
            fr.Spec(c)
        c = tiny_config("minicpm")
        del c["scale_depth"]
        with self.assertRaisesRegex(fr.ConfigError, "scale_depth"):
            fr.Spec(c)
        c = tiny_config("qwen3")
        t = tiny_tensors(c, 0)
        del t["model.layers.1.self_attn.k_norm.weight"]
        with self.assertRaisesRegex(fr.ConfigError, "model.layers.1.self_attn.k_norm.weight"):
            fr.Model(c, t)
        with self.assertRaisesRegex(fr.ConfigError, "rope_scaling type 'mrope'"):
            fr.Spec(tiny_config("llama", rope_scaling={"rope_type": "mrope"}))

    def test_cli_every_family(self):
        with tempfile.TemporaryDirectory() as d:
            for fam in fr.FAMILIES:
                with self.subTest(family=fam):
                    mdir, gdir = os.path.join(d, fam), os.path.join(d, fam + "-golden")
                    make_tiny_hf_model(fam, mdir, 21)
                    prompt = " ".join(str((7 * i + 3) % 96) for i in range(64))
                    with redirect_stdout(io.StringIO()):
                        rc = fr.main([mdir, "--tokens", prompt, "--out", gdir, "--save-greedy-logits"])
                    self.assertEqual(rc, 0)
                    with open(os.path.join(gdir, "golden.json")) as f:
                        g = json.load(f)
                    self.assertEqual((g["family"], g["shape"], len(g["greedy_ids"])), (fam, [64, 96], 64))
                    lg = np.fromfile(os.path.join(gdir, "logits.f32"), dtype="<f4").reshape(64, 96)
                    m = fr.Model.from_dir(mdir)
                    self.assertLess(np.abs(lg - m.forward([int(x) for x in prompt.split()])).max(), 1e-5)
                    # greedy ids replayed by full forwards (no cache) give the same argmaxes
                    seq = [int(x) for x in prompt.split()] + g["greedy_ids"]
                    full = m.forward(seq[:-1])
                    self.assertEqual(np.argmax(full[63:], axis=1).tolist(), g["greedy_ids"])
                    gl = np.fromfile(os.path.join(gdir, "greedy_logits.f32"), dtype="<f4").reshape(64, 96)
                    self.assertLess(np.abs(gl - full[63:]).max(), 1e-4)

if __name__ == "__main__":
    unittest.main()
