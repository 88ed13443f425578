"""The compute thread (engine/compute.py): after `offload()` torch work runs in one
long-lived thread with the process's torch threads while the caller keeps one; without it
everything runs in the caller as before. Decoding through it gives the same tokens."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import torch

from specgen.config import SpecConfig
from specgen.engine import compute
from specgen.pipeline import Pipeline


def _where() -> tuple[str, int]:
    return threading.current_thread().name, torch.get_num_threads()


def test_without_offload_everything_runs_in_the_caller():
    assert not compute.offloaded()
    assert compute.call(_where) == _where()
    assert list(compute.iterate(lambda: iter([_where()]))) == [_where()]


def test_offloaded_work_runs_in_one_thread_with_the_callers_threads():
    threads = torch.get_num_threads()
    compute.offload()
    try:
        assert torch.get_num_threads() == 1  # the caller never forms an OpenMP team
        assert compute.call(_where) == ("specgen-compute", threads)
        assert compute.call(_where) == ("specgen-compute", threads)  # the same thread

        closed = []

        def items():
            try:
                yield _where()
                yield _where()
            finally:
                closed.append(threading.current_thread().name)

        stream = compute.iterate(items)
        assert next(stream) == ("specgen-compute", threads)
        stream.close()  # stopped early: the generator is closed where it ran
        assert closed == ["specgen-compute"]

        with pytest.raises(ValueError, match="bad"):
            compute.call(int, "bad")
    finally:
        compute.shutdown()
    assert torch.get_num_threads() == threads and not compute.offloaded()


def test_a_spawned_stream_holds_the_thread_and_a_call_meanwhile_is_refused():
    compute.offload()
    try:
        started, release, seen = threading.Event(), threading.Event(), []

        def produce():
            seen.append(threading.current_thread().name)
            started.set()
            release.wait(5)

        join = compute.spawn(produce, name="unused")
        assert started.wait(5) and seen == ["specgen-compute"]
        with pytest.raises(RuntimeError, match="running a stream"):
            compute.call(_where)
        release.set()
        join()
        assert compute.call(_where)[0] == "specgen-compute"
    finally:
        compute.shutdown()


def test_ctrl_c_while_waiting_lets_the_work_in_flight_finish():
    compute.offload()
    try:
        main, done = threading.main_thread().ident, []

        def step():
            signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C arrives mid-step
            time.sleep(0.3)
            done.append(True)

        with pytest.raises(KeyboardInterrupt):
            compute.call(step)
        assert done == [True]  # nothing else may touch the step's state before it ends
    finally:
        compute.shutdown()


def test_an_offloaded_pipeline_overlaps_and_gives_the_same_tokens(tiny_dirs):
    spec = SpecConfig(method="ngram", verify_policy="full")
    plain = Pipeline.load(str(tiny_dirs["qwen3"]), device="cpu", dtype="float32", spec=spec)
    assert not plain.overlaps  # "auto" on the CPU without offloading: the sync loop
    want = plain.generate("The quick brown fox", raw=True, max_new_tokens=24).token_ids
    compute.offload()
    try:
        pipe = Pipeline.load(str(tiny_dirs["qwen3"]), device="cpu", dtype="float32", spec=spec)
        assert pipe.overlaps
        got = pipe.generate("The quick brown fox", raw=True, max_new_tokens=24)
        assert got.token_ids == want
        sync = pipe.with_spec(SpecConfig(method="ngram", verify_policy="full", engine="sync"))
        assert not sync.overlaps
        assert sync.generate("The quick brown fox", raw=True, max_new_tokens=24).token_ids == want
    finally:
        compute.shutdown()
