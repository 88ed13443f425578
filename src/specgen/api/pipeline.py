"""The public entry point: a loaded target, its tokenizer, and generation on top.

pipe = Pipeline.load("smollm2-135m")
print(pipe.generate("Why is the sky blue?", max_new_tokens=64).text)
for chunk in pipe.stream("Tell me a joke"):
    print(chunk.text, end="", flush=True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from specgen.api.chunks import Chunk, Completion, Prompt, chunk_of
from specgen.api.loader import Decoding, Target, load_decoding, load_target
from specgen.api.spec import checked_spec
from specgen.core.config import (
    DEFAULT_MAX_NEW_TOKENS,
    MAX_LOGPROBS,
    SamplingParams,
    SpecConfig,
    checked_max_new_tokens,
)
from specgen.core.errors import OptionError, PromptError, SpecgenError
from specgen.core.events import TokenLogprob
from specgen.core.stats import GenStats
from specgen.drafting import DraftMethod
from specgen.engine.costs import Busy, CostWatch
from specgen.engine.run import decode
from specgen.engine.score import score_prompt
from specgen.engine.session import Session
from specgen.hub import Notify
from specgen.models.transformer import Transformer
from specgen.registry import DEFAULT_ALIAS, MODELS
from specgen.scheduling.cost import CostTable
from specgen.scheduling.learning import Schedulers
from specgen.text.codec import Detokenizer, TextCodec
from specgen.verify.constraint import Constraint

if TYPE_CHECKING:
    from specgen.api.streams import Streams


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
        *,
        watch: CostWatch | None = None,
    ) -> None:
        """What was loaded, to run: usually made by `load` and `with_spec` (specgen.api.loader
        loads). `spec` is taken as checked (`spec.checked_spec`); `method` is its loaded
        draft method (None for AR); `costs` (measured verify and draft times) is what the
        "cost" verify policy and a choice among several drafters need: without it every
        draft is verified whole. `watch` measures them again when they go stale."""
        spec = spec or SpecConfig()
        if method is None and not spec.is_ar:
            raise SpecgenError(
                f"Pipeline takes {spec.method}'s loaded draft method: Pipeline.load or "
                "with_spec loads it"
            )
        self.model = model
        self.codec = codec
        self.name = name
        self.context = context
        self.spec = spec
        self.method = method
        self.source = source or name  # where the target came from (cost-table key)
        # the scheduler each answer starts with, and what the last one learnt; a measured
        # table (one with its `watch`) is also corrected by the steps as they run
        self.schedulers = Schedulers(
            spec.verify_policy, costs, len(self.drafters), observe=watch is not None
        )
        self._watch = watch
        # whether requests wait for this pipeline (a server sets it): a cost table measured
        # again mid-serve gives way to them (engine/costs.CostWatch)
        self.busy: Busy | None = None
        entry = MODELS.get(name)
        # the chat template's thinking mode the registry's drafters were trained with
        self.thinking: bool | None = entry.thinking if entry else None
        self.session = self.new_session()

    @property
    def vocab_size(self) -> int:
        """The ids a prompt may hold: [0, vocab_size)."""
        return self.model.args.vocab_size

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
        quantize: str | None = None,
        dequantize: bool = False,
    ) -> Pipeline:
        """Resolve `model` (alias, path, .gguf or Hub repo) and load it.

        Args:
            context: KV-cache capacity in tokens; default min(model limit, 8192).
            quantize: "int8" or "int4": pack a full-precision target's matrices on load.
            dequantize: run a GGUF target dequantized to `dtype` instead of packed.
            spec: the decoding method and its knobs (default: plain AR).
            notify: called with one-line progress messages (conversion, download).
            measure_costs: measure the step costs again instead of using cached ones.
        """
        spec = checked_spec(spec or SpecConfig(), model)  # fail before the slow part
        target = load_target(
            model,
            device=device,
            dtype=dtype,
            context=context,
            notify=notify,
            quantize=quantize,
            dequantize=dequantize,
        )
        loaded = load_decoding(target, spec, notify=notify, measure_costs=measure_costs)
        return cls._of(target, loaded)

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
        `engine.costs.CostWatch`). `costs` given instead (fixed prices for tests, another
        machine's for what-if runs) are used as they are, for the drafters it mounts."""
        spec = checked_spec(spec, self.name)
        loaded = load_decoding(
            self._target, spec, notify=notify, costs=costs, measure_costs=measure_costs
        )
        return Pipeline._of(self._target, loaded)

    @classmethod
    def _of(cls, target: Target, loaded: Decoding) -> Pipeline:
        return cls(
            target.model, target.codec, target.name, target.context, loaded.spec,
            loaded.costs, loaded.method, target.source, watch=loaded.watch,
        )  # fmt: skip

    @property
    def costs(self) -> CostTable | None:
        """The cost table the schedulers decide from (replaced when measured again)."""
        return self.schedulers.costs

    @costs.setter
    def costs(self, costs: CostTable | None) -> None:
        self.schedulers.costs = self.schedulers.seeded_costs = costs  # prices handed in

    @property
    def _target(self) -> Target:
        """What this pipeline runs on, for another method on the same weights."""
        return Target(self.model, self.codec, self.name, self.context, self.source)

    @property
    def _cost_key(self) -> str:
        return self._target.cost_key

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
        return Session(self.model, self.context, drafter, self.schedulers.new(), graphs=graphs)

    def renew(self, session: Session) -> Session:
        """`session` emptied and with a new scheduler (from the estimates the last answer
        left, `Schedulers.learnt`), as `new_session` would make it, but keeping its buffers
        and so its CUDA graphs (captured per session)."""
        session.reset()
        if session.drafter is not None:
            session.scheduler = self.schedulers.new()
        return session

    @property
    def drafters(self) -> tuple[str, ...]:
        """The names of the drafters this pipeline drafts with (none for AR)."""
        return () if self.method is None else tuple(self.method.mounted)

    def encode(self, prompt: Prompt, *, raw: bool = False, think: bool | None = None) -> list[int]:
        """Token ids for `prompt`: chat-templated unless `raw` (then the text as is), in
        thinking mode if `think` (None: what the model's drafters were trained with)."""
        think = bool(self.thinking) if think is None else think
        return self.codec.encode_prompt(prompt, raw=raw, think=think)

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
        ignore_eos: bool = False,
        constraint: Constraint | None = None,
        cancel: Callable[[], bool] | None = None,
        remember: bool = True,
    ) -> Iterator[Chunk]:
        """`ignore_eos`: stop tokens do not end the answer (vLLM's field; load testers ask
        for exactly `max_new_tokens`); the context filling up still does. `constraint`:
        what the answer may say, applied to every row the target scores (every method
        stays exactly constrained AR: verify/constraint.py). `cancel`: asked between
        prefill chunks; when it returns True, `Cancelled` is raised and the session keeps
        the chunks done (engine/prefill.py). `remember`: the drafter may keep the answer
        for later ones (suffix's store); off, the next answer drafts as if this one had not
        been given (a bench's repeats of one prompt)."""
        checked_max_new_tokens(max_new_tokens)
        session = session or self.session
        params = sampling or SamplingParams()
        new_ids, stats = self.prepare_answer(session, prompt_ids, params)
        events = decode(
            session,
            new_ids,
            params=params,
            max_new_tokens=max_new_tokens,
            stop_ids=frozenset() if ignore_eos else self.codec.stop_ids,
            overlap=self.overlaps,
            resident=self.resident_steps,
            constraint=constraint,
            cancel=cancel,
        )
        detok = Detokenizer(self.codec)
        output: list[int] = []
        try:
            for event in events:
                output.extend(event.tokens)
                stats.record(event)
                yield chunk_of(event, detok, stats)
        finally:
            events.close()  # the overlap engine's thread is done after this
            self.settle_answer(session, prompt_ids, output, remember=remember)
        self.judge_costs(stats, session)

    def prepare_answer(
        self, session: Session, prompt_ids: list[int], params: SamplingParams
    ) -> tuple[list[int], GenStats]:
        """`session` ready to answer `prompt_ids` (its cached prefix kept, its scheduler
        chosen): the ids still to prefill, and the answer's stats, started."""
        new_ids = session.prepare(prompt_ids)
        if session.drafter is not None:  # a seeded sampling answer starts from the prior
            session.scheduler = self.schedulers.for_answer(session.scheduler, params)
        stats = GenStats(prompt_tokens=len(prompt_ids), prefill_tokens=len(new_ids))
        stats.method = self.spec.method
        stats.trace = [] if self.spec.trace else None
        if session.drafter is not None:
            stats.verify_policy = str(session.scheduler.policy if session.scheduler else "full")
        return new_ids, stats

    def settle_answer(
        self, session: Session, prompt_ids: list[int], output: list[int], *, remember: bool = True
    ) -> None:
        """An answer on `session` ended (done or cut off) after `prompt_ids` + `output`: the
        cache trusted only for what it holds, what the scheduler learnt kept for the next
        answers, and with `remember` the answer given to the drafter (suffix's store)."""
        session.settle(prompt_ids + output)
        self.schedulers.finished(session.scheduler)
        if session.drafter is not None and remember:
            session.drafter.answered(prompt_ids, output)

    def judge_costs(self, stats: GenStats, session: Session) -> None:
        """An answer that ran to its end, alone: its steps judge the cost table (measured
        again when they disagree, engine/costs.CostWatch)."""
        if self._watch is not None:
            self._watch.after(stats, self.schedulers, session.scheduler, busy=self.busy)

    def streams(self, parallel: int = 4) -> Streams:
        """Up to `parallel` answers at once on this pipeline, their steps batched
        (api/streams.py; `Streams(pipes, ...)` serves several methods of one target)."""
        from specgen.api.streams import Streams

        return Streams(self, parallel)

    def generate_many(
        self, prompts: list[Prompt], *, parallel: int = 4, **options: Any
    ) -> list[Completion]:
        """Every prompt's completion, `parallel` answered at once (`generate`'s options;
        each answer is the one `generate` gives alone)."""
        from specgen.api.streams import generate_many

        return generate_many(self, prompts, parallel=parallel, **options)

    def prompt_logprobs(
        self, prompt_ids: list[int], *, top: int = 0, session: Session | None = None
    ) -> list[TokenLogprob]:
        """The target's logprob of each token of `prompt_ids` after the first, given the
        tokens before it, with the `top` likeliest tokens at each position (raw
        distribution, as `SamplingParams.logprobs`). One prefill of the whole prompt: the
        session then holds it, so answering the same prompt next prefills one token."""
        if not 0 <= top <= MAX_LOGPROBS:
            raise OptionError("logprobs", f"must be in [0, {MAX_LOGPROBS}]", top)
        if not prompt_ids:
            raise PromptError("empty prompt")
        return score_prompt(session or self.session, list(prompt_ids), top)

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
        logprobs: list[TokenLogprob] = []
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
            logprobs.extend(chunk.logprobs)
            stats = chunk.stats
        asked = sampling is not None and sampling.logprobs is not None
        return Completion(prompt, self.codec.decode(ids), ids, stats, logprobs if asked else None)
