#!/usr/bin/env bash
# tools/kernel_ab.sh N FILTER BENCH...: interleaved A/B of kernel bench
# binaries (bench/lumen_bench_kernels builds). Runs each BENCH in turn with
# --benchmark_filter=FILTER, N rounds, so drift in the machine's speed lands
# on every binary alike, and prints per benchmark and binary the median
# rate (GFLOP/s, else GB/s or G/s: tools/bench_rate.awk) with every round's
# figure. Binaries are told apart by file name.
#   tools/kernel_ab.sh 4 'BM_MatMulL2/(5|10)/' /tmp/kb_old /tmp/kb_new
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: tools/kernel_ab.sh N FILTER BENCH..." >&2
  exit 2
fi
rounds=$1 filter=$2
shift 2
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "kernel_ab: N must be a positive integer, got '$rounds'" >&2; exit 2; }
for b in "$@"; do [ -x "$b" ] || { echo "kernel_ab: $b is not executable" >&2; exit 2; }; done
for ((i = 0; i < rounds; ++i)); do
  for b in "$@"; do
    "$b" --benchmark_min_time=0.2 --benchmark_filter="$filter" 2>/dev/null |
      awk -f "$(dirname "$0")/bench_rate.awk" | awk -v B="$(basename "$b")" '{ print $1, B, $2 }'
  done
done | awk '{ k = $1 " " $2; v[k] = v[k] " " $3 } END { for (k in v) print k v[k] }' | sort |
  awk '{ n = NF - 2; for (i = 1; i <= n; i++) a[i] = $(i + 2);
         for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
         med = n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
         rounds = ""; for (i = 3; i <= NF; i++) rounds = rounds " " sprintf("%.4g", $i)
         printf "%-36s %-22s median %8.4g  (%s )\n", $1, $2, med, rounds }'
