"""DFlash: the z-lab format, the cached drafter against its slow oracle, and losslessness."""

from __future__ import annotations

import json

import pytest
import torch

from oracles.dflash import reference_block_hidden
from specgen.api.pipeline import Pipeline
from specgen.core.config import SpecConfig
from specgen.core.errors import CheckpointError, SpecgenError
from specgen.models.drafters.dflash import (
    DFlashArgs,
    build_target_layer_ids,
    check_pair,
    load_dflash,
)
from specgen.models.families import model_args
from specgen.models.loading import load_target
from support.drafters import save_tiny_dflash
from support.targets import FIXTURES, TINY_VOCAB


def _json(name):
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize("size", ["4b", "8b"])
def test_real_zlab_configs_parse_without_edits(size):
    args = DFlashArgs.from_hf(_json(f"dflash-qwen3-{size}-b16.config.json"), name="z-lab")
    assert args.block_size == 16 and args.mask_token_id == 151669
    assert args.target_layer_ids == (1, 9, 17, 25, 33) and args.num_target_layers == 36
    assert args.layers.num_layers == 5 and args.layers.qk_norm
    assert args.windows == (None,) * 5
    target = model_args(_json(f"qwen3-{size}.config.json"))
    check_pair(args, target, f"z-lab/Qwen3-{size}-DFlash-b16", f"qwen3-{size}")


def test_mismatched_pair_names_both_models():
    drafter = DFlashArgs.from_hf(_json("dflash-qwen3-4b-b16.config.json"), name="d")
    target = model_args(_json("qwen3-8b.config.json"))
    with pytest.raises(
        CheckpointError, match=r"drafter D4 does not fit target T8: hidden size 2560 vs 4096"
    ):
        check_pair(drafter, target, "D4", "T8")


def test_target_layer_ids_are_derived_like_the_reference():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert build_target_layer_ids(6, 2) == [1, 3]
    assert build_target_layer_ids(40, 1) == [20]
    cfg = _json("dflash-qwen3-4b-b16.config.json")
    del cfg["dflash_config"]["target_layer_ids"]
    assert DFlashArgs.from_hf(cfg, name="d").target_layer_ids == (1, 9, 17, 25, 33)


@pytest.fixture(scope="module")
def target(tiny_qwen3_deep):
    return load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")


def test_tiny_zlab_checkpoint_loads(target, tiny_dflash):
    net = load_dflash(tiny_dflash, target=target, target_name="tiny", name="drafter")
    assert net.args.target_layer_ids == (1, 3) and net.args.block_size == 8
    assert net.fc.shape == (64, 128) and len(net.layers) == 2


@pytest.mark.parametrize(
    "options, message",
    [
        ({"drop": "layers.1.self_attn.k_norm.weight"}, r"lacks layers\.1\.self_attn\.k_norm"),
        ({"drop": "fc.weight"}, r"lacks fc\.weight"),
        ({"target_layer_ids": [1, 9]}, r"target layer ids \[9\] outside 0\.\.5"),
        ({"mask_token_id": TINY_VOCAB + 3}, "mask token"),
        ({"num_target_layers": 36}, "built for 36 target layers"),
        ({"hidden": 32, "head_dim": 8}, "hidden size 32 vs 64"),
    ],
)
def test_broken_or_mismatched_drafters_fail_clearly(target, tmp_path, options, message):
    options.setdefault("target_layer_ids", [1, 3])
    path = save_tiny_dflash(tmp_path / "d", **options)
    with pytest.raises(CheckpointError, match=message):
        load_dflash(path, target=target, target_name="tiny", name="drafter")


def test_misshaped_tensor(target, tmp_path):
    from safetensors.torch import load_file, save_file

    path = save_tiny_dflash(tmp_path / "d", target_layer_ids=[1, 3])
    tensors = load_file(path / "model.safetensors")
    tensors["fc.weight"] = torch.zeros(64, 64)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(
        CheckpointError, match=r"fc\.weight has shape \(64, 64\), expected \(64, 128\)"
    ):
        load_dflash(path, target=target, target_name="tiny", name="drafter")


@pytest.mark.parametrize("windows", [None, [None, 5]], ids=["full", "sliding"])
def test_cached_drafter_equals_the_slow_reference(target, tmp_path, windows):
    """The eager block and `block_hidden_static` (the CUDA-graph draft step's backbone)."""
    layer_types = None if windows is None else ["full_attention", "sliding_attention"]
    path = save_tiny_dflash(
        tmp_path / "d", target_layer_ids=[1, 3], layer_types=layer_types, sliding_window=5
    )
    net = load_dflash(path, target=target, target_name="tiny", name="d")
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(1, 20, 128, generator=gen)
    block_ids = torch.tensor([[7] + [TINY_VOCAB - 1] * 7])
    block = target.embed_tokens(block_ids)
    cache = net.new_cache(32)
    cache.make_finite()  # the static form reads dead positions, weighted by 0

    def check(context: torch.Tensor) -> None:
        want = reference_block_hidden(net, context, block)
        start = torch.tensor([cache.length])
        for got in (net.block_hidden(cache, block), net.block_hidden_static(cache, block, start)):
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)

    for lo, hi in ((0, 9), (9, 12), (12, 13)):  # committed in uneven pieces
        net.extend(cache, features[:, lo:hi])
    check(features[:, :13])
    cache.rollback(10)  # the target rejected tokens: the drafter forgets them too
    net.extend(cache, features[:, 15:20])
    check(torch.cat([features[:, :10], features[:, 15:20]], 1))


@pytest.fixture(scope="module")
def pipes(tiny_qwen3_deep, tiny_dflash):
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    spec = SpecConfig(method="dflash", drafter=str(tiny_dflash), verify_policy="full", trace=True)
    dflash = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32", spec=spec)
    return ar, dflash


@pytest.mark.parametrize(
    "prompt", ["The quick brown fox", "def add(a, b):", "Speculative decoding drafts tokens"]
)
def test_dflash_greedy_equals_ar(pipes, prompt):
    ar, dflash = pipes
    want = ar.generate(prompt, max_new_tokens=30, session=ar.new_session())
    got = dflash.generate(prompt, max_new_tokens=30, session=dflash.new_session())
    assert got.token_ids == want.token_ids
    trace = got.stats.trace
    assert len(trace) == got.stats.steps
    assert all(len(r["draft"]) <= 7 and 0 <= r["accepted"] <= r["verify_length"] for r in trace)
    assert sum(r["verify_length"] for r in trace[1:]) > 0  # it really drafted


def test_drafter_context_follows_the_target_cache(pipes):
    _, dflash = pipes
    session = dflash.new_session()
    dflash.generate("The quick brown fox", max_new_tokens=12, session=session)
    assert session.drafter.context.length == session.cache.length
    dflash.generate("The quick brown", max_new_tokens=5, session=session)  # prefix reuse
    assert session.drafter.context.length == session.cache.length


def test_smaller_block_size_and_too_large_one(tiny_qwen3_deep, tiny_dflash):
    spec = SpecConfig(method="dflash", drafter=str(tiny_dflash), block_size=4, verify_policy="full")
    pipe = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32", spec=spec)
    out = pipe.generate("The quick brown fox", max_new_tokens=10)
    assert out.stats.verified <= 3 * out.stats.steps
    with pytest.raises(SpecgenError, match="exceeds the block 8"):
        big = SpecConfig(method="dflash", drafter=str(tiny_dflash), block_size=16)
        Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32", spec=big)


def test_drafter_kind_is_read_from_its_config(tiny_qwen3_deep, tiny_dflash):
    spec = SpecConfig(drafter=str(tiny_dflash), verify_policy="full")  # method left at "ar"
    pipe = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32", spec=spec)
    assert pipe.spec.method == "dflash"


def test_no_known_drafter_for_a_plain_path(tiny_qwen3_deep):
    with pytest.raises(SpecgenError, match="no dflash drafter is known"):
        Pipeline.load(str(tiny_qwen3_deep), device="cpu", spec=SpecConfig(method="dflash"))


@pytest.mark.statistical
def test_sampling_through_dflash_has_the_target_distribution(pipes, target):
    """The second generated token's empirical distribution converges to the exact one."""
    from support.statistics import second_token_tv

    tv, far = second_token_tv(pipes[1], target)
    assert tv < 0.06 and tv < far / 5, (tv, far)


def test_a_draft_vocabulary_limits_the_drafts_and_keeps_the_output(pipes, tiny_dflash, tmp_path):
    import shutil

    from specgen.drafting.vocab import save_draft_vocab

    drafter = tmp_path / "vocab"
    shutil.copytree(tiny_dflash, drafter)
    allowed = list(range(0, TINY_VOCAB, 3))
    save_draft_vocab(drafter, allowed)
    spec = SpecConfig(method="dflash", drafter=str(drafter), verify_policy="full", trace=True)
    pipe = pipes[0].with_spec(spec)
    assert pipe.method.vocab is not None and pipe.method.vocab.ids.tolist() == allowed
    want = pipes[0].generate("The quick brown fox", raw=True, max_new_tokens=40).token_ids
    got = pipe.generate("The quick brown fox", raw=True, max_new_tokens=40)
    assert got.token_ids == want
    drafted = [t for r in got.stats.trace for t in r["draft"]]
    assert drafted and set(drafted) <= set(allowed)


@pytest.mark.parametrize(
    "content,message",
    [("{", "is corrupt"), ('{"ids": [1]}', "is corrupt"), ('{"token_ids": [99999]}', "outside")],
)
def test_a_bad_draft_vocabulary_fails_clearly(pipes, tiny_dflash, tmp_path, content, message):
    import shutil

    drafter = tmp_path / "bad"
    shutil.copytree(tiny_dflash, drafter)
    (drafter / "draft_vocab.json").write_text(content)
    with pytest.raises(CheckpointError, match=message):
        pipes[0].with_spec(SpecConfig(method="dflash", drafter=str(drafter)))
