#!/usr/bin/python3
"""Independent float64 numpy reference of embeddings (issue 20).

The rule (src/lumen/engine/embed.h): run the decoder over an input's token
ids from position 0 (full causal attention, sliding windows as configured),
take the final norm's output (no LM head) for every position, pool them, and
divide by the L2 norm. Pooling is what the model directory says, read here
from sentence-transformers' modules.json and the Pooling module's
config.json: pooling_mode_lasttoken -> the last position's state,
pooling_mode_mean_tokens -> the mean over positions, pooling_mode_cls_token ->
the first position's state.

The forward is tools/reference/forward_ref.py (float64) on a Hugging Face
directory, e.g. the synth embedding models the golden uses:
  lumen synth tiny-qwen3 --format hf --pooling last -o /tmp/emb-last
  lumen synth tiny-qwen3 --format hf --pooling mean -o /tmp/emb-mean

Usage:
  embed_ref.py MODEL_DIR [MODEL_DIR ...] --inputs-file IDS.txt --out GOLDEN.json
IDS.txt holds one input per line, token ids separated by spaces. One golden
case per MODEL_DIR.
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forward_ref  # noqa: E402

GENERATED_BY = "tools/reference/embed_ref.py"


def read_pooling(model_dir):
    """'last', 'mean' or 'cls' from the sentence-transformers files."""
    with open(os.path.join(model_dir, "modules.json"), encoding="utf-8") as f:
        modules = json.load(f)
    for m in modules:
        if m.get("type") == "sentence_transformers.models.Pooling":
            with open(os.path.join(model_dir, m.get("path", ""), "config.json"), encoding="utf-8") as f:
                cfg = json.load(f)
            modes = [k for k in ("pooling_mode_lasttoken", "pooling_mode_mean_tokens",
                                 "pooling_mode_cls_token") if cfg.get(k)]
            if len(modes) != 1:
                raise ValueError(f"{model_dir}: expected one pooling mode, got {modes}")
            return {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean",
                    "pooling_mode_cls_token": "cls"}[modes[0]]
    raise ValueError(f"{model_dir}: modules.json has no Pooling module")


def embed(model, ids, pooling):
    hidden = model.forward(ids, return_hidden=True)  # [T, D] float64, final norm applied
    if pooling == "last":
        v = hidden[-1]
    elif pooling == "mean":
        v = hidden.mean(axis=0)
    else:
        v = hidden[0]
    return v / np.sqrt((v * v).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dirs", nargs="+")
    ap.add_argument("--inputs-file", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.inputs_file, encoding="utf-8") as f:
        inputs = [[int(t) for t in line.split()] for line in f if line.strip()]
    cases = []
    for d in args.model_dirs:
        pooling = read_pooling(d)
        model = forward_ref.Model.from_dir(d)
        vecs = [embed(model, ids, pooling) for ids in inputs]
        cases.append({
            "model_dir": os.path.basename(os.path.normpath(d)),
            "pooling": pooling,
            "dim": int(vecs[0].size),
            "embeddings": [[float(x) for x in v] for v in vecs],
        })
    out = {
        "generated_by": GENERATED_BY,
        "note": "float64 numpy; vectors L2-normalized; see tests/goldens/embed/README.md",
        "inputs": inputs,
        "cases": cases,
    }
    # One input or vector per line: small diffs when a golden changes.
    lines = ["{", f' "generated_by": {json.dumps(GENERATED_BY)},', f' "note": {json.dumps(out["note"])},',
             ' "inputs": [']
    lines += ["  " + json.dumps(ids) + ("," if i + 1 < len(inputs) else "") for i, ids in enumerate(inputs)]
    lines.append(" ],")
    lines.append(' "cases": [')
    for ci, c in enumerate(cases):
        lines.append(f'  {{"model_dir": {json.dumps(c["model_dir"])}, "pooling": {json.dumps(c["pooling"])}, '
                     f'"dim": {c["dim"]}, "embeddings": [')
        lines += ["   " + json.dumps([float(repr_x) for repr_x in v]) + ("," if i + 1 < len(c["embeddings"]) else "")
                  for i, v in enumerate(c["embeddings"])]
        lines.append("  ]}" + ("," if ci + 1 < len(cases) else ""))
    lines.append(" ]")
    lines.append("}")
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
