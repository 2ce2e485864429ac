#!/usr/bin/env bash
# tools/peer_bench.sh PEER_DIR MODEL...: lumen and a llama.cpp build side by
# side on the same GGUF files and threads, interleaved (the order alternates
# each round, so drift in the machine's speed lands on both), and the ratios.
#
#   PEER_DIR  a llama.cpp build with bin/llama-bench (../shared/peers/llama.cpp)
#   MODEL     GGUF files both can load (`lumen synth ... -o m.gguf` writes them)
#
# Environment (defaults in brackets):
#   LUMEN [build/release/lumen]   THREADS ["1 2"]   PROMPT [512]   GEN [128]
#   REPEAT [3]: repetitions inside each run   ROUNDS [2]: interleaved runs per side
#   DEPTH [0]: > 0 also decodes after DEPTH tokens of context (llama-bench -d)
#   LUMEN_ARGS [""]: extra lumen bench flags (e.g. "--exact", "--tier l3")
#
# Prints one markdown row per model and thread count: the median over rounds of
# each side's tokens/s and lumen / llama.cpp. The CPU, the load average and the
# exact commands go on top, so the table can be pasted into
# docs/reference/performance.md as it is.
#
# The decode columns are not at the same depth: lumen decodes right after its
# PROMPT-token prompt (positions PROMPT .. PROMPT + GEN), llama-bench's tg
# test starts from an empty context. At PROMPT=512 the attention over the
# prompt costs lumen a few percent (the comparison issue 13 states); PROMPT=16
# compares decode at nearly the same depth, as the docs' decode tables do.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: tools/peer_bench.sh PEER_DIR MODEL.gguf..." >&2
  exit 2
fi
peer=$1
shift
llama="$peer/bin/llama-bench"
lumen=${LUMEN:-build/release/lumen}
threads=${THREADS:-"1 2"}
prompt=${PROMPT:-512}
gen=${GEN:-128}
repeat=${REPEAT:-3}
rounds=${ROUNDS:-2}
depth=${DEPTH:-0}
lumen_args=${LUMEN_ARGS:-}
[ -x "$llama" ] || { echo "peer_bench: $llama is not an executable llama-bench" >&2; exit 2; }
[ -x "$lumen" ] || { echo "peer_bench: $lumen is not an executable lumen (set LUMEN=)" >&2; exit 2; }
for m in "$@"; do
  [ -f "$m" ] || { echo "peer_bench: $m: no such file" >&2; exit 2; }
done
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One run of each side; appends "side model threads pp tg [tg_depth]" to $tmp/runs.
run_lumen() {
  local m=$1 t=$2 out
  local extra=()
  [ "$depth" -gt 0 ] && extra=(--ctx "$depth")
  # shellcheck disable=SC2086
  out=$("$lumen" bench "$m" --prompt "$prompt" --gen "$gen" --repeat "$repeat" -t "$t" \
        --no-membw "${extra[@]}" $lumen_args 2>&1) ||
    { echo "peer_bench: lumen bench failed on $m:" >&2; echo "$out" >&2; exit 1; }
  echo "$out" | "$py" -c '
import re, sys
text = sys.stdin.read()
def tok(label):
    m = re.search(r"^" + re.escape(label) + r": ([0-9.]+) tok/s", text, re.M)
    return m.group(1) if m else "nan"
deep = re.search(r"^decode at context \d+: ([0-9.]+) tok/s", text, re.M)
print("lumen", sys.argv[1], sys.argv[2], tok("prefill"), tok("decode"), deep.group(1) if deep else "nan")
' "$m" "$t" >> "$tmp/runs"
}

run_llama() {
  local m=$1 t=$2 out
  local depths="0"
  [ "$depth" -gt 0 ] && depths="0,$depth"
  out=$("$llama" -m "$m" -t "$t" -p "$prompt" -n "$gen" -r "$repeat" -d "$depths" -o json \
        2>/dev/null) || { echo "peer_bench: llama-bench failed on $m" >&2; exit 1; }
  echo "$out" | "$py" -c '
import json, sys
rows = json.load(sys.stdin)
pp = tg = deep = float("nan")
for r in rows:
    d = r.get("n_depth", 0)
    if r["n_prompt"] > 0 and r["n_gen"] == 0 and d == 0: pp = r["avg_ts"]
    if r["n_gen"] > 0 and r["n_prompt"] == 0 and d == 0: tg = r["avg_ts"]
    if r["n_gen"] > 0 and r["n_prompt"] == 0 and d > 0: deep = r["avg_ts"]
print("llama", sys.argv[1], sys.argv[2], pp, tg, deep)
' "$m" "$t" >> "$tmp/runs"
}

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
echo "lumen: $("$lumen" --version 2>/dev/null || echo "$lumen") $lumen_args; llama.cpp: $peer"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "commands: $lumen bench MODEL --prompt $prompt --gen $gen --repeat $repeat -t T --no-membw" \
     "$([ "$depth" -gt 0 ] && echo "--ctx $depth") $lumen_args |" \
     "$llama -m MODEL -t T -p $prompt -n $gen -r $repeat -d 0$([ "$depth" -gt 0 ] && echo ",$depth") -o json"
for m in "$@"; do
  for t in $threads; do
    for r in $(seq 1 "$rounds"); do
      if [ $((r % 2)) -eq 1 ]; then run_lumen "$m" "$t"; run_llama "$m" "$t"
      else run_llama "$m" "$t"; run_lumen "$m" "$t"; fi
    done
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "decode: lumen at positions $prompt..$((prompt + gen)), llama.cpp at 0..$gen"
echo
"$py" - "$tmp/runs" "$depth" <<'EOF'
import math, statistics, sys, os
runs = {}
for line in open(sys.argv[1]):
    side, model, t, pp, tg, deep = line.split()
    runs.setdefault((model, int(t)), {}).setdefault(side, []).append(
        (float(pp), float(tg), float(deep)))
depth = int(sys.argv[2])
def med(xs):
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")
head = "| model | threads | llama.cpp prefill | lumen prefill | ratio | llama.cpp decode | lumen decode | ratio |"
if depth: head += f" llama.cpp decode @{depth} | lumen decode @{depth} | ratio |"
print(head)
print("|" + "---|" * (head.count("|") - 1))
for (model, t), s in runs.items():
    cols = []
    for i in range(3 if depth else 2):
        a, b = med(x[i] for x in s["llama"]), med(x[i] for x in s["lumen"])
        cols += [f"{a:.1f}", f"{b:.1f}", f"{b / a:.2f}x" if a > 0 else "n/a"]
    print(f"| {os.path.basename(model)} | {t} | " + " | ".join(cols) + " |")
EOF
