"""Scheduler replay: judge verify schedulers over recorded drafts instead of over the models.

A greedy answer is fixed (every method must reproduce AR's), and a drafter's state follows
the committed tokens only (tests/test_stacked.py checks that it drafts as if it had drafted
every step). So what a drafter would propose after n committed tokens does not depend on
which steps it drafted, and one plain decoding pass in which every drafter drafts its
longest draft at every position (`record`) holds everything any scheduler could be shown.
A greedy step's outcome is then a pure function of that record: the chosen draft, cut to
the length the scheduler asks for and trimmed by it, is accepted up to its first token
that differs from the answer. `replay_answer` steps through `engine/loop.py`'s loop on
that basis with a real `VerifyScheduler` deciding, and returns the steps' shapes as
`GenStats.shapes` has them, which bench/modeled.py prices. A scheduler change can so be
judged over hundreds of answers in seconds where a bench run takes half an hour on the
2-core CPU (benchmarks/record_drafts.py, benchmarks/replay_schedulers.py);
tests/test_replay.py checks that a replay's steps are the real loop's.
Research code, not part of the package: it imports specgen, never the other way round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from specgen.core.config import SamplingParams
from specgen.core.draft import Draft, DraftOption, empty_draft
from specgen.drafting import Drafter
from specgen.engine.answer import cut
from specgen.engine.loop import generate_speculative
from specgen.scheduling.cost import Shape
from specgen.scheduling.scheduler import VerifyScheduler

if TYPE_CHECKING:
    from specgen.api.pipeline import Pipeline


class RecordingDrafter(Drafter):
    """A stacked drafter's sub-drafters, each drafting its longest draft at every step;
    none is verified (the draft handed to the loop is empty, so it decodes plainly)."""

    def __init__(self, stacked: Any, names: Sequence[str]) -> None:
        self.stacked = stacked
        self.names = tuple(names)
        self.taps = stacked.taps
        self.max_draft_tokens = stacked.max_draft_tokens
        self.drafts: dict[str, list[list[int]]] = {n: [] for n in self.names}
        self.confidence: dict[str, list[list[float]]] = {n: [] for n in self.names}

    def rollback(self, length: int) -> None:
        self.stacked.rollback(length)

    def observe(self, tokens: Sequence[int], taps: Mapping[int, torch.Tensor]) -> None:
        self.stacked.observe(tokens, taps)

    def propose(
        self, anchor: int, max_tokens: int, params: SamplingParams, generator: Any
    ) -> Draft:
        for name, drafter in zip(self.names, self.stacked.drafters, strict=True):
            draft = drafter.propose(anchor, drafter.max_draft_tokens, params, generator)
            self.drafts[name].append(draft.tokens[0].tolist())
            if draft.confidence is not None:
                self.confidence[name].append(draft.confidence[0].tolist())
        return empty_draft(self.stacked.drafters[0].target.device)


@torch.inference_mode()
def record(stacked: Pipeline, ids: list[int], max_new_tokens: int) -> dict[str, Any]:
    """AR's greedy answer to `ids` and every draft each of `stacked`'s drafters would make
    along it: `tokens` (each step's token, a final stop token included) and, per drafter
    name, at position i (the anchor being tokens[i]) its longest draft, and the draft's
    confidences for a drafter that has them."""
    session = stacked.new_session()
    recorder = RecordingDrafter(session.drafter, stacked.drafters)
    tokens, finish = [], None
    for event in generate_speculative(
        stacked.model,
        session.cache,
        recorder,
        ids,
        params=SamplingParams(),
        max_new_tokens=max_new_tokens,
        stop_ids=stacked.codec.stop_ids,
    ):
        tokens.append(event.bonus)
        finish = event.finish
    return {
        "prompt_tokens": len(ids),
        "max_new_tokens": max_new_tokens,
        "finish": finish,
        "tokens": tokens,
        "drafts": recorder.drafts,
        "confidence": {n: c for n, c in recorder.confidence.items() if c},
    }


@dataclass
class Replayed:
    """One method's steps over one recorded answer, counted as GenStats counts them."""

    shapes: list[Shape] = field(default_factory=list)  # each step after the prefill
    steps: int = 1  # the prefill's step counts, as in τ
    accepted: int = 0


def replay_answer(
    trace: Mapping[str, Any],
    method: str,
    names: Sequence[str],
    options: Sequence[DraftOption],
    scheduler: VerifyScheduler,
    stop_ids: frozenset[int],
) -> Replayed:
    """`generate_speculative`'s greedy steps over one recorded answer, for `method` (one of
    the recorded drafters, or "stacked" choosing among `names` by the scheduler's pick),
    with `options` its drafter's and every decision `scheduler`'s (cost policy)."""
    if not scheduler.prices_drafts:
        raise ValueError("replay needs a scheduler that prices drafts (the cost policy)")
    answer, limit = trace["tokens"], trace["max_new_tokens"]
    stacked = method == "stacked"
    out = Replayed()
    _, finish = cut(answer[:1], 0, limit, stop_ids)  # the prefill's token, as `prefill`
    produced, context = 1, trace["prompt_tokens"]
    while finish is None:
        bucket, room = scheduler.plan(options, context, limit - produced - 1)
        name = (names[bucket] if stacked else method) if room > 0 else None
        i = produced - 1  # the anchor is answer[i]; a draft would continue it
        proposal = empty_draft()
        if room > 0:
            assert name is not None
            confidence = trace["confidence"].get(name)
            proposal = Draft(
                tokens=torch.tensor([trace["drafts"][name][i][:room]]),
                confidence=None if confidence is None else torch.tensor([confidence[i][:room]]),
                bucket=names.index(name) if stacked else 0,
                source=name if stacked else None,
            )
        draft = scheduler.trim(proposal, context)
        verified = draft.tokens[0].tolist()
        known = len(answer) - i - 1  # the answer's tokens after the anchor
        accepted = 0
        follows = answer[i + 1 : i + 1 + min(len(verified), known)]
        while accepted < len(follows) and verified[accepted] == follows[accepted]:
            accepted += 1
        scheduler.record(draft, accepted, proposal.length)
        # a draft accepted up to the answer's stop token: the stop cuts what would follow
        bonus = [answer[i + 1 + accepted]] if accepted < known else []
        tokens, finish = cut([*verified[:accepted], *bonus], produced, limit, stop_ids)
        out.shapes.append((context, name if proposal.length else None, proposal.length,
                           draft.length, len(tokens)))  # fmt: skip
        out.steps += 1
        out.accepted += accepted
        context += 1 + accepted
        produced += len(tokens)
    return out


def replay(
    traces: Sequence[Mapping[str, Any]], pipes: Mapping[str, Pipeline]
) -> dict[str, list[Replayed]]:
    """Each of `pipes` (method name -> a cost-policy pipeline) over every recorded answer in
    order, each answer's scheduler learning from the one before (as a pipeline's
    `Schedulers.learnt` carries it from answer to answer in a bench)."""
    results = {}
    for method, pipe in pipes.items():
        drafter = pipe.new_session().drafter
        names = pipe.drafters
        earlier, answers = None, []
        for trace in traces:
            scheduler = VerifyScheduler(pipe.spec.verify_policy, pipe.costs)
            if earlier is not None:
                scheduler.learn_from(earlier)
            answers.append(
                replay_answer(
                    trace, method, names, drafter.options, scheduler, pipe.codec.stop_ids
                )  # fmt: skip
            )
            earlier = scheduler
        results[method] = answers
    return results
