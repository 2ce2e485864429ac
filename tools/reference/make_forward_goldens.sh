#!/bin/sh
# Regenerates tests/goldens/forward/ (issue 4, proof 2):
#   <name>/model/                 tiny random-weight HF model written by
#                                 `lumen synth tiny-<family> --format hf --vocab 320`
#   <name>/golden.json, logits.f32  from tools/reference/forward_ref.py (float64 numpy)
# for every family, plus llama-rope-<type>/ (llama3, linear, dynamic, yarn):
# tiny-llama with a rope_scaling block merged into its config.json.
#
# For each model the seed is the first of 1, 2, 3, ... whose 64 greedy steps all
# have a top1 - top2 logit margin >= MIN_MARGIN in the reference, so f32
# rounding (~1e-5) can never legitimately flip a greedy token.
#
# Usage: tools/reference/make_forward_goldens.sh [path/to/lumen]   (from anywhere)
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LUMEN=${1:-$ROOT/build/release/lumen}
PY=/usr/bin/python3
REF=tools/reference/forward_ref.py
MIN_MARGIN=0.005
cd "$ROOT"
G=tests/goldens/forward

# A fixed 64-token prompt: a deterministic sequence of ids in [3, 300) with
# repeats (0-2 are the synthetic vocab's special tokens).
PROMPT=$($PY -c 'print(" ".join(str(3 + (i * 37 + (i * i) % 11) % 297) for i in range(64)))')

margin_of() {
  $PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["greedy_min_margin"])' "$1/golden.json"
}
ok_margin() {
  $PY -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' "$1" "$2"
}
patch_config() {  # config.json json-object-to-merge
  $PY -c '
import json, sys
c = json.load(open(sys.argv[1]))
c.update(json.loads(sys.argv[2]))
with open(sys.argv[1], "w") as f:
    json.dump(c, f, indent=2)
    f.write("\n")
' "$1" "$2"
}

to_bf16() {  # model dir: every tensor re-saved as BF16 (round to nearest even)
  $PY -c '
import json, os, sys
sys.path.insert(0, "tools/reference")
import safetensors_np
d = sys.argv[1]
tensors, _ = safetensors_np.load_model_dir(d)
safetensors_np.write_safetensors(os.path.join(d, "model.safetensors"), tensors, dtype="BF16")
' "$1"
  patch_config "$1/config.json" '{"torch_dtype": "bfloat16"}'
}

# make_model DIR SYNTH_NAME CONFIG_PATCH [SYNTH_ARGS [bf16]]: the first seed
# whose greedy margins are all large.
make_model() {
  d=$1
  seed=1
  while :; do
    rm -rf "$d"
    mkdir -p "$d"
    # shellcheck disable=SC2086
    "$LUMEN" synth "$2" --format hf --vocab 320 --seed "$seed" -o "$d/model" ${4:-} 2>/dev/null
    if [ -n "$3" ]; then patch_config "$d/model/config.json" "$3"; fi
    if [ "${5:-}" = bf16 ]; then to_bf16 "$d/model"; fi
    $PY $REF "$d/model" --tokens "$PROMPT" --out "$d" -n 64 >/dev/null
    m=$(margin_of "$d")
    if ok_margin "$m" $MIN_MARGIN; then break; fi
    seed=$((seed + 1))
    if [ $seed -gt 100 ]; then echo "no seed with margin >= $MIN_MARGIN for $d" >&2; exit 1; fi
  done
  echo "$d: seed $seed, min greedy margin $m"
}

for f in llama mistral qwen3 gemma2 gemma3 minicpm phi3; do
  make_model "$G/$f" "tiny-$f" ""
done
# Qwen2 as released configs write it: use_sliding_window + max_window_layers,
# no layer_types (null is read as absent by both implementations).
make_model "$G/qwen2" tiny-qwen2 '{"layer_types": null}'

# Small original contexts so every scaling regime is active within 128 positions.
make_model "$G/llama-rope-llama3" tiny-llama '{"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}'
make_model "$G/llama-rope-linear" tiny-llama '{"rope_scaling": {"rope_type": "linear", "factor": 4.0}}'
# dynamic NTK changes the base only past max_position_embeddings (32 here).
make_model "$G/llama-rope-dynamic" tiny-llama '{"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings": 32}'
make_model "$G/llama-rope-yarn" tiny-llama '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}}'
# A bf16 Gemma checkpoint whose width's sqrt(80) = 8.944 rounds to 8.9375 in
# bf16: HF (and the reference) scale embeddings by the rounded constant.
make_model "$G/gemma3-bf16" tiny-gemma3 "" "--dim 80" bf16
