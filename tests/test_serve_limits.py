"""`specgen serve`'s bounds on one request: the body's size (read as it streams, refused
before parsing), JSON nesting and sizes, and a prompt that cannot fit told apart before
the whole of it is tokenized. Then a seeded fuzz over the request schema: thousands of
bodies, none answered with a 5xx, and the server still answers after them."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random

import pytest

from specgen.serve import limits
from specgen.serve.errors import APIError
from support.cli import assert_one_line_error, run
from support.serve import FIELDS, TOOL_ANSWERS
from support.serve_stub import StubPipe, codec_with, stub_app


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    return StubPipe(codec_with(tmp_path_factory.mktemp("stub")), context=256)


@pytest.fixture(scope="module")
def http(pipe):
    with stub_app(pipe, max_body_bytes=4096) as client:
        yield client


def error_of(r, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code and "\n" not in error["message"], error
    return error


# --- the body's size ----------------------------------------------------------------------


def test_content_length_over_the_limit_is_a_413_before_reading():
    async def never():
        raise AssertionError("the body was read")
        yield b""

    with pytest.raises(APIError) as e:
        asyncio.run(limits.read_body({"content-length": "5000"}, never(), 4096))
    assert e.value.status == 413 and "5000 bytes" in e.value.message


def test_a_streamed_body_stops_being_read_once_past_the_limit():
    read = []

    async def chunks():
        for _ in range(100):
            read.append(1)
            yield b"x" * 1000

    with pytest.raises(APIError) as e:
        asyncio.run(limits.read_body({}, chunks(), 4096))
    assert e.value.status == 413 and len(read) == 5  # the fifth passed it: no sixth


def test_the_limit_holds_over_http(http):
    big = json.dumps({"prompt": "x" * 5000}).encode()
    r = http.post("/v1/completions", content=big, headers={"Content-Type": "application/json"})
    error_of(r, 413, "request_too_large")
    r = http.post("/v1/completions", content=iter([big[:3000], big[3000:]]))  # chunked
    error_of(r, 413, "request_too_large")
    assert http.post("/v1/completions", json={"prompt": "hi"}).status_code == 200


def test_max_body_bytes_is_checked_on_the_command_line(tiny_llama):
    result = run("serve", "--model", str(tiny_llama), "--max-body-bytes", "0")
    assert_one_line_error(result, 2, "--max-body-bytes must be at least 1")


# --- the JSON's shape ---------------------------------------------------------------------


@pytest.mark.parametrize("depth", [limits.MAX_DEPTH + 1, 3000, 200_000])
def test_deep_nesting_is_a_400_not_a_recursion_error(depth):
    body = ("[" * depth + "]" * depth).encode()
    with pytest.raises(APIError) as e:
        limits.parse_json(body)
    assert (e.value.status, e.value.code) == (400, "too_deep")


def test_nesting_within_the_bound_parses():
    d = limits.MAX_DEPTH - 1
    assert limits.parse_json(('{"a":' * d + "1" + "}" * d).encode()) is not None


@pytest.mark.parametrize(
    "where",
    ['{"prompt": "a\\ud800"}', '{"\\udfff": 1}', '{"messages": [{"content": ["\\ud800"]}]}'],
)
def test_a_lone_surrogate_is_a_400_not_a_tokenizer_s_type_error(where):
    with pytest.raises(APIError) as e:
        limits.parse_json(where.encode())
    assert (e.value.status, e.value.code) == (400, "invalid_json")
    assert "surrogate" in e.value.message
    assert limits.parse_json(b'{"prompt": "\\ud83d\\ude00"}') == {"prompt": "\U0001f600"}  # a pair


def test_too_many_items_is_a_400(monkeypatch):
    monkeypatch.setattr(limits, "MAX_ITEMS", 10)
    with pytest.raises(APIError) as e:
        limits.parse_json(json.dumps({"prompt": list(range(11))}).encode())
    assert (e.value.status, e.value.code) == (400, "too_many_items")


def test_a_deeply_nested_body_over_http_is_a_400(tmp_path):
    pipe = StubPipe(codec_with(tmp_path))
    with stub_app(pipe) as http:  # the default body limit: 8 MiB
        deep = '{"messages": [{"role": "user", "content": "x"}], "metadata": ' + "[" * 100_000
        r = http.post("/v1/chat/completions", content=deep + "]" * 100_000 + "}")
        error_of(r, 400, "too_deep")


# --- a prompt too long for the context ------------------------------------------------------


def test_a_huge_prompt_is_refused_from_a_sample(tmp_path):
    pipe = StubPipe(codec_with(tmp_path), context=64)
    seen = []

    class Counting:  # the cached tokenizer's backend: every text it tokenizes passes here
        def __init__(self, backend):
            self.backend = backend

        def encode(self, text, **k):
            seen.append(len(text))
            return self.backend.encode(text, **k)

        def __getattr__(self, name):
            return getattr(self.backend, name)

    assert pipe.codec.from_cache
    fast = pipe.codec._fast
    pipe.codec._fast = dataclasses.replace(fast, backend=Counting(fast.backend))
    with stub_app(pipe) as http:
        huge = [{"role": "user", "content": "ab " * 500_000}]
        for route, body in [
            ("/v1/completions", {"prompt": "fox jumps " * 200_000}),  # 2 MB
            ("/v1/chat/completions", {"messages": huge}),
        ]:
            error = error_of(http.post(route, json=body), 400, "context_length_exceeded")
            assert "at least" in error["message"]
    assert max(seen, default=0) <= 64 * limits.SAMPLE_PER_TOKEN  # never the whole prompt
    assert pipe.prompts == []  # nothing reached the worker


def test_certainly_too_long_is_a_lower_bound():
    words = "a " * 10_000

    def count(s: str) -> int:
        return len(s) // 2  # one token per "a "

    assert limits.certainly_too_long(words, 100, 2, count) == 10_000  # from the length alone
    assert limits.certainly_too_long(words, 100, 1000, count) >= 100  # from a sample
    assert limits.certainly_too_long("a " * 300, 100, 1000, count) is None  # tokenized whole
    assert limits.certainly_too_long(words, 10_000, 1000, count) is None  # may fit


# --- a seeded fuzz over the request schema ---------------------------------------------------

CONTENTS = ["hi", "", None, 3, [{"type": "text", "text": "a"}], [{"type": "image"}], [1],
            {"text": "x"}, "x" * 300, "Café 🙂", "lone \ud800 surrogate"]  # fmt: skip
ROLES = ["user", "system", "assistant", "developer", "tool", "bot", None, 1, [], {"a": 1}]


def junk(rng: random.Random, depth: int = 0):
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, -1, 1.5, 2**63, -(2**80), 1e300])
    if kind == 2:
        return "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(6)))
    if kind in (3, 4):
        return rng.choice(["", "x", "\x00", "\ud7ff", "\ud800", "a\udfff", "\ud83d\ude00"])
    if kind in (5, 6):
        return [junk(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {str(junk(rng, 9)): junk(rng, depth + 1) for _ in range(rng.randrange(4))}


def message(rng: random.Random):
    if rng.random() < 0.1:
        return junk(rng)
    m = {"role": rng.choice(ROLES), "content": rng.choice(CONTENTS)}
    if rng.random() < 0.15:
        m["tool_calls"] = rng.choice([
            [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            [{"function": {"name": 3, "arguments": "{bad"}}], "x", [None], [],
        ])  # fmt: skip
    if rng.random() < 0.1:
        m["tool_call_id"] = rng.choice(["c1", 3, None])
    return m


def fuzz_body(rng: random.Random) -> tuple[str, bytes]:
    chat = rng.random() < 0.6
    route = "/v1/chat/completions" if chat else "/v1/completions"
    r = rng.random()
    if r < 0.05:
        return route, bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
    if r < 0.1:
        return route, json.dumps(junk(rng)).encode()
    body: dict = {}
    if chat:
        if rng.random() < 0.9:
            body["messages"] = [message(rng) for _ in range(rng.randrange(4))]
    elif rng.random() < 0.9:
        body["prompt"] = rng.choice(["hi", "", "x" * 500, [1, 2], [[1]], ["a", "b"], [-1],
                                     [10**9], [True], None, {"a": 1}, ["a"]])  # fmt: skip
    for name in rng.sample(sorted(FIELDS), rng.randrange(5)):
        body[name] = rng.choice(FIELDS[name])
    if rng.random() < 0.1:
        body[str(junk(rng, 9))] = junk(rng)
    if "max_tokens" not in body:
        body["max_tokens"] = 3  # keep answers short
    return route, json.dumps(body).encode()


F_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
          "properties": {"a": {"type": "integer"}}}}}  # fmt: skip
TOOL_TURNS = [  # a history the tool templates render: a call and its result
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "2"},
]  # fmt: skip


def tool_body(rng: random.Random) -> tuple[str, bytes]:
    """A mostly valid tool request (so the rendering and parsing run), one field fuzzed."""
    messages = [{"role": "user", "content": "hi"}] + (TOOL_TURNS if rng.random() < 0.5 else [])
    body = {"messages": messages, "tools": [F_TOOL], "max_tokens": rng.choice([2, 8, 200, 200]),
            "stream": rng.random() < 0.5,
            "tool_choice": rng.choice(["auto", "required", "none", {"type": "function",
                                       "function": {"name": "f"}}]),
            "parallel_tool_calls": rng.random() < 0.5}  # fmt: skip
    name = rng.choice(sorted(FIELDS))
    if rng.random() < 0.5:
        body[name] = rng.choice(FIELDS[name])
    return "/v1/chat/completions", json.dumps(body).encode()


def calls_in(r) -> int:
    if r.status_code != 200:
        return 0
    if r.headers["content-type"].startswith("text/event-stream"):
        return r.text.count('"tool_calls": [')
    return len(r.json()["choices"][0].get("message", {}).get("tool_calls") or [])


CASES = 2500


@pytest.mark.integration  # thousands of requests through the whole server
@pytest.mark.parametrize("family, cases", [("chatml", CASES), ("qwen3", 800), ("gemma4", 800)])
def test_fuzzed_requests_never_get_a_5xx_and_the_server_answers_after(
    family, cases, pipe, tmp_path
):
    """On the tiny ChatML template (tools refused) and on two published tool templates
    (tools rendered, scripted calls parsed, Gemma 4's with its special tokens)."""
    if family != "chatml":
        from support.serve_tools import SPECIAL, template

        codec = codec_with(tmp_path, template(family), SPECIAL[family])
        pipe = StubPipe(codec, context=4096, answers=TOOL_ANSWERS[family])
    rng = random.Random(35)
    statuses: dict[int, int] = {}
    calls = 0
    with stub_app(pipe) as http:
        for i in range(cases):
            tools = family != "chatml" and rng.random() < 0.5
            route, content = tool_body(rng) if tools else fuzz_body(rng)
            r = http.post(route, content=content, headers={"Content-Type": "application/json"})
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            calls += calls_in(r)
            assert r.status_code < 500, (i, content[:300], r.text[:300])
            if r.status_code >= 400:
                assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        hi = {"messages": [{"role": "user", "content": "hi"}]}
        ok = http.post("/v1/chat/completions", json=hi)
        assert ok.status_code == 200 and http.get("/health").json()["status"] == "ok"
    assert statuses.get(200, 0) > cases // 20 and statuses.get(400, 0) > cases // 10, statuses
    assert family == "chatml" or calls >= 10  # calls were parsed, whole and streamed


@pytest.mark.integration  # many requests through the whole server
def test_fuzzed_requests_on_a_real_pipeline_never_get_a_5xx(tiny_qwen3_deep, tiny_dflash):
    """Through real pipelines (the tiny Qwen3, AR and DFlash, a 64-token context): every field's
    every value in a valid request, then 100 fuzzed bodies, so what only the engine sees
    (extreme sampling values, answers that fill the context) is held to it too; it caught
    temperature 1e-300 (a NaN softmax)."""
    from starlette.testclient import TestClient

    from specgen.api.pipeline import Pipeline
    from specgen.api.spec import SpecConfig
    from specgen.serve.app import Service, build_app
    from specgen.serve.metrics import Metrics
    from specgen.serve.openai_api import Defaults
    from specgen.serve.worker import Worker

    def load():
        spec = SpecConfig(method="dflash", drafter=str(tiny_dflash))
        return {
            m: Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32", context=64,
                             spec=spec if m == "dflash" else None)
            for m in ("ar", "dflash")
        }  # fmt: skip

    worker = Worker(load, queue_size=8)
    worker.start()
    service = Service(worker, "m", frozenset({"m"}), Defaults(max_tokens=4),
                      Metrics(("ar", "dflash")))  # fmt: skip
    rng = random.Random(36)
    statuses: dict[int, int] = {}
    # every field's every value once in an otherwise valid request, then random bodies
    bases = [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                       "specgen": {"method": "dflash"}}),
             ("/v1/completions", {"prompt": "hi"})]  # fmt: skip
    single = [
        (route, json.dumps({**base, "max_tokens": 4, name: value}).encode())
        for name, values in FIELDS.items()
        for value in values
        for route, base in bases
    ]
    try:
        with TestClient(build_app(service)) as http:
            for i in range(len(single) + 100):
                route, content = single[i] if i < len(single) else fuzz_body(rng)
                r = http.post(route, content=content, headers={"Content-Type": "application/json"})
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                assert r.status_code < 500, (i, content[:300], r.text[:300])
                assert "internal_error" not in r.text, (content[:300], r.text[:300])  # in a stream
            assert http.post("/v1/completions", json={"prompt": "hi"}).status_code == 200
    finally:
        worker.close()
    assert statuses.get(200, 0) > 10, statuses


# --- issue 49: bounds and statuses clients rely on ------------------------------------------


def test_max_tokens_is_bounded_by_the_context(pipe):
    with stub_app(pipe) as http:  # context 256
        r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 10**12})
        error = error_of(r, 400, "context_length_exceeded")
        assert error["param"] == "max_tokens" and "256" in error["message"]
        r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 255})
        error_of(r, 400, "context_length_exceeded")  # 2 prompt tokens + 255 > 256
    with stub_app(pipe, max_tokens=10_000) as http:  # a default too large is cut to the room
        r = http.post("/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 200


def test_a_body_that_never_arrives_is_a_408():
    async def slow():
        yield b"{"
        await asyncio.sleep(5)
        yield b"}"

    with pytest.raises(APIError) as e:
        asyncio.run(limits.read_body_within({}, slow(), 100, timeout=0.2))
    assert e.value.status == 408 and e.value.code == "request_timeout"


def test_retry_after_is_one_place_of_the_measured_drain_rate():
    import time

    from specgen.serve.worker import Worker

    worker = Worker(lambda: {}, queue_size=1)
    now = time.perf_counter()
    worker._ends.extend([now - 6, now - 4, now - 2, now])  # a job ends every 2 s
    assert worker.retry_after() == 2  # one place frees in ~2 s, whatever the queue's length
    worker._ends.clear()
    assert worker.retry_after() == 1  # nothing measured yet: the running mean's 1 s


def test_health_says_stopping_with_a_503_and_models_by_id(pipe):
    with stub_app(pipe) as http:
        assert http.get("/v1/models/m").json()["id"] == "m"
        error_of(http.get("/v1/models/other"), 404, "model_not_found")
        assert http.get("/health").status_code == 200
        http.app.service.draining = True
        r = http.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "stopping"
        error_of(http.post("/v1/completions", json={"prompt": "hi"}), 503, "shutting_down")
