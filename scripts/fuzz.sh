#!/usr/bin/env bash
# Builds the libFuzzer targets in tests/fuzz/ with clang and runs each for N
# seconds (default 30) over its corpus. Fails on any crash.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
if ! command -v clang++ >/dev/null; then echo "fuzz: clang++ missing, skipped"; exit 0; fi
CC=clang CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DLUMEN_FUZZ=ON -DLUMEN_BUILD_TESTS=OFF -DLUMEN_BUILD_BENCH=OFF >/dev/null
targets=$(ls tests/fuzz/*_fuzz.cc 2>/dev/null | xargs -n1 basename | sed 's/\.cc$//')
for t in $targets; do cmake --build build/fuzz --target "$t" -j"$(nproc)" >/dev/null; done
for t in $targets; do
  name=${t%_fuzz}
  work=$(mktemp -d)
  echo "fuzz: $t for ${secs}s"
  ./build/fuzz/tests/fuzz/"$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=0 "$work" "tests/fuzz/corpus/$name" 2>&1 | tail -n 2
  rm -rf "$work"
done
