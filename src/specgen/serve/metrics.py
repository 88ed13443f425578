"""`GET /metrics` in Prometheus' text format (0.0.4), written by hand: a few counters do
not need a client library. Names follow vLLM's where vLLM has the number
(`spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`)."""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass

from specgen.core.stats import GenStats

ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/health",
    "/metrics",
    "/",
)  # fmt: skip  (any other path is counted as "other": labels stay few)


@dataclass
class _Method:
    answers: int = 0
    steps: int = 0  # target forwards, the prefill's included (as in τ)
    drafted: int = 0  # draft tokens sent to verification
    accepted: int = 0
    tokens: int = 0
    seconds: float = 0.0  # generating, from the prefill to the last token


class Metrics:
    """Counters since the server started; updated from the event loop and the worker."""

    def __init__(self, methods: tuple[str, ...]) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, int], int] = defaultdict(int)
        self._finish: dict[str, int] = defaultdict(int)
        self._methods = {m: _Method() for m in methods}
        self._prompt = self._cached = self._completion = 0
        self.queued = lambda: 0  # set by the server: answers waiting, and those running
        self.running = lambda: 0
        self.parallel = 1  # slots (set by the server)
        self.slots = lambda: []  # set by the server: each busy slot's answer so far
        self.batch = lambda: None  # set by the server: engine/batch.Counters
        self._per_slot: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])

    def request(self, path: str, status: int) -> None:
        route = path if path in ROUTES else "other"
        with self._lock:
            self._requests[(route, status)] += 1

    def answer(self, stats: GenStats, finish: str, slot: int | None = None) -> None:
        with self._lock:
            if slot is not None:  # answers, tokens and prompt tokens from its cache
                counts = self._per_slot[slot]
                counts[0] += 1
                counts[1] += stats.new_tokens
                counts[2] += stats.prompt_tokens - stats.prefill_tokens
            self._finish[finish] += 1
            self._prompt += stats.prompt_tokens
            self._cached += stats.prompt_tokens - stats.prefill_tokens
            self._completion += stats.new_tokens
            m = self._methods.setdefault(stats.method, _Method())
            m.answers += 1
            m.steps += stats.steps
            m.drafted += stats.verified
            m.accepted += stats.accepted
            m.tokens += stats.new_tokens
            m.seconds += stats.seconds

    def render(self) -> str:
        with self._lock:
            requests = [
                (f'route="{r}",status="{s}"', n) for (r, s), n in sorted(self._requests.items())
            ]
            finished = [(f'reason="{r}"', n) for r, n in sorted(self._finish.items())]
            families = [
                ("requests_total", "counter", "HTTP requests by route and status code.", requests),
                ("finished_total", "counter", "Answers by finish reason.", finished),
                ("prompt_tokens_total", "counter", "Prompt tokens.", [("", self._prompt)]),
                ("prompt_tokens_cached_total", "counter",
                 "Prompt tokens served from the KV cache.", [("", self._cached)]),
                ("generation_tokens_total", "counter", "Generated tokens.",
                 [("", self._completion)]),
            ]  # fmt: skip
            for name, kind, help_, value in _PER_METHOD:
                samples = [(f'method="{k}"', value(m)) for k, m in sorted(self._methods.items())]
                families.append((name, kind, help_, samples))
            families += [
                ("queue_depth", "gauge", "Requests waiting for the worker.", [("", self.queued())]),
                ("requests_running", "gauge", "Answers being generated (one a slot at most).",
                 [("", self.running())]),
                ("slots", "gauge", "Slots: answers generated at once at most (--parallel).",
                 [("", self.parallel)]),
            ]  # fmt: skip
            families += self._slot_families()
        out: list[str] = []
        for name, kind, help_, samples in families:
            out += [f"# HELP specgen_{name} {help_}", f"# TYPE specgen_{name} {kind}"]
            for labels, value in samples:
                out.append(
                    f"specgen_{name}{{{labels}}} {value}" if labels else f"specgen_{name} {value}"
                )
        return "\n".join(out) + "\n"

    def _slot_families(self) -> list:
        busy = {s["slot"]: s for s in self.slots()}
        slots = range(self.parallel)
        per = self._per_slot
        out = [
            ("slot_busy", "gauge", "1 while the slot answers.",
             [(f'slot="{i}"', int(i in busy)) for i in slots]),
            ("slot_context_tokens", "gauge", "Tokens of the slot's answer so far (prompt and "
             "output; 0 when idle).", [(f'slot="{i}"', busy[i]["context"] if i in busy else 0)
                                       for i in slots]),
            ("slot_answers_total", "counter", "Answers the slot finished.",
             [(f'slot="{i}"', per[i][0] if i in per else 0) for i in slots]),
            ("slot_generation_tokens_total", "counter", "Tokens the slot generated.",
             [(f'slot="{i}"', per[i][1] if i in per else 0) for i in slots]),
            ("slot_prompt_tokens_cached_total", "counter",
             "Prompt tokens the slot's answers found in their session's cache.",
             [(f'slot="{i}"', per[i][2] if i in per else 0) for i in slots]),
        ]  # fmt: skip
        counters = self.batch()
        if counters is not None:
            sizes = sorted(counters.by_size.items())
            out += [
                ("batch_steps_total", "counter", "Steps run (each one step of every answer "
                 "in a slot).", [("", counters.steps)]),
                ("batch_answers_total", "counter", "Answers in each step, summed (/ steps: "
                 "the mean batch).", [("", counters.answers)]),
                ("batch_rows_total", "counter", "Target rows run (prompt chunks, anchors, "
                 "drafts).", [("", counters.rows)]),
                ("batch_draft_rows_total", "counter", "Target rows that verified drafts.",
                 [("", counters.drafted)]),
                ("batch_steps_held_total", "counter", "Shared steps whose answers were held "
                 "back from drafting (plain steps were committing tokens faster).",
                 [("", counters.held)]),
                ("batch_steps_by_size_total", "counter", "Steps by the answers in them.",
                 [(f'answers="{n}"', k) for n, k in sizes]),
            ]  # fmt: skip
        return out


_PER_METHOD = [
    ("spec_decode_num_drafts_total", "counter",
     "Decoding steps (target forwards, the prefill's included).", lambda m: m.steps),
    ("spec_decode_num_draft_tokens_total", "counter", "Draft tokens sent to verification.",
     lambda m: m.drafted),
    ("spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.",
     lambda m: m.accepted),
    ("mean_acceptance_length", "gauge",
     "tau: 1 + accepted draft tokens per step (incl. the bonus token), over every answer.",
     lambda m: round(1 + m.accepted / m.steps, 4) if m.steps else 0),
    ("tokens_per_second", "gauge", "Generated tokens per second of generating.",
     lambda m: round(m.tokens / m.seconds, 2) if m.seconds else 0),
]  # fmt: skip
