#!/usr/bin/env bash
# On the GPU machine, after scripts/split_default_gguf.sh's parts were carried over: train
# the shipped drafters of the embedded default further, on the committed answers
# (data/smollm2-135m/answers.jsonl), with far larger steps than the 2-core CPU affords.
# The same recipe as scripts/train_default_drafters.sh (warm start, every 65th answer held
# out for the offline τ); DSpark's calibration is left to this side:
#   specgen calibrate --prompts data/smollm2-135m/calibration-prompts.jsonl --drafter DIR
# Both drafters (for a run stopped early, its last checkpoint's) come back as one tar cut
# into 15 MB parts, as the device tool returns files of at most 16 MiB, with the logs:
#   cat drafters.tar.part-* | tar x    # -> gpu-drafters/{dflash,dspark}/
set -uo pipefail
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
source scripts/gpu_default_model.sh
DEVICE="${DEVICE:-cuda}" MINUTES="${MINUTES:-5}" LR="${LR:-6e-4}"
SEQS="${SEQS:-16}" ANCHORS="${ANCHORS:-128}" EVAL="${EVAL:-1}"
DATA=data/smollm2-135m/answers.jsonl
BUILD=build/gpu-drafters
LAYERS=1,7,14,21,27
rm -rf "$BUILD"
# the target's hidden states once (DSpark's layers cover DFlash's); both runs read them
timeout "${FEATURES_LIMIT:-240}" python3 -m specgen train --kind dspark --data "$DATA" \
  --out "$BUILD/features" --block-size 8 --target-layers "$LAYERS" --steps 1 \
  --eval-minutes 0 --device "$DEVICE" > "$OUT/features.log" 2>&1
echo "features: exit $?"; tail -2 "$OUT/features.log"
# the budget starts after the target's features are read back (~2 min there for 3k
# answers); a run stopped at this outer limit still leaves its last checkpoint's drafter
LIMIT=$(python3 -c "print(int($MINUTES * 60 + ${MARGIN:-300}))")
for kind in dflash dspark; do
  timeout "$LIMIT" python3 -m specgen train --kind "$kind" --data "$DATA" \
    --out "$BUILD/$kind" --block-size 8 --target-layers "$LAYERS" \
    --init "src/specgen/assets/drafters/smollm2-135m-$kind" --lr "$LR" --minutes "$MINUTES" \
    --sequences-per-step "$SEQS" --anchors-per-sequence "$ANCHORS" --eval-minutes "$EVAL" \
    --device "$DEVICE" > "$OUT/train-$kind.log" 2>&1 &
done
wait
for kind in dflash dspark; do echo "== $kind"; grep -E "τ|wrote|rror" "$OUT/train-$kind.log"; done
mkdir -p gpu-drafters
for kind in dflash dspark; do
  [ -f "$BUILD/$kind/model.safetensors" ] || continue
  mkdir -p "gpu-drafters/$kind"
  # training.json only when the run finished; else config.json says how far it got
  for f in config.json model.safetensors training.json draft_vocab.json; do
    [ -f "$BUILD/$kind/$f" ] && cp "$BUILD/$kind/$f" "gpu-drafters/$kind/"
  done
done
tar cf - gpu-drafters | split -b 15m - "$OUT/drafters.tar.part-"
ls -l "$OUT"
