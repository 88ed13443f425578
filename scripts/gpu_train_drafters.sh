#!/usr/bin/env bash
# On the GPU machine, after scripts/split_default_gguf.sh's parts were carried over: train
# the default's drafters further, with far larger steps than the 2-core CPU affords, within
# a lent GPU's 15 minutes (the start, the features and the three runs side by side on the
# one GPU, MINUTES each, default 5: one call under the device tool's 10 minutes). Data:
# when carried (`carry: build/long-train/answers`), the verifying target's own answers to
# the training and generated prompts (scripts/long_train.sh makes them on the CPU), else
# the committed answers (data/smollm2-135m/answers.jsonl, from eager batches). DFlash and DSpark go on from the
# shipped drafters (warm start); EAGLE-3 starts afresh (its head rows are its vocabulary).
# Every 65th answer is held out for the offline τ; DSpark's calibration and the decision
# to ship (scripts/ship_drafters.py, τ >= 0.1 above the shipped one's) are this side's:
#   specgen calibrate --prompts data/smollm2-135m/calibration-prompts.jsonl --drafter DIR
# The drafters (for a run stopped early, its last checkpoint's) come back as one tar cut
# into 15 MB parts, as the device tool returns files of at most 16 MiB, with the logs:
#   cat drafters.tar.part-* | tar x    # -> gpu-drafters/{dflash,dspark,eagle3}/
set -uo pipefail
OUT="${OUT:-gpu-results}"
mkdir -p "$OUT"
source scripts/gpu_default_model.sh
DEVICE="${DEVICE:-cuda}" MINUTES="${MINUTES:-5}" LR="${LR:-6e-4}"
SEQS="${SEQS:-16}" ANCHORS="${ANCHORS:-128}" EVAL="${EVAL:-1}"
KINDS="${KINDS:-dflash dspark eagle3}"
DATA=(--data data/smollm2-135m/answers.jsonl)
[ -s build/long-train/answers/answers.jsonl ] && DATA=(--data build/long-train/answers/answers.jsonl)
BUILD=build/gpu-drafters
LAYERS=1,7,14,21,27
rm -rf "$BUILD"
# the target's hidden states once (DSpark's layers cover DFlash's); both runs read them
timeout "${FEATURES_LIMIT:-150}" python3 -m specgen train --kind dspark "${DATA[@]}" \
  --out "$BUILD/features" --block-size 8 --target-layers "$LAYERS" --steps 1 \
  --eval-minutes 0 --device "$DEVICE" > "$OUT/features.log" 2>&1
echo "features: exit $?"; tail -2 "$OUT/features.log"
# the budget starts after the target's features are read back (~2 min there for 3k
# answers); a run stopped at this outer limit still leaves its last checkpoint's drafter
LIMIT=$(python3 -c "print(int($MINUTES * 60 + ${MARGIN:-45}))")
for kind in $KINDS; do
  shape=(--block-size 8 --target-layers "$LAYERS"
         --init "src/specgen/assets/drafters/smollm2-135m-$kind")
  [ "$kind" = eagle3 ] && shape=(--init random)
  timeout "$LIMIT" python3 -m specgen train --kind "$kind" "${DATA[@]}" \
    --out "$BUILD/$kind" "${shape[@]}" --lr "$LR" --minutes "$MINUTES" \
    --sequences-per-step "$SEQS" --anchors-per-sequence "$ANCHORS" --eval-minutes "$EVAL" \
    --device "$DEVICE" > "$OUT/train-$kind.log" 2>&1 &
done
wait
for kind in $KINDS; do echo "== $kind"; grep -E "τ|wrote|rror" "$OUT/train-$kind.log"; done
mkdir -p gpu-drafters
for kind in $KINDS; do
  [ -f "$BUILD/$kind/model.safetensors" ] || continue
  mkdir -p "gpu-drafters/$kind"
  # training.json only when the run finished; else config.json says how far it got
  for f in config.json model.safetensors training.json draft_vocab.json; do
    [ -f "$BUILD/$kind/$f" ] && cp "$BUILD/$kind/$f" "gpu-drafters/$kind/"
  done
done
tar cf - gpu-drafters | split -b 15m - "$OUT/drafters.tar.part-"
ls -l "$OUT"
