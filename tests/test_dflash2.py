"""DFlash 2: the published config, losslessness (greedy equal to AR on the tiny families,
sampling exact), its method name, and bad checkpoints refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from specgen.api.pipeline import Pipeline
from specgen.cli import app
from specgen.core.config import SamplingParams, SpecConfig
from specgen.core.errors import CheckpointError
from specgen.methods.dflash2.network import DFlash2Args, load_dflash2
from specgen.models.drafters.dflash import check_pair
from specgen.models.families import model_args
from specgen.models.loading import load_target
from specgen.verify.sampling import make_generator, probabilities
from support.drafters import save_tiny_dflash, save_tiny_dflash2
from support.statistics import chi_square_pvalue
from support.targets import FIXTURES, TINY_VOCAB

FIXTURE = "dflash2-qwen3.6-27b.config.json"
PROMPTS = ("The quick brown fox", "def add(a, b):", "Speculative decoding drafts tokens")


def _json(name):
    return json.loads((FIXTURES / name).read_text())


def test_the_published_config_parses_and_pairs_with_its_target():
    args = DFlash2Args.from_hf(_json(FIXTURE), name="z-lab/Qwen3.8-27B-DFlash2")
    assert (args.conv_kernel, args.conv_group, args.selector_rank, args.selector_top_k) == (
        2,
        16,
        256,
        16,
    )
    assert args.block_size == 8 and args.mask_token_id == 248070
    assert args.target_layer_ids == (5, 19, 33, 47, 61) and args.num_target_layers == 64
    assert args.windows == (2048,) * 5 and args.causal == (False,) * 5  # is_causal: false
    check_pair(args, model_args(_json("qwen3.5-27b.config.json")), "d2", "qwen3.5-27b")
    with pytest.raises(CheckpointError, match=r"drafter d2 does not fit target qwen3-8b: hidden"):
        check_pair(args, model_args(_json("qwen3-8b.config.json")), "d2", "qwen3-8b")


@pytest.fixture(scope="module")
def target(tiny_qwen3_deep):
    return load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")


def test_a_tiny_checkpoint_loads(target, tiny_dflash2):
    net = load_dflash2(tiny_dflash2, target=target, target_name="tiny", name="d")
    assert net.selector.predecessor.shape == (TINY_VOCAB, 8) and net.selector.top_k == 6
    assert net.layers[1].mlp_conv.base.shape == (2, 2, 64)
    assert net.layers[0].attention_conv.projection.shape == (2 * 2 * 4, 64)


# --- lossless -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipes(tiny_qwen3_deep, tiny_dflash2):
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    spec = SpecConfig(method="dflash2", drafter=str(tiny_dflash2), verify_policy="full", trace=True)
    return ar, ar.with_spec(spec)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_ar(pipes, prompt):
    ar, d2 = pipes
    want = ar.generate(prompt, max_new_tokens=30, session=ar.new_session())
    got = d2.generate(prompt, max_new_tokens=30, session=d2.new_session())
    assert got.token_ids == want.token_ids
    assert got.stats.method == "dflash2"
    trace = got.stats.trace
    assert all(r["drafter"] == "dflash2" and len(r["draft"]) <= 7 for r in trace)
    assert sum(r["verify_length"] for r in trace[1:]) > 0  # it really drafted


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral", "qwen3.5"])
def test_greedy_equals_ar_on_every_tiny_family(tiny_dirs, tiny_qwen3_5, tmp_path, family):
    """The two-layer families tapped at both layers; Qwen3.5 (hybrid) at two of six."""
    path = tiny_qwen3_5 if family == "qwen3.5" else tiny_dirs[family]
    taps = dict(target_layer_ids=[1, 3]) if family == "qwen3.5" else {}
    if not taps:
        taps = dict(target_layer_ids=[0, 1], num_target_layers=2)
    drafter = save_tiny_dflash2(tmp_path / "d", **taps)
    ar = Pipeline.load(str(path), device="cpu", dtype="float32")
    d2 = ar.with_spec(SpecConfig(drafter=str(drafter), verify_policy="full", trace=True))
    assert d2.spec.method == "dflash2"  # read from the checkpoint's architecture
    for prompt in PROMPTS[:2]:
        want = ar.generate(prompt, raw=True, max_new_tokens=24).token_ids
        assert d2.generate(prompt, raw=True, max_new_tokens=24).token_ids == want


def test_method_dflash_runs_a_dflash2_checkpoint_as_dflash2(pipes, tiny_dflash2):
    pipe = pipes[0].with_spec(SpecConfig(method="dflash", drafter=str(tiny_dflash2)))
    assert pipe.spec.method == "dflash2"
    assert pipe.generate("The quick brown fox", max_new_tokens=8).stats.method == "dflash2"


def test_a_draft_vocabulary_limits_the_candidates(pipes, tiny_dflash2, tmp_path):
    from specgen.drafting.vocab import save_draft_vocab

    drafter = tmp_path / "vocab"
    shutil.copytree(tiny_dflash2, drafter)
    allowed = list(range(0, TINY_VOCAB, 3))
    save_draft_vocab(drafter, allowed)
    spec = SpecConfig(method="dflash2", drafter=str(drafter), verify_policy="full", trace=True)
    pipe = pipes[0].with_spec(spec)
    want = pipes[0].generate("The quick brown fox", raw=True, max_new_tokens=30).token_ids
    got = pipe.generate("The quick brown fox", raw=True, max_new_tokens=30)
    assert got.token_ids == want
    drafted = [t for r in got.stats.trace for t in r["draft"]]
    assert drafted and set(drafted) <= set(allowed)


@pytest.mark.statistical
def test_the_sampled_walk_draws_from_the_q_it_reports(pipes, target):
    """Many walks over the same block: the first slot's draws follow q's first row (only
    the candidates have mass), and the reported q sums to 1 on the candidates."""
    drafter = pipes[1].method.new_drafter(64)
    features = torch.randn(1, 9, 128, generator=torch.Generator().manual_seed(0))
    drafter.context.append(features)
    params = SamplingParams(temperature=1.5, seed=0)
    generator = make_generator(params, torch.device("cpu"))
    counts, q = torch.zeros(TINY_VOCAB), None
    for _ in range(3000):
        draft = drafter.propose(7, 3, params, generator)
        counts[draft.tokens[0, 0]] += 1
        q = draft.probs[0, 0] if q is None else q
        torch.testing.assert_close(draft.probs[0, 0], q)  # the first row: anchor only
    assert (q > 0).sum() == 6 and abs(q.sum().item() - 1) < 1e-5
    assert chi_square_pvalue(counts, q) > 1e-3
    assert chi_square_pvalue(counts, q.roll(1) * 0.2 + q * 0.8) < 1e-6


def exact_token_distribution(target, prompt, params, position):
    """P(token at `position` of the answer) under the target alone (every path)."""
    paths, weights = [list(prompt)], torch.ones(1, dtype=torch.float64)
    for step in range(position + 1):
        logits = target(torch.tensor(paths), target.new_cache(64, batch=len(paths))).logits
        p = probabilities(logits[:, -1], params).double()
        if step == position:
            return weights @ p
        nz = p.nonzero()
        weights = weights[nz[:, 0]] * p[nz[:, 0], nz[:, 1]]
        paths = [paths[i] + [t] for i, t in nz.tolist()]


@pytest.mark.statistical
def test_sampling_through_dflash2_has_the_target_distribution(pipes, target):
    """The 3rd answer token, after a step that verified a sampled chain whose second
    proposal depends on the sampled first: chi-square against the exact distribution."""
    pipe = pipes[1]
    text = "The quick brown fox"
    prompt = pipe.encode(text, raw=True)
    params = SamplingParams(temperature=1.0, top_k=3)
    exact = exact_token_distribution(target, prompt, params, 2).float()
    counts = torch.zeros(TINY_VOCAB)
    session, n, verified, accepted = pipe.new_session(), 1500, 0, 0
    for seed in range(n):
        sampling = SamplingParams(temperature=1.0, top_k=3, seed=seed)
        out = pipe.generate(text, raw=True, sampling=sampling, max_new_tokens=4, session=session)
        counts[out.token_ids[2]] += 1
        verified += out.stats.verified
        accepted += out.stats.accepted
    assert verified > n and accepted > n // 30  # both the accept and the residual paths
    assert chi_square_pvalue(counts, exact) > 1e-3
    shifted = exact.roll(1) * 0.1 + exact * 0.9
    assert chi_square_pvalue(counts, shifted) < 1e-6


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"drop_fields": ("selector_top_k",)}, r"d: a DFlash 2 config\.json needs dflash_config"),
        ({"drop_fields": ("conv_kernel_size", "selector_rank")}, r"conv_kernel_size, selector_r"),
        ({"group": 24}, "conv_group_size 24 does not divide hidden 64"),
        ({"top_k": TINY_VOCAB + 1}, f"selector_top_k {TINY_VOCAB + 1} exceeds the vocabulary"),
        (
            {"codebook_rows": 300},
            r"drafter d does not fit target tiny: candidate_selector\.predecessor_codebook is "
            r"\(300, 8\), the target's vocabulary needs \(320, 8\)",
        ),
        ({"hidden": 32, "head_dim": 8}, "drafter d does not fit target tiny: hidden size 32 vs 64"),
        ({"num_target_layers": 64}, "does not fit target tiny: built for 64 target layers"),
    ],
)
def test_bad_or_mismatched_checkpoints_fail_clearly(target, tmp_path, kwargs, message):
    if "hidden" in kwargs:
        kwargs["group"] = 8
    path = save_tiny_dflash2(tmp_path / "d", **kwargs)
    with pytest.raises(CheckpointError, match=message):
        load_dflash2(path, target=target, target_name="tiny", name="d")


@pytest.mark.parametrize(
    "key",
    ["layers.1.mlp_conv.base_kernel", "layers.0.attention_conv.kernel_projection.weight",
     "candidate_selector.successor_codebook"],
)  # fmt: skip
def test_a_checkpoint_without_a_dflash2_tensor_names_it(target, tmp_path, key):
    from safetensors.torch import load_file, save_file

    path = save_tiny_dflash2(tmp_path / "d")
    tensors = load_file(path / "model.safetensors")
    del tensors[key]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=f"d: checkpoint lacks {key}"):
        load_dflash2(path, target=target, target_name="tiny", name="d")


def test_the_wrong_method_for_a_checkpoint_is_refused(pipes, tiny_dflash, tiny_dflash2):
    with pytest.raises(CheckpointError, match="is a dflash drafter .* not a dflash2 one"):
        pipes[0].with_spec(SpecConfig(method="dflash2", drafter=str(tiny_dflash)))
    with pytest.raises(CheckpointError, match="is a dflash2 drafter .* not a dspark one"):
        pipes[0].with_spec(SpecConfig(method="dspark", drafter=str(tiny_dflash2)))


@pytest.mark.parametrize(
    "case, fragments",
    [
        ("missing", ("needs dflash_config.selector_rank",)),
        ("codebooks", ("does not fit target", "predecessor_codebook is (300, 8)")),
        ("other target", ("does not fit target", "hidden size 32 vs 64")),
        ("dflash1 as dflash2", ("is a dflash drafter", "not a dflash2 one")),
    ],
)
def test_the_cli_says_it_in_one_line_with_exit_2(tiny_qwen3_deep, tmp_path, case, fragments):
    path = tmp_path / "d"
    if case == "missing":
        save_tiny_dflash2(path, drop_fields=("selector_rank",))
    elif case == "codebooks":
        save_tiny_dflash2(path, codebook_rows=300)
    elif case == "other target":
        save_tiny_dflash2(path, hidden=32, head_dim=8, group=8)
    else:
        save_tiny_dflash(path, target_layer_ids=[1, 3])
    method = ["--method", "dflash2"] if case == "dflash1 as dflash2" else []
    result = CliRunner().invoke(
        app,
        ["generate", "hi", "--model", str(tiny_qwen3_deep), "--device", "cpu", "--drafter",
         str(path), *method],
    )  # fmt: skip
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    errors = [line for line in result.stderr.strip().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and result.stderr.strip().splitlines()[-1] == errors[0]
    assert all(f in errors[0] for f in fragments), errors[0]
    assert "Traceback" not in result.stderr
