"""EAGLE-3 bad input: a drafter for another target, a draft vocabulary map that does not
fit, and a drafter of one method run as another: one line naming both sides, exit 2."""

from __future__ import annotations

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SpecConfig
from specgen.core.errors import CheckpointError
from support.cli import FAST, assert_one_line_error, run
from support.drafters import save_tiny_dflash
from support.eagle3 import H, save_eagle3, save_target
from support.targets import TINY_VOCAB


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return save_target(tmp_path_factory.mktemp("eagle3-target") / "t")


def _load(target_dir, drafter, method="eagle3"):
    spec = SpecConfig(method=method, drafter=str(drafter))
    return Pipeline.load(str(target_dir), device="cpu", dtype="float32", spec=spec)


@pytest.mark.parametrize(
    "layout, kwargs, message",
    [
        # another target: hidden size (its fc takes taps of 32), vocabulary, tap count
        (
            "specforge",
            {"edit": {"target_hidden_size": 32}, "tensors_edit": {"fc.weight": torch.zeros(H, 96)}},
            r"does not fit target T: hidden size 32 vs 64",
        ),
        (
            "speculators",
            {"edit": {"draft_vocab_size": 200}, "options": {"model_type": "qwen3"}},
            None,
        ),
        (
            "deepspec",
            {"edit": {"vocab_size": 500}},
            r"does not fit target T: vocabulary 500 vs 320",
        ),
        (
            "specforge",
            {"tensors_edit": {"fc.weight": torch.zeros(H, 5 * H)}},
            r"fc\.weight takes 320 features, 3 taps of 64 need 192",
        ),
        (
            "deepspec",
            {"edit": {"num_target_layers": 36}},
            "built for 36 target layers, target has 8",
        ),
        (
            "speculators",
            {"taps": [2, 4, 12]},
            r"tapped layers \[2, 4, 12\] \(speculators ids\) fall outside the target's 8 layers",
        ),
        # draft vocabulary maps that do not fit
        (
            "specforge",
            {"tensors_edit": {"d2t": torch.full((200,), TINY_VOCAB)}},
            "draft vocabulary does not fit target T: d2t maps draft tokens outside",
        ),
        (
            "specforge",
            {"tensors_edit": {"d2t": torch.zeros(199, dtype=torch.long)}},
            r"d2t has shape \(199,\)",
        ),
        (
            "speculators",
            {"tensors_edit": {"d2t": -torch.arange(200)}},
            "d2t maps two draft tokens to one target token",
        ),
        (
            "specforge",
            {"tensors_edit": {"t2d": torch.ones(TINY_VOCAB, dtype=torch.bool)}},
            "t2d and d2t name different draft tokens",
        ),
        ("specforge", {"drop": "d2t"}, "200 draft tokens but no d2t map to the target's 320"),
    ],
)
def test_mismatched_drafters_fail_naming_both(tmp_path, target_dir, layout, kwargs, message):
    if message is None:  # the speculators layer config names the vocabulary
        kwargs = {**kwargs, "edit": {}}
        path = save_eagle3(tmp_path / "d", layout, target=target_dir, **kwargs)
        cfg = (path / "config.json").read_text().replace('"vocab_size": 320', '"vocab_size": 640')
        (path / "config.json").write_text(cfg)
        message = r"vocabulary 640 vs 320"
    else:
        path = save_eagle3(tmp_path / "d", layout, target=target_dir, **kwargs)
    from specgen.methods.eagle3.network import load_eagle3
    from specgen.models.loading import load_target

    target = load_target(target_dir, dtype=torch.float32, device="cpu")
    with pytest.raises(CheckpointError, match=message) as info:
        load_eagle3(path, target=target, target_name="T", name="D")
    assert "D" in str(info.value) and "\n" not in str(info.value)


def test_cli_another_targets_drafter_exits_2(tmp_path, target_dir):
    path = save_eagle3(tmp_path / "d", "deepspec", target=target_dir, edit={"vocab_size": 500})
    result = run("generate", "hi", "--model", str(target_dir), "--drafter", str(path), *FAST)
    assert_one_line_error(result, 2, str(path), str(target_dir), "vocabulary 500 vs 320")


def test_cli_bad_d2t_exits_2(tmp_path, target_dir):
    bad = {"d2t": torch.full((200,), TINY_VOCAB)}
    path = save_eagle3(tmp_path / "d", "specforge", tensors_edit=bad)
    result = run(
        "generate", "hi", "--model", str(target_dir), "--method", "eagle3", "--drafter", str(path),
        *FAST,
    )  # fmt: skip
    assert_one_line_error(result, 2, str(path), str(target_dir), "d2t maps draft tokens outside")


def test_cli_eagle3_method_with_a_dflash_drafter_exits_2(tmp_path, target_dir):
    dflash = save_tiny_dflash(tmp_path / "dflash", target_layer_ids=[1, 3], num_target_layers=8)
    result = run(
        "generate", "hi", "--model", str(target_dir), "--method", "eagle3", "--drafter",
        str(dflash), *FAST,
    )  # fmt: skip
    assert_one_line_error(result, 2, str(dflash), "is a dflash drafter", "not a eagle3 one")


@pytest.mark.parametrize("layout", ["specforge", "speculators", "deepspec"])
def test_cli_dflash_method_with_an_eagle3_drafter_exits_2(tmp_path, target_dir, layout):
    path = save_eagle3(tmp_path / "d", layout, target=target_dir)
    result = run(
        "generate", "hi", "--model", str(target_dir), "--method", "dflash", "--drafter", str(path),
        *FAST,
    )  # fmt: skip
    assert_one_line_error(result, 2, str(path), "is a eagle3 drafter", "not a dflash one")
