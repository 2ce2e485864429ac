#!/usr/bin/env bash
# tools/issue13_campaign.sh: the same-run table of docs/reference/performance.md
# (issue 13) in one go, one file per step under $OUT (default /tmp/i13):
#   peer.md    lumen against llama.cpp, every GGUF type, 1 and 2 threads
#   short.md   the same at 16-token prompts (not an issue-13 target: what a
#              chat turn's prompt costs; SHORT=0 skips it, about 12 minutes)
#   batch.txt  batch-4 aggregate over a single stream, 2 threads, 3 rounds
#   depth.md   decode at depth 8192 against llama.cpp (Q4_0, 2 threads)
#   mlx.txt    MLX 4/8-bit (lumen only), 1 and 2 threads
#   rss.txt    peak RSS against weights + KV, and the load time, every type
#   membw.txt  read bandwidth before and after
#   ceilings.md  the decode kernel's rate from cache and from DRAM, every
#              int8x2 type (tools/decode_ceilings.sh; BENCH= the kernel bench)
#   summary.txt  every target counted from the files above, with its misses
#              (tools/issue13_summary.py; also printed at the end)
# Needs the synth files: lumen synth llama-3.2-1b -o /tmp/pb_Q.gguf --quant Q
# (and -o /tmp/pb_mlx4 --quant mlx4, mlx8). About 50 minutes on 2 cores.
#   LUMEN=/tmp/lumen tools/issue13_campaign.sh
set -euo pipefail
cd "$(dirname "$0")/.."
L=${LUMEN:-build/release/lumen}
O=${OUT:-/tmp/i13}
PEER=${PEER:-../shared/peers/llama.cpp}
[ -x "$L" ] || { echo "issue13_campaign: $L is not an executable lumen (set LUMEN=)" >&2; exit 2; }
types="q4_0 q8_0 q4_k_m f16 bf16 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k"
files=()
for t in $types; do files+=("/tmp/pb_$t.gguf"); done
for f in "${files[@]}" /tmp/pb_mlx4 /tmp/pb_mlx8; do
  [ -e "$f" ] || { echo "issue13_campaign: $f missing (lumen synth)" >&2; exit 2; }
done
mkdir -p "$O"
{ date -u; git log --oneline -1; lscpu | grep -E 'Model name|^CPU\(s\)'; uptime; } > "$O/env.txt"
$L bench --membw > "$O/membw.txt" 2>&1
LUMEN=$L THREADS="1 2" ROUNDS=2 REPEAT=1 PROMPT=512 GEN=32 \
  tools/peer_bench.sh "$PEER" "${files[@]}" > "$O/peer.md" 2>&1
if [ "${SHORT:-1}" != 0 ]; then
  LUMEN=$L THREADS="1 2" ROUNDS=1 REPEAT=3 PROMPT=16 GEN=16 \
    tools/peer_bench.sh "$PEER" "${files[@]}" > "$O/short.md" 2>&1
fi
for r in 1 2 3; do
  for t in $types; do
    echo "$t round $r $($L bench "/tmp/pb_$t.gguf" --prompt 16 --gen 16 --repeat 1 --batch 4 -t 2 \
      --no-membw 2>&1 | grep -E '^(decode|batch)' | tr '\n' ' ')"
  done
done > "$O/batch.txt"
LUMEN=$L THREADS=2 ROUNDS=1 REPEAT=1 PROMPT=512 GEN=32 DEPTH=8192 \
  tools/peer_bench.sh "$PEER" /tmp/pb_q4_0.gguf > "$O/depth.md" 2>&1
for m in mlx4 mlx8; do
  for t in 1 2; do
    echo "$m -t $t"
    $L bench "/tmp/pb_$m" --prompt 512 --gen 32 --repeat 2 -t "$t" --batch 4 --no-membw 2>&1 |
      grep -E '^(prefill|decode|batch)'
  done
done > "$O/mlx.txt"
for t in $types mlx4 mlx8; do
  f=/tmp/pb_$t.gguf
  [ -e "$f" ] || f=/tmp/pb_$t
  echo "$t $($L bench "$f" --prompt 512 --gen 32 --repeat 1 -t 2 --no-membw 2>&1 | grep -E '^load: |peak RSS' | tr '\n' ' ')"
done > "$O/rss.txt"
BENCH=${BENCH:-build/dev/bench/lumen_bench_kernels} LUMEN=$L ROUNDS=5 \
  tools/decode_ceilings.sh > "$O/ceilings.md" 2>&1
$L bench --membw >> "$O/membw.txt" 2>&1
uptime >> "$O/env.txt"
/usr/bin/python3 tools/issue13_summary.py "$O" | tee "$O/summary.txt"
