#!/usr/bin/env bash
# The README's test command: set up, build (release), run every test, run each
# fuzzer briefly when clang's libFuzzer is available. Prints ctest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The official OpenAI/Anthropic SDKs for the server client tests (lockfile-pinned).
if command -v npm >/dev/null 2>&1 && [ ! -d tests/clients/node_modules ]; then
  npm ci --prefix tests/clients --no-audit --no-fund --loglevel=error || echo "test: npm ci failed; SDK client tests skipped"
fi
cmake --preset release -DLUMEN_BUILD_BENCH=OFF >/dev/null
cmake --build build/release -j"$(nproc)"
export LUMEN_FIXTURES="${LUMEN_FIXTURES:-$(pwd)/../shared/fixtures}"
ctest --test-dir build/release --output-on-failure -j"$(nproc)" 2>&1 | tail -n 40
if [ "${LUMEN_SKIP_FUZZ:-0}" != 1 ]; then bash scripts/fuzz.sh 30; fi
