#!/usr/bin/env python3
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


if __name__ == "__main__":
    unittest.main()
