#!/usr/bin/env bash
# The README's test command: set up, build (release), run every test, run each
# fuzzer briefly when clang's libFuzzer is available. Prints ctest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The official OpenAI/Anthropic SDKs and client libraries for the server client
# tests (lockfile-pinned); reinstalled when the lockfile is newer than the install.
if command -v npm >/dev/null 2>&1 && { [ ! -f tests/clients/node_modules/.package-lock.json ] ||
   [ tests/clients/package-lock.json -nt tests/clients/node_modules/.package-lock.json ]; }; then
  npm ci --prefix tests/clients --no-audit --no-fund --loglevel=error || echo "test: npm ci failed; SDK client tests skipped"
fi
cmake --preset release -DLUMEN_BUILD_BENCH=OFF >/dev/null
cmake --build build/release -j"$(nproc)"
export LUMEN_FIXTURES="${LUMEN_FIXTURES:-$(pwd)/../shared/fixtures}"
# The junit file feeds the route gate: every L1/L2 route's tests must have run and
# passed in this same run (docs/design/routes.md).
junit="$(pwd)/build/release/ctest-junit.xml"
rm -f "$junit"
# The whole log is kept; the summary is its tail, and a failure also prints the
# failed tests' own output (which a 40-line tail usually cuts off).
log="$(pwd)/build/release/ctest.log"
status=0
ctest --test-dir build/release --output-on-failure -j"$(nproc)" --output-junit "$junit" >"$log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  echo "test: ctest failed (exit $status); the failed tests' output (whole log: $log):"
  awk '/Test +#[0-9]+: .*(\*\*\*(Failed|Timeout|Exception)|Not Run)/ { keep = 1; print; next }
       /^ *[0-9]+\/[0-9]+ Test +#|^ *Start +[0-9]+:/ { keep = 0 }
       keep' "$log" | tail -n 400
fi
tail -n 40 "$log"
[ "$status" -eq 0 ] || exit "$status"
build/release/lumen routes --check "$junit"
if [ "${LUMEN_SKIP_FUZZ:-0}" != 1 ]; then bash scripts/fuzz.sh 30; fi
