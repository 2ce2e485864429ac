#!/bin/bash
# Server speed benchmark (not a test): 1 vs 4 streaming clients and HTTP
# overhead against `lumen generate`, for both matmul routes. Needs a model at
# /tmp/m4.gguf (lumen synth llama-3.2-1b --layers 4 -o /tmp/m4.gguf --quant q4_0)
# and LUMEN (default build/speed/lumen). Results: docs/reference/server-api.md.
set -u
cd "$(dirname "$0")/.."
L=${LUMEN:-build/speed/lumen}
M=${MODEL:-/tmp/m4.gguf}
for r in ${ROUTES:-exact int8}; do
  $L serve "$M" --port 18181 --parallel 4 --act-route $r > /tmp/serve_$r.log 2>&1 &
  P=$!
  for i in $(seq 60); do curl -sf 127.0.0.1:18181/health >/dev/null && break; sleep 0.5; done
  echo "== route $r"
  for c in 1 4; do
    node tools/load_test.mjs --url http://127.0.0.1:18181 --clients $c --seconds 20 --max-tokens 64
    curl -s 127.0.0.1:18181/stats | /usr/bin/python3 -c \
      "import json,sys; print('batching', json.load(sys.stdin).get('batching'))"
  done
  echo "-- 1 client, 256 tokens (overhead)"
  node tools/load_test.mjs --url http://127.0.0.1:18181 --clients 1 --seconds 20 --max-tokens 256
  kill -INT $P
  wait $P
  echo "-- engine alone ($r)"
  for i in 1 2; do
    $L generate -m "$M" "Once upon a time" -n 256 --ignore-eos --temp 0 --act-route $r 2>&1 >/dev/null | tail -1
  done
done
