"""The fused CPU pass's thread count, chosen from its measured calls: it settles on the
count that runs fastest, keeps trying the others rarely, follows a change of load, and
never changes an answer (the pass gives the same bits with any count)."""

from __future__ import annotations

import random

import torch

from specgen.models.fused.cpu_pass import FusedPass
from specgen.models.fused.threads import FIRST_PROBE, LAST_PROBE, ThreadTuner, candidates
from specgen.models.loading import load_gguf_target
from support.packed import FAMILY_MIXES, write_tiny_gguf


def drive(tuner, calls, cost, rows=1, most=2):
    """`calls` calls timed by `cost(threads)` seconds per row; the counts chosen."""
    chosen = []
    for _ in range(calls):
        n = tuner.choose(rows, most)
        tuner.record(rows, n, cost(n) * rows)
        chosen.append(n)
    return chosen


def test_candidates_halve_down_to_one():
    assert candidates(16) == (16, 8, 4, 2, 1)
    assert candidates(6) == (6, 3, 1)
    assert candidates(1) == (1,)


def test_it_settles_on_the_faster_count_and_still_looks_at_the_other_rarely():
    busy = {1: 0.012, 2: 0.028}  # beside a busy process: one thread wins
    chosen = drive(ThreadTuner(), 2000, busy.__getitem__)
    assert chosen[: FIRST_PROBE - 1] == [2] * (FIRST_PROBE - 1)  # every thread first
    assert chosen[100:].count(1) >= 0.95 * len(chosen[100:])
    later = chosen[300:]
    assert later.count(2) >= 3  # tried again now and then ...
    assert later.count(2) <= len(later) / LAST_PROBE * 8  # ... more rarely while it holds
    quiet = {1: 0.012, 2: 0.0065}
    assert drive(ThreadTuner(), 400, quiet.__getitem__)[-100:].count(2) >= 97


def test_a_try_is_judged_beside_the_calls_just_before_it_not_minutes_apart():
    """A served batch's calls grow slower as its answers' contexts grow, its first calls
    came while eight prompts were being read (two threads 2.6x slower then), and a count
    tried after a long spell of the other is slow on its first call (a woken thread, cold
    caches: up to 2.5x seen). Two threads are 0.65x one's time all along after the start:
    they must win (timed apart, the old tuner kept one thread for good here)."""
    state = {"i": 0, "last": 2}

    def cost(n):
        state["i"] += 1
        grown = 1 + state["i"] / 300  # contexts growing: every call slower than the last
        per_row = 0.0125 * grown * (0.65 if n == 2 else 1.0)
        if n == 2 and state["i"] <= 10:
            per_row = 0.032 * grown  # the burst while prompts were read
        if n != state["last"]:
            per_row *= 2.5  # the first call after a change of count
        state["last"] = n
        return per_row

    chosen = drive(ThreadTuner(), 2000, cost, rows=8)
    assert chosen[200:].count(2) >= 0.95 * len(chosen[200:])


def test_it_follows_a_change_of_load_within_a_few_tries():
    tuner = ThreadTuner()
    drive(tuner, 3000, {1: 0.012, 2: 0.0065}.__getitem__)  # quiet: two threads
    after = drive(tuner, 3 * LAST_PROBE, {1: 0.012, 2: 0.028}.__getitem__)  # a process arrives
    switched = after.index(1)
    assert switched <= 2 * FIRST_PROBE  # the chosen count's slower calls trigger a look
    assert after[switched + 20 :].count(1) >= 0.95 * len(after[switched + 20 :])


def test_noise_does_not_flip_the_choice_for_good():
    rng = random.Random(0)
    cost = lambda n: {1: 0.012, 2: 0.0065}[n] * rng.lognormvariate(0, 0.3)  # noqa: E731
    chosen = drive(ThreadTuner(), 4000, cost)
    assert chosen[100:].count(2) >= 0.9 * len(chosen[100:])


def test_prefills_take_every_thread_and_one_thread_is_one():
    tuner = ThreadTuner()
    assert {tuner.choose(200, 4) for _ in range(50)} == {4}
    assert {tuner.choose(1, 1) for _ in range(50)} == {1}


def test_kinds_of_call_are_tuned_apart_and_a_new_thread_limit_starts_over():
    tuner = ThreadTuner()
    drive(tuner, 300, {1: 0.01, 2: 0.02}.__getitem__, rows=1)
    drive(tuner, 300, {1: 0.01, 2: 0.004}.__getitem__, rows=12)
    assert tuner.kinds[1].chosen == 1 and tuner.kinds[16].chosen == 2
    assert tuner.choose(1, 4) == 4  # --threads changed: every count again, the most first


def test_the_answer_never_depends_on_the_counts_chosen(tiny_qwen3_deep, tmp_path):
    write_tiny_gguf(tiny_qwen3_deep, tmp_path / "t.gguf", FAMILY_MIXES["q4_1"])
    model = load_gguf_target(
        tmp_path / "t.gguf", tiny_qwen3_deep, dtype=torch.float32, device="cpu"
    )
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, model.args.vocab_size, (1, 40), generator=gen)
    fused = FusedPass.of(model)
    fused.min_parallel_work = 0  # share even a tiny model's phases

    def logits(chooser):
        fused.tuner = chooser
        cache = model.new_cache(48)
        rows = [model(tokens[:, :8], cache).logits[:, -1]]
        for i in range(8, 40):
            rows.append(model(tokens[:, i : i + 1], cache).logits[:, -1])
        return torch.cat(rows)

    class Random(ThreadTuner):
        rng = random.Random(1)

        def choose(self, rows, most):
            return self.rng.choice((1, 2, 3))

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert torch.equal(logits(None), logits(Random()))
        assert torch.equal(logits(None), logits(ThreadTuner()))
    finally:
        torch.set_num_threads(threads)


def test_a_prompts_chunk_takes_every_thread_untimed(tiny_qwen3_deep, tmp_path):
    """Served prompts come in chunks of 64 rows, within the tuned calls' sizes: a try of one
    thread on them was a step twice as long, which a request sent meanwhile waited on."""
    write_tiny_gguf(tiny_qwen3_deep, tmp_path / "t.gguf", FAMILY_MIXES["q4_1"])
    model = load_gguf_target(
        tmp_path / "t.gguf", tiny_qwen3_deep, dtype=torch.float32, device="cpu"
    )
    fused = FusedPass.of(model)
    fused.min_parallel_work = 0  # share even a tiny model's phases

    class Counted(ThreadTuner):
        asked: list[int] = []

        def choose(self, rows, most):
            self.asked.append(rows)
            return 1

    fused.tuner = tuner = Counted()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        cache = model.new_cache(64)
        prompt = torch.arange(20).unsqueeze(0)
        model(prompt[:, :12], cache, num_logits=1)  # a prompt's chunk: every thread
        other = model.new_cache(64)
        fused.run_many(model, [(prompt[0, 12:].tolist(), cache, 1), ([5], other, 1)], ())
        assert tuner.asked == [] and tuner.kinds == {}
        model(prompt[:, 12:14], cache)  # a verify block: tuned
        assert tuner.asked == [2]
    finally:
        torch.set_num_threads(threads)


def test_a_slow_start_is_forgotten_within_a_few_tries():
    calls = {1: 0, 2: 0}

    def cost(n):  # two threads' first calls slow (cold caches, a burst elsewhere)
        calls[n] += 1
        return 0.030 if n == 2 and calls[n] <= 4 else {1: 0.012, 2: 0.0065}[n]

    chosen = drive(ThreadTuner(), 400, cost)
    assert chosen[100:].count(2) >= 0.97 * len(chosen[100:])


def test_where_counts_tie_noise_leaves_the_calls_with_more_threads():
    rng = random.Random(2)  # two busy processes on two cores: one thread barely slower
    cost = lambda n: {1: 0.026, 2: 0.023}[n] * rng.lognormvariate(0, 0.4)  # noqa: E731
    chosen = drive(ThreadTuner(), 4000, cost)
    assert chosen[100:].count(2) >= 0.9 * len(chosen[100:])
