"""What the scheduler learns of earlier steps (scheduling/history.py): per draft position
the conditional acceptance rates, pulled towards the position before them (the first
towards the optimistic prior), fading back when a bucket goes unused."""

from __future__ import annotations

import pytest
import torch

from specgen.core.draft import Draft
from specgen.scheduling.history import PRIOR_RATE, StepHistory
from specgen.scheduling.verify_length import survival


def _step(history: StepHistory, bucket: int, verified: int, accepted: int) -> None:
    """A drafted step of `bucket`, all `verified` drafts verified, `accepted` accepted."""
    history.record(bucket, proposed=verified, verified=verified, judged=verified, accepted=accepted)


def test_tracker_starts_at_the_prior_and_learns():
    tracker = StepHistory(positions=3)
    assert survival(tracker.rates(1, 2)) == pytest.approx([PRIOR_RATE, PRIOR_RATE**2])
    for _ in range(40):
        _step(tracker, 1, verified=3, accepted=3)
        _step(tracker, 2, verified=3, accepted=0)
    assert survival(tracker.rates(1, 3))[-1] > 0.8
    assert survival(tracker.rates(2, 1))[0] < 0.1
    assert survival(tracker.rates(3, 1)) == pytest.approx([PRIOR_RATE])  # an unseen bucket


def test_only_positions_that_were_judged_count():
    tracker = StepHistory(positions=4)
    for _ in range(50):
        _step(tracker, 0, verified=4, accepted=1)  # position 3 and 4 were never judged
    rates = survival(tracker.rates(0, 4))
    assert rates[0] > 0.9 and rates[1] / rates[0] < 0.1
    # positions 3 and 4: no evidence about them, so position 2's conditional rate
    conditional = tracker.rates(0, 4)
    assert conditional[2] == pytest.approx(conditional[1]) == pytest.approx(conditional[3])


def test_a_position_never_verified_takes_the_rate_of_the_one_before():
    """A copying drafter verified three deep, every draft accepted: its fourth position is
    priced as its third, not at the prior, so the scheduler verifies deeper and learns
    what the fourth is worth (priced at the prior, it was never verified, and never
    learnt otherwise)."""
    from specgen.core.config import VerifyPolicy
    from specgen.scheduling.cost import CostTable
    from specgen.scheduling.scheduler import VerifyScheduler

    table = CostTable(contexts=(100,), seconds=((1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6),))
    scheduler = VerifyScheduler(VerifyPolicy.parse("cost"), table)
    tokens = torch.zeros(1, 3, dtype=torch.long)
    for _ in range(30):
        scheduler.record(Draft(tokens=tokens, bucket=2), accepted=3)
    conditional = scheduler.history.rates(2, 6)
    assert conditional[0] > 0.9 and conditional[3:] == pytest.approx([conditional[2]] * 3)
    long_draft = Draft(tokens=torch.zeros(1, 6, dtype=torch.long), bucket=2)
    assert scheduler.decide(long_draft, context=100).length == 6
    for _ in range(30):  # the fourth is never accepted: it stops being verified
        scheduler.record(long_draft, accepted=3)
    assert scheduler.decide(long_draft, context=100).length == 3


def test_unused_buckets_drift_back_to_the_prior():
    tracker = StepHistory(positions=1)
    for _ in range(30):
        _step(tracker, 5, verified=1, accepted=0)
    low = survival(tracker.rates(5, 1))[0]
    for _ in range(200):
        _step(tracker, 6, verified=1, accepted=1)
    assert low < survival(tracker.rates(5, 1))[0] < PRIOR_RATE + 1e-9
