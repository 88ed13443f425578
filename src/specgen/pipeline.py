"""The public entry point: a loaded target, its tokenizer, and generation on top.

pipe = Pipeline.load("smollm2-135m")
print(pipe.generate("Why is the sky blue?", max_new_tokens=64).text)
for chunk in pipe.stream("Tell me a joke"):
    print(chunk.text, end="", flush=True)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from specgen.config import SamplingParams, SpecConfig
from specgen.drafting import DRAFTERS, method_of
from specgen.drafting.base import DraftMethod
from specgen.engine import compute
from specgen.engine.ar import generate_ar
from specgen.engine.events import StepEvent
from specgen.engine.loop import generate_speculative
from specgen.engine.overlap import overlapped
from specgen.engine.resident import generate_resident, resident_ready
from specgen.engine.session import Session
from specgen.errors import PromptError, SpecgenError
from specgen.hub import Notify, resolve_drafter, resolve_model
from specgen.models.loading import load_target
from specgen.models.transformer import Transformer
from specgen.registry import DEFAULT_ALIAS, MODELS
from specgen.scheduling.cost import CostTable, cached_costs
from specgen.scheduling.scheduler import VerifyScheduler
from specgen.stats import GenStats
from specgen.text import Detokenizer, TextCodec

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

METHODS = ("ar", *DRAFTERS)  # what --method accepts: plain decoding + registered drafters

DEFAULT_CONTEXT = 8192  # positions the KV cache is sized for unless --context says more

Prompt = str | list[dict[str, str]]  # text, or a chat conversation


@dataclass(frozen=True)
class Chunk:
    """One step of a stream: the text it added and the tokens it committed."""

    text: str
    token_ids: tuple[int, ...]
    stats: GenStats  # running totals; final once stats.finish_reason is set
    draft_chars: int = 0  # text[:draft_chars] came from accepted draft tokens


@dataclass(frozen=True)
class Completion:
    prompt: Prompt
    text: str
    token_ids: list[int]
    stats: GenStats

    def to_dict(self) -> dict[str, Any]:
        record = {
            "prompt": self.prompt,
            "text": self.text,
            "token_ids": self.token_ids,
            "stats": self.stats.to_dict(),
        }
        if self.stats.trace is not None:
            record["trace"] = self.stats.trace
        return record


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecgenError(f"--device {device}: this torch build sees no CUDA GPU")
    if device != "cpu" and not device.startswith("cuda"):
        raise SpecgenError(f"--device must be auto, cpu or cuda[:N] (got {device!r})")
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        # bf16 halves the bytes a GPU step reads; on CPUs without bf16 matmul units it is
        # slower than fp32 (benchmarks/ar_vs_transformers.py measures both).
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise SpecgenError(f"--dtype must be one of auto, {', '.join(DTYPES)} (got {dtype!r})")
    return DTYPES[dtype]


def _checked_spec(spec: SpecConfig, model: str) -> SpecConfig:
    """The method exists; given drafters name their method; a method that needs drafters
    has them (the registry's for `model` when none were given)."""
    if spec.method not in METHODS:
        raise SpecgenError(f"unknown method {spec.method!r}; available: {', '.join(METHODS)}")
    if spec.method == "ar" and isinstance(spec.drafter, tuple):  # the method mounting as many
        fits = [m for m, cls in DRAFTERS.items() if cls.drafters_needed == len(spec.drafter)]
        if not fits:
            raise SpecgenError(f"no method mounts {len(spec.drafter)} drafters")
        spec = replace(spec, method=fits[0])
    elif spec.drafter is not None and spec.method == "ar":  # the drafter says what it is
        drafter_dir = resolve_drafter(spec.drafter)
        spec = replace(spec, method=method_of(drafter_dir), drafter=str(drafter_dir))
    if spec.method == "ar":
        return spec
    cls = DRAFTERS[spec.method]
    given = spec.drafter if isinstance(spec.drafter, tuple) else (spec.drafter,)
    if spec.drafter is not None and len(given) != cls.drafters_needed:
        raise SpecgenError(
            f"--method {spec.method} takes {cls.drafters_needed} --drafter, got {len(given)}"
        )
    if spec.drafter is not None or not cls.needs_drafter:
        return spec
    entry = MODELS.get(model.lower())
    drafter = None
    if entry is not None:  # a method mounting several checkpoints picks them itself
        pick = getattr(cls, "registry_drafter", None)
        drafter = pick(entry.drafters) if pick else entry.drafters.get(spec.method)
    if drafter is None:
        raise SpecgenError(
            f"no {spec.method} drafter is known for {model}; pass --drafter PATH|REPO"
        )
    return replace(spec, drafter=drafter)


class Pipeline:
    def __init__(
        self,
        model: Transformer,
        codec: TextCodec,
        name: str,
        context: int,
        spec: SpecConfig | None = None,
        costs: CostTable | None = None,
        method: DraftMethod | None = None,
        source: str | None = None,
    ) -> None:
        """Usually made by `load`. `costs` (measured verify and draft times) is what the
        "cost" verify policy needs; without it every draft is verified whole. `method` is
        the loaded draft method (loaded here from `spec` when not given)."""
        self.model = model
        self.codec = codec
        self.name = name
        self.context = context
        self.spec = spec or SpecConfig()
        if self.spec.method not in METHODS:
            raise SpecgenError(
                f"unknown method {self.spec.method!r}; available: {', '.join(METHODS)}"
            )
        if method is None and self.spec.method != "ar":
            method = DRAFTERS[self.spec.method].load(model, self.spec, target_name=name)
        self.method = method
        self.costs = costs
        self.source = source or name  # where the target came from (cost-table key)
        self.learnt: VerifyScheduler | None = None  # the last answer's scheduler: new
        # sessions start from its estimates (VerifyScheduler.learn_from)
        self.session = self.new_session()

    @classmethod
    @compute.runs_there
    def load(
        cls,
        model: str = DEFAULT_ALIAS,
        *,
        device: str = "auto",
        dtype: str = "auto",
        context: int | None = None,
        spec: SpecConfig | None = None,
        notify: Notify | None = None,
    ) -> Pipeline:
        """Resolve `model` (alias, path, .gguf or Hub repo) and load it.

        Args:
            context: KV-cache capacity in tokens; default min(model limit, 8192).
            spec: the decoding method and its knobs (default: plain AR).
            notify: called with one-line progress messages (conversion, download).
        """
        spec = _checked_spec(spec or SpecConfig(), model)  # fail before the slow part
        resolved = resolve_model(model, notify=notify)
        dev = resolve_device(device)
        target = load_target(
            resolved.path, dtype=resolve_dtype(dtype, dev), device=dev, name=resolved.name
        )
        limit = target.args.max_positions
        if context is not None and not 1 < context <= limit:
            raise SpecgenError(f"--context must be in [2, {limit}] for {resolved.name}")
        codec = TextCodec(resolved.path, resolved.name, target.args.eos_token_ids)
        context = context or min(limit, DEFAULT_CONTEXT)
        # plain AR keeps the spec too: its engine, CUDA graphs and tracing settings
        ar = spec if spec.method == "ar" else None
        base = cls(target, codec, resolved.name, context, ar, source=str(resolved.path))
        return base if ar is not None else base.with_spec(spec, notify=notify)

    @compute.runs_there
    def with_spec(self, spec: SpecConfig, *, notify: Notify | None = None) -> Pipeline:
        """Another decoding method on this pipeline's loaded target (weights are shared;
        sessions are not). Loads the drafter and, for the cost policy, the cost table."""
        spec = _checked_spec(spec, self.name)
        if spec.method == "ar":
            return Pipeline(
                self.model, self.codec, self.name, self.context, spec, source=self.source
            )
        method = DRAFTERS[spec.method].load(self.model, spec, target_name=self.name, notify=notify)
        costs = None
        if spec.verify_policy.needs_costs:
            drafter_key = f"{spec.method}|{spec.drafter}|{spec.block_size}|{spec.draft_tokens}"
            costs = cached_costs(
                self.model,
                f"{self.name}|{self.source}",
                method.max_draft_tokens,
                notify,
                method=method,
                drafter_key=drafter_key,
                graphs=spec.cuda_graphs,
            )
        return Pipeline(
            self.model, self.codec, self.name, self.context, spec, costs, method, self.source
        )

    @property
    def overlaps(self) -> bool:
        """Whether decoding runs in the overlap engine's compute thread. "auto" overlaps on
        CUDA, and on the CPU when the caller has offloaded its torch work to the compute
        thread (`engine/compute.py`; the CLI does): otherwise the compute thread's OpenMP
        kernels run ~1.5x slower beside the caller's idle team, which outweighs the host
        work hidden."""
        engine = self.spec.engine
        if engine != "auto":
            return engine == "overlap"
        return self.model.device.type == "cuda" or compute.offloaded()

    @property
    def resident_steps(self) -> bool:
        """Whether speculative steps keep their state on the device (engine/resident.py):
        the overlap engine on CUDA, for drafters with fixed-shape draft steps. On the CPU
        every op finishes before it returns, so there is nothing to queue ahead."""
        return self.overlaps and self.model.device.type == "cuda"

    @compute.runs_there
    def new_session(self) -> Session:
        """A fresh KV cache (and drafter state), e.g. for an independent chat."""
        graphs = self.spec.cuda_graphs and self.model.device.type == "cuda"
        if self.method is None:
            return Session(self.model, self.context, graphs=graphs)
        drafter = self.method.new_drafter(self.context)
        return Session(self.model, self.context, drafter, self._scheduler(), graphs=graphs)

    def renew(self, session: Session) -> Session:
        """`session` emptied and with a new scheduler (from the estimates the last answer
        left, `learnt`), as `new_session` would make it, but keeping its buffers and so its
        CUDA graphs (captured per session)."""
        session.reset()
        if session.drafter is not None:
            session.scheduler = self._scheduler()
        return session

    def _scheduler(self, *, learn: bool = True) -> VerifyScheduler | None:
        policy = self.spec.verify_policy
        if policy.kind != "full" and (self.costs is not None or not policy.needs_costs):
            scheduler = VerifyScheduler(policy, self.costs)
            if learn and self.learnt is not None:
                scheduler.learn_from(self.learnt)
            return scheduler
        return None  # every draft verified whole

    def _forget_learnt(self, session: Session) -> None:
        """A seeded answer depends on its conversation and its seed alone, not on what was
        asked before: how many drafts are verified (the scheduler) and which drafter drafts
        (stacked's selector) decide which of the generator's draws fall on which token, so
        both start from their priors instead of from what earlier answers learnt."""
        session.scheduler = self._scheduler(learn=False)
        forget = getattr(session.drafter, "forget", None)  # drafters that adapt per answer
        if forget is not None:
            forget()

    def encode(self, prompt: Prompt, *, raw: bool = False, think: bool = False) -> list[int]:
        """Token ids for `prompt`: chat-templated unless `raw` (then the text as is)."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise PromptError("empty prompt")
            if raw:
                return self.codec.encode_raw(prompt)
            prompt = [{"role": "user", "content": prompt}]
        return self.codec.encode_chat(prompt, think=think)

    def stream(
        self,
        prompt: Prompt,
        *,
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 256,
        raw: bool = False,
        think: bool = False,
        session: Session | None = None,
    ) -> Iterator[Chunk]:
        """Yield text as it is generated; the last chunk's stats carry the finish reason."""
        ids = self.encode(prompt, raw=raw, think=think)
        yield from self.stream_ids(
            ids, sampling=sampling, max_new_tokens=max_new_tokens, session=session
        )

    def stream_ids(
        self,
        prompt_ids: list[int],
        *,
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 256,
        session: Session | None = None,
    ) -> Iterator[Chunk]:
        if max_new_tokens < 1:
            raise SpecgenError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
        session = session or self.session
        new_ids = session.prepare(prompt_ids)
        params, stop_ids = sampling or SamplingParams(), self.codec.stop_ids
        if session.drafter is not None and params.seed is not None and not params.greedy:
            self._forget_learnt(session)
        stats = GenStats(prompt_tokens=len(prompt_ids), prefill_tokens=len(new_ids))
        if session.drafter is not None:
            policy = session.scheduler.policy if session.scheduler else "full"
            stats.verify_policy = str(policy)
        if self.spec.trace:
            stats.trace = []
        detok = Detokenizer(self.codec)
        output: list[int] = []
        if session.drafter is None:

            def make_events() -> Iterator[StepEvent]:
                return generate_ar(
                    session.forward,
                    session.cache,
                    new_ids,
                    params=params,
                    max_new_tokens=max_new_tokens,
                    stop_ids=stop_ids,
                )
        else:
            resident = self.resident_steps and resident_ready(session.drafter)
            loop = generate_resident if resident else generate_speculative

            def make_events() -> Iterator[StepEvent]:
                return loop(
                    session.forward,
                    session.cache,
                    session.drafter,
                    new_ids,
                    params=params,
                    max_new_tokens=max_new_tokens,
                    stop_ids=stop_ids,
                    scheduler=session.scheduler,
                )

        if self.overlaps:
            events = overlapped(make_events)
        else:  # one step at a time (in the compute thread when offloaded)
            events = compute.iterate(make_events)
        try:
            for event in events:
                context = len(prompt_ids) + len(output) - 1  # the cache, the anchor not yet in
                output.extend(event.tokens)
                stats.record_step(
                    len(event.tokens),
                    event.drafted,
                    event.accepted,
                    event.finish,
                    event.confidence,
                    event.drafter,
                )
                if stats.steps > 1:  # the first event is the prefill's
                    drafter = (event.drafter or self.spec.method) if event.proposal else None
                    shape = (context, drafter, len(event.proposal), event.drafted)
                    stats.shapes.append((*shape, len(event.tokens)))
                if stats.trace is not None:
                    stats.trace.append(self._trace_record(event))
                # accepted drafts first, then the target's own token: views colour them apart
                drafts = min(event.accepted, len(event.tokens))
                drafted_text = detok.push(list(event.tokens[:drafts])) if drafts else ""
                text = drafted_text + detok.push(list(event.tokens[drafts:]))
                if event.finish is not None:
                    text += detok.flush()
                yield Chunk(text, event.tokens, stats, draft_chars=len(drafted_text))
        finally:
            events.close()  # the overlap engine's compute thread is done after this
            session.settle(prompt_ids + output)
            if session.scheduler is not None:
                self.learnt = session.scheduler

    def _trace_record(self, event: StepEvent) -> dict[str, Any]:
        """What `--trace` shows for one step (the first step of an answer is the prefill)."""
        record = {
            "drafter": event.drafter or self.spec.method,
            "draft": list(event.proposal),
            "verify_length": event.drafted,
            "accepted": event.accepted,
            "bonus": event.bonus,
            "committed": list(event.tokens),
        }
        if event.confidence:  # the drafter's c_j for each proposed token
            record["confidence"] = [round(c, 6) for c in event.confidence]
        return record

    def generate(
        self,
        prompt: Prompt,
        *,
        sampling: SamplingParams | None = None,
        max_new_tokens: int = 256,
        raw: bool = False,
        think: bool = False,
        session: Session | None = None,
    ) -> Completion:
        """Generate to completion (same options as `stream`)."""
        ids: list[int] = []
        stats = GenStats()
        chunks = self.stream(
            prompt,
            sampling=sampling,
            max_new_tokens=max_new_tokens,
            raw=raw,
            think=think,
            session=session,
        )
        for chunk in chunks:
            ids.extend(chunk.token_ids)
            stats = chunk.stats
        return Completion(prompt, self.codec.decode(ids), ids, stats)
