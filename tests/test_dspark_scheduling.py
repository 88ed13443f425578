"""The confidence scheduler: pure decisions on hand-made confidences and costs, the verify
policies, calibration, and the DSpark paper's counterexample (Appendix A)."""

from __future__ import annotations

import json

import pytest
import torch

from specgen.core.config import SamplingParams, VerifyPolicy
from specgen.core.draft import Draft
from specgen.core.errors import CheckpointError, SpecgenError
from specgen.methods.dspark.calibration import (
    Calibration,
    Step,
    ece,
    fit_temperatures,
    load_calibration,
    save_calibration,
)
from specgen.scheduling.cost import CostTable
from specgen.scheduling.scheduler import VerifyScheduler
from specgen.scheduling.verify_length import (
    choose_verify_length,
    survival,
    threshold_length,
)
from specgen.verify import verify_draft
from support.statistics import chi_square_pvalue


def test_no_verification_when_drafting_does_not_pay():
    decision = choose_verify_length([0.1, 0.9, 0.9], step_seconds=[1.0, 1.5, 1.6, 1.7])
    assert decision.length == 0 and decision.expected_tokens == 1.0


def test_full_length_when_confident_and_verification_is_cheap():
    decision = choose_verify_length([0.95] * 7, step_seconds=[1.0 + 0.01 * n for n in range(8)])
    assert decision.length == 7
    assert decision.expected_tokens == pytest.approx(1 + sum(survival([0.95] * 7)))


def test_the_drafters_own_time_makes_longer_verification_worth_it():
    """Drafting is paid whatever is verified, so it dilutes the verify cost."""
    costs = [1.0, 1.4, 1.8]
    assert choose_verify_length([0.6, 0.6], step_seconds=costs).length == 1
    assert choose_verify_length([0.6, 0.6], step_seconds=costs, draft_seconds=2.0).length == 2


def test_threshold_stops_at_the_first_low_confidence():
    assert threshold_length([0.9, 0.4, 0.9], 0.5).length == 1
    assert threshold_length([0.9, 0.8], 0.5).length == 2
    assert threshold_length([0.3], 0.5).length == 0


@pytest.mark.parametrize(
    "text, kind, threshold",
    [("cost", "cost", 0.0), ("full", "full", 0.0), ("threshold=0.7", "threshold", 0.7)],
)
def test_policy_parsing(text, kind, threshold):
    policy = VerifyPolicy.parse(text)
    assert (policy.kind, policy.threshold) == (kind, threshold)
    assert str(policy) == text


@pytest.mark.parametrize("text", ["fast", "threshold", "threshold=x", "threshold=1.5", "cost=1"])
def test_bad_policies_are_refused(text):
    with pytest.raises(SpecgenError, match="--verify-policy"):
        VerifyPolicy.parse(text)


def _draft(conf):
    tokens = torch.zeros(1, len(conf), dtype=torch.long)
    return Draft(tokens=tokens, confidence=torch.tensor([conf]))


def test_scheduler_uses_the_drafters_confidence_when_it_has_one():
    costs = CostTable(contexts=(1,), seconds=((1.0, 1.1, 1.2, 1.3),))
    scheduler = VerifyScheduler(VerifyPolicy(), costs)
    assert scheduler.trim(_draft([0.9, 0.9, 0.05]), 10).length == 2
    threshold = VerifyScheduler(VerifyPolicy("threshold", 0.5))
    assert threshold.trim(_draft([0.9, 0.3, 0.9]), 10).length == 1
    with pytest.raises(ValueError):
        VerifyScheduler(VerifyPolicy(), None)


# --- The paper's counterexample (Appendix A) ------------------------------------------
# Target p = (0.7, 0.3) over tokens {A, B}; the drafter proposes from q = (0.5, 0.5). The
# first slot's confidence c1 is known before d1 is drawn (here 0.3 or 0.95, at random); the
# second slot's confidence is read after d1 and depends on it: 0.99 after A, 0.01 after B.
# Costs make a step over 1 draft as dear as over 2, so a rule that looks at every prefix
# (global argmax) verifies d1 when it is A (then c2 is high and 2 slots pay) and skips it
# when it is B. It thus sees A more often than q proposes it and the first committed token
# comes out ~(0.775, 0.225). The paper's early stop never looks past slot 1 when slot 1
# does not pay, so its output is the target's (0.7, 0.3).

A, B = 0, 1
P = torch.tensor([0.7, 0.3])
Q = torch.tensor([0.5, 0.5])
COSTS = CostTable(contexts=(1,), seconds=((1.0, 1.5, 1.5),))


def _global_argmax(conditional, step_seconds):
    alive = survival(conditional)
    rates = [(1 + sum(alive[:n])) / step_seconds[n] for n in range(len(alive) + 1)]
    return max(range(len(rates)), key=rates.__getitem__)


def _first_tokens(rule, n, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.log(torch.stack([P, Q, Q]))[None]  # target rows for [anchor, d1, d2]
    params = SamplingParams(temperature=1.0)
    scheduler = VerifyScheduler(VerifyPolicy(), COSTS)
    counts = torch.zeros(2)
    for _ in range(n):
        d = torch.multinomial(Q.expand(2, 2), 1, generator=gen)[:, 0]
        c1 = 0.3 if torch.rand(1, generator=gen).item() < 0.5 else 0.95
        conf = [c1, 0.99 if d[0] == A else 0.01]
        draft = Draft(tokens=d[None], probs=Q.expand(1, 2, 2), confidence=torch.tensor([conf]))
        if rule == "ours":
            length = scheduler.decide(draft, context=1).length
        else:
            length = _global_argmax(conf, COSTS.step_seconds(1))
        verdict = verify_draft(logits[:, : length + 1], draft.truncated(length), params, gen)
        first = int(d[0]) if int(verdict.accepted[0]) >= 1 else int(verdict.bonus[0])
        counts[first] += 1
    return counts


@pytest.mark.statistical
def test_the_papers_counterexample_biases_an_anticipating_rule_but_not_ours():
    n = 4000
    ours = _first_tokens("ours", n, seed=0)
    anticipating = _first_tokens("global-argmax", n, seed=0)
    assert chi_square_pvalue(ours, P) > 1e-3
    assert abs(ours[A] / n - 0.7) < 0.03
    assert chi_square_pvalue(anticipating, P) < 1e-6
    assert abs(anticipating[A] / n - 0.775) < 0.03


# --- Calibration ------------------------------------------------------------------------


def test_ece_of_a_calibrated_and_an_overconfident_predictor():
    gen = torch.Generator().manual_seed(0)
    truth = torch.rand(20000, generator=gen)
    outcome = (torch.rand(20000, generator=gen) < truth).tolist()
    assert ece(truth.tolist(), outcome) < 0.02
    assert ece((truth * 0.5 + 0.5).tolist(), outcome) > 0.2


def _synthetic_steps(n, seed, scale=3.0):
    """The head's logits are `scale` times too sharp: true c_j = sigmoid(z_j / scale)."""
    gen = torch.Generator().manual_seed(seed)
    steps = []
    for _ in range(n):
        z = (torch.randn(4, generator=gen) * 2 + 1).tolist()
        accepted = 0
        for zj in z:
            if torch.rand(1, generator=gen).item() >= torch.sigmoid(torch.tensor(zj / scale)):
                break
            accepted += 1
        steps.append(Step(tuple(z), accepted))
    return steps


def test_fitted_temperatures_undo_overconfidence():
    fit = fit_temperatures(_synthetic_steps(6000, seed=0))
    assert fit.temperatures[0] == pytest.approx(3.0, rel=0.25)
    assert all(a < b for a, b in zip(fit.ece_after, fit.ece_before, strict=True))
    assert max(fit.ece_after) < 0.03 < min(fit.ece_before)
    assert fit.samples[0] == 6000 and fit.samples[3] == 6000


def test_calibration_round_trip_and_scaling(tmp_path):
    fit = fit_temperatures(_synthetic_steps(500, seed=1))
    path = save_calibration(tmp_path, fit, {"drafter": "d"})
    assert path.name == "calibration.json" and json.loads(path.read_text())["drafter"] == "d"
    loaded = load_calibration(tmp_path)
    assert loaded.temperatures == pytest.approx(fit.temperatures, abs=1e-5)
    scaled = Calibration((2.0, 4.0)).scale(torch.tensor([2.0, 4.0, 8.0]))
    assert scaled.tolist() == [1.0, 1.0, 2.0]  # later positions reuse the last temperature
    assert load_calibration(tmp_path / "missing") is None


def test_a_corrupt_calibration_fails_clearly(tmp_path):
    (tmp_path / "calibration.json").write_text('{"temperatures": "x"}')
    with pytest.raises(CheckpointError, match="not a calibration specgen wrote"):
        load_calibration(tmp_path)
