#!/usr/bin/env bash
# One prepared run on a machine with an NVIDIA GPU (the device tool's H200):
#   1. install specgen over the machine's own torch / transformers / triton (--no-deps);
#   2. the gpu-marked tests and the kernel tests, for real on CUDA;
#   3. step costs at Qwen3-4B / Qwen3-8B shapes with random bf16 weights, eager and as CUDA
#      graphs (benchmarks/shapes_bench.py);
#   4. the AR loop at Qwen3-8B shapes: eager vs graphs, sync vs overlap, device idle share;
#      whole DFlash / DSpark steps in the sync loop and the device-resident loop
#      (benchmarks/engine_steps.py);
# and write everything to $OUT (default ./gpu-results). Meant to finish in under 8 minutes.
# The embedded default model end to end on CUDA is a separate call when device time is
# left: scripts/split_default_gguf.sh (here), then scripts/gpu_default_bench.sh (there).
set -uo pipefail
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
export SPECGEN_HOME="${SPECGEN_HOME:-$PWD/.specgen-home}"

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

python -m pip install -q --no-deps -e . > "$OUT/install.txt" 2>&1 || {
  echo "install failed"; cat "$OUT/install.txt"; exit 1; }
# pytest/typer/rich/gguf may be missing on a bare machine: install only what is absent
python -m pip install -q pytest typer rich gguf safetensors huggingface-hub > /dev/null 2>&1 || true

timeout 240 python -m pytest -q tests/test_gpu.py tests/kernels tests/test_cuda_graphs.py 2>&1 | tail -25 | tee "$OUT/gpu-tests.txt"

timeout 300 python benchmarks/shapes_bench.py --device cuda --dtype bfloat16 \
  --contexts 512,4096 --out "$OUT/shapes.json" 2>&1 | grep -v '^{' | tee "$OUT/shapes.txt"
# the real AR loop at Qwen3-8B shapes: eager vs CUDA graphs, sync vs overlap, device idle
timeout 180 python benchmarks/engine_steps.py --device cuda --dtype bfloat16 --context 512 \
  --out "$OUT/engine.json" 2>&1 | grep -v '^{' | tee "$OUT/engine.txt"
echo "results in $OUT"
