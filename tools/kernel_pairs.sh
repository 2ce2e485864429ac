#!/usr/bin/env bash
# tools/kernel_pairs.sh N FILTER OLD NEW: paired A/B of two kernel bench
# binaries, for a host whose speed swings between phases that outlast one
# binary's pass over a filter (tools/kernel_ab.sh's rounds). Each benchmark
# FILTER lists runs N times as an adjacent pair, OLD then NEW (NEW first on
# odd pairs), so both halves of a pair land in the same phase; prints per
# benchmark the median of the pairs' NEW / OLD rate ratios (FLOP/s, else
# kernel_GBps, groups/s or iters/s: rate below) and every pair's ratio. A
# change is real when most pairs fall on one side of 1.
#   tools/kernel_pairs.sh 8 'BM_MatMul/(9|10)/(1|4)/1/2048/3/' /tmp/kb_old /tmp/kb_new
set -euo pipefail
if [ $# -ne 4 ]; then
  echo "usage: tools/kernel_pairs.sh N FILTER OLD NEW" >&2
  exit 2
fi
pairs=$1 filter=$2 old=$3 new=$4
[[ "$pairs" =~ ^[1-9][0-9]*$ ]] || { echo "kernel_pairs: N must be a positive integer, got '$pairs'" >&2; exit 2; }
for b in "$old" "$new"; do [ -x "$b" ] || { echo "kernel_pairs: $b is not executable" >&2; exit 2; }; done
mapfile -t benches < <("$old" --benchmark_list_tests --benchmark_filter="$filter" 2>/dev/null | grep '^BM')
[ ${#benches[@]} -gt 0 ] || { echo "kernel_pairs: no benchmark matches '$filter'" >&2; exit 2; }
# The rate one benchmark (its name anchored) prints from one binary
# (tools/bench_rate.awk: FLOP/s, else kernel_GBps, groups/s or iters/s).
rate_awk="$(dirname "$0")/bench_rate.awk"
rate() {
  "$1" --benchmark_min_time=0.15 --benchmark_filter="^$2\$" 2>/dev/null | awk -f "$rate_awk" |
    awk 'NR == 1 { print $2 }'
}
for bm in "${benches[@]}"; do
  ratios=()
  for ((i = 0; i < pairs; ++i)); do
    if ((i % 2)); then
      b=$(rate "$new" "$bm") a=$(rate "$old" "$bm")
    else
      a=$(rate "$old" "$bm") b=$(rate "$new" "$bm")
    fi
    [ -n "$a" ] && [ -n "$b" ] || { echo "kernel_pairs: $bm printed no rate (FLOP/s, kernel_GBps, groups, iters)" >&2; exit 1; }
    ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }')")
  done
  printf '%s\n' "${ratios[@]}" | sort -n |
    awk -v name="$bm" -v all="${ratios[*]}" '{ r[NR] = $1 }
      END { med = NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2
            printf "%-40s new/old median %.3f  (%s)\n", name, med, all }'
done
