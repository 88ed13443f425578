"""The one door into the engine: an answer's decoding steps on a session, from the loop
that fits its drafter, in the thread the engine runs in."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import cast

from specgen.core.config import SamplingParams
from specgen.core.events import StepEvent
from specgen.drafting.base import ResidentDrafter
from specgen.engine.ar import generate_ar
from specgen.engine.loop import generate_speculative
from specgen.engine.overlap import overlapped
from specgen.engine.resident import generate_resident
from specgen.engine.session import Session
from specgen.verify.constraint import Constraint


def decode(
    session: Session,
    new_ids: list[int],
    *,
    params: SamplingParams,
    max_new_tokens: int,
    stop_ids: frozenset[int],
    overlap: bool,
    resident: bool,
    constraint: Constraint | None = None,
    cancel: Callable[[], bool] | None = None,
) -> Iterator[StepEvent]:
    """The steps of one answer after `new_ids` (what `session.prepare` left to prefill).

    `overlap`: decode in a thread of its own, a step or two ahead of the caller
    (engine/overlap.py); else one step at a time. `resident`: a drafter that can be driven
    with its state on the device runs the device-resident loop (engine/resident.py), unless
    a `constraint` (verify/constraint.py) must see each step's tokens before the next's
    masks. `cancel` is asked between prefill chunks (engine/prefill.py)."""
    drafter = session.drafter
    history = list(session.ids)  # the prompt's part the cache already holds

    def steps() -> Iterator[StepEvent]:
        limits = dict(
            params=params, max_new_tokens=max_new_tokens, stop_ids=stop_ids, history=history,
            cancel=cancel,
        )  # fmt: skip
        if drafter is None:
            return generate_ar(
                session.forward, session.cache, new_ids, constraint=constraint, **limits
            )
        if resident and drafter.resident and constraint is None:
            resident_drafter = cast(ResidentDrafter, drafter)
            return generate_resident(
                session.forward, session.cache, resident_drafter, new_ids,
                scheduler=session.scheduler, **limits,
            )  # fmt: skip
        return generate_speculative(
            session.forward, session.cache, drafter, new_ids,
            scheduler=session.scheduler, constraint=constraint, **limits,
        )  # fmt: skip

    return overlapped(steps) if overlap else steps()
