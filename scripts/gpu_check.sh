#!/usr/bin/env bash
# One prepared run on a machine with an NVIDIA GPU (the device tool's H200):
#   1. the AR loop at Qwen3-8B shapes: eager vs graphs, sync vs overlap, device idle share;
#      whole DFlash / DSpark steps in the sync loop and the device-resident loop
#      (benchmarks/engine_steps.py) -- issue 8's sync-vs-overlap measurement;
#      and a profile of eager decoding steps (benchmarks/profile_eager_steps.py);
#   2. the gpu-marked tests and the kernel tests, for real on CUDA (EAGLE-3's chain graphs
#      and resident steps: tests/test_gpu_eagle3.py; MTP's: tests/test_gpu_mtp.py);
#   3. step costs at Qwen3-4B / Qwen3-8B, Qwen3.5-4B / -9B and Gemma-4-12B shapes with random bf16 weights,
#      eager and as CUDA graphs (benchmarks/shapes_bench.py: AR step, verify-16 / AR, DFlash
#      draft / AR, and for the hybrid targets a verify after a partial acceptance, whose
#      Gated DeltaNet layers first replay the committed tokens: the rollback's cost);
#      and one Gated DeltaNet layer's rollback, tape replay against per-position states
#      (benchmarks/hybrid_rollback.py);
# and write everything to $OUT (default ./gpu-results) as it goes, so a run stopped at its
# limit still brings back what finished. Meant to finish in under 10 minutes.
# That machine reaches no package index: specgen runs from src/ (no pip install), and the
# packages it needs (torch, transformers, triton, typer, rich, safetensors, huggingface-hub,
# pytest) are already in its image. The embedded default model end to end on CUDA is a
# separate call when device time is left: scripts/split_default_gguf.sh (here), then
# scripts/gpu_default_bench.sh (there).
set -uo pipefail
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
export SPECGEN_HOME="${SPECGEN_HOME:-$PWD/.specgen-home}"
export PYTHONPATH="$PWD/src:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
PY=python3

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
  $PY -c "import specgen; print('specgen from', specgen.__file__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# 1. the real AR loop at Qwen3-8B shapes; sync vs overlap; resident speculative steps
timeout 170 $PY benchmarks/engine_steps.py --device cuda --dtype bfloat16 --context 512 \
  --out "$OUT/engine.json" 2>&1 | grep -v '^{' | tee "$OUT/engine.txt"

# 1b. where an eager step's time goes (the loop's eager steps ran ~4x slower than a forward)
timeout 90 $PY benchmarks/profile_eager_steps.py --device cuda --context 512 --steps 24 \
  --out "$OUT/eager-profile.txt" > /dev/null 2>&1
head -3 "$OUT/eager-profile.txt"

# 2. correctness on CUDA: lossless per method and engine, kernels against their references
PER_TEST=""
$PY -c "import pytest_timeout" 2>/dev/null && PER_TEST="--timeout 120"
timeout 200 $PY -m pytest -q -p no:cacheprovider $PER_TEST tests/test_gpu.py tests/test_gpu_logprobs.py tests/kernels \
  tests/test_cuda_graphs.py tests/test_gpu_hybrid.py tests/test_hybrid_state.py \
  tests/test_gpu_gemma4.py tests/test_gpu_gemma3.py tests/test_gpu_eagle3.py tests/test_gpu_mtp.py \
  "tests/test_draft_model.py::test_on_cuda_every_engine_is_ar" \
  "tests/test_packed_families.py::test_on_cuda_a_packed_target_gives_the_files_logits_and_greedy_answers" 2>&1 | tee "$OUT/gpu-tests.full.txt" | tail -30 > "$OUT/gpu-tests.txt"
cat "$OUT/gpu-tests.txt"

# 2b. packed weights (issue 33): Qwen3-8B shapes with int4 matrices (Triton dequant kernel):
#     int4 AR vs the bf16 AR of step 3, and a 16-token verify over an int4 AR step
timeout 150 $PY benchmarks/shapes_bench.py --device cuda --dtype bfloat16 --contexts 512 \
  --quantize int4 --target tests/fixtures/qwen3-8b.config.json \
  --out "$OUT/shapes-int4.json" 2>&1 | grep -v '^{' | tee "$OUT/shapes-int4.txt"

# 3. step costs at Qwen3-4B and Qwen3-8B shapes, then Qwen3.5-4B and -9B (hybrid)
timeout 200 $PY benchmarks/shapes_bench.py --device cuda --dtype bfloat16 \
  --contexts 512,4096 --out "$OUT/shapes.json" 2>&1 | grep -v '^{' | tee "$OUT/shapes.txt"
timeout 200 $PY benchmarks/shapes_bench.py --device cuda --dtype bfloat16 --contexts 512,4096 \
  --target tests/fixtures/qwen3.5-4b.config.json --target tests/fixtures/qwen3.5-9b.config.json \
  --out "$OUT/shapes-qwen3.5.json" 2>&1 | grep -v '^{' | tee "$OUT/shapes-qwen3.5.txt"
# Gemma-4-12B: sliding (head 256) and global (head 512, one KV head) layers, window 1024;
# z-lab's DFlash (Qwen3 layers) and DeepSpec's DSpark drafter (Gemma layers) sized for it
timeout 200 $PY benchmarks/shapes_bench.py --device cuda --dtype bfloat16 --contexts 512,4096 \
  --target tests/fixtures/gemma-4-12b.config.json \
  --out "$OUT/shapes-gemma4.json" 2>&1 | grep -v '^{' | tee "$OUT/shapes-gemma4.txt"
timeout 60 $PY benchmarks/hybrid_rollback.py --device cuda --shape 9b \
  --out "$OUT/hybrid-rollback.json" 2>&1 | tee "$OUT/hybrid-rollback.txt"
# 4. draft models (issue 48): the real pairings where their weights are in the HF cache
#    (that machine reaches no Hub: copy them in first); each one's bench against AR, greedy
for pair in "qwen3-8b Qwen/Qwen3-0.6B" "qwen3-4b Qwen/Qwen3-0.6B" \
            "HuggingFaceTB/SmolLM2-1.7B-Instruct smollm2-135m"; do
  set -- $pair
  timeout 150 $PY -m specgen bench --model "$1" --draft-model "$2" --methods draft \
    --device cuda --dtype bfloat16 --num-prompts 6 --max-new-tokens 128 --quiet \
    > "$OUT/draft-model-${2//\//_}-for-${1//\//_}.txt" 2>&1 \
    || echo "draft model $2 for $1: not run (weights not here?)"
done
echo "results in $OUT"
