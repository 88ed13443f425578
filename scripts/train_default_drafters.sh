#!/usr/bin/env bash
# How the drafters shipped for the embedded default (src/specgen/assets/drafters/) are made.
#
#   bash scripts/train_default_drafters.sh [MINUTES_PER_DRAFTER] [DEVICE]
#   WARM=1 LR=5e-4 bash scripts/train_default_drafters.sh 50   # train the shipped ones on
#
# 1. The target answers the training prompts (../shared/data/train/*.jsonl only, never the
#    evaluation sets) into data/smollm2-135m/answers.jsonl; resumable, already-answered
#    prompts are skipped (the committed file holds the answers used for the shipped ones).
#    The prompts in data/smollm2-135m/calibration-prompts.jsonl (the last 6 of each source
#    the first drafters never saw answered) are held back: step 3 calibrates on them.
# 2. One DFlash and one DSpark drafter are trained on those answers (the target's hidden
#    states are computed once and cached under $SPECGEN_HOME/features). WARM=1 starts each
#    from the shipped drafter of its kind instead of random weights (`--init DIR`); every
#    65th answer is held out for the offline τ either way, a split appending never moves.
# 3. The DSpark confidence head is calibrated on the held-back prompts.
# 4. The drafters (bf16 weights, config, draft vocabulary, training record, calibration)
#    are copied into the package. Run from the repository root; takes MINUTES plus the
#    answers (about 40 min for 1,000 prompts on 2 CPU cores), features and calibration.
set -euo pipefail
MINUTES=${1:-36}
DEVICE=${2:-cpu}
LR=${LR:-1e-3}
TRAIN=../shared/data/train
BUILD=build/drafters
RESERVE=data/smollm2-135m/calibration-prompts.jsonl

python scripts/train_prompts.py "$TRAIN" "$RESERVE" build/train-prompts
if [[ "${SKIP_ANSWERS:-0}" != 1 ]]; then
  PROMPTS=()
  for f in build/train-prompts/*.jsonl; do PROMPTS+=(--prompts "$f"); done
  specgen train "${PROMPTS[@]}" --out data/smollm2-135m --device "$DEVICE"
fi
DATA=data/smollm2-135m/answers.jsonl
# the target's hidden states once, with every thread (DSpark's layers cover DFlash's); the
# two runs below then only read them
specgen train --kind dspark --data "$DATA" --out "$BUILD/features" --block-size 8 \
  --target-layers 1,7,14,21,27 --steps 1 --eval-minutes 0 --device "$DEVICE" >/dev/null
# both at once, one thread each (on the 2-core machine: the same total compute as one
# after the other, with neither's curve squeezed into half the wall time)
for kind in dflash dspark; do
  INIT=random
  [[ "${WARM:-0}" == 1 ]] && INIT=src/specgen/assets/drafters/smollm2-135m-$kind
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 specgen train --kind "$kind" --data "$DATA" \
    --out "$BUILD/$kind" --block-size 8 --target-layers 1,7,14,21,27 --init "$INIT" \
    --lr "$LR" --minutes "$MINUTES" --device "$DEVICE" --resume &
done
wait
specgen calibrate --prompts "$RESERVE" --drafter "$BUILD/dspark" \
  --max-new-tokens 96 --device "$DEVICE"
for kind in dflash dspark; do
  dest=src/specgen/assets/drafters/smollm2-135m-$kind
  mkdir -p "$dest"
  cp "$BUILD/$kind"/{config.json,model.safetensors,training.json,draft_vocab.json} "$dest/"
  [[ -f "$BUILD/$kind/calibration.json" ]] && cp "$BUILD/$kind/calibration.json" "$dest/"
done
echo "shipped: src/specgen/assets/drafters/smollm2-135m-{dflash,dspark}"
