#!/usr/bin/python3
"""Issue 17's experiment: does the adaptive lambda controller beat a fixed ORPO lambda?

usage: dynamic_lambda.py [--lumen BIN] [--work DIR] [--img DIR] [--seeds 1,2,3] [--only TASK]

Runs every arm of docs/experiments/dynamic-lambda.md sequentially on 2
threads (`lumen train` on the embedded stories260K), then greedy-generates
from held-out prompts, scores them, prints the tables of the doc (markdown)
and writes the plots (tools/plot_metrics.py) to --img. Runs already finished
in --work (their adapter file exists) are not redone.

Tasks (data in tests/data/train):
  uppercase  positive control: chosen = the rejected continuation in UPPERCASE
  feeling    hard task (tools/reference/make_pref_hard.py): chosen and rejected
             differ in one word, the feeling that matches the event
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "reference"))
import make_pref_hard  # noqa: E402

COMMON = ["--method", "orpo", "--batch-size", "4", "-t", "2", "-q"]

# Per task: data, training knobs, the readings' interval, and the arms.
WIDE = ["--lambda-min", "0.05", "--lambda-max", "20", "--lambda-ramp", "1.0"]
TASKS = {
    "uppercase": {
        "data": "tests/data/train/uppercase",
        "train": ["--iters", "60", "--lr", "2e-3", "--steps-per-eval", "2", "--steps-per-report", "2"],
        "adaptive": ["--lambda-warmup-readings", "5"],
        "arms": [
            ("static-0.05", ["--lambda", "0.05"]),
            ("static-0.5", ["--lambda", "0.5"]),
            ("static-2", ["--lambda", "2.0"]),
            ("aimd", ["--lambda-schedule", "adaptive", "--lambda-controller", "aimd"]),
            ("p", ["--lambda-schedule", "adaptive", "--lambda-controller", "p"]),
            ("pd", ["--lambda-schedule", "adaptive", "--lambda-controller", "pd"]),
            ("pid", ["--lambda-schedule", "adaptive", "--lambda-controller", "pid"]),
        ],
    },
    "feeling": {
        "data": "tests/data/train/feeling",
        "train": ["--iters", "120", "--lr", "3e-3", "--steps-per-eval", "5", "--steps-per-report", "5"],
        "adaptive": ["--lambda-warmup-readings", "5"],
        "arms": [
            ("static-0.05", ["--lambda", "0.05"]),
            ("static-1", ["--lambda", "1.0"]),
            ("static-20", ["--lambda", "20"]),
            ("aimd", ["--lambda-schedule", "adaptive", "--lambda-controller", "aimd"] + WIDE),
            ("p", ["--lambda-schedule", "adaptive", "--lambda-controller", "p"] + WIDE),
            ("pd", ["--lambda-schedule", "adaptive", "--lambda-controller", "pd"] + WIDE),
            ("pid", ["--lambda-schedule", "adaptive", "--lambda-controller", "pid"] + WIDE),
            ("aimd-default", ["--lambda-schedule", "adaptive", "--lambda-controller", "aimd"]),
        ],
    },
}
SETTLE = {"uppercase": 10, "feeling": 30}  # displacement is counted after this step


def load(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def train(lumen, task, arm, extra, seed, work):
    out = os.path.join(work, task, f"{arm}-s{seed}")
    if os.path.exists(os.path.join(out, "adapter_model.safetensors")):
        return out
    t = TASKS[task]
    cmd = [lumen, "train", "--data", t["data"], "--out", out, "--seed", str(seed)] + COMMON + t["train"] + extra
    if "adaptive" in extra:
        cmd += t["adaptive"]
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return out


def generate(lumen, prompt, adapter):
    cmd = [lumen, "generate", prompt, "-n", "24", "--temp", "0", "--no-echo", "-t", "2"]
    if adapter:
        cmd += ["--adapter", adapter]
    r = subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    return r.stdout.decode("utf-8", "replace")


# ------------------------------------------------------------ downstream rules

def uppercase_prompts():
    with open(os.path.join(ROOT, "tests/data/train/uppercase/valid.jsonl")) as f:
        return [(json.loads(line)["prompt"], None) for line in f]


def uppercase_win(text, _):
    letters = [c for c in text if c.isalpha()]
    return bool(letters) and sum(c.isupper() for c in letters) / len(letters) > 0.5


def feeling_prompts(n=40):
    """Held-out prompts (in neither train nor valid) with the matching feeling."""
    seen = set()
    for name in ("train", "valid"):
        with open(os.path.join(ROOT, "tests/data/train/feeling", f"{name}.jsonl")) as f:
            seen |= {json.loads(line)["prompt"] for line in f}
    rows = make_pref_hard.rows(1703, n, seen)
    return [(r["prompt"], r["chosen"].split()[0].strip(".,")) for r in rows]


def feeling_win(text, want):
    """The first feeling word of the first sentence is the one that matches."""
    first = re.split(r"[.!?\n]", text, maxsplit=1)[0]
    for w in re.findall(r"[A-Za-z]+", first):
        if w.lower() in ("happy", "sad"):
            return w.lower() == want
    return False


def feeling_clean(text, vocab):
    """The first sentence ends with '.' and every word of it is a word of the data set."""
    m = re.match(r"([^.!?\n]*)\.", text)
    return bool(m) and all(w in vocab for w in re.findall(r"\S+", m.group(1).replace(",", " ")))


def feeling_vocab():
    v = set()
    with open(os.path.join(ROOT, "tests/data/train/feeling/train.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            for k in ("prompt", "chosen", "rejected"):
                v |= set(r[k].replace(".", " ").replace(",", " ").split())
    return v


# ------------------------------------------------------------------- summary

def summarize(task, run):
    rows = load(run)
    ev = [r for r in rows if r["kind"] == "eval"]
    tr = [r for r in rows if r["kind"] == "train"]
    ctl = [r for r in rows if r["kind"] == "control"]
    s = {"acc": ev[-1]["accuracy"], "margin": ev[-1]["margin"], "l_w": ev[-1]["l_w"], "l_r": ev[-1]["l_r"],
         "lambda": tr[-1]["lambda"], "lambda_max": max(r["lambda"] for r in tr),
         "backoffs": sum(1 for r in ctl if r.get("phase") in ("backoff", "frozen"))}
    late = [r for r in ev if r["step"] >= SETTLE[task]]
    best, deficit, disp = -1e9, 0.0, 0
    for a, b in zip(late, late[1:]):
        if b["l_w"] < a["l_w"] - 0.05 and b["margin"] > a["margin"] + 0.1:
            disp += 1  # an interval where l_w fell while the margin grew (raw deltas, for the report only)
    for r in late:
        best = max(best, r["l_w"])
        deficit = max(deficit, best - r["l_w"])
    s["disp"] = disp
    s["deficit"] = deficit
    return s


def ms(xs, fmt="{:.2f}"):
    m = statistics.mean(xs)
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return (fmt + " ± " + fmt).format(m, sd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lumen", default=os.environ.get("LUMEN", "./build/release/lumen"))
    ap.add_argument("--work", default="/tmp/dynamic-lambda")
    ap.add_argument("--img", default=os.path.join(ROOT, "docs/experiments/img"))
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--only", choices=list(TASKS))
    a = ap.parse_args()
    lumen = os.path.abspath(a.lumen) if os.path.sep in a.lumen else a.lumen
    seeds = [int(x) for x in a.seeds.split(",")]
    vocab = feeling_vocab()
    for task, t in TASKS.items():
        if a.only and task != a.only:
            continue
        prompts = uppercase_prompts() if task == "uppercase" else feeling_prompts()
        win = uppercase_win if task == "uppercase" else feeling_win
        base = [generate(lumen, p, None) for p, _ in prompts]
        base_win = sum(win(g, w) for g, (_, w) in zip(base, prompts)) / len(prompts)
        base_clean = sum(feeling_clean(g, vocab) for g in base) / len(prompts)
        print(f"\n### {task}\n\nbase model: win rate {base_win:.2f}" +
              (f", clean {base_clean:.2f}" if task == "feeling" else "") + "\n")
        print("| arm | val accuracy | margin | l_w | l_r | final lambda (max) | backoff readings "
              "| displaced intervals | worst l_w drop | win rate | clean |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        dirs = {}
        samples = {}
        for arm, extra in t["arms"]:
            runs = [train(lumen, task, arm, extra, s, a.work) for s in seeds]
            dirs[arm] = runs
            sums = [summarize(task, r) for r in runs]
            wins, cleans = [], []
            for r in runs:
                gens = [generate(lumen, p, r) for p, _ in prompts]
                wins.append(sum(win(g, w) for g, (_, w) in zip(gens, prompts)) / len(prompts))
                cleans.append(sum(feeling_clean(g, vocab) for g in gens) / len(prompts))
                samples.setdefault(arm, gens[:2])
            col = lambda k, f="{:.2f}": ms([x[k] for x in sums], f)
            lam = f"{ms([x['lambda'] for x in sums])} ({max(x['lambda_max'] for x in sums):.2f})"
            print(f"| {arm} | {col('acc')} | {col('margin')} | {col('l_w', '{:.3f}')} | {col('l_r')} | {lam} "
                  f"| {sum(x['backoffs'] for x in sums)} | {col('disp', '{:.1f}')} | {col('deficit', '{:.3f}')} "
                  f"| {ms(wins)} | {ms(cleans) if task == 'feeling' else '-'} |")
            sys.stdout.flush()
        print("\ngreedy samples (seed 1):\n")
        for i in range(2):
            print(f"- prompt: `{prompts[i][0]}`")
            print(f"  - base: `{base[i].strip()!r}`")
            for arm in dirs:
                print(f"  - {arm}: `{samples[arm][i].strip()!r}`")
        os.makedirs(a.img, exist_ok=True)
        plot = os.path.join(ROOT, "tools", "plot_metrics.py")
        groups = [f"{arm}={','.join(rs)}" for arm, rs in dirs.items()]
        title = f"{task}: ORPO on stories260K, mean of seeds {a.seeds} (band: min..max)"
        subprocess.run([sys.executable, plot, os.path.join(a.img, f"dynamic-lambda-{task}.svg"), "--band",
                        "--title", title, "--field", "eval:accuracy", "--field", "train:lambda",
                        "--field", "eval:margin", "--field", "eval:l_w", "--field", "eval:l_r"] + groups,
                       check=True)
        # One seed, unaveraged: displacement is an event in time, averaging smears it.
        one = [f"{arm}={rs[0]}" for arm, rs in dirs.items() if arm.startswith(("static", "aimd", "pid"))]
        subprocess.run([sys.executable, plot, os.path.join(a.img, f"dynamic-lambda-{task}-seed{seeds[0]}.svg"),
                        "--title", f"{task}: seed {seeds[0]} only", "--field", "eval:l_w", "--field",
                        "eval:margin", "--field", "train:lambda", "--field", "eval:l_r"] + one, check=True)


if __name__ == "__main__":
    sys.exit(main())
