"""`--method mtp`: a Qwen3.5 target's own MTP layer drafts, held to a slow float64 reference
recomputing every entry (tests/oracles/mtp.py) after uneven commits and rollbacks, in the
sync and the device-resident protocol; every engine path is AR token for token, at the
edges too (a stop token inside accepted drafts, max tokens, the context's end); sampling
keeps the target's distribution; a target without MTP layers is refused in one line.

Two tiny checkpoints carry MTP weights in the published names: one random (drafts mostly
rejected, the target's recurrent state rolled back every step) and one `echo` (layers
scaled down, the head reading the embedding: long accepted chains)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from oracles.mtp import Reference
from specgen.api.pipeline import Pipeline
from specgen.cli import app
from specgen.core.config import SamplingParams, SpecConfig
from specgen.core.errors import CheckpointError
from support.cli import assert_one_line_error
from support.statistics import chi_square_pvalue
from support.targets import TINY_VOCAB, save_tiny_qwen3_5

runner = CliRunner()
FAST = ["--device", "cpu", "--dtype", "float32"]
PROMPTS = ("The quick brown fox", "one two one two one two")
SAMPLED = SamplingParams(temperature=1.5, top_k=100, seed=4)


@pytest.fixture(autouse=True)
def _fp32(monkeypatch):
    monkeypatch.setenv("SPECGEN_CPU_ACT", "fp32")  # the oracle path (a packed target's)


@pytest.fixture(scope="module")
def echo_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("mtp-echo") / "t"
    save_tiny_qwen3_5(path, seed=3, mtp_layers=1, echo=0.01)
    return path


@pytest.fixture(scope="module")
def random_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("mtp-random") / "t"
    save_tiny_qwen3_5(path, seed=5, mtp_layers=1)
    return path


@pytest.fixture(scope="module")
def ars(echo_dir, random_dir):
    return {
        name: Pipeline.load(str(path), device="cpu", dtype="float32")
        for name, path in (("echo", echo_dir), ("random", random_dir))
    }


@pytest.fixture(scope="module")
def answers(ars):
    """AR's answers to PROMPTS (24 tokens), each in a fresh session."""
    return {name: [ar.generate(p, max_new_tokens=24) for p in PROMPTS] for name, ar in ars.items()}


@pytest.fixture
def resident(monkeypatch):
    """Pipelines run speculative steps in the resident loop, as on CUDA."""
    monkeypatch.setattr(Pipeline, "resident_steps", property(lambda self: True))


def _mtp(ar, **kw):
    kw.setdefault("verify_policy", "full")
    kw.setdefault("draft_tokens", 4)
    kw.setdefault("trace", True)
    return ar.with_spec(SpecConfig(method="mtp", **kw))


class Oracle:
    """transformers' Qwen3.5 (float64) for the target's hidden states, and the reference."""

    def __init__(self, path, mtp_source=None):
        from transformers import Qwen3_5ForConditionalGeneration

        hf = Qwen3_5ForConditionalGeneration.from_pretrained(path, dtype=torch.float64).eval()
        self.text, self.head = hf.model.language_model, hf.lm_head.weight
        self.ref = Reference(mtp_source or path, path)

        self._hidden: tuple[list[int], torch.Tensor] | None = None

    def draft(self, seq, n, anchor, k):
        """The reference's k drafts after the first n tokens of `seq` and `anchor`. The
        target is causal: its hidden states of a prefix are those of the whole sequence's
        first rows, computed once per sequence."""
        if self._hidden is None or self._hidden[0] != seq.tolist():
            with torch.no_grad():
                self._hidden = (seq.tolist(), self.text(input_ids=seq[None]).last_hidden_state[0])
        hidden = self._hidden[1][:n]
        embed = self.text.embed_tokens.weight
        return self.ref.draft(hidden, seq[:n].tolist(), anchor, k, embed, self.head)


@pytest.mark.parametrize("which", ["echo", "random"])
def test_uneven_commits_and_rollbacks_equal_the_reference(ars, echo_dir, random_dir, which):
    """The drafter driven directly: committed runs of 1..6 tokens (as steps accepting 0..5
    drafts commit them) and rollbacks (a chat rewinding), each draft against the oracle."""
    path = echo_dir if which == "echo" else random_dir
    pipe = _mtp(ars[which], draft_tokens=5)
    target = pipe.model
    oracle = Oracle(path)
    drafter = pipe.method.new_drafter(64)
    cache = target.new_cache(64)
    seq = torch.randint(0, TINY_VOCAB, (48,), generator=torch.Generator().manual_seed(3))
    same = total = 0
    for size, back in ((9, 0), (1, 0), (3, 0), (6, 2), (2, 0), (5, 0), (4, 7), (1, 0), (6, 0)):
        if back:  # the target forgets its last `back` tokens; the drafter follows
            cache = target.new_cache(64)  # (a hybrid cache restores by re-prefilling here)
            target(seq[None, : drafter.length - back], cache)
            drafter.rollback(cache.length)
        start = cache.length
        chunk = seq[start : start + size]
        out = target(chunk[None], cache, taps=drafter.taps)
        drafter.observe(chunk.tolist(), out.taps)
        n = cache.length
        k = drafter.max_draft_tokens
        got = drafter.propose(int(seq[n]), k).tokens[0].tolist()
        want = oracle.draft(seq, n, int(seq[n]), k)
        same += got == want
        total += 1
    assert (same, drafter.length) == (total, cache.length)


def test_resident_steps_with_any_acceptance_equal_the_reference(ars, echo_dir):
    """The resident protocol driven directly: each verified block has its first `a` drafts
    right and the rest wrong, chains of several lengths; every draft against the oracle."""
    pipe = _mtp(ars["echo"], draft_tokens=7)
    model = pipe.model
    oracle = Oracle(echo_dir)
    drafter = pipe.method.new_drafter(96)
    cache = model.new_cache(96, steps=8)
    seq = torch.randint(0, TINY_VOCAB, (80,), generator=torch.Generator().manual_seed(7))
    out = model(seq[None, :9], cache, taps=drafter.taps)
    drafter.observe(seq[:9].tolist(), out.taps)
    cache.make_finite()
    drafter.begin_resident()
    start, same, total = 9, 0, 0
    # (drafts verified, drafts accepted, chain length drafted)
    steps = [(4, 4, 7), (3, 0, 3), (6, 2, 7), (1, 1, 1), (0, 0, 2), (5, 3, 5), (2, 2, 7), (7, 7, 4)]
    for verified, accepted, k in steps:
        start_t = torch.tensor([start])
        anchor = int(seq[start])
        got = drafter.draft_at(torch.tensor([[anchor]]), start_t, k).tokens[0].tolist()
        same += got == oracle.draft(seq, start, anchor, k)
        total += 1
        block = seq[start : start + 1 + verified].clone()
        block[1 + accepted :] = (block[1 + accepted :] + 1) % TINY_VOCAB  # rejected drafts
        out = model.forward_static(block[None], cache, start_t, taps=drafter.taps)
        drafter.observe_at(block[None], out.taps, start_t)
        start += accepted + 1
        cache.assume_written(start)
        drafter.assume(start)
    assert same == total


def test_the_engines_drafts_equal_the_reference(ars, echo_dir):
    """Every step the sync loop took (its trace): the draft is the oracle's for the tokens
    committed before it, whatever the steps before accepted."""
    pipe = _mtp(ars["echo"])
    oracle = Oracle(echo_dir)
    prompt = pipe.encode(PROMPTS[0], raw=True)
    out = pipe.generate(PROMPTS[0], raw=True, max_new_tokens=30, session=pipe.new_session())
    seq = torch.tensor(prompt + out.token_ids)
    n, accepted = len(prompt) - 1, set()  # the first record is the prefill's (no draft)
    trace = [r for r in out.stats.trace if r["draft"]]
    assert trace
    for record in out.stats.trace:
        if record["draft"]:
            want = oracle.draft(seq, n, int(seq[n]), len(record["draft"]))
            assert record["draft"] == want
        accepted.add(record["accepted"])
        n += record["accepted"] + 1
    assert len(accepted) >= 3  # steps accepting different counts were taken


# the random head (drafts mostly rejected: the target's state rolled back every step) on
# the loops; the echo head (long accepted runs) on every path
PATHS = ["sync", "cost", "resident", "stacked-ngram", "many", "int8"]
ENGINE_CASES = [("echo", e) for e in PATHS] + [("random", e) for e in ("sync", "resident", "int8")]


@pytest.mark.parametrize(("which", "engine"), ENGINE_CASES)
def test_every_engine_path_is_ar(ars, answers, echo_dir, random_dir, which, engine, monkeypatch):
    ar = ars[which]
    if engine == "int8":  # packed matrices: the target AR runs is packed, and the head too
        monkeypatch.setenv("SPECGEN_DRAFT_WEIGHTS", "int8")
        ar = Pipeline.load(str(echo_dir if which == "echo" else random_dir), device="cpu",
                           dtype="float32", quantize="int8")  # fmt: skip
    if engine == "resident":
        monkeypatch.setattr(Pipeline, "resident_steps", property(lambda self: True))
    spec = dict(verify_policy="cost", draft_tokens=None) if engine == "cost" else {}
    if engine == "stacked-ngram":
        pipe = ar.with_spec(SpecConfig(method="stacked", drafter=("mtp", "ngram"), trace=True))
    else:
        pipe = _mtp(ar, **spec)
    want = answers[which]
    if engine == "int8":
        want = [ar.generate(p, max_new_tokens=24) for p in PROMPTS]
    if engine == "many":
        got = pipe.generate_many(list(PROMPTS), parallel=2, max_new_tokens=24)
    else:
        session = pipe.new_session()
        got = [pipe.generate(p, max_new_tokens=24, session=session) for p in PROMPTS]
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids
    if which == "echo" and engine != "stacked-ngram":
        assert sum(g.stats.accepted for g in got) > 0  # drafts were accepted


def test_the_resident_loop_makes_the_sync_loops_steps(ars, resident):
    pipe = _mtp(ars["echo"])
    session = pipe.new_session()
    got = [pipe.generate(p, max_new_tokens=30, session=session) for p in PROMPTS]
    got += [pipe.generate(p, sampling=SAMPLED, max_new_tokens=24, session=session) for p in PROMPTS]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(Pipeline, "resident_steps", property(lambda self: False))
        sync = pipe.new_session()
        want = [pipe.generate(p, max_new_tokens=30, session=sync) for p in PROMPTS]
        want += [pipe.generate(p, sampling=SAMPLED, max_new_tokens=24, session=sync)
                 for p in PROMPTS]  # fmt: skip
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids
        assert g.stats.acceptance_length == w.stats.acceptance_length
    assert session.ids == sync.ids
    assert session.drafter.length == sync.drafter.length == session.cache.length


@pytest.mark.parametrize("engine", ["sync", "resident"])
def test_rollback_at_the_edges(ars, engine, monkeypatch):
    """max_new_tokens cutting a step's accepted drafts, a stop token inside them, and the
    context's end: AR's tokens, and a session that continues exactly."""
    if engine == "resident":
        monkeypatch.setattr(Pipeline, "resident_steps", property(lambda self: True))
    ar = ars["echo"]
    pipe = _mtp(ar, draft_tokens=5)
    full = pipe.generate(PROMPTS[0], raw=True, max_new_tokens=30)
    then = ar.generate(PROMPTS[1], max_new_tokens=12).token_ids
    for n in range(1, 10):  # every cut through the first steps' accepted runs
        session = pipe.new_session()
        got = pipe.generate(PROMPTS[0], raw=True, max_new_tokens=n, session=session)
        assert got.token_ids == full.token_ids[:n]
        assert session.drafter.length == session.cache.length
        again = pipe.generate(PROMPTS[1], max_new_tokens=12, session=session)
        assert again.token_ids == then
    # a stop token the drafts accepted mid-run (its first occurrence after a long step)
    steps, n = full.stats.trace, 0
    for record in steps:
        if record["accepted"] >= 2:
            stop = full.token_ids[n + 1]
            break
        n += record["accepted"] + 1
    stops = (ar.codec.stop_ids, pipe.codec.stop_ids)
    try:
        ar.codec.stop_ids = pipe.codec.stop_ids = stops[0] | {stop}
        want = ar.generate(PROMPTS[0], raw=True, max_new_tokens=30)
        session = pipe.new_session()
        got = pipe.generate(PROMPTS[0], raw=True, max_new_tokens=30, session=session)
        assert got.token_ids == want.token_ids and len(got.token_ids) < 30
        assert session.drafter.length == session.cache.length
    finally:
        ar.codec.stop_ids, pipe.codec.stop_ids = stops
    # the context's end: a target sized to stop mid-answer
    small = Pipeline.load(str(ar.model.source), device="cpu", dtype="float32", context=24)
    want = small.generate(PROMPTS[0], raw=True, max_new_tokens=40)
    got = _mtp(small, draft_tokens=5).generate(PROMPTS[0], raw=True, max_new_tokens=40)
    assert got.token_ids == want.token_ids
    assert got.stats.finish_reason == want.stats.finish_reason == "context"


def test_the_cost_scheduler_chooses_k(ars):
    """Under the cost policy, from fixed prices (not this machine's timings): priced cheap,
    the echo head's chains are verified, long; priced at five target steps a token, the
    scheduler mostly decodes plainly (but for its probes); AR's answer either way."""
    from specgen.scheduling.cost import CostTable

    ar = ars["echo"]
    pipe = ar.with_spec(SpecConfig(method="mtp", draft_tokens=5, trace=True))
    assert pipe.method.max_draft_tokens == 5

    def priced(draft):
        steps = tuple(1.0 + 0.01 * n for n in range(6))
        table = CostTable((1,), (steps,), {"mtp": tuple(draft * (j + 1) for j in range(5))})
        return ar.with_spec(pipe.spec, costs=table)

    want = ar.generate(PROMPTS[0], max_new_tokens=30).token_ids
    cheap = priced(0.01).generate(PROMPTS[0], max_new_tokens=30)
    dear = priced(5.0).generate(PROMPTS[0], max_new_tokens=30)
    assert cheap.token_ids == dear.token_ids == want
    assert max(len(r["draft"]) for r in cheap.stats.trace) > 1  # chains of several drafts
    assert all(len(r["draft"]) <= 5 for r in cheap.stats.trace)
    assert dear.stats.verified < cheap.stats.verified / 2
    assert dear.stats.steps > cheap.stats.steps


def test_an_mtp_only_file_as_drafter(ars, echo_dir, tmp_path):
    """The head cut out into its own file drafts for a checkpoint without it, as the
    target's own head does."""
    bare = shutil.copytree(echo_dir, tmp_path / "bare")
    tensors = load_file(bare / "model.safetensors")
    head = {k: tensors.pop(k) for k in list(tensors) if k.startswith("mtp.")}
    save_file(tensors, bare / "model.safetensors")
    save_file(head, tmp_path / "mtp.safetensors")
    ar = Pipeline.load(str(bare), device="cpu", dtype="float32")
    with pytest.raises(CheckpointError, match="has no MTP layers"):
        _mtp(ar)
    pipe = _mtp(ar, drafter=str(tmp_path / "mtp.safetensors"))
    own = _mtp(ars["echo"])
    for prompt in PROMPTS:
        got = pipe.generate(prompt, max_new_tokens=20, session=pipe.new_session())
        want = own.generate(prompt, max_new_tokens=20, session=own.new_session())
        assert got.token_ids == want.token_ids
        assert [r["draft"] for r in got.stats.trace] == [r["draft"] for r in want.stats.trace]


def test_a_gguf_target_drafts_with_the_head_given_as_a_file(echo_dir, tmp_path):
    """A packed GGUF target (even one whose file keeps llama.cpp's MTP blocks) does not
    read them: refused in one line; the checkpoint's head given as a file drafts for it."""
    from support.packed import FAMILY_MIXES, write_tiny_gguf

    write_tiny_gguf(echo_dir, tmp_path / "t.gguf", FAMILY_MIXES["q8_0"], mtp=1)
    ar = Pipeline.load(str(tmp_path / "t.gguf"), device="cpu", dtype="float32")
    with pytest.raises(CheckpointError, match="not read from GGUF files"):
        _mtp(ar)
    head = {
        k: v for k, v in load_file(echo_dir / "model.safetensors").items() if k.startswith("mtp.")
    }
    save_file(head, tmp_path / "mtp.safetensors")
    pipe = _mtp(ar, drafter=str(tmp_path / "mtp.safetensors"))
    got = [pipe.generate(p, max_new_tokens=20, session=pipe.new_session()) for p in PROMPTS]
    assert [g.token_ids for g in got] == [
        ar.generate(p, max_new_tokens=20).token_ids for p in PROMPTS
    ]
    assert sum(g.stats.accepted for g in got) > 0


def test_a_target_without_mtp_layers_is_refused_in_one_line(tiny_qwen3_5, tiny_llama):
    for model, fragment in ((tiny_qwen3_5, "has no MTP layers"), (tiny_llama, "a llama target")):
        result = runner.invoke(app, ["generate", "hi", "--model", str(model), *FAST,
                                     "--method", "mtp"])  # fmt: skip
        assert_one_line_error(result, 2, fragment)


def test_an_mtp_file_without_method_is_refused_in_one_line(echo_dir, tmp_path):
    head = {
        k: v for k, v in load_file(echo_dir / "model.safetensors").items() if k.startswith("mtp.")
    }
    save_file(head, tmp_path / "mtp.safetensors")
    result = runner.invoke(app, ["generate", "hi", "--model", str(echo_dir), *FAST,
                                 "--drafter", str(tmp_path / "mtp.safetensors")])  # fmt: skip
    assert_one_line_error(result, 2, "a weights file without a config", "--method mtp")


def test_a_head_of_two_layers_is_refused(echo_dir, tmp_path):
    path = shutil.copytree(echo_dir, tmp_path / "two")
    tensors = load_file(path / "model.safetensors")
    tensors |= {k.replace("mtp.layers.0.", "mtp.layers.1."): v.clone()
                for k, v in tensors.items() if k.startswith("mtp.layers.0.")}  # fmt: skip
    save_file(tensors, path / "model.safetensors")
    result = runner.invoke(app, ["generate", "hi", "--model", str(path), *FAST, "--method", "mtp"])
    assert_one_line_error(result, 2, "2 MTP layers")


@pytest.mark.statistical
def test_a_sampled_first_draft_is_a_draw_from_its_q(ars):
    pipe = _mtp(ars["echo"])
    drafter = pipe.method.new_drafter(64)
    ids = pipe.encode(PROMPTS[0], raw=True)
    cache = pipe.model.new_cache(64)
    out = pipe.model(torch.tensor([ids]), cache, taps=drafter.taps)
    drafter.observe(ids, out.taps)
    params = SamplingParams(temperature=1.5)
    counts, q, n = torch.zeros(TINY_VOCAB), None, 3000
    for seed in range(n):
        draft = drafter.propose(ids[-1], 1, params, torch.Generator().manual_seed(seed))
        counts[draft.tokens[0, 0]] += 1
        q = draft.probs[0, 0] if q is None else q
    assert chi_square_pvalue(counts, q) > 1e-3
    assert chi_square_pvalue(counts, q.roll(1) * 0.3 + q * 0.7) < 1e-6  # the test can tell


@pytest.mark.statistical
@pytest.mark.parametrize("engine", ["sync", "resident"])
def test_sampling_through_mtp_has_the_target_distribution(ars, engine, monkeypatch):
    """The 5th answer token (a later step's), with chains drawn at T = 1."""
    from support.statistics import exact_token_distribution

    if engine == "resident":
        monkeypatch.setattr(Pipeline, "resident_steps", property(lambda self: True))
    pipe = _mtp(ars["echo"])
    text = PROMPTS[0]
    params = SamplingParams(temperature=1.0, top_k=3)
    exact = exact_token_distribution(pipe.model, pipe.encode(text, raw=True), params, 4)
    counts, session, n, accepted = torch.zeros(TINY_VOCAB), pipe.new_session(), 1500, 0
    stops = pipe.codec.stop_ids
    pipe.codec.stop_ids = frozenset()  # the exact distribution's paths never stop
    try:
        for seed in range(n):
            sampling = SamplingParams(temperature=1.0, top_k=3, seed=seed)
            out = pipe.generate(text, raw=True, sampling=sampling, max_new_tokens=5,
                                session=session)  # fmt: skip
            counts[out.token_ids[4]] += 1
            accepted += out.stats.accepted
    finally:
        pipe.codec.stop_ids = stops
    assert accepted > n // 4  # sampled drafts were accepted: their q entered the verdicts
    assert chi_square_pvalue(counts, exact.float()) > 1e-3
    shifted = exact.float().roll(1) * 0.25 + exact.float() * 0.75  # the test can tell
    assert chi_square_pvalue(counts, shifted) < 1e-6


@pytest.mark.integration
def test_cli_generate_and_bench_run_mtp(echo_dir, tmp_path):
    base = ["generate", PROMPTS[0], "--raw", "--json", "--model", str(echo_dir), *FAST,
            "-n", "16"]  # fmt: skip
    ar_ids = json.loads(runner.invoke(app, base).stdout)["token_ids"]
    result = runner.invoke(app, [*base, "--method", "mtp", "--trace"])
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["token_ids"] == ar_ids and record["trace"]
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"category": "c", "turns": [t]}) + "\n" for t in PROMPTS))
    bench = runner.invoke(app, ["bench", "--model", str(echo_dir), "--suite", str(suite),
                                "--methods", "mtp", "--max-new-tokens", "16", *FAST,
                                "--json"])  # fmt: skip
    assert bench.exit_code == 0, bench.stderr
    last = json.loads(bench.stdout.strip().splitlines()[-1])
    assert last["lossless"]["mtp"]["match_rate"] == 1.0
    assert last["results"]["mtp"]["all"]["tau"] > 1.0


@pytest.mark.integration
def test_serve_answers_with_mtp_as_ar_does(echo_dir):
    """`specgen serve --methods ar,mtp`: a request for mtp is answered as AR answers it,
    alone and beside another (slots), with MTP's drafts accepted."""
    from concurrent.futures import ThreadPoolExecutor

    from support.serve import CPU, Server

    srv = Server("--model", str(echo_dir), "--methods", "ar,mtp", "--parallel", "2", *CPU)
    try:
        with srv.http() as http:

            def ask(method):
                body = {"prompt": PROMPTS[0], "max_tokens": 20, "specgen": {"method": method}}
                r = http.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                return r.json()

            ar, mtp = ask("ar"), ask("mtp")
            with ThreadPoolExecutor(2) as pool:
                together = list(pool.map(ask, ["mtp", "ar"]))
    finally:
        srv.stop()
    text = ar["choices"][0]["text"]
    assert mtp["choices"][0]["text"] == text
    assert [t["choices"][0]["text"] for t in together] == [text, text]
    assert mtp["specgen"]["method"] == "mtp" and mtp["specgen"]["mean_acceptance_length"] > 1
