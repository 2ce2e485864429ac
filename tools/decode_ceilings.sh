#!/usr/bin/env bash
# tools/decode_ceilings.sh: what limits the default decode kernel (int8x2)
# per weight type, from the kernel bench alone. For each type it prints, in
# GB/s of weight bytes (medians of ROUNDS alternating rounds):
#   cache   1 thread, a 2048 x 2048 matrix that stays in L2/L3: the rate the
#           kernel's instructions allow (BM_MatMul/T/1/1/2048/3)
#   dram1   1 thread, a 134M-weight matrix streamed from DRAM (BM_MatVec/T/1/2/1;
#           75-142 MB: where the last-level cache holds it, e.g. the 260 MiB
#           L3 of session 41's Intel Xeon, this is the L3's rate after the
#           first iteration, not DRAM's: BM_DecodeStream's 1 GiB matrix is)
#   dram2   the same on 2 threads (BM_MatVec/T/2/2/1)
# beside the read bandwidth `lumen bench --membw` measures in the same run.
# Where cache is near or below the 1-thread bandwidth, one thread decodes at
# the kernel's instruction rate, not at the memory's.
#   BENCH=build/dev/bench/lumen_bench_kernels LUMEN=build/dev/lumen ROUNDS=5 \
#     tools/decode_ceilings.sh
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BENCH:-build/dev/bench/lumen_bench_kernels}
L=${LUMEN:-build/dev/lumen}
R=${ROUNDS:-5}
for x in "$B" "$L"; do
  [ -x "$x" ] || { echo "decode_ceilings: $x is not executable (set BENCH=, LUMEN=)" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
filter='BM_MatMul/([3-9]|10|12|13)/1/1/2048/3/|BM_MatVec/([3-9]|10|12|13)/[12]/2/1/'
for ((i = 0; i < R; i++)); do
  "$B" --benchmark_filter="$filter" --benchmark_min_time=0.3 2>/dev/null |
    sed -n 's/^\(BM_[^ ]*\) .*bytes\/s=\([0-9.]*\)G\/s.*/\1 \2/p' >> "$tmp/all"
  "$L" bench --membw 2>&1 | sed -n 's/^ *read bandwidth, \([12]\) threads\{0,1\}: \([0-9.]*\) GB.*/membw\1 \2/p' \
    >> "$tmp/all"
done
/usr/bin/python3 - "$tmp/all" <<'PY'
import collections, statistics, sys
names = {3: "Q8_0", 4: "Q4_0", 5: "Q4_K", 6: "Q6_K", 7: "MLX 4-bit", 8: "Q2_K", 9: "Q4_0 column groups",
         10: "Q4_K column groups", 12: "Q8_0 column groups", 13: "Q6_K slices"}
v = collections.defaultdict(list)
for line in open(sys.argv[1]):
    key, val = line.split()
    v[key].append(float(val))
med = {k: statistics.median(x) for k, x in v.items()}
m1, m2 = med.get("membw1", 0), med.get("membw2", 0)
print(f"read bandwidth (lumen bench --membw): 1 thread {m1:.1f} GB/s, 2 threads {m2:.1f} GB/s")
print("| type | cache, 1 thread | DRAM, 1 thread | DRAM, 2 threads | cache / 1-thread bandwidth |")
print("|---|---|---|---|---|")
for t, name in names.items():
    c = med.get(f"BM_MatMul/{t}/1/1/2048/3/real_time")
    d1 = med.get(f"BM_MatVec/{t}/1/2/1/real_time")
    d2 = med.get(f"BM_MatVec/{t}/2/2/1/real_time")
    if c is None or d1 is None or d2 is None:
        continue
    ratio = f"{c / m1:.2f}" if m1 else "-"
    print(f"| {name} | {c:.1f} | {d1:.1f} | {d2:.1f} | {ratio} |")
PY
