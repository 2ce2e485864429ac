#!/usr/bin/env bash
# tools/ab_bench.sh N MODEL "BENCH ARGS" BIN...: interleaved A/B of lumen
# binaries (or wrapper scripts that add flags) on one model. Runs
# `BIN bench MODEL ARGS --no-membw` for each BIN in turn, N rounds, so drift
# in the machine's speed lands on every binary alike, and prints each one's
# median and per-round prefill, decode and (with --batch) batch aggregate
# tok/s. On a noisy host, a change is real only when the per-round figures
# separate, not just the medians.
#   tools/ab_bench.sh 6 /tmp/pb_q4_k.gguf "--prompt 512 --gen 1 --repeat 1 -t 1" /tmp/old /tmp/new
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: tools/ab_bench.sh N MODEL \"BENCH ARGS\" BIN..." >&2
  exit 2
fi
rounds=$1 model=$2 args=$3
shift 3
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ab_bench: N must be a positive integer, got '$rounds'" >&2; exit 2; }
[ -e "$model" ] || { echo "ab_bench: $model: no such file or folder" >&2; exit 2; }
for b in "$@"; do [ -x "$b" ] || { echo "ab_bench: $b is not executable" >&2; exit 2; }; done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bins=("$@")
for ((i = 0; i < rounds; ++i)); do
  for j in "${!bins[@]}"; do
    b=${bins[$j]}
    # shellcheck disable=SC2086
    out=$("$b" bench "$model" $args --no-membw 2>&1) ||
      { echo "ab_bench: $b bench failed:" >&2; echo "$out" >&2; exit 1; }
    pre=$(echo "$out" | sed -n 's/^prefill: \([0-9.]*\) tok\/s.*/\1/p')
    dec=$(echo "$out" | sed -n 's/^decode: \([0-9.]*\) tok\/s.*/\1/p')
    bat=$(echo "$out" | sed -n 's/^batch [0-9]* aggregate: \([0-9.]*\) tok\/s.*/\1/p')
    echo "${pre:-nan} ${dec:-nan} ${bat:-nan}" >>"$tmp/$j"
  done
done
for j in "${!bins[@]}"; do
  /usr/bin/python3 - "${bins[$j]}" "$tmp/$j" <<'PY'
import math, statistics, sys
rows = [l.split() for l in open(sys.argv[2])]
out = []
for name, col in (("prefill", 0), ("decode", 1), ("batch aggregate", 2)):
    v = [float(r[col]) for r in rows]
    if all(math.isnan(x) for x in v):
        continue
    out.append("%s median %.2f (%s)" % (name, statistics.median(v), " ".join("%.2f" % x for x in v)))
print("%s: %s" % (sys.argv[1], "; ".join(out)))
PY
done
