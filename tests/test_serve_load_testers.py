"""What load testers send and count: guidellm's `ignore_eos: true` (an answer of exactly
`max_tokens`, every method alike) and `stream_options.continuous_usage_stats`; requests
that arrive together answered one at a time in the order they came, each as it is alone,
with /metrics counting them all."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from specgen.api.pipeline import Pipeline
from specgen.api.spec import SpecConfig
from specgen.core.config import SamplingParams
from specgen.serve.errors import APIError
from specgen.serve.openai_api import Defaults, parse
from support.serve_stub import StubPipe, codec_with, stub_app

MSG = [{"role": "user", "content": "hi"}]


def test_ignore_eos_is_parsed_and_checked():
    d, m = Defaults(), ("ar",)
    assert parse({"messages": MSG, "ignore_eos": True}, chat=True, defaults=d, methods=m).ignore_eos
    assert not parse({"prompt": "x"}, chat=False, defaults=d, methods=m).ignore_eos
    with pytest.raises(APIError) as e:
        parse({"prompt": "x", "ignore_eos": "yes"}, chat=False, defaults=d, methods=m)
    assert (e.value.status, e.value.param) == (400, "ignore_eos")


@pytest.fixture(scope="module")
def pipes(tiny_qwen3_deep, tiny_dflash):
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    spec = SpecConfig(method="dflash", drafter=str(tiny_dflash), verify_policy="full")
    return ar, Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32", spec=spec)


def ids_of(pipe, prompt, **kwargs) -> list[int]:
    out: list[int] = []
    for chunk in pipe.stream_ids(prompt, session=pipe.new_session(), **kwargs):
        out.extend(chunk.token_ids)
    return out


def test_ignore_eos_runs_to_max_tokens_and_every_method_agrees(pipes, monkeypatch):
    ar, dflash = pipes
    prompt = ar.encode("The quick brown fox", raw=True)
    free = ids_of(ar, prompt, max_new_tokens=12)
    assert len(free) == 12 and free[2] not in free[:2]
    for pipe in pipes:  # the third token made a stop token: plain answers end before it
        monkeypatch.setattr(pipe.codec, "stop_ids", frozenset({free[2]}))
    assert ids_of(ar, prompt, max_new_tokens=12) == free[:2]
    greedy = [ids_of(p, prompt, max_new_tokens=12, ignore_eos=True) for p in pipes]
    assert greedy == [free, free]  # AR's tokens, past the stop token, to max_new_tokens
    sampled = [
        ids_of(p, prompt, max_new_tokens=12, ignore_eos=True,
               sampling=SamplingParams(temperature=1.0, seed=3))
        for p in pipes
    ]  # fmt: skip
    assert [len(s) for s in sampled] == [12, 12]  # (sampling is exact in law, not per seed)


# --- the queue, in order --------------------------------------------------------------------


class GatedPipe(StubPipe):
    """The first answer waits for `gate`, so the others queue behind it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.started = threading.Event()

    def stream_ids(self, ids, sampling=None, max_new_tokens=256, **kwargs):
        self.started.set()
        if len(self.prompts) == 0:
            assert self.gate.wait(30)
        yield from super().stream_ids(ids, sampling, max_new_tokens)


def test_requests_that_arrive_together_are_answered_in_order_each_as_alone(tmp_path):
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    codec = codec_with(tmp_path)
    answers = [f"answer to {w}" for w in words]
    pipe = GatedPipe(codec, answers=answers)
    with stub_app(pipe, max_tokens=64) as http:
        before = http.get("/metrics").text
        assert 'specgen_requests_total{route="/v1/completions",status="200"}' not in before

        def ask(i: int):
            body = {"prompt": words[i], "stream": i % 2 == 1}
            return http.post("/v1/completions", json=body)

        with ThreadPoolExecutor(len(words)) as pool:
            futures = [pool.submit(ask, 0)]
            assert pipe.started.wait(30)
            for i in range(1, len(words)):  # each waits in the queue before the next comes
                futures.append(pool.submit(ask, i))
                for _ in range(300):
                    if http.get("/health").json()["queued"] == i:
                        break
                    time.sleep(0.01)
                assert http.get("/health").json()["queued"] == i
            pipe.gate.set()
            replies = [f.result() for f in futures]
        assert [codec.decode(p) for p in pipe.prompts] == words  # run in arrival order
        for i, r in enumerate(replies):
            assert r.status_code == 200
            text = r.json()["choices"][0]["text"] if i % 2 == 0 else _streamed(r.text)
            assert text == answers[i]  # the answer it gets alone (its script)
        metrics = _samples(http.get("/metrics").text)
    assert metrics['specgen_requests_total{route="/v1/completions",status="200"}'] == len(words)
    assert metrics['specgen_finished_total{reason="stop"}'] == len(words)
    tokens = sum(len(codec.encode_raw(a)) for a in answers)
    assert metrics["specgen_generation_tokens_total"] == tokens
    assert metrics["specgen_prompt_tokens_total"] == sum(len(p) for p in pipe.prompts)
    assert metrics["specgen_queue_depth"] == 0 and metrics["specgen_requests_running"] == 0


def test_continuous_usage_stats_is_accepted_and_usage_comes_last(tmp_path):
    with stub_app(StubPipe(codec_with(tmp_path), answers=["four words of text"])) as http:
        options = {"include_usage": True, "continuous_usage_stats": True}  # guidellm's
        body = {"messages": MSG, "stream": True, "ignore_eos": True, "stop": None,
                "max_completion_tokens": 3, "stream_options": options}  # fmt: skip
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        events = [json.loads(e[6:]) for e in r.text.split("\n\n") if e.startswith("data: {")]
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3


def _streamed(text: str) -> str:
    out = ""
    for event in text.split("\n\n"):
        if event.startswith("data: {"):
            out += json.loads(event[6:])["choices"][0].get("text") or ""
    return out


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out
