#!/usr/bin/env bash
# tools/kernel_insns.sh BIN KERNEL FMT MB L: static counts of one int8
# kernel instantiation in BIN (lumen or lumen_bench_kernels), for comparing
# builds where timings are too noisy: KERNEL is Rows, RowsK or RowsMlx, FMT
# the int8_vnni::Fmt value (matmul_q8_internal.h order: Q4_0 0, ..., Q2_K 9,
# Q3_K 10, Q4_K 11, Q5_K 12, Q4_K groups 13, Q5_K groups 14, Q6_K 15, Q6_K
# slices 16, Q8_0 groups 17, MLX 4-bit 18, 8-bit 19), MB the activation rows
# (1-4), L the levels (1 or 2). Prints the instructions between the symbol's
# address and its end, and how many are vpdpbusd, FMAs, stack accesses and
# calls.
#   tools/kernel_insns.sh build/dev/bench/lumen_bench_kernels RowsK 10 4 2
set -euo pipefail
if [ $# -ne 5 ]; then
  echo "usage: tools/kernel_insns.sh BIN Rows|RowsK|RowsMlx FMT MB L" >&2
  exit 2
fi
bin=$1 kernel=$2 fmt=$3 mb=$4 levels=$5
[ -x "$bin" ] || { echo "kernel_insns: $bin is not executable" >&2; exit 2; }
case $kernel in Rows | RowsK | RowsMlx) ;; *) echo "kernel_insns: no kernel '$kernel'" >&2; exit 2 ;; esac
# Mangled: <length><name>IL...FmtE<fmt>ELi<mb>ELi<levels>E
line=$(nm -S "$bin" | grep -E "[0-9]${kernel}ILN.*FmtE${fmt}ELi${mb}ELi${levels}E" | head -1 || true)
[ -n "$line" ] || { echo "kernel_insns: no $kernel<$fmt, $mb, $levels> in $bin" >&2; exit 1; }
read -r addr size _ <<<"$line"
start=$((16#$addr))
end=$((start + 16#$size))
dis=$(objdump -d --no-show-raw-insn --start-address="$start" --stop-address="$end" "$bin")
count() { grep -cE "$1" <<<"$dis" || true; }
echo "$kernel<$fmt, $mb, $levels>: $(count '^ +[0-9a-f]+:	') instructions," \
  "$(count 'vpdpbusd') vpdpbusd, $(count 'vfmadd') FMAs, $(count '\(%rsp\)') stack accesses," \
  "$(count 'call ') calls"
