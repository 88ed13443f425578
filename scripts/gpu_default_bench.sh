#!/usr/bin/env bash
# On the GPU machine, after scripts/split_default_gguf.sh's parts were carried over: the
# embedded default (SmolLM2-135M-Instruct) with the shipped drafters, end to end on CUDA.
# `specgen bench` at fp32 (every method must match AR token for token) and at bf16 (the
# match rate, and the target's logit margin at each first divergence), ar / dflash /
# dspark / stacked, engine auto (overlap with the device-resident loop) and sync.
set -uo pipefail
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
source scripts/gpu_default_model.sh

SUITE=benchmarks/prompts/spec_bench_sample.jsonl
DEVICE="${DEVICE:-cuda}" PROMPTS="${PROMPTS:-8}" TOKENS="${TOKENS:-128}"
IFS=, read -ra RUNS <<< "${RUNS:-float32 auto,bfloat16 auto,bfloat16 sync}"
for run in "${RUNS[@]}"; do
  set -- $run
  name="default-bench-$1-$2"
  timeout "${RUN_LIMIT:-100}" python3 -m specgen bench --suite "$SUITE" --num-prompts "$PROMPTS" \
    --max-new-tokens "$TOKENS" --methods ar,dflash,dspark,stacked --device "$DEVICE" \
    --dtype "$1" --engine "$2" --json \
    > "$OUT/$name.txt" 2> "$OUT/$name.err"
  echo "$name: exit $?"; grep -E "all|=" "$OUT/$name.txt" | tail -8
done
echo "results in $OUT"
