"""specgen's DFlash drafter against z-lab's own code (PyPI `dflash`, installed --no-deps):
the same checkpoint's block hidden states, for full-attention drafters and for the
sliding-window ones z-lab ships for its larger targets (causal sliding layers, the window
only under `use_sliding_window`, `is_causal` overriding)."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

from specgen.models.drafters.dflash import load_dflash
from specgen.models.loading import load_target
from support.drafters import save_tiny_dflash
from support.targets import TINY_VOCAB

if importlib.util.find_spec("dflash") is None:
    if os.environ.get("SPECGEN_REQUIRE_ORACLES") == "1":
        raise RuntimeError("the dflash package is not installed (pip install --no-deps dflash)")
    pytest.skip("z-lab's dflash package is not installed", allow_module_level=True)

SLIDING = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=4)
CASES = {
    "full": ({}, {}),
    "sliding": (SLIDING, {}),
    "sliding, is_causal false": (SLIDING, {"is_causal": False}),
    "sliding, no use_sliding_window": (SLIDING, {"use_sliding_window": False}),
}


@pytest.fixture(scope="module")
def target(tiny_qwen3_5):
    return load_target(tiny_qwen3_5, dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("case", list(CASES))
def test_block_hidden_states_equal_zlabs(target, tmp_path, case):
    from dflash import DFlashDraftModel

    layout, edit = CASES[case]
    path = save_tiny_dflash(tmp_path / "d", target_layer_ids=[1, 3], **layout)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, **edit}))
    reference = DFlashDraftModel.from_pretrained(path, dtype=torch.float32).eval()
    ours = load_dflash(path, target=target, target_name="tiny", name="d")

    context, block = 13, 8
    features = torch.randn(1, context, 128, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[7] + [TINY_VOCAB - 1] * (block - 1)])
    embedded = target.embed_tokens(ids)
    with torch.no_grad():
        want = reference(
            position_ids=torch.arange(context + block)[None],
            noise_embedding=embedded,
            target_hidden=features,
        )
    cache = ours.new_cache(64)
    cache.make_finite()  # the fixed-shape form reads dead positions, weighted by 0
    ours.extend(cache, features[:, :9])  # committed in two pieces
    ours.extend(cache, features[:, 9:])
    torch.testing.assert_close(ours.block_hidden(cache, embedded), want, atol=1e-5, rtol=1e-5)
    static = ours.block_hidden_static(cache, embedded, torch.tensor([context]))
    torch.testing.assert_close(static, want, atol=1e-5, rtol=1e-5)
