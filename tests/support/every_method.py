"""Fixtures for tests that hold every method to one reference on the deep tiny Qwen3
(logprobs, penalties): AR and each method's pipeline, every draft verified whole, and
transformers' model of the same checkpoint. Import them into a test module to use them."""

from __future__ import annotations

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SpecConfig
from support.eagle3 import save_eagle3


@pytest.fixture(scope="module")
def hf_deep(tiny_qwen3_deep):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_qwen3_deep, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def pipes(tiny_qwen3_deep, tiny_dflash, tiny_dspark, tmp_path_factory):
    """AR and every method on the deep tiny Qwen3, every draft verified whole."""
    eagle3 = save_eagle3(tmp_path_factory.mktemp("every") / "eagle3", "specforge", taps=[1, 3, 5])
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    drafters = {"ngram": None, "suffix": None, "dflash": str(tiny_dflash),
                "dspark": str(tiny_dspark), "eagle3": str(eagle3),
                "stacked": (str(tiny_dflash), str(tiny_dspark), str(eagle3))}  # fmt: skip
    out = {"ar": ar}
    for method, drafter in drafters.items():
        out[method] = ar.with_spec(SpecConfig(method=method, drafter=drafter, verify_policy="full"))
    return out
