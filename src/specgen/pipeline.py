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

from specgen.config import DEFAULT_MAX_NEW_TOKENS, SamplingParams, SpecConfig
from specgen.device import resolve_device, resolve_dtype
from specgen.drafting import DraftMethod
from specgen.engine.costs import CostCheck, cached_costs
from specgen.engine.run import decode
from specgen.engine.session import Session
from specgen.errors import PromptError, SpecgenError
from specgen.events import StepEvent
from specgen.hub import Notify, resolve_model
from specgen.models.loading import load_target
from specgen.models.transformer import Transformer
from specgen.registry import DEFAULT_ALIAS, MODELS
from specgen.scheduling.cost import CostTable
from specgen.scheduling.scheduler import VerifyScheduler
from specgen.spec import checked_spec, load_method
from specgen.stats import GenStats
from specgen.text import Detokenizer, TextCodec

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
        """Usually made by `load` and `with_spec`. `costs` (measured verify and draft
        times) is what the "cost" verify policy and a choice among several drafters need;
        without it every draft is verified whole. `method` is the loaded draft method
        (loaded here from `spec` when not given)."""
        self.model = model
        self.codec = codec
        self.name = name
        self.context = context
        spec = spec or SpecConfig()
        if method is None:
            spec = checked_spec(spec, name)
            if not spec.is_ar:
                method = load_method(model, spec, name)
        self.spec = spec
        self.method = method
        self.costs = costs
        self.source = source or name  # where the target came from (cost-table key)
        self.learnt: VerifyScheduler | None = None  # the last answer's scheduler: new
        # sessions start from its estimates (VerifyScheduler.learn_from)
        entry = MODELS.get(name)
        # the chat template's thinking mode the registry's drafters were trained with
        self.thinking: bool | None = entry.thinking if entry else None
        self.session = self.new_session()
        self._check: CostCheck | None = None  # measured costs, held against the steps
        self._notify: Notify | None = None

    @classmethod
    def load(
        cls,
        model: str = DEFAULT_ALIAS,
        *,
        device: str = "auto",
        dtype: str = "auto",
        context: int | None = None,
        spec: SpecConfig | None = None,
        notify: Notify | None = None,
        measure_costs: bool = False,
    ) -> Pipeline:
        """Resolve `model` (alias, path, .gguf or Hub repo) and load it.

        Args:
            context: KV-cache capacity in tokens; default min(model limit, 8192).
            spec: the decoding method and its knobs (default: plain AR).
            notify: called with one-line progress messages (conversion, download).
            measure_costs: measure the step costs again instead of using cached ones.
        """
        spec = checked_spec(spec or SpecConfig(), model)  # fail before the slow part
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
        ar = spec if spec.is_ar else None
        base = cls(target, codec, resolved.name, context, ar, source=str(resolved.path))
        if ar is not None:
            return base
        return base.with_spec(spec, notify=notify, measure_costs=measure_costs)

    def with_spec(
        self,
        spec: SpecConfig,
        *,
        notify: Notify | None = None,
        costs: CostTable | None = None,
        measure_costs: bool = False,
    ) -> Pipeline:
        """Another decoding method on this pipeline's loaded target (weights are shared;
        sessions are not). Loads the drafter and, where the policy or a choice among
        drafters needs them, the measured costs (cached; `measure_costs`: measured again;
        and measured again once by itself when the steps disagree with them,
        `engine.costs.CostCheck`). `costs` given instead (fixed prices for tests, another
        machine's for what-if runs) are used as they are, for the drafters it mounts."""
        spec = checked_spec(spec, self.name)
        if spec.is_ar:
            return Pipeline(
                self.model, self.codec, self.name, self.context, spec, source=self.source
            )
        method = load_method(self.model, spec, self.name, notify)
        measured = costs is None and (spec.verify_policy.needs_costs or len(method.mounted) > 1)
        if costs is not None:
            costs = replace(costs, drafts={n: costs.drafts[n] for n in method.mounted})
        elif measured:
            costs = cached_costs(
                self.model, self._cost_key, method, notify, graphs=spec.cuda_graphs,
                fresh=measure_costs,
            )  # fmt: skip
        pipe = Pipeline(
            self.model, self.codec, self.name, self.context, spec, costs, method, self.source
        )
        if measured:
            pipe._check, pipe._notify = CostCheck(), notify
        return pipe

    @property
    def _cost_key(self) -> str:
        return f"{self.name}|{self.source}"

    def _check_costs(self, stats: GenStats, session: Session) -> None:
        """Measured costs that the answers' steps disagree with beyond noise (`CostCheck`)
        are measured again, once per pipeline, and decide from then on."""
        if self._check is None or self.costs is None or self.method is None:
            return
        ratio = self._check.stale(stats, self.costs)
        if ratio is None:
            return
        self._check = None  # once: a machine under changing load must not re-measure forever
        if self._notify:
            self._notify(
                f"decoding steps ran at {ratio:.2f}x the measured step costs: measuring them "
                "again (--measure-costs does this up front)"
            )
        self.costs = cached_costs(
            self.model, self._cost_key, self.method, self._notify,
            graphs=self.spec.cuda_graphs, fresh=True,
        )  # fmt: skip
        for scheduler in (session.scheduler, self.learnt):
            if scheduler is not None:
                scheduler.costs = self.costs

    @property
    def overlaps(self) -> bool:
        """Whether decoding runs in the overlap engine's thread: "auto" overlaps on CUDA
        only. On the CPU torch's kernels run slower from a second thread than from the one
        that formed its thread team, and nothing measurable is gained (docs/results.md)."""
        if self.spec.engine != "auto":
            return self.spec.engine == "overlap"
        return self.model.device.type == "cuda"

    @property
    def resident_steps(self) -> bool:
        """Whether speculative steps keep their state on the device (engine/resident.py):
        the overlap engine on CUDA, for drafters with fixed-shape draft steps. On the CPU
        every op finishes before it returns, so there is nothing to queue ahead."""
        return self.overlaps and self.model.device.type == "cuda"

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
        """The scheduler a new answer starts with (from what the last one learnt unless
        `learn` is False); None when every draft is verified whole and there is no choice
        of drafter to make."""
        policy, several = self.spec.verify_policy, len(self.drafters) > 1
        if (policy.kind == "full" and not several) or (self.costs is None and (
            policy.needs_costs or several
        )):  # fmt: skip
            return None
        scheduler = VerifyScheduler(policy, self.costs)
        if learn and self.learnt is not None:
            scheduler.learn_from(self.learnt)
        return scheduler

    @property
    def drafters(self) -> tuple[str, ...]:
        """The names of the drafters this pipeline drafts with (none for AR)."""
        return () if self.method is None else tuple(self.method.mounted)

    def encode(self, prompt: Prompt, *, raw: bool = False, think: bool | None = None) -> list[int]:
        """Token ids for `prompt`: chat-templated unless `raw` (then the text as is), in
        thinking mode if `think` (None: what the model's drafters were trained with)."""
        if think is None:
            think = bool(self.thinking)
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
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        raw: bool = False,
        think: bool | None = None,
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
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        session: Session | None = None,
    ) -> Iterator[Chunk]:
        if max_new_tokens < 1:
            raise SpecgenError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
        session = session or self.session
        new_ids = session.prepare(prompt_ids)
        params = sampling or SamplingParams()
        if session.drafter is not None and params.seed is not None and not params.greedy:
            # a seeded answer depends on its conversation and seed alone: how many drafts
            # are verified and which drafter drafts decide which draws fall on which token,
            # so the scheduler starts from its prior, not from what earlier answers learnt
            session.scheduler = self._scheduler(learn=False)
        stats = GenStats(prompt_tokens=len(prompt_ids), prefill_tokens=len(new_ids))
        stats.method = self.spec.method
        stats.trace = [] if self.spec.trace else None
        if session.drafter is not None:
            stats.verify_policy = str(session.scheduler.policy if session.scheduler else "full")
        events = decode(
            session,
            new_ids,
            params=params,
            max_new_tokens=max_new_tokens,
            stop_ids=self.codec.stop_ids,
            overlap=self.overlaps,
            resident=self.resident_steps,
        )
        detok = Detokenizer(self.codec)
        output: list[int] = []
        try:
            for event in events:
                output.extend(event.tokens)
                stats.record(event)
                yield _chunk(event, detok, stats)
        finally:
            events.close()  # the overlap engine's thread is done after this
            session.settle(prompt_ids + output)
            if session.scheduler is not None:
                self.learnt = session.scheduler
        self._check_costs(stats, session)  # an answer that ran to its end

    def generate(
        self,
        prompt: Prompt,
        *,
        sampling: SamplingParams | None = None,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        raw: bool = False,
        think: bool | None = None,
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


def _chunk(event: StepEvent, detok: Detokenizer, stats: GenStats) -> Chunk:
    """A step's text: accepted drafts first, then the target's own token, so views can
    colour them apart."""
    drafts = min(event.accepted, len(event.tokens))
    drafted_text = detok.push(list(event.tokens[:drafts])) if drafts else ""
    text = drafted_text + detok.push(list(event.tokens[drafts:]))
    if event.finish is not None:
        text += detok.flush()
    return Chunk(text, event.tokens, stats, draft_chars=len(drafted_text))
