#!/usr/bin/python3
"""Independent float64 numpy reference of strided perplexity (issue 20).

The rule (the same text is in src/lumen/eval/perplexity.h): windows begin at
0, S, 2S, ...; window k holds tokens [begin, end = min(begin + ctx, N)), run
from position 0 of a fresh cache; it scores targets t in [max(prev_end,
begin + 1), end), predicted by the logits at t - 1 of the same window; the
loop stops after the window that reaches N. nll = mean of -log p(target);
ppl = exp(nll); se(nll) = sqrt(var / (n - 1)), var = mean(nll^2) - nll^2;
se(ppl) = ppl * se(nll).

The forward is tools/reference/forward_ref.py (float64) on a Hugging Face
directory, e.g. the embedded model written by
  lumen convert models/stories260K.gguf /tmp/s260k --to hf --type f32

Usage:
  perplexity_ref.py MODEL_DIR --tokens-file IDS.txt --ctx 128 --stride 64 \
      [--stride 128 ...] --out GOLDEN.json
IDS.txt holds the token ids, whitespace-separated (`lumen tokenize --ids`).
One golden case per --stride.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forward_ref  # noqa: E402

GENERATED_BY = "tools/reference/perplexity_ref.py"


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def windows(n, ctx, stride):
    out = []
    prev_end = 0
    begin = 0
    while begin < n:
        end = min(begin + ctx, n)
        out.append((begin, end, max(prev_end, begin + 1)))
        prev_end = end
        if end == n:
            break
        begin += stride
    return out


def perplexity(model, ids, ctx, stride):
    nlls = []
    ws = windows(len(ids), ctx, stride)
    for begin, end, first in ws:
        logits = np.asarray(model.forward(ids[begin:end]), dtype=np.float64)  # [end-begin, V]
        lp = log_softmax(logits)
        for t in range(first, end):
            assert t - 1 - begin >= 0
            nlls.append(-lp[t - 1 - begin, ids[t]])
    nlls = np.array(nlls, dtype=np.float64)
    n = len(nlls)
    mean = float(nlls.mean())
    var = max(float((nlls**2).mean()) - mean * mean, 0.0)
    se = math.sqrt(var / (n - 1)) if n > 1 else 0.0
    ppl = math.exp(mean)
    return {
        "ctx": ctx,
        "stride": stride,
        "windows": len(ws),
        "scored": n,
        "nll": mean,
        "nll_se": se,
        "ppl": ppl,
        "ppl_se": ppl * se,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--tokens-file", required=True)
    ap.add_argument("--ctx", type=int, required=True)
    ap.add_argument("--stride", type=int, action="append", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(a.tokens_file) as f:
        ids = [int(x) for x in f.read().split()]
    if len(ids) < 2:
        sys.exit("perplexity_ref: need at least 2 tokens")
    model = forward_ref.Model.from_dir(a.model_dir)
    cases = []
    for s in a.stride:
        if not 1 <= s <= a.ctx:
            sys.exit(f"perplexity_ref: stride {s} must be in [1, ctx={a.ctx}]")
        cases.append(perplexity(model, ids, a.ctx, s))
        print(json.dumps(cases[-1]))
    golden = {
        "generated_by": GENERATED_BY,
        "model": "stories260K (models/stories260K.gguf via lumen convert --to hf --type f32)",
        "tokens": ids,
        "cases": cases,
    }
    with open(a.out, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
