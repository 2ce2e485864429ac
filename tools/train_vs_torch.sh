#!/usr/bin/env bash
# lumen's LoRA training step against the plain torch loop a user would write
# (tools/reference/torch_lora_train.py), side by side in one session
# (issue 16, "Measurement: lumen bench train").
#
#   LUMEN=build/release/lumen tools/train_vs_torch.sh [--layers 2] [--threads N]
#       [--steps 1] [--seqs "512 2048"] [--methods "sft orpo"] [--keep DIR]
#       [--torch-blas DIR] [--computes "f32 auto"]
#
# For each seq and method it runs, one after another:
#   lumen bench train --layers L --seq S --method M --configs plain --configs all -t T --steps K
#       --compute C, for each C of --computes (lumen's product precision: f32,
#       bf16, or auto = what `lumen train` runs by default on this CPU)
#     (each configuration in its own child process; step time = mean of the
#      K steps, no warm-up; peak RSS of that child)
#   torch_lora_train.py ... in f32 and with --autocast bf16, each in its own
#     process (step time = median of K steps after one warm-up; ru_maxrss)
# --torch-blas DIR puts DIR first on LD_LIBRARY_PATH for the torch runs only:
# Debian's torch does its f32 products through libblas.so.3, and where that
# is the reference BLAS (libblas3, about 1 GFLOP/s) the f32 loop measures it,
# not torch; point DIR at an OpenBLAS (e.g. libopenblas0-pthread's
# /usr/lib/x86_64-linux-gnu/openblas-pthread). The tables name the BLAS used.
# Then it prints markdown tables of step time and peak MB with the ratios
# torch / lumen (> 1: lumen is faster or smaller). Raw outputs stay in
# --keep DIR (default: a temp dir, removed). The machine's load matters:
# the tables carry the load average before and after.
set -uo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "train_vs_torch.sh: $*" >&2; exit 2; }

LUMEN=${LUMEN:-build/release/lumen}
PY=${PYTHON:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")" && pwd)
TORCH_LOOP="$HERE/reference/torch_lora_train.py"
layers=2
threads=$(nproc)
steps=1
seqs="512 2048"
methods="sft orpo"
keep=""
torch_blas=""
computes="f32 auto"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --layers) layers=${2:-}; shift 2 || die "--layers needs a value" ;;
    --threads|-t) threads=${2:-}; shift 2 || die "--threads needs a value" ;;
    --steps) steps=${2:-}; shift 2 || die "--steps needs a value" ;;
    --seqs) seqs=${2:-}; shift 2 || die "--seqs needs a value" ;;
    --methods) methods=${2:-}; shift 2 || die "--methods needs a value" ;;
    --keep) keep=${2:-}; shift 2 || die "--keep needs a directory" ;;
    --torch-blas) torch_blas=${2:-}; shift 2 || die "--torch-blas needs a directory" ;;
    --computes) computes=${2:-}; shift 2 || die "--computes needs a value" ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
posint() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 '$2': must be a positive integer"; }
posint --layers "$layers"
posint --threads "$threads"
posint --steps "$steps"
for s in $seqs; do posint "--seqs entry" "$s"; [[ $s -ge 4 ]] || die "--seqs $s: at least 4"; done
for c in $computes; do
  [[ $c == f32 || $c == bf16 || $c == auto ]] || die "--computes '$c': f32, bf16 or auto"
done
[[ -n "$computes" ]] || die "--computes: at least one of f32, bf16, auto"
for m in $methods; do
  [[ $m == sft || $m == orpo ]] || die "--methods '$m': sft or orpo (the torch loop has these two)"
done
[[ -x "$LUMEN" ]] || die "LUMEN=$LUMEN is not an executable (build lumen or set LUMEN)"
"$PY" -c "import torch" 2>/dev/null || die "$PY cannot import torch (use Debian's /usr/bin/python3)"
[[ -f "$TORCH_LOOP" ]] || die "$TORCH_LOOP missing"
torch_env=()
if [[ -n "$torch_blas" ]]; then
  [[ -f "$torch_blas/libblas.so.3" ]] || die "--torch-blas $torch_blas: no libblas.so.3 there"
  torch_env=(env "LD_LIBRARY_PATH=$torch_blas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
fi

if [[ -n "$keep" ]]; then
  work=$keep
  mkdir -p "$work" || die "--keep $keep: cannot create it"
else
  work=$(mktemp -d /tmp/train_vs_torch.XXXXXX)
  trap 'rm -rf "$work"' EXIT
fi

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
{
  echo "cpu=$cpu"
  echo "cores=$(nproc)"
  echo "lumen=$LUMEN"
  echo "torch=$("$PY" -c 'import torch; print(torch.__version__)')"
  echo "layers=$layers"
  echo "threads=$threads"
  echo "steps=$steps"
  echo "load_start=$(loadavg)"
} > "$work/session.txt"

for seq in $seqs; do
  for method in $methods; do
    tag="$seq-$method"
    for c in $computes; do
      echo "[$(date +%T)] seq $seq $method: lumen bench train --compute $c (load $(loadavg))" >&2
      "$LUMEN" bench train --layers "$layers" --seq "$seq" --method "$method" \
        --configs plain --configs all -t "$threads" --steps "$steps" --compute "$c" \
        > "$work/lumen-$tag-$c.md" 2> "$work/lumen-$tag-$c.err"
      echo $? > "$work/lumen-$tag-$c.rc"
    done
    for compute in f32 bf16; do
      echo "[$(date +%T)] seq $seq $method: torch $compute (load $(loadavg))" >&2
      extra=()
      [[ $compute == bf16 ]] && extra=(--autocast bf16)
      # oom_score_adj 1000: if a torch run outgrows the machine (ORPO at 2048
      # peaks near 16 GB), the kernel kills it, not a neighbour's process.
      "${torch_env[@]}" bash -c 'echo 1000 > /proc/self/oom_score_adj 2>/dev/null; exec "$@"' _ \
        "$PY" "$TORCH_LOOP" --layers "$layers" --seq "$seq" --method "$method" \
        --steps "$steps" --threads "$threads" "${extra[@]}" \
        > "$work/torch-$tag-$compute.json" 2> "$work/torch-$tag-$compute.err"
      echo $? > "$work/torch-$tag-$compute.rc"
    done
  done
done
echo "load_end=$(loadavg)" >> "$work/session.txt"

"$PY" - "$work" "$seqs" "$methods" "$computes" <<'EOF'
import json, os, sys

work, seqs, methods = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
computes = sys.argv[4].split()
session = dict(l.rstrip("\n").split("=", 1) for l in open(os.path.join(work, "session.txt")))


def lumen_rows(tag):
    """{configuration: (step_s, peak_mb) or error string} from bench train's
    first table (the one whose header has 'step s' and 'peak RSS MB')."""
    path = os.path.join(work, f"lumen-{tag}.md")
    rc = open(os.path.join(work, f"lumen-{tag}.rc")).read().strip()
    resolved = None
    text = open(path).read() if os.path.exists(path) else ""
    out, cols = {}, None
    for line in text.splitlines():
        if resolved is None and "--compute " in line:
            resolved = line.split("--compute ", 1)[1].split(")")[0].strip()
        if not line.startswith("|"):
            if cols is not None and out:
                break  # the table ended
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "step s" in cells and "peak RSS MB" in cells:
            cols = {name: i for i, name in enumerate(cells)}
            continue
        if cols is None or set(line) <= set("|-: "):
            continue
        config = cells[cols["configuration"]]
        step = cells[cols["step s"]]
        if step.startswith("error"):
            out[config] = step
            continue
        try:
            out[config] = (float(step), float(cells[cols["peak RSS MB"]]))
        except (ValueError, IndexError):
            out[config] = f"unparsed row: {line}"
    if not out:
        err = open(os.path.join(work, f"lumen-{tag}.err")).read().strip().splitlines()
        msg = f"lumen exited {rc}" + (f": {err[-1]}" if err else "")
        out = {"plain": msg, "all": msg}
    return out, resolved


def torch_row(tag, compute):
    base = os.path.join(work, f"torch-{tag}-{compute}")
    rc = open(base + ".rc").read().strip()
    try:
        j = json.loads(open(base + ".json").read().strip().splitlines()[-1])
        blas.update(j.get("blas", []))
        return (j["step_s"], j["peak_rss_mb"])
    except (IndexError, ValueError, KeyError):
        err = open(base + ".err").read().strip().splitlines()
        why = {"137": "killed (out of memory?)", "-9": "killed"}.get(rc, f"exit {rc}")
        return f"{why}" + (f": {err[-1]}" if err else "")


def cell(v, i, fmt):
    return fmt.format(v[i]) if isinstance(v, tuple) else "n/a"


def ratio(t, l, i):
    if isinstance(t, tuple) and isinstance(l, tuple) and l[i] > 0:
        return f"{t[i] / l[i]:.2f}x"
    return "-"


rows, notes, blas = [], [], set()
for seq in seqs:
    for m in methods:
        tag = f"{seq}-{m}"
        tf, tb = torch_row(tag, "f32"), torch_row(tag, "bf16")
        for name, v in (("torch f32", tf), ("torch bf16 autocast", tb)):
            if not isinstance(v, tuple):
                notes.append(f"seq {seq} {m}, {name}: {v}")
        for c in computes:
            lum, resolved = lumen_rows(f"{tag}-{c}")
            lp, la = lum.get("plain", "missing"), lum.get("all", "missing")
            label = c if not resolved or resolved == c else f"{c} ({resolved})"
            for name, v in (("lumen plain", lp), ("lumen all levers", la)):
                if not isinstance(v, tuple):
                    notes.append(f"seq {seq} {m}, {name} --compute {c}: {v}")
            rows.append((seq, m, label, lp, la, tf, tb))

print(f"{session['cpu']}, {session['cores']} cores; lumen {session['lumen']}, "
      f"torch {session['torch']}; synth llama-3.2-1b widths, {session['layers']} layers, "
      f"{session['threads']} threads, {session['steps']} measured step(s)")
print(f"torch's BLAS (f32 products): {', '.join(sorted(blas)) or '?'}; "
      "bf16 autocast products go to oneDNN")
print(f"load average (1, 5, 15 min): {session['load_start']} at the start, "
      f"{session.get('load_end', '?')} at the end\n")
for title, i, fmt in (("Step time (s)", 0, "{:.2f}"), ("Peak RSS (MB)", 1, "{:.0f}")):
    print(f"{title}; ratio = torch / lumen (> 1: lumen is better)\n")
    print("| seq | method | lumen --compute | lumen plain | lumen all levers | torch f32 "
          "| torch bf16 autocast | f32 / plain | f32 / all | bf16 / plain | bf16 / all |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for seq, m, c, lp, la, tf, tb in rows:
        print(f"| {seq} | {m} | {c} | {cell(lp, i, fmt)} | {cell(la, i, fmt)} "
              f"| {cell(tf, i, fmt)} | {cell(tb, i, fmt)} | {ratio(tf, lp, i)} "
              f"| {ratio(tf, la, i)} | {ratio(tb, lp, i)} | {ratio(tb, la, i)} |")
    print()
for n in notes:
    print(f"- {n}")
EOF
