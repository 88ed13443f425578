"""Questions from the repository's Spec-Bench sample, for runs on the embedded default."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "benchmarks" / "prompts" / "spec_bench_sample.jsonl"


def spec_bench_questions(ids):
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    return [r["turns"][0] for r in rows if r["question_id"] in ids]
