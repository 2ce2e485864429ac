#!/usr/bin/env bash
# Installs every Debian package lumen needs to build, test and make goldens.
# Idempotent: a second run checks dpkg and installs nothing when all is present.
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config git
  libhwy-dev nlohmann-json3-dev libcpp-httplib-dev
  libcli11-dev libfmt-dev libpcre2-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev clang-format clang-tidy
  python3 python3-numpy python3-jinja2 python3-sentencepiece
  nodejs  # the nodejs package ships npm on this distribution
  chromium  # the web app's browser tests (tests/web) drive it headless
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ] && command -v npm >/dev/null 2>&1; then
  echo "setup: all ${#PKGS[@]} packages present"
else
  # Debian's nodejs lacks npm (NodeSource's includes it); the SDK tests need it.
  command -v npm >/dev/null 2>&1 || missing+=(npm)

  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The web app's npm packages (bundler, uPlot, marked, DOMPurify, highlight.js,
# playwright-core for its tests), lockfile-pinned; CMake bundles web/ when they
# are present. Reinstalled when the lockfile is newer than the install.
WEB="$(cd "$(dirname "$0")/.." && pwd)/web"
if command -v npm >/dev/null 2>&1 && { [ ! -f "$WEB/node_modules/.package-lock.json" ] ||
   [ "$WEB/package-lock.json" -nt "$WEB/node_modules/.package-lock.json" ]; }; then
  npm ci --prefix "$WEB" --no-audit --no-fund --loglevel=error ||
    echo "setup: npm ci in web/ failed; lumen builds without the web app"
fi
