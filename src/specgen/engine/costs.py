"""Measuring the step costs a pipeline's schedulers decide from (scheduling/cost.py), once
per (model, drafter, dtype, weight format, device, threads, torch) and cached as JSON under
$SPECGEN_HOME/costs/, so later runs (and seeded sampling runs, whose verify lengths
depend on these numbers) reuse them; and watching them against the steps that ran
(`CostWatch`). Timings never enter tests; they only steer the verify length and the
drafter choice, which do not change which tokens come out.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specgen.core import clock
from specgen.core.config import SamplingParams
from specgen.core.paths import specgen_home
from specgen.core.stats import GenStats
from specgen.drafting.base import DraftMethod
from specgen.kernels.library import kv_kind
from specgen.kernels.packed import activations
from specgen.models.graphs import GraphedForward
from specgen.models.transformer import Transformer
from specgen.scheduling.cost import CostTable, modeled
from specgen.scheduling.learning import Schedulers
from specgen.scheduling.scheduler import VerifyScheduler

PROFILE_CONTEXTS = (128, 1024)  # cached tokens behind the measured blocks
DRAFT_CONTEXT = 128  # tokens a drafter has observed when its steps are timed
CHECK_STEPS = 32  # decoding steps a cost table is held against before it is judged
DRIFT = 2.0  # steps this many times faster or slower than the table: it is stale
HOST_SLACK = 0.002  # seconds of host work a step may add to its forward (sampling, Python)

# Says whether requests are waiting (a server's queue): a measurement made mid-serve then
# stops at its next timed forward instead of holding them up for its few seconds.
Busy = Callable[[], bool]


class Interrupted(Exception):
    """A measurement stopped because `busy` said requests were waiting."""


def _check(busy: Busy | None) -> None:
    if busy is not None and busy():
        raise Interrupted


@dataclass
class CostCheck:
    """Whether a measured cost table still describes the machine: the time the decoding
    steps took, against the table's price for the same steps (`modeled`), summed over
    answers until `CHECK_STEPS` steps. A table measured while the machine was busy prices
    plain steps and verifies wrongly for good, and the scheduler then drafts where drafting
    does not pay (or not where it does). A step may add `HOST_SLACK` of host work to the
    table's forward, which the forwards of a tiny model would otherwise drown in."""

    predicted: float = 0.0
    observed: float = 0.0
    steps: int = 0

    def stale(self, stats: GenStats, table: CostTable) -> float | None:
        """After an answer: the observed / predicted ratio once judged and out of bounds
        (then re-measure), else None."""
        priced = modeled(stats.shapes, table)
        if priced is None:
            return None
        self.predicted += priced[1]
        self.observed += sum(stats.step_seconds)
        self.steps += len(stats.shapes)
        if self.steps < CHECK_STEPS or self.predicted <= 0:
            return None
        ratio = self.observed / self.predicted
        slow = self.observed > DRIFT * self.predicted + HOST_SLACK * self.steps
        fast = self.observed < self.predicted / DRIFT
        self.predicted = self.observed = 0.0
        self.steps = 0
        return ratio if slow or fast else None


class CostWatch:
    """Measured costs held against the answers' steps (`CostCheck`): when the steps
    disagree with them beyond noise they are measured again, once, and the schedulers
    decide from the new table (`Schedulers.reprice`). Once: a machine under changing load
    must not re-measure forever. Only for measured tables; fixed prices (tests, what-if
    runs with another machine's) are never second-guessed."""

    def __init__(
        self,
        model: Transformer,
        key: str,
        method: DraftMethod,
        notify: Callable[[str], None] | None = None,
        *,
        graphs: bool = False,
    ) -> None:
        self.model, self.key, self.method = model, key, method
        self.notify, self.graphs = notify, graphs
        self.check: CostCheck | None = CostCheck()  # None: measured again already

    def after(
        self,
        stats: GenStats,
        schedulers: Schedulers,
        *running: VerifyScheduler | None,
        busy: Busy | None = None,
    ) -> None:
        """After an answer that ran to its end: judge `schedulers.costs` by its steps and,
        when stale, measure again and reprice them and the `running` schedulers. With
        `busy`, the measurement gives way to waiting requests: it stops (the table stays),
        and the steps of later answers judge the table anew."""
        if self.check is None or schedulers.costs is None:
            return
        ratio = self.check.stale(stats, schedulers.costs)
        if ratio is None:
            return
        if busy is not None and busy():  # not begun: judged again after more steps
            return
        self.check = None
        if self.notify:
            self.notify(
                f"decoding steps ran at {ratio:.2f}x the measured step costs: measuring them "
                "again (--measure-costs does this up front)"
            )
        try:
            costs = cached_costs(
                self.model, self.key, self.method, self.notify, graphs=self.graphs,
                fresh=True, busy=busy,
            )  # fmt: skip
        except Interrupted:
            self.check = CostCheck()
            if self.notify:
                self.notify("stopped measuring: requests are waiting (the costs stay as they were)")
            return
        schedulers.reprice(costs, *running)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_costs(
    model: Transformer,
    max_drafts: int,
    *,
    contexts: tuple[int, ...] = PROFILE_CONTEXTS,
    repeats: int = 5,
    graphs: bool = False,
    busy: Busy | None = None,
) -> CostTable:
    """Time target forwards over blocks of 1..max_drafts+1 tokens after each context
    (`Interrupted` before any of them when `busy` says so).

    Sizes are interleaved across sweeps and each keeps its fastest run: on a shared machine
    interference only ever adds time. `graphs` (CUDA): each block replayed as the CUDA graph
    a session decodes with, so verify costs are on the same footing as the drafter's step,
    whose graphs `measure_draft_seconds` already replays; eager launch overhead would make
    every verify length look alike and drafting look cheaper than it is.
    """
    device, vocab = model.device, model.args.vocab_size
    contexts = tuple(c for c in contexts if c + max_drafts + 1 <= model.args.max_positions)
    gen = torch.Generator().manual_seed(0)
    table = []
    for context in contexts or (1,):
        cache = model.new_cache(context + max_drafts + 1, steps=max_drafts + 1)
        forward = model
        if graphs and device.type == "cuda":
            forward = GraphedForward(model, cache, max_tokens=max_drafts + 1, capture=True)
        model(torch.randint(0, vocab, (1, context), generator=gen).to(device), cache)
        blocks = [
            torch.randint(0, vocab, (1, n + 1), generator=gen).to(device)
            for n in range(max_drafts + 1)
        ]
        seconds = [float("inf")] * (max_drafts + 1)
        for sweep in range(repeats + 1):  # the first sweep warms up
            for n, block in enumerate(blocks):
                _check(busy)
                _sync(device)
                start = clock.now()
                forward(block, cache)
                _sync(device)
                if sweep:
                    seconds[n] = min(seconds[n], clock.now() - start)
                cache.rollback(context)
        table.append(tuple(seconds))
    return CostTable(contexts or (1,), tuple(table))


def measure_draft_seconds(
    method: DraftMethod,
    model: Transformer,
    *,
    context: int = DRAFT_CONTEXT,
    repeats: int = 5,
    busy: Busy | None = None,
) -> tuple[float, ...]:
    """A drafter's time per step after `context` tokens, for each draft length k = 1..its
    longest ([k - 1]): observe the anchor and two accepted tokens, propose k tokens (a
    drafter may defer its observing work to here), and roll back: what a drafting step
    costs. Greedy; lengths interleaved across sweeps, each keeping its fastest run."""
    device, vocab = model.device, model.args.vocab_size
    gen = torch.Generator().manual_seed(1)
    drafter = method.new_drafter(context + 8)
    cache = model.new_cache(context + 8)
    ids = torch.randint(0, vocab, (1, context + 3), generator=gen).to(device)
    out = model(ids, cache, taps=drafter.taps)
    drafter.observe(ids[0, :context].tolist(), {i: h[:, :context] for i, h in out.taps.items()})
    step = {i: h[:, context:] for i, h in out.taps.items()}
    anchor, params = int(ids[0, context]), SamplingParams()
    best = [float("inf")] * method.max_draft_tokens
    for attempt in range(repeats + 1):  # the first warms up
        for k in range(1, method.max_draft_tokens + 1):
            _check(busy)
            _sync(device)
            start = clock.now()
            drafter.observe(ids[0, context:].tolist(), step)
            drafter.propose(anchor, k, params, None)
            _sync(device)
            if attempt:
                best[k - 1] = min(best[k - 1], clock.now() - start)
            drafter.rollback(context)
    return tuple(best)


def _cache_path(ident: str):
    return specgen_home() / "costs" / (hashlib.sha256(ident.encode()).hexdigest()[:16] + ".json")


def _write_json(path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


# Bumped whenever a kernel's speed changes on purpose, so cached costs are measured again
# (2: few-row CPU matmul paths retuned, draft vocabularies through them; 3: the Markov
# draw spread over the GPU, eager CUDA attention without cuDNN; 4: DSpark's Markov rows for
# its draft vocabulary gathered once, not per slot; drafts timed per length; 5: the packed
# CPU kernel's direct path for verify blocks up to 16 rows; 6: the fused CPU pass, fp16
# packed scales, packed draft-vocabulary heads; 7: 16-lane packed products on AVX-512, and
# the ISA a build targets, SPECGEN_CPU_ISA; 8: per-ISA libraries built at install, and the
# 8-bit-activation products, SPECGEN_CPU_ACT, whose extra rows cost a fraction of fp32's;
# 9: panel-major scales (a decode step 12% faster) and 8-row register blocks: tables made
# before them priced a plain step high and 5-8-row blocks high; 10: attention tile by tile
# for the queries that share a KV head, long contexts' verify blocks 14-23% cheaper; 11: fp16
# scales widened in the 8-bit kernel, attention shared by cost: steps 2-7% cheaper).
KERNELS_REVISION = 11


def cached_costs(
    model: Transformer,
    key: str,
    method: DraftMethod,
    notify: Callable[[str], None] | None = None,
    *,
    graphs: bool = False,
    fresh: bool = False,
    busy: Busy | None = None,
) -> CostTable:
    """The cost table of `method` on `model` (`key`: the model's identity): the target's
    verify costs up to its longest draft (`target_costs`) and each mounted drafter's draft
    costs, measuring what is missing once; `fresh`: measuring all of it again (`busy`:
    see `measure_costs`)."""
    ident = _identity(model, key, graphs)
    table = None if fresh else _load_table(_cache_path(ident), method.max_draft_tokens)
    keys = {name: f"{ident}|drafter={part.cache_key}" for name, part in method.mounted.items()}
    drafts = {
        name: None if fresh else _load_draft_costs(keys[name], part.max_draft_tokens)
        for name, part in method.mounted.items()
    }
    missing = [name for name, costs in drafts.items() if costs is None]
    verify = table is None
    if notify and (verify or missing):  # said before: the first use of a method waits on it
        guess = estimate_seconds(model, method.max_draft_tokens, verify, missing)
        notify(_measuring(verify, missing, fresh, guess))
    start = time.perf_counter()
    if table is None:
        table = target_costs(
            model, key, method.max_draft_tokens, graphs=graphs, fresh=True, busy=busy
        )
    for name in missing:
        drafts[name] = _measure_draft_costs(model, method.mounted[name], keys[name], busy)
    if notify and (verify or missing):  # one line for all of it, naming each part
        notify(_measured(verify, missing, fresh, time.perf_counter() - start))
    return CostTable(table.contexts, table.seconds, drafts)


def _what(verify: bool, drafters: list[str], fresh: bool) -> str:
    """What a measurement covers, e.g. "verify costs and the dflash and dspark drafters'
    costs once"."""
    parts = ["verify costs"] if verify else []
    if drafters:
        names = " and ".join(drafters)
        parts.append(f"the {names} drafter's cost" if len(drafters) == 1 else
                     f"the {names} drafters' costs")  # fmt: skip
    return f"{' and '.join(parts)} {'again' if fresh else 'once'}"


def _measuring(verify: bool, drafters: list[str], fresh: bool, guess: float) -> str:
    """The line said before measuring, with its estimate: "measuring verify costs and the
    dflash drafter's cost once for this model and device, about 4 s"."""
    about = f"about {guess:.0f} s" if guess >= 1 else "under a second"
    return f"measuring {_what(verify, drafters, fresh)} for this model and device, {about}"


def _measured(verify: bool, drafters: list[str], fresh: bool, seconds: float) -> str:
    """The line said after, with the time it took: "measured verify costs and the dflash
    and dspark drafters' costs once for this model and device in 4.2 s (cached)"."""
    what = _what(verify, drafters, fresh)
    return f"measured {what} for this model and device in {seconds:.1f} s (cached)"


def estimate_seconds(
    model: Transformer,
    max_drafts: int,
    verify: bool,
    drafters: list[str],
    *,
    contexts: tuple[int, ...] = PROFILE_CONTEXTS,
    repeats: int = 5,
) -> float:
    """How long measuring will take, from two timed target forwards (a one-token step and a
    block of max_drafts + 1 tokens, a few milliseconds on a small model): the verify sweeps
    price each block between the two, prefills as blocks of that size, and a drafter's
    sweeps (its prefill, then `repeats` + 1 proposals of each length) one step a proposal,
    which block drafters are near and copy drafters well under: an estimate to set the
    user's expectation, never a decision's input."""
    device, vocab, block = model.device, model.args.vocab_size, max_drafts + 1
    cache = model.new_cache(16 + block, steps=block)
    ids = torch.randint(0, vocab, (1, 8 + block), generator=torch.Generator().manual_seed(2))
    model(ids[:, :8].to(device), cache)
    timed = []
    for n in (1, block):
        _sync(device)
        start = time.perf_counter()
        model(ids[:, 8 : 8 + n].to(device), cache)
        _sync(device)
        timed.append(time.perf_counter() - start)
        cache.rollback(8)
    one, many = timed
    contexts = tuple(c for c in contexts if c + block <= model.args.max_positions) or (1,)
    sweep = sum(one + (many - one) * n / max(block - 1, 1) for n in range(block))
    total = 0.0
    if verify:
        total += sum(c / block * many + (repeats + 1) * sweep for c in contexts)
    for _ in drafters:
        total += (DRAFT_CONTEXT + 3) / block * many + (repeats + 1) * max_drafts * one
    return total


def target_costs(
    model: Transformer,
    key: str,
    max_drafts: int,
    notify: Callable[[str], None] | None = None,
    *,
    graphs: bool = False,
    fresh: bool = False,
    busy: Busy | None = None,
) -> CostTable:
    """The target's verify costs for up to `max_drafts` drafts, measured once and cached
    (`fresh`: measured again). `graphs`: the session decodes with CUDA graphs, so the steps
    are timed as replays. `busy`: see `measure_costs`."""
    ident = _identity(model, key, graphs)
    table = None if fresh else _load_table(_cache_path(ident), max_drafts)
    if table is None:
        start = time.perf_counter()
        cuda = graphs and model.device.type == "cuda"
        table = measure_costs(model, max_drafts, graphs=cuda, busy=busy)
        record = {"key": ident, "contexts": table.contexts, "seconds": table.seconds}
        _write_json(_cache_path(ident), record)
        if notify:
            notify(_measured(True, [], fresh, time.perf_counter() - start))
    return table


def _identity(model: Transformer, key: str, graphs: bool) -> str:
    """What a measurement depends on besides the drafter."""
    graphs = graphs and model.device.type == "cuda"
    return (
        f"{key}|{model.dtype}|{model.weights_identity}|{model.device}"
        f"|threads={torch.get_num_threads()}"
        f"|torch={torch.__version__}|kernels={KERNELS_REVISION}"
        f"|isa={os.environ.get('SPECGEN_CPU_ISA', 'native')}|act={activations()}|kv={kv_kind()}"
        + ("|graphs" if graphs else "")
    )


def _load_draft_costs(ident: str, max_draft_tokens: int) -> tuple[float, ...] | None:
    """A drafter's cached draft costs (None: absent, unreadable or for shorter drafts)."""
    try:
        by_length = tuple(float(s) for s in json.loads(_cache_path(ident).read_text())["by_length"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return by_length[:max_draft_tokens] if len(by_length) >= max_draft_tokens else None


def _measure_draft_costs(
    model: Transformer, method: DraftMethod, ident: str, busy: Busy | None = None
) -> tuple[float, ...]:
    by_length = measure_draft_seconds(method, model, busy=busy)
    _write_json(_cache_path(ident), {"key": ident, "by_length": by_length})
    return tuple(by_length[: method.max_draft_tokens])


def _load_table(path, max_drafts: int) -> CostTable | None:
    try:
        data = json.loads(path.read_text())
        table = CostTable(tuple(data["contexts"]), tuple(tuple(s) for s in data["seconds"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent, unreadable or from an older format: measure again
    if table.max_drafts < max_drafts:
        return None
    # cut to this method's longest draft: a table measured again later (`fresh`) has this
    # shape, and the scheduler's history is sized by the table it started from
    return CostTable(table.contexts, tuple(row[: max_drafts + 1] for row in table.seconds))
