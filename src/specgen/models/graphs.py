"""CUDA-graph replay (`Replay`), and the target's forward for the decoding loops with its
decode and verify steps as CUDA graphs (`GraphedForward`).

A decode step of a 4-8B model is ~36 layers x ~12 kernels: launched one by one from Python
that is more host time than the step's own GPU time at bf16. A CUDA graph replays all of
them with one launch. A graph bakes in every shape and pointer, so a step of T tokens is
captured once per T (1: AR decode, 1 + l: a verify of l drafts) over `step_static`,
which reads its position from a device tensor, writes K/V with `index_copy_` and attends
with a mask (or the Triton kernel) computed from that tensor: the same graph serves every
cache length. Inputs are copied into the graph's static buffers before a replay; outputs
are copied out after it, so the next replay cannot overwrite what a caller still holds.

Prefills (any step on an empty cache or with `num_logits`), padded batches and steps
longer than `max_tokens` run the ordinary eager forward. `capture=False` runs the same
static path eagerly: that is how the CPU tests it, and what `--no-cuda-graphs` avoids (it
keeps the plain eager forward instead). The graphs belong to one cache: a session's.
A capture that fails (an op this torch/driver/kernel setup cannot capture) is not fatal:
the session warns once and goes on eagerly, with the same output.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from specgen.models.cache.kv import StaticKVCache
from specgen.models.transformer import ForwardOutput, Transformer

WARMUP_RUNS = 2  # eager runs on a side stream before capture (allocator and autotune warm-up)


class Replay:
    """`fn`, which reads and writes only tensors that outlive it (static buffers), captured
    as a CUDA graph and replayed; or, with `pool` None, simply called. A replay returns the
    outputs captured, which the next replay overwrites."""

    def __init__(self, fn: Callable[[], Any], pool=None) -> None:
        self.fn = fn
        self.graph: torch.cuda.CUDAGraph | None = None
        if pool is None:
            return
        side = torch.cuda.Stream()  # warm-up (allocator, autotuning) off the main stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: the overlap engine captures in its compute thread while the main
        # thread may still be printing; only this thread's calls must be capture-safe
        with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
            self.out = fn()

    def __call__(self) -> Any:
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.out


class _Step:
    """One step size: static inputs, and the replay that fills the outputs from them."""

    def __init__(
        self,
        model: Transformer,
        cache: StaticKVCache,
        tokens: torch.Tensor,  # [1, T]: the first call's, also used to warm up
        start: int | torch.Tensor,  # its position (a host int, or [1] int64 on the device)
        taps: tuple[int, ...],
        pool,
    ) -> None:
        self.tokens = tokens.clone()
        self.start = torch.zeros(1, dtype=torch.long, device=tokens.device)
        self._place(start)
        # Warm-up and capture write K/V at [start, start + T): the range this call reserved,
        # and which the replay overwrites with the same values.
        self.replay = Replay(
            lambda: model.step_static(self.tokens, cache, self.start, taps=taps), pool
        )

    @property
    def graph(self) -> torch.cuda.CUDAGraph | None:
        return self.replay.graph

    def __call__(self, tokens: torch.Tensor, start: int | torch.Tensor) -> ForwardOutput:
        self.tokens.copy_(tokens, non_blocking=True)
        self._place(start)
        out = self.replay()
        if self.graph is None:
            return out
        return ForwardOutput(
            logits=out.logits.clone(), taps={i: h.clone() for i, h in out.taps.items()}
        )

    def _place(self, start: int | torch.Tensor) -> None:
        set_input(self.start, start)


def set_input(buffer: torch.Tensor, value: int | torch.Tensor) -> None:
    """Put a graph input in place: a host int (filled in, no copy) or a device tensor (copied
    on the device, which the host never reads)."""
    if isinstance(value, torch.Tensor):
        buffer.copy_(value.view(buffer.shape))
    else:
        buffer.fill_(value)


class GraphedForward:
    """Called like `Transformer` by the decoding loops; owns one session's step graphs."""

    def __init__(
        self, model: Transformer, cache: StaticKVCache, *, max_tokens: int, capture: bool
    ) -> None:
        if capture and model.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.model, self.cache = model, cache
        self.max_tokens = max_tokens  # the longest step graphed: 1 + the most drafts
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._steps: dict[tuple[int, tuple[int, ...]], _Step] = {}
        self.failed: str | None = None  # why a capture failed: eager from then on
        cache.make_finite()  # the masked attention reads dead positions (weighted by 0)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @property
    def captured(self) -> int:
        """Step sizes captured so far (0 when running eagerly)."""
        return sum(1 for s in self._steps.values() if s.graph is not None)

    def __call__(
        self,
        tokens: torch.Tensor,  # [B, T]
        cache: StaticKVCache,
        *,
        taps: tuple[int, ...] = (),
        num_logits: int | None = None,
        pad: torch.Tensor | None = None,
    ) -> ForwardOutput:
        t = tokens.shape[1]
        static = (
            cache is self.cache
            and tokens.shape[0] == 1
            and 1 <= t <= self.max_tokens
            and cache.length > 0
            and num_logits is None
            and pad is None
        )
        if not static or self.failed:  # a prefill or anything unusual: the eager forward
            return self.model(tokens, cache, taps=taps, num_logits=num_logits, pad=pad)
        start = cache.reserve(t)
        step = self._step(tokens, start, tuple(taps))
        if step is None:
            cache.rollback(start)  # drop the reservation; the eager forward writes
            return self.model(tokens, cache, taps=taps)
        out = step(tokens, start)
        cache.stepped()
        cache.commit(start + t)
        return out

    @torch.inference_mode()
    def forward_static(
        self,
        tokens: torch.Tensor,  # [1, T]
        cache: StaticKVCache,
        start: torch.Tensor,  # [1] int64 on the device
        *,
        taps: tuple[int, ...] = (),
    ) -> ForwardOutput:
        """`Transformer.forward_static` (the device-resident loop's step), replayed from
        this session's graph for T tokens when there is one."""
        t = tokens.shape[1]
        if cache is not self.cache or not 1 <= t <= self.max_tokens or self.failed:
            return self.model.forward_static(tokens, cache, start, taps=taps)
        step = self._step(tokens, start, tuple(taps))
        if step is None:
            return self.model.forward_static(tokens, cache, start, taps=taps)
        out = step(tokens, start)
        cache.stepped()
        return out

    def _step(
        self, tokens: torch.Tensor, start: int | torch.Tensor, taps: tuple[int, ...]
    ) -> _Step | None:
        """The graph for this step size, captured now if new; None if capture failed."""
        key = (tokens.shape[1], taps)
        step = self._steps.get(key)
        if step is None:
            try:
                step = _Step(self.model, self.cache, tokens, start, taps, self._pool)
            except RuntimeError as e:  # an op this setup cannot capture: decode eagerly
                self.failed = graphs_failed(e)
                return None
            self._steps[key] = step
        return step


def graphs_failed(error: Exception) -> str:
    """Warn, once per session, that a capture failed and decoding goes on eagerly (the
    same tokens, only slower); returns the reason."""
    reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    warnings.warn(
        f"CUDA graph capture failed ({reason}); this session decodes without graphs "
        "(same output; --no-cuda-graphs skips the attempt)",
        RuntimeWarning,
        stacklevel=3,
    )
    return reason


GREEDY = "greedy"  # the key of a drafter's greedy step


class StepGraphs:
    """A drafter's fixed-shape draft steps, one per key (greedy, or a sampling setting),
    each built once by the drafter (`build(key, capture)`) and replayed. With `capture`
    they are CUDA graphs; without, the same steps run as they are (the CPU tests, and the
    device-resident loop with graphs off). The first capture that fails (an op this setup
    cannot capture) turns them off for good, warned once, and that step and every later
    one run eagerly with the same output: what every drafter's graphs share."""

    def __init__(self, build: Callable[[Any, bool], Callable[..., Any]], *, on: bool,
                 capture: bool = True) -> None:  # fmt: skip
        self.build = build
        self.on = on  # steps replayed (graphs on), else drafted the ordinary way
        self.capture = capture
        self._steps: dict[Any, Callable[..., Any]] = {}  # replayed while `on`
        self._eager: dict[Any, Callable[..., Any]] = {}  # after a failure, or graphs off

    def uncaptured(self) -> StepGraphs:
        """The same steps, on, run as they are: their shapes tested without a GPU."""
        return StepGraphs(self.build, on=True, capture=False)

    def step(self, key: Any) -> Callable[..., Any]:
        """The step for `key` as it runs now (built on first use)."""
        steps, capture = (self._steps, self.capture) if self.on else (self._eager, False)
        if key not in steps:
            steps[key] = self.build(key, capture)
        return steps[key]

    def keys(self) -> list[Any]:
        return list(self._steps if self.on else self._eager)

    def replay(self, key: Any, *args: Any) -> Any | None:
        """The step for `key` on `args` while graphs are on; None when they are off, or
        when this capture just failed (the caller then drafts the ordinary way)."""
        if not self.on:
            return None
        try:
            return self.step(key)(*args)
        except RuntimeError as e:  # a capture this setup cannot do: eagerly from now on
            self.on = False
            self._steps.clear()
            graphs_failed(e)
            return None

    def __call__(self, key: Any, *args: Any) -> Any:
        """The step for `key` on `args`: replayed, else the same step run as it is."""
        out = self.replay(key, *args)
        return self.step(key)(*args) if out is None else out
