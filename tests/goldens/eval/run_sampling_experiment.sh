#!/bin/sh
# Reproduces the table in docs/experiments/sampling.md: each HLG pivot at a few
# settings against its entropy-matched temperature, 3 seeds, on the embedded
# stories260K. Usage: run_sampling_experiment.sh [LUMEN_BINARY]
set -e
LUMEN=${1:-build/lumen}
P=tests/goldens/eval/prompts.txt
for pivot in top entropy median; do
  for t in 0.7 1.0 1.3; do
    echo "## pivot $pivot, T $t"
    "$LUMEN" eval match --prompts $P -n 8 --max-tokens 48 --seeds 3 -t 1 \
      --hlg-sampling on --hlg-pivot $pivot --temp $t
  done
done
echo "## pivot top, T 1.0, narrow: width 1, shoulder 1, toe 2"
"$LUMEN" eval match --prompts $P -n 8 --max-tokens 48 --seeds 3 -t 1 \
  --hlg-sampling on --hlg-pivot top --temp 1.0 --hlg-width 1 --hlg-shoulder 1 --hlg-toe 2
