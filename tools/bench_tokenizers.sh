#!/bin/bash
# Encode MB/s per tokenizer: lumen (bench/tokenizer_bench.cc) vs transformers.js
# (tools/reference/js/bench_encode.mjs), one thread each, same corpus.
# Usage: tools/bench_tokenizers.sh [path/to/lumen_bench_kernels]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bench=${1:-$root/build/release/bench/lumen_bench_kernels}
cd "$root"
[ -d tools/reference/js/node_modules ] || (cd tools/reference/js && npm ci --no-audit --no-fund >/dev/null)
declare -A js
while read -r m v; do js[$m]=$v; done < <(node tools/reference/js/bench_encode.mjs)
printf '%-10s %12s %12s %8s\n' tokenizer lumen_MB/s js_MB/s ratio
LUMEN_SOURCE_DIR=$root "$bench" --benchmark_filter='BM_Encode' --benchmark_format=json 2>/dev/null |
  python3 -c '
import json, sys
js = dict(a.split("=") for a in sys.argv[1:])
for b in json.load(sys.stdin)["benchmarks"]:
    m = b["name"].split("/")[1]
    mb = b["bytes_per_second"] / 1e6
    r = js.get(m)
    print("%-10s %12.2f %12s %8s" % (m, mb, r or "-", ("%.1fx" % (mb / float(r))) if r else "-"))
' $(for m in "${!js[@]}"; do echo "$m=${js[$m]}"; done)
