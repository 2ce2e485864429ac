#!/usr/bin/python3
"""Does torch_lora_train.py's loop compute the loss lumen computes, on the
same model and row? (issue 16: the torch baseline must train the same thing.)

  LUMEN=build/release/lumen /usr/bin/python3 tools/reference/torch_lora_check.py [--keep DIR]

1. `lumen synth llama-3.2-1b` shrunk to dim 64 (4 heads of 16, 2 KV heads,
   ffn 96, vocab 512, 2 layers) with f32 weights in the Hugging Face layout:
   the llama-3.2-1b family switches (tied embeddings, llama3 RoPE scaling)
   at a size that runs in a second.
2. One SFT row (prompt/completion) and one ORPO row (prompt/chosen/rejected),
   tokenized by `lumen tokenize` exactly as lumen's dataset loader does
   (train/dataset.cc: the prompt with BOS, prompt + response with BOS and a
   trailing EOS, split at the common prefix).
3. `lumen train --exact --iters 1` on that row with the same row as
   valid.jsonl: metrics.jsonl holds the validation loss before the step
   (LoRA B = 0: the base model) and after it.
4. torch_lora_train.py's Llama and loss_fn, f32, on the same weights:
   a. the loss before the step;
   b. the loss after the step with lumen's written adapter loaded (checks
      the LoRA forward: targets, scale, layout);
   c. the loss after torch's own AdamW step from lumen's initial A (A does
      not move in step 1 since B = 0, so lumen's adapter holds it) and B = 0
      (checks the step: gradient, clip, AdamW).
Each must match lumen's within --tol (default 1e-6, tighter than the 1e-4 asked for: f32 lands
   near 1e-7 and a dropped llama3 RoPE scaling moves the loss by only 2e-6 on
   this small random model). Prints one line per check and
exits 1 if any is over the tolerance, 2 if lumen or a file is missing.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch_lora_train as tlt  # noqa: E402  (exits with a message without torch)
import safetensors_np  # noqa: E402
import torch  # noqa: E402

ROWS = {
    "sft": {"prompt": "Once upon a time, there was a little",
            "completion": " dog named Max. He liked to run in the park with his red ball."},
    "orpo": {"prompt": "Tom looked at the sky and said",
             "chosen": " that the rain would stop soon, so they could play outside.",
             "rejected": " nothing at all."},
}
SYNTH = ["synth", "llama-3.2-1b", "--layers", "2", "--dim", "64", "--ffn", "96", "--heads", "4",
         "--kv-heads", "2", "--vocab", "512", "--quant", "f32", "--format", "hf", "--seed", "1"]


def die(msg, code=2):
    print(f"torch_lora_check.py: {msg}", file=sys.stderr)
    sys.exit(code)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        die(f"`{' '.join(cmd)}` failed ({r.returncode}):\n{r.stderr.strip()}")
    return r.stdout


class Tok:
    def __init__(self, lumen, model, tmp):
        self.lumen, self.model, self.tmp = lumen, model, tmp
        with open(os.path.join(model, "tokenizer_config.json"), encoding="utf-8") as f:
            eos = json.load(f).get("eos_token")
        with open(os.path.join(model, "tokenizer.json"), encoding="utf-8") as f:
            added = {t["content"]: t["id"] for t in json.load(f).get("added_tokens", [])}
        if eos not in added:
            die(f"{model}: eos token {eos!r} not among tokenizer.json's added tokens")
        self.eos = added[eos]

    def encode(self, text):  # with BOS, as Tokenizer::Encode(text, true)
        path = os.path.join(self.tmp, "text.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return [int(x) for x in run([self.lumen, "tokenize", self.model, "--file", path,
                                     "--ids"]).split()]

    def prompt_response(self, p, r):  # dataset.cc PromptResponse (string fields)
        pt = self.encode(p)
        full = self.encode(p + r) + [self.eos]
        n = common_prefix(pt, full)
        return full[:n], full[n:]


def common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def row_tokens(tok, method):
    row = ROWS[method]
    if method == "sft":
        p, c = tok.prompt_response(row["prompt"], row["completion"])
        return p, c, []
    p, c = tok.prompt_response(row["prompt"], row["chosen"])
    p2, r = tok.prompt_response(row["prompt"], row["rejected"])
    n = common_prefix(p, p2)
    return p[:n], p[n:] + c, p2[n:] + r


def torch_model(model_dir):
    a = argparse.Namespace(model=model_dir, rank=8, alpha=16.0)
    return tlt.build_model(a)


def load_adapter(model, adapter_dir):
    """lumen's PEFT-layout adapter into the LoraLinear modules."""
    with open(os.path.join(adapter_dir, "adapter_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    if cfg.get("r") != 8 or float(cfg.get("lora_alpha", 0)) != 16.0:
        die(f"{adapter_dir}: expected r 8 alpha 16, got {cfg.get('r')} {cfg.get('lora_alpha')}")
    t = safetensors_np.read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    hf = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
          "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
          "down": "mlp.down_proj"}
    with torch.no_grad():
        for i, b in enumerate(model.blocks):
            for name in tlt.TARGETS:
                mod = getattr(b.attn if name in ("q", "k", "v", "o") else b.mlp, name)
                for ab in ("A", "B"):
                    key = f"base_model.model.model.layers.{i}.{hf[name]}.lora_{ab}.weight"
                    if key not in t:
                        die(f"{adapter_dir}: {key} missing")
                    getattr(mod, f"lora_{ab}").copy_(torch.from_numpy(t[key].astype("float32")))


def torch_loss(model, method, batch):
    with torch.no_grad():
        loss, nll = tlt.loss_fn(method, model(batch[0]), batch[1])
    return float(loss), float(nll)


def check_method(lumen, model_dir, tok, method, tmp, tol):
    prompt, chosen, rejected = row_tokens(tok, method)
    data = os.path.join(tmp, f"data-{method}")
    os.makedirs(data, exist_ok=True)
    for f in ("train.jsonl", "valid.jsonl"):
        with open(os.path.join(data, f), "w", encoding="utf-8") as out:
            out.write(json.dumps(ROWS[method]) + "\n")
    out_dir = os.path.join(tmp, f"out-{method}")
    run([lumen, "train", model_dir, "--data", data, "--method", method, "--iters", "1",
         "-o", out_dir, "-t", "1", "--exact", "-q"])
    evals = []
    with open(os.path.join(out_dir, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            j = json.loads(line)
            if j.get("kind") == "eval":
                evals.append(j)
    if len(evals) != 2 or evals[0]["step"] != 0 or evals[1]["step"] != 1:
        die(f"{out_dir}/metrics.jsonl: expected evals at steps 0 and 1, got {evals}")

    batch = tlt.make_batch(method, prompt, chosen, rejected or chosen)
    model = torch_model(model_dir)
    for mod in model.modules():  # B = 0, A = lumen's (unchanged by step 1)
        if isinstance(mod, tlt.LoraLinear):
            mod.lora_B.data.zero_()
    results = []
    before = torch_loss(model, method, batch)
    results.append(("base (B = 0), before the step", before, (evals[0]["loss"], evals[0]["nll"])))

    load_adapter(model, out_dir)
    adapted = torch_loss(model, method, batch)
    results.append(("lumen's adapter after 1 step", adapted, (evals[1]["loss"], evals[1]["nll"])))

    load_adapter(model, out_dir)  # lumen's A; B back to 0; one torch step
    for mod in model.modules():
        if isinstance(mod, tlt.LoraLinear):
            mod.lora_B.data.zero_()
    opt = torch.optim.AdamW(model.lora_parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    loss, _ = tlt.loss_fn(method, model(batch[0]), batch[1])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.lora_parameters(), 1.0)
    opt.step()
    stepped = torch_loss(model, method, batch)
    results.append(("torch's own AdamW step", stepped, (evals[1]["loss"], evals[1]["nll"])))

    ok = True
    print(f"{method}: prompt {len(prompt)} tokens, chosen {len(chosen)}"
          + (f", rejected {len(rejected)}" if rejected else ""))
    for what, (tl, tn), (ll, ln) in results:
        d = max(abs(tl - ll), abs(tn - ln))
        good = d <= tol
        ok &= good
        print(f"  {what:32s} loss torch {tl:.7f} lumen {ll:.7f}  nll torch {tn:.7f} "
              f"lumen {ln:.7f}  max |diff| {d:.2e} {'ok' if good else 'OVER ' + str(tol)}")
    return ok


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tol", type=float, default=1e-6,
                    help="max |loss diff| (1e-6: f32 lands near 1e-7; a missing llama3 RoPE "
                    "scaling moves it by 2e-6, a wrong ORPO lambda by 7e-2)")
    ap.add_argument("--keep", help="work in this directory and keep it (default: a temp dir)")
    a = ap.parse_args(argv)
    lumen = os.environ.get("LUMEN", "build/release/lumen")
    if not (os.path.isfile(lumen) and os.access(lumen, os.X_OK)):
        die(f"LUMEN={lumen}: not an executable (build lumen or point LUMEN at the binary)")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    tmp = a.keep or tempfile.mkdtemp(prefix="torch_lora_check_")
    os.makedirs(tmp, exist_ok=True)
    try:
        model_dir = os.path.join(tmp, "model")
        run([lumen] + SYNTH + ["-o", model_dir])
        tok = Tok(lumen, model_dir, tmp)
        ok = all([check_method(lumen, model_dir, tok, m, tmp, a.tol) for m in ("sft", "orpo")])
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print("all within tolerance" if ok else "FAILED: a loss differs by more than the tolerance")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
