#!/bin/bash
# The measurement campaign behind docs/reference/performance.md: every model
# on both matmul routes, long context, thread scaling and the kernel
# micro-benchmarks, one file per run under $OUT (default /tmp/perf_runs).
# Needs the models of the doc's Commands section in /tmp and a build in
# build/speed (cmake ... -DLUMEN_BUILD_BENCH=ON). Takes about 25 minutes.
set -u
cd "$(dirname "$0")/.."
L=${LUMEN:-build/speed/lumen}
O=${OUT:-/tmp/perf_runs}
mkdir -p "$O"
git log --oneline | head -1 > "$O/commit.txt"
$L bench --membw > "$O/membw.txt" 2>&1
for m in l_q4_0.gguf l_q8_0.gguf l_q4_k_m.gguf l_mlx4 qwen_q4_0.gguf gemma_q4_0.gguf; do
  for r in exact int8+bf16; do
    $L bench /tmp/$m --prompt 512 --gen 128 --repeat 3 --batch 4 --act-route $r > "$O/${m}_$r.txt" 2>&1
  done
done
for r in exact bf16; do
  $L bench /tmp/l_f16.gguf --prompt 512 --gen 128 --repeat 3 --batch 4 --act-route $r \
    > "$O/l_f16.gguf_$r.txt" 2>&1
done
for m in l_q4_0.gguf l_q8_0.gguf; do
  $L bench /tmp/$m --prompt 512 --gen 32 --repeat 2 --ctx 8192 --no-membw --act-route int8 \
    > "$O/${m}_ctx8192.txt" 2>&1
done
$L bench /tmp/l_q4_0.gguf --prompt 512 --gen 32 --repeat 2 --ctx 8192 --no-membw --act-route int8 \
  --kv-type q8_0 > "$O/l_q4_0.gguf_ctx8192_kvq8.txt" 2>&1
for t in 1 2; do
  $L bench /tmp/l_q4_0.gguf --prompt 512 --gen 16 --repeat 2 --threads $t --no-membw \
    > "$O/threads_$t.txt" 2>&1
  $L bench /tmp/l_q4_0.gguf --prompt 512 --gen 16 --repeat 2 --threads $t --no-membw \
    --act-route int8+bf16 > "$O/threads_${t}_bf16.txt" 2>&1
done
build/speed/bench/lumen_bench_kernels --benchmark_filter='MatVec|BM_MatMul/./256/1/2048' \
  > "$O/kernels.txt" 2>&1
