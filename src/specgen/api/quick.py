"""`specgen generate`'s fast start: a greedy AR answer from a fused pass's image, without
torch.

On two cores a cold `generate` spent about 0.9 s of 1.5 importing torch for a pass that runs
in C (decoder.c). When a full load of a GGUF target that runs the fused pass answers a
greedy AR `generate`, it writes the pass's image (models/fused/image.py: the very bytes it
described, about the file's size again; `write_image`); later runs whose options the image
can answer (`open_quick`: AR, greedy, no penalties, the CPU, packed weights, a context the
image's RoPE tables cover) map it and run the same pass through numpy and ctypes. The
answer is the full path's token for token (the same bytes, the same per-row arithmetic,
argmax); `tests/test_quick.py` holds the two to each other. Anything else loads as before.

`QuickPipeline` has the part of `Pipeline`'s interface `generate` uses: `encode`,
`stream_ids`, `codec`, and what the views read.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from specgen.api.chunks import Chunk, Prompt, chunk_of
from specgen.core.config import (
    AR,
    DEFAULT_CONTEXT,
    DEFAULT_MAX_NEW_TOKENS,
    SamplingParams,
    checked_max_new_tokens,
)
from specgen.core.errors import SpecgenError
from specgen.core.events import StepEvent
from specgen.core.paths import specgen_home
from specgen.core.stats import GenStats
from specgen.core.timings import phase
from specgen.engine.answer import Answer, reusable_prefix
from specgen.text.codec import Detokenizer, TextCodec

if TYPE_CHECKING:
    from specgen.hub import ResolvedModel

CHUNK = 512  # prompt tokens per pass (engine/prefill.py's; a row's bits do not depend on it)
IMAGE_LIMIT = 1 << 30  # bytes: images are for models whose cold start is mostly imports
GREEDY = SamplingParams()


def plain_greedy(sampling: SamplingParams) -> bool:
    """Whether `sampling` answers as GREEDY does: the argmax of unchanged logits (a seed or
    top-k/top-p filters change nothing at temperature 0), nothing else reported."""
    return (
        sampling.temperature == 0.0
        and sampling.presence_penalty == 0.0
        and sampling.frequency_penalty == 0.0
        and sampling.repetition_penalty == 1.0
        and sampling.logprobs is None
    )


def image_key(gguf: Path) -> dict[str, Any]:
    """Everything an image's bytes depend on: the file, the kernels' build and what they
    multiply, and specgen's own code (a checkout that changes anything writes anew)."""
    from specgen.kernels import cpu_build
    from specgen.kernels.library import _loaded, activations, kernel_lanes, kv_kind

    lib, variant = _loaded()
    if lib is None:
        raise SpecgenError("no CPU kernels")
    v = next(x for x in cpu_build.variants() if x.name == variant)
    st = gguf.stat()
    return {
        "file": str(gguf.resolve()), "size": st.st_size, "mtime": st.st_mtime_ns,
        "kernels": cpu_build.source_hash(v), "act": activations(), "lanes": kernel_lanes(),
        "kv": kv_kind(), "code": _code_digest(),
    }  # fmt: skip


def _code_digest() -> str:
    """A digest of specgen's Python sources (a few milliseconds)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def image_path(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return specgen_home() / "fast" / f"{Path(key['file']).stem}-{digest}.img"


def gpu_visible() -> bool:
    """Whether torch could find a GPU here (asked without importing torch)."""
    return any(Path(p).exists() for p in ("/dev/nvidiactl", "/proc/driver/nvidia", "/dev/kfd"))


def wants_quick(*, method: str | None, drafter: Any, sampling: SamplingParams, device: str,
                dtype: str, quantize: str | None, dequantize: bool) -> bool:  # fmt: skip
    """Whether the options ask for what an image answers: plain greedy decoding of packed
    weights on the CPU, in fp32."""
    return (
        method in (None, AR)
        and not drafter
        and plain_greedy(sampling)
        and (device == "cpu" or (device == "auto" and not gpu_visible()))
        and dtype in ("auto", "float32")
        and quantize is None
        and not dequantize
        and os.environ.get("SPECGEN_CPU_PASS", "fused").lower() == "fused"
        and os.environ.get("SPECGEN_QUICK", "1") != "0"
    )


def open_quick(resolved: ResolvedModel, context: int | None, threads: int | None,
               thinking: bool | None) -> QuickPipeline | None:  # fmt: skip
    """The quick pipeline for `resolved` when its image is there and covers `context`."""
    from specgen.models.fused.image import Image

    if resolved.gguf is None:
        return None
    with phase("image"):
        image = Image.open(image_path(image_key(resolved.gguf)))
    if image is None:
        return None
    limit = image.header["max_positions"]
    if context is not None and not 1 < context <= limit:
        return None  # the full load says why
    context = context or min(limit, DEFAULT_CONTEXT)
    if context > image.header["rope"]["length"]:
        return None
    with phase("tokenizer"):
        codec = TextCodec(resolved.path, resolved.name)
    codec.stop_ids |= frozenset(image.header["eos"])
    return QuickPipeline(image, codec, resolved.name, context, threads, thinking)


def write_image(model, gguf: Path) -> tuple[Path, int] | None:
    """Write `model`'s image for `gguf` (a full load's packed CPU target), unless the pass
    does not run it or it is too large to be worth one: its path and size."""
    from specgen.models.fused.cpu_pass import FusedPass
    from specgen.models.fused.image import write

    fused = FusedPass.of(model)
    if fused is None:
        return None
    try:
        header, buffers = fused.image(model)
    except ValueError:
        return None
    if sum(b.nbytes for b in buffers) > IMAGE_LIMIT:
        return None
    path = image_path(image_key(gguf))
    size = write(path, header, buffers)
    for old in path.parent.glob(f"{gguf.stem}-*.img"):  # the file's earlier images
        if old != path:
            old.unlink(missing_ok=True)
    return path, size


class QuickPipeline:
    """A greedy AR answerer over an image (see the module's docstring)."""

    method = None  # no drafter
    costs = None  # nothing to compare a speedup with

    def __init__(self, image, codec: TextCodec, name: str, context: int, threads: int | None,
                 thinking: bool | None) -> None:  # fmt: skip
        from specgen.kernels.decoder_cpu import decoder_forward

        self.image, self.codec, self.name, self.thinking = image, codec, name, thinking
        self.forward = decoder_forward()
        if self.forward is None:
            raise SpecgenError("no CPU kernels")
        self.model = image.model()
        s = image.header["pass"]["sizes"]
        shape = (s["layers"], 1, s["kv_heads"], context, s["head_dim"])
        half = bool(s.get("kv_half"))  # the pass's keys and values as fp16 (cpu_pass.kv_dtype)
        self.k, self.v = _zeros(shape, half), _zeros(shape, half)
        rope = image.header["rope"]
        m = self.model
        m.capacity, m.k, m.v = context, self.k.ctypes.data, self.v.ctypes.data
        m.cos, m.sin = image.pointer(rope["cos"]), image.pointer(rope["sin"])
        self.capacity, self.vocab = context, s["vocab"]
        self.threads = threads or _default_threads()
        self.work = image.header["pass"]  # layer_work, min_parallel_work: FusedPass.threads
        self.ids: list[int] = []  # what the cache holds
        self.length = 0

    @property
    def context(self) -> int:
        """The cache's capacity in tokens, as `Pipeline.context`."""
        return self.capacity

    @property
    def vocab_size(self) -> int:
        return self.vocab

    def encode(self, prompt: Prompt, *, raw: bool = False, think: bool | None = None) -> list[int]:
        """As `Pipeline.encode`."""
        think = bool(self.thinking) if think is None else think
        return self.codec.encode_prompt(prompt, raw=raw, think=think)

    def stream_ids(self, prompt_ids: list[int], *, sampling: SamplingParams | None = None,
                   max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                   ignore_eos: bool = False) -> Iterator[Chunk]:  # fmt: skip
        """As `Pipeline.stream_ids` for a greedy AR answer (the cache keeps the longest
        prefix the previous answer shares with this prompt, as a session does);
        `ignore_eos`: stop tokens do not end it."""
        checked_max_new_tokens(max_new_tokens)
        if sampling is not None and not plain_greedy(sampling):
            raise SpecgenError("the fast start answers greedily only")  # open_quick's rule
        new_ids = self._prepare(prompt_ids)
        stats = GenStats(prompt_tokens=len(prompt_ids), prefill_tokens=len(new_ids))
        stats.method = AR
        detok = Detokenizer(self.codec)
        output: list[int] = []
        try:
            stops = frozenset() if ignore_eos else self.codec.stop_ids
            for event in self._decode(new_ids, max_new_tokens, stops):
                output.extend(event.tokens)
                stats.record(event)
                yield chunk_of(event, detok, stats)
        finally:
            sequence = [*prompt_ids, *output]
            self.ids = sequence[: min(self.length, len(sequence))]
            self.length = len(self.ids)

    def _prepare(self, prompt_ids: list[int]) -> list[int]:
        keep = reusable_prefix(self.ids, prompt_ids, self.capacity)  # as a session does
        self.ids, self.length = list(prompt_ids[:keep]), keep
        return list(prompt_ids[keep:])

    def _decode(self, new_ids: list[int], max_new_tokens: int,
                stops: frozenset[int]) -> Iterator[StepEvent]:  # fmt: skip
        answer = Answer(max_new_tokens, stops)
        for start in range(0, len(new_ids), CHUNK):
            logits = self._pass(new_ids[start : start + CHUNK])
        while True:
            token = int(np.argmax(logits[-1]))  # the first of equal maxima, as torch's
            committed, finish = answer.commit([token], self.capacity - self.length)
            yield StepEvent(tokens=committed, finish=finish, bonus=token)
            if finish is not None:
                return
            logits = self._pass([token])

    def _pass(self, ids: list[int]) -> np.ndarray:
        """One forward of `ids` after what the cache holds: the last row's logits [1, V]."""
        t = len(ids)
        x = self.image.embed(ids)
        logits = np.empty((1, self.vocab), np.float32)
        taps = (ctypes.c_int64 * 1)()
        small = t * self.work["layer_work"] < 6 * self.work["min_parallel_work"]
        threads = 1 if small else self.threads  # FusedPass.threads' rule, without its tuner
        failed = self.forward(ctypes.byref(self.model), x.ctypes.data, t, self.length, taps, 0,
                              None, 1, logits.ctypes.data, threads)  # fmt: skip
        if failed:
            raise MemoryError("fused decoder pass: out of memory for its buffers")
        self.ids.extend(ids)
        self.length += t
        return logits


def _zeros(shape: tuple[int, ...], half: bool = False) -> np.ndarray:
    """fp32 (or fp16, `half`) zeros whose pages come as they are first written: a cache
    sized for 8192 positions is mostly never touched (numpy's own zeros asks for huge pages,
    and faulting in 2 MB of zeros per layer and head cost most of a second)."""
    import mmap

    count, kind = int(np.prod(shape)), np.uint16 if half else np.float32
    size = np.dtype(kind).itemsize
    return np.frombuffer(mmap.mmap(-1, max(size * count, 1)), kind, count).reshape(shape)


def _default_threads() -> int:
    """torch's default: OMP_NUM_THREADS, else one per core this process may run on."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
