"""The compute thread: one long-lived thread for a process's torch work, so that the main
thread stays free for the live view (and the overlap engine has a thread to run ahead in).

Why one thread for everything, and why the caller is kept at one torch thread: torch's CPU
kernels run an OpenMP team per calling thread, and once a process holds more OpenMP
threads than CPUs (a second thread's team next to the first thread's idle one), libgomp
stops spinning between parallel regions and sleeps instead, so each of the hundreds of
small parallel regions in a decoding step pays a wake-up. Measured on the 2-core CPU, one
target decode step at a 200-token context: 25.5 ms from the thread that loaded the model;
37-41 ms from a second thread (the overlap engine's compute thread until now: 0.62x of
the sync loop end to end); 26-28 ms from a second thread when the first never formed a
team. Setting the first thread to one torch thread after it formed a team does not help
(its idle team stays): it has to be set before any parallel work.

`offload()` (the CLI, on the CPU, before loading anything) therefore sets the caller to
one torch thread and from then on `call`, `iterate` and `spawn` run work in the compute
thread, which uses the process's full thread count. Without `offload()` (library use,
tests) they run in the caller as before (`spawn`: a fresh thread), so nothing changes for
code that never asked.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from typing import Any, ParamSpec, TypeVar

import torch

T = TypeVar("T")
P = ParamSpec("P")

_jobs: queue.SimpleQueue = queue.SimpleQueue()
_thread: threading.Thread | None = None
_threads = 0  # the compute thread's torch thread count (the caller's before `offload`)
_spawned = threading.Event()  # a `spawn`ed job holds the compute thread


def offload() -> None:
    """From now on, run torch work in the compute thread; keep this thread at one torch
    thread. Call before any parallel torch work in this thread (see the module docstring)."""
    global _thread, _threads
    if _thread is not None:
        return
    _threads = torch.get_num_threads()
    torch.set_num_threads(1)
    _thread = threading.Thread(target=_serve, name="specgen-compute", daemon=True)
    _thread.start()


def offloaded() -> bool:
    return _thread is not None


def shutdown() -> None:
    """Undo `offload()`: stop the compute thread (after the work it holds) and give this
    thread back its torch threads (tests, and apps that offload for a while)."""
    global _thread
    if _thread is None:
        return
    thread, _thread = _thread, None
    _jobs.put((None, None))
    thread.join()
    _spawned.clear()
    torch.set_num_threads(_threads)


def _serve() -> None:
    torch.set_num_threads(_threads)
    while True:
        fn, job = _jobs.get()
        if job is None:  # shutdown()
            return
        if job.set_running_or_notify_cancel():
            try:
                job.set_result(fn())
            except BaseException as e:  # handed to the caller, raised there
                job.set_exception(e)


def _here() -> bool:
    return _thread is None or threading.current_thread() is _thread


def _submit(fn: Callable[[], T]) -> Future:
    job: Future = Future()
    _jobs.put((fn, job))
    return job


def _result(job: Future) -> Any:
    try:
        return job.result()
    except KeyboardInterrupt:  # Ctrl-C while waiting: the work in flight finishes first,
        wait([job])  # so nothing else touches its state half-way
        raise


def call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`, run in the compute thread when offloaded."""
    if _here():
        return fn(*args, **kwargs)
    if _spawned.is_set():  # it would wait behind a job that waits for this thread
        raise RuntimeError("the compute thread is running a stream; finish or close it first")
    return _result(_submit(lambda: fn(*args, **kwargs)))


def runs_there(fn: Callable[P, T]) -> Callable[P, T]:
    """Decorator: `fn` always runs in the compute thread when offloaded (`call`)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        return call(fn, *args, **kwargs)

    return wrapper


def iterate(make: Callable[[], Iterator[T]]) -> Iterator[T]:
    """The items of `make()`, each computed in the compute thread when offloaded (one at a
    time: the sync engine)."""
    if _here():
        yield from make()
        return
    items = call(make)
    end = object()
    try:
        while (item := call(next, items, end)) is not end:
            yield item
    finally:
        call(items.close)


def spawn(fn: Callable[[], None], name: str) -> Callable[[], None]:
    """Start `fn` off this thread (the compute thread when offloaded, else a new thread
    called `name`); returns a function that waits for it to end."""
    if _here():
        worker = threading.Thread(target=fn, name=name, daemon=True)
        worker.start()
        return worker.join

    def run() -> None:
        try:
            fn()
        finally:
            _spawned.clear()

    _spawned.set()
    job = _submit(run)

    def join() -> None:
        wait([job])

    return join
