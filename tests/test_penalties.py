"""Presence, frequency and repetition penalties: vLLM's definitions (transformers' for the
repetition penalty), applied at every verified position as plain decoding applies them, so
every method stays greedy-identical to AR and samples the penalised distribution.

The slow reference is plain decoding written straightforwardly: transformers' model over
the whole sequence for every token, the penalties in plain Python over a Counter.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from specgen.core.config import SamplingParams
from specgen.core.draft import Draft
from specgen.core.errors import OptionError
from specgen.engine.loop import generate_speculative
from specgen.engine.resident import generate_resident
from specgen.models.loading import load_target
from specgen.verify.penalties import Penalties, penalise
from specgen.verify.sampling import probabilities
from support.cli import assert_one_line_error, run
from support.scripted_drafters import AnswerKeyDrafter
from support.statistics import chi_square_pvalue
from support.targets import TINY_VOCAB

PENALTIES = [
    dict(repetition_penalty=1.3),
    dict(frequency_penalty=0.7, presence_penalty=0.4),
    dict(repetition_penalty=0.8, presence_penalty=-0.5),  # rewards repeats: drafts accepted
    dict(repetition_penalty=1.2, frequency_penalty=-0.6, presence_penalty=0.3),
    dict(frequency_penalty=-1.5, presence_penalty=-1.0),  # loops: the step's drafts decide
]
IDS = ["repetition", "frequency+presence", "rewarding", "all three", "looping"]


def reference_scores(logits, prompt, answer, params) -> torch.Tensor:
    """The penalised logits, one token at a time, as the definitions read."""
    counts, seen = Counter(answer), set(prompt) | set(answer)
    out = logits.double().clone()
    for t in range(out.shape[-1]):
        x = float(out[t])
        if t in seen and params.repetition_penalty != 1.0:
            x = x / params.repetition_penalty if x > 0 else x * params.repetition_penalty
        x -= params.frequency_penalty * counts[t]
        x -= params.presence_penalty * (counts[t] > 0)
        out[t] = x
    return out


def reference_greedy(hf, prompt: list[int], n: int, params: SamplingParams) -> list[int]:
    """Plain greedy decoding with penalties: a full forward per token, no cache."""
    answer: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            logits = hf(torch.tensor([prompt + answer])).logits[0, -1]
            answer.append(int(reference_scores(logits, prompt, answer, params).argmax()))
    return answer


# --- the definitions --------------------------------------------------------------------------


@pytest.mark.parametrize("r", [1.5, 0.7])
def test_the_repetition_penalty_is_transformers(r):
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1, TINY_VOCAB, generator=gen) * 3
    prompt, answer = [5, 9, 9, 40], [40, 7, 7, 7, 300]
    theirs = RepetitionPenaltyLogitsProcessor(r)(torch.tensor([prompt + answer]), logits.clone())
    params = SamplingParams(repetition_penalty=r)
    state = Penalties(params, prompt, TINY_VOCAB, torch.device("cpu"))
    state.count(torch.tensor(answer))
    torch.testing.assert_close(state.apply(logits), theirs)
    assert not torch.equal(theirs, logits)  # it bit


@pytest.mark.parametrize("penalties", PENALTIES, ids=IDS)
def test_each_verified_row_counts_the_drafts_before_it(penalties):
    """Row j of a verify pass over [anchor, d1..dk] is penalised as if the answer ended
    with d1..dj; a step's commit counts its accepted drafts and its bonus only."""
    params = SamplingParams(**penalties)
    gen = torch.Generator().manual_seed(1)
    prompt, answer, drafts = [3, 3, 17], [17, 8, 250, 8], [8, 99, 3, 99]
    logits = torch.randn(len(drafts) + 1, TINY_VOCAB, generator=gen) * 2
    state = Penalties(params, prompt, TINY_VOCAB, torch.device("cpu"))
    state.count(torch.tensor(answer))
    rows = state.apply(logits, torch.tensor(drafts))
    for j in range(len(drafts) + 1):
        want = reference_scores(logits[j], prompt, answer + drafts[:j], params)
        torch.testing.assert_close(rows[j].double(), want, atol=1e-5, rtol=1e-6)
    state.commit(torch.tensor(drafts), 2, torch.tensor([42]))  # d1, d2 and the bonus
    want = reference_scores(logits[0], prompt, answer + drafts[:2] + [42], params)
    torch.testing.assert_close(state.apply(logits[:1])[0].double(), want, atol=1e-5, rtol=1e-6)
    state.commit(torch.tensor(drafts), torch.tensor([0]), torch.tensor([5]))  # a device count
    want = reference_scores(logits[0], prompt, answer + drafts[:2] + [42, 5], params)
    torch.testing.assert_close(state.apply(logits[:1])[0].double(), want, atol=1e-5, rtol=1e-6)


def test_no_penalty_is_no_state_and_no_change():
    assert Penalties.start(SamplingParams(temperature=1.0), [1, 2], torch.zeros(1, 8)) is None
    logits = torch.randn(3, 8)
    same = penalise(logits, torch.ones(3, 8), torch.ones(8, dtype=torch.bool), SamplingParams())
    assert torch.equal(same, logits)


@pytest.mark.parametrize(
    "field, value, rule",
    [("presence_penalty", 2.5, "[-2, 2]"), ("frequency_penalty", -3.0, "[-2, 2]"),
     ("presence_penalty", float("nan"), "[-2, 2]"), ("repetition_penalty", 0.0, "[0.01, 100]"),
     ("repetition_penalty", 101.0, "[0.01, 100]"), ("logprobs", 21, "[0, 20]"),
     ("logprobs", -1, "[0, 20]")],
)  # fmt: skip
def test_bad_values_are_one_option_error(field, value, rule):
    with pytest.raises(OptionError) as e:
        SamplingParams(**{field: value})
    assert e.value.option == field and rule in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "flag, value", [("--presence-penalty", "2.5"), ("--frequency-penalty", "-2.01"),
                    ("--repetition-penalty", "0")],
)  # fmt: skip
def test_the_cli_refuses_bad_penalties_in_one_line_before_loading(flag, value):
    result = run("generate", "hi", "--model", "no-such-model-anywhere", flag, value)
    assert_one_line_error(result, 2, flag, value)


# --- greedy: every method is plain decoding with penalties -----------------------------------


def answer_ids(pipe, prompt, n, params, session=None):
    ids, accepted = [], 0
    session = session or pipe.new_session()
    for chunk in pipe.stream_ids(
        prompt, sampling=params, max_new_tokens=n, ignore_eos=True, session=session
    ):
        ids += chunk.token_ids
        accepted = chunk.stats.accepted
    return ids, accepted


PROMPTS = ("The quick brown fox", "one two one two one two")


@pytest.mark.parametrize("penalties", PENALTIES, ids=IDS)
def test_greedy_with_penalties_is_the_slow_reference_for_every_method(pipes, hf_deep, penalties):
    params = SamplingParams(**penalties)
    accepted_total = 0
    for text in PROMPTS:
        prompt = pipes["ar"].encode(text, raw=True)
        want = reference_greedy(hf_deep, prompt, 24, params)
        plain = answer_ids(pipes["ar"], prompt, 24, SamplingParams())[0]
        assert want != plain  # the penalties change the answer: the test can tell
        for method, pipe in pipes.items():
            got, accepted = answer_ids(pipe, prompt, 24, params)
            assert got == want, (method, text)
            accepted_total += accepted
    assert accepted_total > 0  # some rows after accepted drafts decided tokens


def test_a_chat_turn_counts_the_whole_prompt_not_only_what_it_prefills(pipes, hf_deep):
    """The second turn reuses the cached prefix; the repetition penalty still counts it."""
    params = SamplingParams(repetition_penalty=1.6)
    ar = pipes["ar"]
    first = ar.encode("one two one two one two", raw=True)
    second = first + ar.encode(" three one two", raw=True)
    for method in ("ar", "dflash"):
        session = pipes[method].new_session()
        answer_ids(pipes[method], first, 4, params, session)
        got = answer_ids(pipes[method], second, 16, params, session)[0]
        assert got == reference_greedy(hf_deep, second, 16, params), method


# --- an answer key: every draft right, so every row after accepted drafts decides ----------


class KeyDrafter(AnswerKeyDrafter):
    """Drafts the known answer, every `wrong`-th draft changed (0: none is)."""

    def _draft(self, start: int, k: int) -> Draft:
        tokens = [self._at(start + 1 + i) for i in range(k)]
        for i in range(self.wrong - 1, k, self.wrong) if self.wrong else ():
            tokens[i] = (tokens[i] + 1) % TINY_VOCAB
        return Draft(torch.tensor([tokens]))


@pytest.fixture(scope="module")
def llama(tiny_llama):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    return load_target(tiny_llama, dtype=torch.float32, device="cpu"), hf


@pytest.mark.parametrize(
    "loop", [generate_speculative, generate_resident], ids=["sync", "resident"]
)
@pytest.mark.parametrize("penalties", PENALTIES, ids=IDS)
@pytest.mark.parametrize("wrong", [0, 3])  # every draft right; every third wrong
def test_drafts_of_the_penalised_answer_are_accepted_and_reproduce_it(
    llama, loop, penalties, wrong
):
    model, hf = llama
    params = SamplingParams(**penalties)
    prompt = [5, 17, 42, 99, 7, 3, 250, 11, 5, 17, 42]
    want = reference_greedy(hf, prompt, 30, params)
    drafter = KeyDrafter(prompt + want, 4, wrong)
    events = list(loop(model, model.new_cache(128), drafter, prompt, params=params,
                       max_new_tokens=30, stop_ids=frozenset()))  # fmt: skip
    assert [t for e in events for t in e.tokens] == want
    accepted, verified = sum(e.accepted for e in events), sum(e.verified for e in events)
    if wrong == 0:
        assert accepted == verified > 20  # every draft of the right answer accepted
    else:
        assert 0 < accepted < verified


# --- sampling: the penalised distribution, exactly -------------------------------------------


# penalties that reward repeats: they move the third token most on these random weights
SAMPLED = dict(temperature=1.0, top_k=3, repetition_penalty=0.7, frequency_penalty=-0.8,
               presence_penalty=0.3)  # fmt: skip


def exact_penalised(target, prompt, params, position) -> torch.Tensor:
    """P(answer token at `position`) under plain penalised sampling, by enumerating every
    path through the (top-k-limited) earlier tokens."""
    paths, weights = [list(prompt)], torch.ones(1, dtype=torch.float64)
    for step in range(position + 1):
        logits = target(torch.tensor(paths), target.new_cache(64, batch=len(paths))).logits
        rows = [reference_scores(logits[i, -1], prompt, path[len(prompt) :], params)
                for i, path in enumerate(paths)]  # fmt: skip
        p = probabilities(torch.stack(rows).float(), params).double()  # [paths, V]
        if step == position:
            return weights @ p
        nz = p.nonzero()
        weights = weights[nz[:, 0]] * p[nz[:, 0], nz[:, 1]]
        paths = [paths[i] + [t] for i, t in nz.tolist()]
    raise AssertionError("unreachable")


@pytest.mark.statistical
@pytest.mark.parametrize("method", ["ar", "dflash", "dspark"])  # (ngram: no matches here)
def test_sampling_with_penalties_has_the_penalised_distribution(pipes, method):
    """The 3rd answer token: drawn from a verify row after the first token and, when d1
    was accepted, after d1 too; its penalties count both."""
    pipe = pipes[method]
    text = "one two one two"
    settings = SAMPLED
    prompt = pipe.encode(text, raw=True)
    exact = exact_penalised(pipe.model, prompt, SamplingParams(**settings), 2).float()
    plain = exact_penalised(pipe.model, prompt, SamplingParams(temperature=1.0, top_k=3), 2)
    assert 0.5 * (exact - plain.float()).abs().sum() > 0.1  # the penalties move it
    counts, session, n, accepted = torch.zeros(TINY_VOCAB), pipe.new_session(), 1500, 0
    for seed in range(n):
        params = SamplingParams(seed=seed, **settings)
        out = pipe.generate(text, raw=True, sampling=params, max_new_tokens=4, session=session)
        counts[out.token_ids[2]] += 1
        accepted += out.stats.accepted
    if method != "ar":
        assert accepted > 0  # drafts were accepted: some rows after them decided
    assert chi_square_pvalue(counts, exact) > 1e-3
    assert chi_square_pvalue(counts, plain.float()) < 1e-6  # unpenalised: told apart


class TwinDrafter(KeyDrafter):
    """Drafts what the target itself would say greedily, penalised (the slow reference):
    its drafts are often accepted under sampling, so the rows after them decide often."""

    def __init__(self, hf, prompt: list[int], params: SamplingParams, k: int = 3) -> None:
        super().__init__([], k)
        self.hf, self.prompt, self.params, self.ids = hf, prompt, params, []

    def observe(self, tokens, taps):
        self.ids += list(tokens)
        self.length = len(self.ids)

    def rollback(self, length):
        self.ids = self.ids[:length]
        self.length = len(self.ids)

    def propose(self, anchor, max_tokens, params=None, generator=None):
        seq = self.ids + [anchor]
        with torch.no_grad():
            for _ in range(min(max_tokens, self.max_draft_tokens)):
                logits = self.hf(torch.tensor([seq])).logits[0, -1]
                counts = torch.bincount(torch.tensor(seq[len(self.prompt) :]), minlength=TINY_VOCAB)
                in_prompt = torch.zeros(TINY_VOCAB, dtype=torch.bool)
                in_prompt[self.prompt] = True
                scores = penalise(logits, counts.float(), in_prompt, self.params)
                seq.append(int(scores.argmax()))
        return Draft(torch.tensor([seq[len(self.ids) + 1 :]]))


# strong rewards for repeats: whether a row counts the draft before it moves this third
# token by a total variation of 0.27 on the tiny Llama (a row that missed d1 fails here)
TWIN = dict(temperature=1.0, top_k=3, frequency_penalty=-2.0, presence_penalty=-2.0)


@pytest.mark.statistical
def test_sampled_rows_after_accepted_drafts_count_them(llama):
    """Under sampling, with drafts the target often accepts: the third answer token comes
    from the row after an accepted d1 most of the time, penalised with d1 counted."""
    model, hf = llama
    prompt = [5, 17, 42, 99, 7, 3, 250, 11, 5, 17, 42]
    exact = exact_penalised(model, prompt, SamplingParams(**TWIN), 2).float()
    counts, accepted, n = torch.zeros(TINY_VOCAB), 0, 1500
    for seed in range(n):
        params = SamplingParams(seed=seed, **TWIN)
        drafter = TwinDrafter(hf, prompt, params)
        events = list(generate_speculative(model, model.new_cache(64), drafter, prompt,
                                           params=params, max_new_tokens=3,
                                           stop_ids=frozenset()))  # fmt: skip
        tokens = [t for e in events for t in e.tokens]
        counts[tokens[2]] += 1
        accepted += events[1].accepted >= 1  # the 3rd token came from row 1 or later
    assert accepted > n // 3
    assert chi_square_pvalue(counts, exact) > 1e-3
