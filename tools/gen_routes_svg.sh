#!/usr/bin/env bash
# Regenerates docs/design/routes.svg from the registry: `lumen routes --dot`
# rendered by Graphviz (apt-get install graphviz). Usage: tools/gen_routes_svg.sh [LUMEN]
set -euo pipefail
cd "$(dirname "$0")/.."
lumen="${1:-build/release/lumen}"
command -v dot >/dev/null || { echo "gen_routes_svg: needs graphviz's dot (apt-get install graphviz)" >&2; exit 1; }
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
"$lumen" routes --dot > "$tmp"
dot -Tsvg "$tmp" -o docs/design/routes.svg.tmp
mv docs/design/routes.svg.tmp docs/design/routes.svg
echo "wrote docs/design/routes.svg"
