"""The training prompts the default's drafters learn from: ../shared/data/train/*.jsonl
less the calibration reserve (data/smollm2-135m/calibration-prompts.jsonl, which the DSpark
confidence head is calibrated on), one file per source under OUT.

    python scripts/train_prompts.py TRAIN_DIR RESERVE_JSONL OUT_DIR
"""

import json
import sys
from pathlib import Path

from specgen.training.generate import prompt_key

train, reserve_file, out = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
reserve = {
    prompt_key(json.loads(line)["turns"][0])
    for line in reserve_file.read_text(encoding="utf-8").splitlines()
    if line.strip()
}
out.mkdir(parents=True, exist_ok=True)
for path in sorted(train.glob("*.jsonl")):
    lines = [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]
    kept = [line for line in lines if prompt_key(json.loads(line)["turns"][0]) not in reserve]
    (out / path.name).write_text("".join(line + "\n" for line in kept), encoding="utf-8")
