"""Training answers on the CPU: the eager left-padded batches against the library's
continuous batching (`specgen train --prompts`' two ways), side by side in one run.

    python benchmarks/train_answers.py --prompts 32 --batch 16 --parallel 8,16

Both answer the last --prompts generated training prompts (data/smollm2-135m/
generated-prompts.jsonl; never evaluation prompts) of the embedded default, as
scripts/long_train.sh asks (prompts cut to 512 tokens, 256-token answers). Reported: each
way's tokens/s, and how many answers each gives that are the verifying target's own (the
streamed answers are; the batches' are compared with them token by token).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from specgen.cli import train_answers
from specgen.cli.common import quiet_libraries
from specgen.hub import resolve_model
from specgen.training.generate import answer_prompts, read_answers

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "data" / "smollm2-135m" / "generated-prompts.jsonl"


def answered(way, width: int, texts: list[str]) -> tuple[float, dict[str, list[int]]]:
    if way == "batches":
        answer, codec, meta = train_answers._batched(resolve_model("smollm2-135m"), "cpu", width,
                                                     256, {})  # fmt: skip
    else:
        answer, codec, meta = train_answers._streamed("smollm2-135m", width, 256, {})

    def encode(text: str) -> list[int]:
        cut = codec.decode(codec.encode_raw(text)[:512])
        return codec.encode_chat([{"role": "user", "content": cut}])

    out = Path(tempfile.mkdtemp()) / "answers.jsonl"
    start = time.perf_counter()
    rows = list(answer_prompts(answer, encode, texts, out, meta=meta))
    seconds = time.perf_counter() - start
    return rows[-1]["tokens"] / seconds, {r["key"]: r["response_ids"] for r in read_answers(out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--parallel", default="8,16")
    a = ap.parse_args()
    quiet_libraries()
    lines = PROMPTS.read_text(encoding="utf-8").splitlines()[-a.prompts :]
    texts = [json.loads(line)["turns"][0] for line in lines]
    runs = [("batches", a.batch)] + [("streams", int(p)) for p in a.parallel.split(",")]
    results = {f"{way} {width}": answered(way, width, texts) for way, width in runs}
    truth = results[f"streams {runs[1][1]}"][1]
    print(f"{len(texts)} prompts, 256-token answers")
    print("way          | tok/s  | answers the verifying target's own")
    for name, (rate, got) in results.items():
        same = sum(got[k] == truth[k] for k in truth)
        print(f"{name:12s} | {rate:6.1f} | {same}/{len(truth)}")
    print(json.dumps({name: round(rate, 1) for name, (rate, _) in results.items()}))


if __name__ == "__main__":
    main()
