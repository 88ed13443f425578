#!/usr/bin/env bash
# One working session of the long run that trains the default's drafters far longer than
# scripts/train_default_drafters.sh did. Run it again the next day and it carries on:
#
#   nice -n 19 bash scripts/long_train.sh            # 60 min per drafter, in the background
#   SESSION=240 KINDS="dflash eagle3" nice -n 19 bash scripts/long_train.sh
#   SHIP=1 bash scripts/long_train.sh                # also copy a drafter that earned it
#
# 1. Data: the target that verifies (the default's own packed GGUF, decoding as it does
#    when it verifies: `specgen train --prompts` on the CPU answers through the library's
#    continuous batching) answers the training prompts ../shared/data/train (less the
#    calibration reserve) and the generated ones (data/smollm2-135m/generated-prompts.jsonl,
#    scripts/make_train_prompts.py) into build/long-train/answers/answers.jsonl;
#    resumable, each session answers for at most ANSWER_MINUTES. Never the evaluation
#    prompts. (data/smollm2-135m/answers.jsonl, the shipped drafters' data, came from eager
#    batches whose answers left the verifying target's in 20 of 32 answers measured, so
#    the long run answers those prompts again.)
# 2. Each drafter trains for SESSION minutes from where the last session stopped (its
#    state in build/long-train/KIND, the learning rate on a schedule over STEPS steps,
#    not over wall time, so a session starved by other work loses nothing), starting from
#    the shipped drafter of its kind. Held-out τ is measured every EVAL minutes on every
#    65th answer (never trained on).
# 3. scripts/ship_drafters.py measures each candidate and the shipped drafter on the same
#    held-out answers; a candidate whose τ is >= 0.1 above the shipped one's is copied
#    into src/specgen/assets/drafters/ (with SHIP=1; the layout kept), so git grows only
#    when a drafter really improved. Committing stays a person's (or the lead's) step.
set -euo pipefail
SESSION=${SESSION:-60}
STEPS=${STEPS:-40000}
KINDS=${KINDS:-"dflash dspark eagle3"}
ANSWER_MINUTES=${ANSWER_MINUTES:-60}
EVAL=${EVAL:-15}
LR=${LR:-3e-4}
DEVICE=${DEVICE:-cpu}
ROOT=build/long-train
LAYERS=1,7,14,21,27
mkdir -p "$ROOT/answers"

if [[ ! -s data/smollm2-135m/generated-prompts.jsonl ]]; then
  python scripts/make_train_prompts.py 3000 > data/smollm2-135m/generated-prompts.jsonl
fi
python scripts/train_prompts.py ../shared/data/train data/smollm2-135m/calibration-prompts.jsonl \
  build/train-prompts
PROMPTS=(--prompts data/smollm2-135m/generated-prompts.jsonl)
for f in build/train-prompts/*.jsonl; do PROMPTS+=(--prompts "$f"); done
# answers in slices: `timeout` stops the answering (each answer is written as it ends), and
# the next session skips what is done
timeout "$((ANSWER_MINUTES * 60))" specgen train "${PROMPTS[@]}" \
  --out "$ROOT/answers" --max-new-tokens 256 --prompt-tokens 512 --batch 16 \
  --device "$DEVICE" || echo "answers: stopped after $ANSWER_MINUTES min (resumes next session)"
DATA=(--data "$ROOT/answers/answers.jsonl")

for kind in $KINDS; do
  # the block drafters go on from the shipped ones (same shape); EAGLE-3, whose head rows
  # are its draft vocabulary, starts afresh (the shipped one had 87 steps) and taps its
  # own layers (low, middle, high)
  shape=(--block-size 8 --target-layers "$LAYERS"
         --init "src/specgen/assets/drafters/smollm2-135m-$kind")
  [[ "$kind" == eagle3 ]] && shape=(--init random)
  specgen train --kind "$kind" "${DATA[@]}" --out "$ROOT/$kind" "${shape[@]}" \
    --lr "$LR" --steps "$STEPS" \
    --session-minutes "$SESSION" --eval-minutes "$EVAL" --device "$DEVICE" --resume \
    2>&1 | tee -a "$ROOT/$kind.log" | grep -E "τ|wrote|rror" || true
done
python scripts/ship_drafters.py --root "$ROOT" --kinds $KINDS ${SHIP:+--ship} "${DATA[@]}"
