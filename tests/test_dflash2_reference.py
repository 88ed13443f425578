"""specgen's DFlash 2 drafter against z-lab's own code (PyPI `dflash` 0.1.0,
`DFlash2DraftModel`) on tiny random checkpoints saved in its layout: the block's hidden
states, the greedy chain drafted token for token (eager and fixed-shape steps), the
sampled walk's q rows along the reference's own path, and a whole greedy generation's
acceptance lengths against `dflash_generate` with a transformers target."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig
from specgen.methods.dflash2.drafter import DFlash2Drafter
from specgen.methods.dflash2.network import load_dflash2
from specgen.models.graphs import GREEDY
from specgen.models.loading import load_target
from support.drafters import save_tiny_dflash2
from support.targets import TINY_VOCAB

if importlib.util.find_spec("dflash") is None:
    if os.environ.get("SPECGEN_REQUIRE_ORACLES") == "1":
        raise RuntimeError("the dflash package is not installed (pip install --no-deps dflash)")
    pytest.skip("z-lab's dflash package is not installed", allow_module_level=True)

SLIDING = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=4)
CASES = {
    "full, kernel 2": {},
    "kernel 3, group 8, top-k 10": dict(kernel=3, group=8, top_k=10),
    "sliding, causal by type": dict(edit={"is_causal": None}, **SLIDING),
    "sliding, is_causal false": SLIDING,
}
CONTEXT, BLOCK, TRIALS = 13, 8, 24


@pytest.fixture(scope="module")
def target(tiny_qwen3_deep):
    return load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")


def _pair(target, path):
    from dflash import DFlash2DraftModel

    reference = DFlash2DraftModel.from_pretrained(path, dtype=torch.float32).eval()
    return reference, load_dflash2(path, target=target, target_name="tiny", name="d")


def _head(target):
    head = torch.nn.Linear(64, TINY_VOCAB, bias=False)
    head.weight.data.copy_(target.lm_head.dense())
    return head


def _save(tmp_path, case):
    kw = dict(CASES[case])
    edit = kw.pop("edit", None)
    path = save_tiny_dflash2(tmp_path / "d", **kw)
    if edit:  # `is_causal: None` drops the field (layer types decide)
        import json

        cfg = json.loads((path / "config.json").read_text())
        for key, value in edit.items():
            cfg.pop(key) if value is None else cfg.update({key: value})
        (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_drafts_equal_zlabs_token_for_token(target, tmp_path, case):
    """Over TRIALS random contexts and anchors: the reference's `propose` (block forward,
    head, chain walk) and specgen's drafter, eager and through the fixed-shape step."""
    reference, ours = _pair(target, _save(tmp_path, case))
    head = _head(target)
    gen = torch.Generator().manual_seed(1)
    same = total = differs_from_argmax = 0
    for _ in range(TRIALS):
        features = torch.randn(1, CONTEXT, 128, generator=gen)
        anchor = int(torch.randint(0, TINY_VOCAB - 1, (1,), generator=gen))
        ids = torch.tensor([[anchor] + [TINY_VOCAB - 1] * (BLOCK - 1)])
        with torch.no_grad():
            hidden = reference(
                position_ids=torch.arange(CONTEXT + BLOCK)[None],
                noise_embedding=target.embed_tokens(ids),
                target_hidden=features,
            )[:, 1:]
            want, _, _ = reference.propose(hidden, ids[:, 0], head, 0.0)
            per_slot = reference.compute_logits(hidden, head).argmax(-1)
        drafter = _drafter(target, ours, features)
        eager = drafter.propose(anchor, BLOCK - 1, SamplingParams(), None).tokens
        static = drafter.steps.uncaptured()(GREEDY, anchor, CONTEXT, BLOCK - 1).tokens
        assert torch.equal(eager, static)
        same += int((eager == want).sum())
        total += want.numel()
        differs_from_argmax += int((want != per_slot).any())
    print(f"DFlash 2 [{case}]: {same}/{total} drafted tokens identical to z-lab's")
    assert same == total
    assert differs_from_argmax > 0  # the selector really changes drafts on these weights


def _drafter(target, net, features) -> DFlash2Drafter:
    from specgen.methods.dflash2.drafter import DFlash2Method

    method = DFlash2Method(net, target, BLOCK)
    drafter = method.new_drafter(64)
    drafter.context.cache.make_finite()  # the fixed-shape step reads dead positions
    drafter.context.append(features)
    return drafter


def test_sampled_q_rows_equal_zlabs_along_its_path(target, tmp_path):
    """The reference samples a path; specgen's walk, forced down the same path (its race
    noise tiny at the reference's pick), reports the same q rows (over the vocabulary)."""
    reference, ours = _pair(target, _save(tmp_path, "full, kernel 2"))
    head, temperature, checked = _head(target), 0.7, 0
    gen = torch.Generator().manual_seed(2)
    for trial in range(8):
        features = torch.randn(1, CONTEXT, 128, generator=gen)
        anchor = int(torch.randint(0, TINY_VOCAB - 1, (1,), generator=gen))
        ids = torch.tensor([[anchor] + [TINY_VOCAB - 1] * (BLOCK - 1)])
        with torch.no_grad():
            hidden = reference(
                position_ids=torch.arange(CONTEXT + BLOCK)[None],
                noise_embedding=target.embed_tokens(ids),
                target_hidden=features,
            )[:, 1:]
            torch.manual_seed(trial)
            path, candidates, q = reference.propose(hidden, ids[:, 0], head, temperature)
        want = torch.zeros(BLOCK - 1, TINY_VOCAB).scatter_(1, candidates[0], q[0])
        drafter = _drafter(target, ours, features)
        h = ours.block_hidden(drafter.context.ready(), ours.embed_block(target, ids))[0, 1:]
        mine = torch.topk(ours.head(target, h), ours.selector.top_k, dim=-1).indices
        noise = torch.ones(BLOCK - 1, ours.selector.top_k)
        for j, token in enumerate(path[0].tolist()):
            noise[j, (mine[j] == token).nonzero()[0, 0]] = 1e-30
        draft = drafter._walk(h[None], torch.tensor([anchor]), temperature, noise)
        assert draft.tokens[0].tolist() == path[0].tolist()
        torch.testing.assert_close(draft.probs[0], want, atol=1e-6, rtol=1e-5)
        checked += BLOCK - 1
    print(f"DFlash 2 sampled: {checked}/{checked} q rows identical to z-lab's")


def test_a_greedy_generation_drafts_what_zlabs_does(tiny_qwen3_deep, tmp_path, monkeypatch):
    """`dflash_generate` with the transformers target and specgen's pipeline: the same
    answer and, step by step, the same drafts and acceptance lengths (the reference
    shrinks its last block to the tokens left, so the last step is left out)."""
    import dflash.model as zlab
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(zlab, "_cuda_time", lambda: 0.0)  # it synchronizes CUDA
    path = save_tiny_dflash2(tmp_path / "d")
    reference = zlab.DFlash2DraftModel.from_pretrained(path, dtype=torch.float32).eval()
    hf = AutoModelForCausalLM.from_pretrained(tiny_qwen3_deep, dtype=torch.float32).eval()
    drafted: list[list[int]] = []
    propose = reference.propose

    def recorded(*args, **kwargs):
        out = propose(*args, **kwargs)
        drafted.append(out[0][0].tolist())
        return out

    monkeypatch.setattr(reference, "propose", recorded)
    spec = SpecConfig(method="dflash2", drafter=str(path), verify_policy="full", trace=True)
    pipe = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32", spec=spec)
    same = total = 0
    for text in ("The quick brown fox", "def add(a, b):", "Speculative decoding"):
        prompt = pipe.encode(text, raw=True)
        drafted.clear()
        out = zlab.dflash_generate(
            reference, hf, torch.tensor([prompt]), 40, None, return_stats=True
        )
        got = pipe.generate(text, raw=True, max_new_tokens=40)
        assert got.token_ids == out.output_ids[0, len(prompt) :].tolist()
        steps = [r for r in got.stats.trace if r["verify_length"]][: len(drafted) - 1]
        assert [r["accepted"] + 1 for r in steps] == out.acceptance_lengths[: len(steps)]
        for mine, theirs in zip(steps, drafted, strict=False):
            if len(theirs) == len(mine["draft"]) == BLOCK - 1:  # a full block on both sides
                same += sum(a == b for a, b in zip(mine["draft"], theirs, strict=True))
                total += len(theirs)
    print(f"DFlash 2 generation: {same}/{total} drafted tokens identical to z-lab's")
    assert same == total > 0
