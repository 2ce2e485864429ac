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
# The fuzzers are single-threaded: run as many at once as there are cores, each
# into its own log, and report them in order.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
run_one() {
  local t=$1 name=${1%_fuzz} work
  work=$(mktemp -d)
  local rc=0
  ./build/fuzz/tests/fuzz/"$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=0 "$work" "tests/fuzz/corpus/$name" >"$logs/$t.log" 2>&1 || rc=$?
  rm -rf "$work"
  echo "$rc" >"$logs/$t.rc"
}
jobs_max=$(nproc)
for t in $targets; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
  run_one "$t" &
done
wait
failed=0
for t in $targets; do
  echo "fuzz: $t for ${secs}s"
  rc=$(cat "$logs/$t.rc")
  if [ "$rc" -ne 0 ]; then
    failed=1
    echo "fuzz: $t FAILED (exit $rc); its log:"
    tail -n 60 "$logs/$t.log"
  else
    tail -n 2 "$logs/$t.log"
  fi
done
exit "$failed"
