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
        self.queued = lambda: 0  # set by the server: answers waiting, and one running
        self.running = lambda: 0

    def request(self, path: str, status: int) -> None:
        route = path if path in ROUTES else "other"
        with self._lock:
            self._requests[(route, status)] += 1

    def answer(self, stats: GenStats, finish: str) -> None:
        with self._lock:
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
                ("requests_running", "gauge", "Answers being generated (0 or 1).",
                 [("", self.running())]),
            ]  # fmt: skip
        out: list[str] = []
        for name, kind, help_, samples in families:
            out += [f"# HELP specgen_{name} {help_}", f"# TYPE specgen_{name} {kind}"]
            for labels, value in samples:
                out.append(
                    f"specgen_{name}{{{labels}}} {value}" if labels else f"specgen_{name} {value}"
                )
        return "\n".join(out) + "\n"


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
