"""`--method draft` / `--draft-model`: a smaller model of the target's tokenizer drafts a
chain with its own KV cache. Its drafts are held step by step to a slow reference (the
draft model's own greedy decoding in transformers, recomputed from scratch every step,
through observe / rollback sequences), every engine path is AR's output, sampling keeps
the target's distribution, the cache edges (EOS and max tokens mid-draft, the draft
model's own context end) hold, and bad pairs are refused in one line."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig
from specgen.core.errors import CheckpointError, SpecgenError
from specgen.methods.draft.model import check_vocabulary, fit_vocabulary
from specgen.methods.draft.pairing import pairings
from specgen.scheduling.cost import CostTable
from support.cli import FAST, assert_one_line_error, run
from support.packed import FAMILY_MIXES, write_tiny_gguf
from support.statistics import chi_square_pvalue, exact_token_distribution
from support.targets import TINY_VOCAB, save_tiny

PROMPTS = ("The quick brown fox", "def add(a, b):", "one two one two one two")
SMALL = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
             num_attention_heads=2, num_key_value_heads=1)  # fmt: skip


@pytest.fixture(autouse=True)
def _fp32_activations(monkeypatch):
    monkeypatch.setenv("SPECGEN_CPU_ACT", "fp32")  # the oracle path (a GGUF drafter is packed)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny Llama target, a smaller Llama and a smaller Qwen3 of its tokenizer (other
    seeds), one whose own context ends at 24 positions, and the small Llama as a Q8_0
    GGUF file (with its dequantized twin, the reference's weights)."""
    root = tmp_path_factory.mktemp("draft-model")
    save_tiny(root / "target", "llama", seed=3)
    save_tiny(root / "small", "llama", seed=7, **SMALL)
    save_tiny(root / "qwen3", "qwen3", seed=11, **SMALL)
    save_tiny(root / "short", "llama", seed=7, max_position_embeddings=24, **SMALL)
    gguf_dir = root / "gguf"
    gguf_dir.mkdir()
    dense = write_tiny_gguf(root / "small", gguf_dir / "small.gguf", FAMILY_MIXES["q8_0"])
    out = {name: root / name for name in ("target", "small", "qwen3", "short")}
    return {**out, "gguf": gguf_dir / "small.gguf", "gguf_dense": dense}


@pytest.fixture(scope="module")
def ar(models):
    return Pipeline.load(str(models["target"]), device="cpu", dtype="float32")


def _draft(ar, drafter, policy="full", **kw):
    spec = SpecConfig(method="draft", drafter=str(drafter), verify_policy=policy, **kw)
    return ar.with_spec(spec)


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _reference(hf, context: list[int], k: int) -> list[int]:
    """The draft model's k greedy tokens after `context`, every one recomputed from the
    whole sequence (no cache)."""
    ids = list(context)
    for _ in range(k):
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(context) :]


@pytest.mark.parametrize("which", ["small", "qwen3", "gguf"])
def test_drafts_equal_the_slow_reference_step_by_step(ar, models, which):
    """Through accepted prefixes, rejected drafts, bonus tokens and rollbacks (a context
    cut short, as an interrupted answer or a new turn does), each chain is the draft
    model's own greedy decoding of the committed tokens and the anchor."""
    pipe = _draft(ar, models[which])
    hf = _hf(models["gguf_dense" if which == "gguf" else which])
    drafter = pipe.new_session().drafter
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(0, TINY_VOCAB, (12,), generator=gen).tolist()
    drafter.observe(context[:-1], {})
    committed, anchor = context[:-1], context[-1]
    for step, (k, accept) in enumerate([(5, 2), (3, 0), (8, 8), (1, 1), (6, 3), (4, 0)]):
        draft = drafter.propose(anchor, k, SamplingParams(), None)
        assert draft.probs is None  # greedy: a point mass
        assert draft.tokens[0].tolist() == _reference(hf, [*committed, anchor], k), step
        kept = draft.tokens[0, :accept].tolist()
        drafter.observe([anchor, *kept], {})
        committed = [*committed, anchor, *kept]
        anchor = int(torch.randint(0, TINY_VOCAB, (1,), generator=gen))  # the bonus
        if step == 3:  # cut back into the prompt (a new turn on a session)
            committed, anchor = committed[:7], committed[7]
            drafter.rollback(7)


def test_a_same_weights_drafter_is_accepted_whole(ar, models):
    pipe = _draft(ar, models["target"], draft_tokens=4)
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=30, session=ar.new_session())
        got = pipe.generate(prompt, max_new_tokens=30, session=pipe.new_session())
        assert got.token_ids == want.token_ids
        assert got.stats.verified > 0
        assert got.stats.accepted == got.stats.verified
        assert got.stats.acceptance_length > 3


def _priced(pipe, ar, draft=0.05):
    """Deciding from fixed prices where drafting pays, not this machine's timings."""
    steps = tuple(1.0 + 0.01 * n for n in range(17))
    costs = CostTable((1,), (steps,), {n: tuple(draft * (j + 1) for j in range(8))
                                       for n in pipe.drafters})  # fmt: skip
    return ar.with_spec(pipe.spec, costs=costs)


CASES = [
    (w, e, p) for w in ("small", "target") for e in ("sync", "overlap") for p in ("full", "cost")
] + [("qwen3", "sync", "cost"), ("gguf", "overlap", "cost")]


@pytest.mark.parametrize(("which", "engine", "policy"), CASES)
def test_every_engine_path_is_ar(ar, models, engine, policy, which):
    pipe = _draft(ar, models[which], policy, engine=engine, trace=True)
    if policy == "cost":
        pipe = _priced(pipe, ar)
    session = pipe.new_session()
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=24, session=ar.new_session())
        got = pipe.generate(prompt, max_new_tokens=24, session=session)  # one session: turns
        assert got.token_ids == want.token_ids


def test_the_cost_scheduler_settles_k(ar, models):
    """Priced cheap, the same-weights drafter's chains are verified; priced at five target
    steps a token, the scheduler mostly decodes plainly; the answer is AR's either way."""
    pipe = _draft(ar, models["target"], "cost")
    want = ar.generate(PROMPTS[0], max_new_tokens=30, session=ar.new_session())
    cheap = _priced(pipe, ar, draft=0.01).generate(PROMPTS[0], max_new_tokens=30)
    dear = _priced(pipe, ar, draft=5.0).generate(PROMPTS[0], max_new_tokens=30)
    assert cheap.token_ids == dear.token_ids == want.token_ids
    assert cheap.stats.verified >= 20  # long chains, all accepted
    # dear: plain steps, but for the scheduler's short probes (engine's Probes)
    assert dear.stats.verified < cheap.stats.verified / 2
    assert dear.stats.steps > 2 * cheap.stats.steps


def test_answers_batched_together_are_ar(ar, models):
    pipe = _draft(ar, models["small"])
    want = [ar.generate(p, max_new_tokens=20, session=ar.new_session()).token_ids for p in PROMPTS]
    got = pipe.generate_many(list(PROMPTS), parallel=2, max_new_tokens=20)
    assert [c.token_ids for c in got] == want


def test_stacked_with_a_draft_model_and_suffix_is_ar(ar, models):
    pipe = ar.with_spec(SpecConfig(method="stacked", drafter=(str(models["small"]), "suffix"),
                                   verify_policy="full"), costs=CostTable((1,), ((1.0,) * 9,),
                        {"draft": (0.1,) * 8, "suffix": (0.0,) * 32}))  # fmt: skip
    assert pipe.drafters == ("draft", "suffix")
    session = pipe.new_session()
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=30, session=ar.new_session())
        assert pipe.generate(prompt, max_new_tokens=30, session=session).token_ids == want.token_ids
        for d in session.drafter.drafters:
            if hasattr(d, "context"):  # the draft model's follows the target
                assert len(d.context) == session.cache.length


def test_a_stop_token_inside_the_draft_ends_the_answer_and_the_next_turn_is_ar(ar, models):
    """The same-weights drafter drafts the stop token in mid-chain: the answer ends there,
    the drafter keeps only what the target committed, and a further turn is still AR's."""
    prompt = PROMPTS[0]
    full = ar.generate(prompt, max_new_tokens=12, session=ar.new_session()).token_ids
    stop = full[5]
    assert stop not in full[:5]
    pipe = _draft(ar, models["target"], draft_tokens=8)
    saved = ar.codec.stop_ids
    try:
        ar.codec.stop_ids = frozenset({stop})
        s_ar, s_draft = ar.new_session(), pipe.new_session()
        for text in (prompt, PROMPTS[1]):
            want = ar.generate(text, max_new_tokens=12, session=s_ar)
            got = pipe.generate(text, max_new_tokens=12, session=s_draft)
            assert got.token_ids == want.token_ids
            assert len(s_draft.drafter.context) == s_draft.cache.length
    finally:
        ar.codec.stop_ids = saved
    assert want.token_ids  # the second turn decoded


@pytest.mark.parametrize("limit", [1, 3, 7])
def test_max_tokens_inside_the_draft(ar, models, limit):
    pipe = _draft(ar, models["target"], draft_tokens=8)
    session = pipe.new_session()
    for text in PROMPTS:
        want = ar.generate(text, max_new_tokens=limit, session=ar.new_session())
        got = pipe.generate(text, max_new_tokens=limit, session=session)
        assert got.token_ids == want.token_ids
        assert len(session.drafter.context) == session.cache.length


def test_the_draft_models_own_context_end(ar, models):
    """The draft model holds 24 positions, the target 256: it drafts shorter chains near
    its end, then none, and the target decodes alone; the answer is AR's."""
    pipe = _draft(ar, models["short"], trace=True)
    got = pipe.generate(PROMPTS[0], raw=True, max_new_tokens=40, session=pipe.new_session())
    want = ar.generate(PROMPTS[0], raw=True, max_new_tokens=40, session=ar.new_session())
    assert got.token_ids == want.token_ids
    drafter = pipe.new_session().drafter
    assert drafter.cache.capacity == 24
    drafter.observe(list(range(5, 27)), {})  # 22 committed: the anchor at 22, drafts at 23
    assert drafter.propose(4, 8, SamplingParams(), None).length == 2
    drafter.observe([4], {})
    assert drafter.propose(4, 8, SamplingParams(), None).length == 1
    drafter.observe([4], {})
    assert drafter.propose(4, 8, SamplingParams(), None).length == 0
    drafter.rollback(10)  # room again after a rollback
    assert drafter.propose(4, 8, SamplingParams(), None).length == 8


def test_the_targets_context_end(models):
    ar = Pipeline.load(str(models["target"]), device="cpu", dtype="float32", context=24)
    pipe = _draft(ar, models["small"])
    for text in PROMPTS:
        want = ar.generate(text, raw=True, max_new_tokens=40, session=ar.new_session())
        got = pipe.generate(text, raw=True, max_new_tokens=40, session=pipe.new_session())
        assert got.token_ids == want.token_ids


def test_sampled_drafts_hand_over_their_q(ar, models):
    drafter = _draft(ar, models["small"]).new_session().drafter
    drafter.observe([5, 6, 7], {})
    params = SamplingParams(temperature=0.8, top_k=5, seed=1)
    gen = torch.Generator().manual_seed(1)
    draft = drafter.propose(8, 4, params, gen)
    assert draft.probs.shape == (1, 4, TINY_VOCAB)
    assert torch.allclose(draft.probs.sum(-1), torch.ones(1, 4))
    assert ((draft.probs > 0).sum(-1) <= 5).all()  # top-k applied to the draft model
    picked = draft.probs[0].gather(-1, draft.tokens[0, :, None])
    assert (picked > 0).all()  # each token drawn from its q


@pytest.mark.statistical
@pytest.mark.parametrize("which", ["small", "target"])
def test_sampling_has_the_target_distribution(ar, models, which):
    pipe = _draft(ar, models[which])
    text = "The quick brown fox"
    prompt = pipe.encode(text, raw=True)
    params = SamplingParams(temperature=1.0, top_k=3)
    exact = exact_token_distribution(pipe.model, prompt, params, 2).float()
    counts, session, n = torch.zeros(TINY_VOCAB), pipe.new_session(), 1500
    for seed in range(n):
        sampling = SamplingParams(temperature=1.0, top_k=3, seed=seed)
        out = pipe.generate(text, raw=True, sampling=sampling, max_new_tokens=4, session=session)
        counts[out.token_ids[2]] += 1
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_seeded_sampling_repeats(ar, models):
    pipe = _draft(ar, models["small"])
    params = SamplingParams(temperature=0.9, seed=4)
    a = pipe.generate(PROMPTS[0], sampling=params, max_new_tokens=20, session=pipe.new_session())
    b = pipe.generate(PROMPTS[0], sampling=params, max_new_tokens=20, session=pipe.new_session())
    assert a.token_ids == b.token_ids


# -- bad pairs and sources


@pytest.fixture(scope="module")
def other_tokenizer(models, tmp_path_factory):
    """The small model with two tokens' ids swapped in its tokenizer."""
    out = tmp_path_factory.mktemp("other") / "small"
    shutil.copytree(models["small"], out)
    data = json.loads((out / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (out / "tokenizer.json").write_text(json.dumps(data))
    return out


def test_another_tokenizer_is_refused_naming_both(ar, models, other_tokenizer):
    with pytest.raises(CheckpointError) as e:
        _draft(ar, other_tokenizer)
    message = str(e.value)
    assert "\n" not in message
    assert str(other_tokenizer) in message and str(models["target"]) in message
    assert "tokenizers differ (2 tokens map to other ids" in message


def test_a_recurrent_model_is_refused(ar, tiny_qwen3_5):
    with pytest.raises(CheckpointError, match="recurrent layers cannot draft"):
        _draft(ar, tiny_qwen3_5)


def test_a_drafter_checkpoint_is_not_a_draft_model(ar, tiny_dflash):
    with pytest.raises(CheckpointError, match="is a dflash drafter"):
        _draft(ar, tiny_dflash)


def test_vocabulary_checks():
    check_vocabulary({"a": 0, "b": 1}, {"a": 0, "b": 1}, "d", "t")
    with pytest.raises(CheckpointError, match="'c': absent there, 2 in the target"):
        check_vocabulary({"a": 0, "b": 1}, {"a": 0, "b": 1, "c": 2}, "d", "t")
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    assert fit_vocabulary(logits, 2).tolist() == [[1.0, 2.0]]  # the draft model's padding
    padded = fit_vocabulary(logits, 5)  # the target's padding: never drafted
    assert padded.shape == (1, 5) and padded[0, 3:].eq(float("-inf")).all()


def test_pairings_from_the_models_at_hand(models, other_tokenizer, tiny_qwen3_5):
    found = pairings({"target": models["target"], "small": models["small"],
                      "qwen3": models["qwen3"], "other": other_tokenizer,
                      "hybrid": tiny_qwen3_5})  # fmt: skip
    # smaller and of the same vocabulary; the recurrent one (same tokenizer) drafts nothing
    assert found["target"] == ["small", "qwen3"] or found["target"] == ["qwen3", "small"]
    assert "other" not in found["target"] and "hybrid" not in found.get("target", [])
    assert "small" not in found  # nothing of its vocabulary is smaller


def _cache_repo(cache, repo: str, source) -> None:
    """`source`'s files as `repo`'s snapshot in a Hugging Face cache."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0" * 40)
    shutil.copytree(source, folder / "snapshots" / ("0" * 40))


def test_models_lists_the_pairings_at_hand(models, other_tokenizer, tmp_path, monkeypatch):
    """The default alias's repo cached as the tiny target, beside a smaller model of its
    tokenizer and one of another: its row offers the smaller one as a draft model."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    _cache_repo(cache, "HuggingFaceTB/SmolLM2-135M-Instruct", models["target"])
    _cache_repo(cache, "org/smaller", models["small"])
    _cache_repo(cache, "org/other", other_tokenizer)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    result = run("models", "--json")
    assert result.exit_code == 0, result.stderr
    rows = {r["alias"]: r for r in map(json.loads, result.stdout.splitlines())}
    drafters = rows["smollm2-135m"]["drafters"]
    assert {"method": "draft", "repo": "org/smaller"} in drafters
    assert not any(d["repo"] == "org/other" for d in drafters)


def test_cli_draft_model(models):
    base = ["generate", "The quick brown fox", "--json", "--model", str(models["target"]),
            *FAST, "-n", "10"]  # fmt: skip
    want = json.loads(run(*base).stdout)
    result = run(*base, "--draft-model", str(models["gguf"]), "--trace")
    assert result.exit_code == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["token_ids"] == want["token_ids"]
    assert got["trace"] and all(step["drafter"] == "draft" for step in got["trace"])
    auto = run(*base, "--drafter", str(models["small"]))  # a whole model's kind: draft
    assert json.loads(auto.stdout)["token_ids"] == want["token_ids"]
    stacked = run(*base, "--method", "stacked", "--drafter", "ngram",
                  "--draft-model", str(models["small"]))  # fmt: skip
    assert stacked.exit_code == 0, stacked.stderr
    assert json.loads(stacked.stdout)["token_ids"] == want["token_ids"]


@pytest.mark.integration  # whole CLI runs
def test_cli_bad_draft_models(models, other_tokenizer, tmp_path):
    base = ["generate", "hi", "--model", str(models["target"]), *FAST]
    result = run(*base, "--draft-model", str(tmp_path / "nowhere"))
    assert_one_line_error(result, 2, "no such")
    result = run(*base, "--draft-model", str(other_tokenizer))
    assert_one_line_error(result, 2, "cannot draft for", "tokenizers differ")
    result = run(*base, "--draft-model", str(models["small"]), "--method", "dflash")
    assert_one_line_error(result, 2, "--draft-model drafts with --method draft or stacked")
    result = run(*base, "--draft-model", str(models["small"]), "--drafter", "ngram")
    assert_one_line_error(result, 2, "need --method stacked")
    result = run(*base, "--draft-model", "smollm2-135m")  # another tokenizer altogether
    if result.exit_code != 0 or "embedded" in result.stderr:
        assert_one_line_error(result, 2, "smollm2-135m cannot draft for")


def test_export_draft_model():
    from specgen.export import launch_argv, notes, resolve_target

    serve = resolve_target("qwen3-8b", "draft", "Qwen/Qwen3-0.6B", None)
    vllm = launch_argv("vllm", serve)
    config = json.loads(vllm[vllm.index("--speculative-config") + 1])
    assert config == {"method": "draft_model", "model": "Qwen/Qwen3-0.6B",
                      "num_speculative_tokens": 5}  # fmt: skip
    sglang = launch_argv("sglang", resolve_target("qwen3-8b", "draft", "smollm2-135m", 4))
    assert sglang[sglang.index("--speculative-algorithm") + 1] == "STANDALONE"
    assert sglang[sglang.index("--speculative-draft-model-path") + 1] == (
        "HuggingFaceTB/SmolLM2-135M-Instruct"  # an alias: its repo
    )
    assert sglang[sglang.index("--speculative-num-steps") + 1] == "4"
    assert sglang[sglang.index("--speculative-num-draft-tokens") + 1] == "5"
    assert any("--model-draft" in line for line in notes("vllm", serve))  # llama.cpp's


@pytest.mark.integration
def test_bench_runs_the_draft_method(models, tmp_path):
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    result = run("bench", "--model", str(models["target"]), "--draft-model", str(models["small"]),
                 "--methods", "draft", "--suite", str(suite), "--device", "cpu",
                 "--dtype", "float32", "--max-new-tokens", "16", "--json", "--quiet")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["methods"] == ["ar", "draft"]
    assert record["lossless"]["draft"]["identical"] == len(PROMPTS)  # every answer AR's


@pytest.mark.integration
def test_serve_answers_with_the_draft_model_as_ar_does(models):
    """Two slots answering at once, one method each: every answer is AR's alone."""
    from concurrent.futures import ThreadPoolExecutor

    from support.serve import CPU, Server, generate

    srv = Server("--model", str(models["target"]), "--methods", "ar,draft",
                 "--draft-model", str(models["gguf"]), "--parallel", "2", *CPU)  # fmt: skip
    try:
        with srv.http() as http:

            def ask(args):
                prompt, method = args
                body = {"prompt": prompt, "max_tokens": 12, "temperature": 0,
                        "specgen": {"method": method}}  # fmt: skip
                r = http.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["text"]

            asks = [(p, m) for p in PROMPTS for m in ("draft", "ar")]
            with ThreadPoolExecutor(4) as pool:
                got = list(pool.map(ask, asks))
    finally:
        srv.stop()
    for (prompt, _), text in zip(asks, got, strict=True):
        assert text == generate(str(models["target"]), prompt, "--raw", "-n", "12")["text"]


def test_no_draft_model_given(ar):
    with pytest.raises(SpecgenError, match="no draft method drafter is known|pass --drafter"):
        ar.with_spec(SpecConfig(method="draft"))


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["sync", "overlap"])
def test_on_cuda_every_engine_is_ar(models, engine):
    """On CUDA the overlap engine queues steps ahead; the draft model's cache lives there."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    ar = Pipeline.load(str(models["target"]), device="cuda", dtype="float32")
    for which in ("small", "target"):
        pipe = _draft(ar, models[which], engine=engine)
        session = pipe.new_session()
        for prompt in PROMPTS:
            want = ar.generate(prompt, max_new_tokens=24, session=ar.new_session())
            assert pipe.generate(prompt, max_new_tokens=24, session=session).token_ids == (
                want.token_ids
            )
