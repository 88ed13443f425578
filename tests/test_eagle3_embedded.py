"""EAGLE-3 on the embedded default (SmolLM2-135M-Instruct, Q4_1 GGUF, fp32): untrained
drafters in the SpecForge and speculators layouts, sized for it, leave AR's output intact."""

from __future__ import annotations

import os

import pytest

from specgen.api.pipeline import Pipeline
from specgen.core.config import SpecConfig
from support.eagle3 import save_eagle3
from support.embedded import spec_bench_questions

pytestmark = pytest.mark.slow

SMOLLM2 = dict(hidden=576, heads=9, kv_heads=3, head_dim=64, vocab=49152)


@pytest.fixture(scope="module")
def pipe(embedded_dir):
    os.environ.setdefault("SPECGEN_HOME", str(embedded_dir.parents[1]))
    return Pipeline.load("smollm2-135m", device="cpu", dtype="float32")


@pytest.mark.parametrize("layout", ["specforge", "speculators"])
def test_eagle3_with_an_untrained_drafter_is_still_exact(pipe, tmp_path, layout):
    path = save_eagle3(tmp_path / layout, layout, draft_vocab=8000, dims=SMOLLM2, scale=0.05)
    eagle3 = pipe.with_spec(SpecConfig(method="eagle3", drafter=str(path), verify_policy="full"))
    assert eagle3.method.net.args.taps == (1, 14, 26)  # entering 2, 15, 27 of 30 layers
    for question in spec_bench_questions({81, 121, 321}):
        want = pipe.generate(question, max_new_tokens=24, session=pipe.new_session())
        got = eagle3.generate(question, max_new_tokens=24, session=eagle3.new_session())
        assert got.token_ids == want.token_ids
        assert got.stats.verified > 0


def test_the_shipped_eagle3_drafter_is_exact_and_accepted(pipe):
    """specgen:smollm2-135m-eagle3 (`specgen train --kind eagle3`): AR's answers, with
    drafts accepted, alone and stacked with the shipped DFlash and DSpark drafters."""
    eagle3 = pipe.with_spec(
        SpecConfig(method="eagle3", drafter="specgen:smollm2-135m-eagle3", verify_policy="full")
    )
    drafters = ("specgen:smollm2-135m-dflash", "specgen:smollm2-135m-dspark")
    stacked = pipe.with_spec(
        SpecConfig(drafter=(*drafters, "specgen:smollm2-135m-eagle3"), verify_policy="full")
    )
    assert stacked.drafters == ("dflash", "dspark", "eagle3")
    for question in spec_bench_questions({81, 121}):
        want = pipe.generate(question, max_new_tokens=24, session=pipe.new_session())
        got = eagle3.generate(question, max_new_tokens=24, session=eagle3.new_session())
        assert got.token_ids == want.token_ids
        assert got.stats.accepted > 0
        both = stacked.generate(question, max_new_tokens=24, session=stacked.new_session())
        assert both.token_ids == want.token_ids
