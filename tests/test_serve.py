"""`specgen serve` end to end: the real server in a subprocess, driven with the official
`openai` client, its answers held to `specgen generate --json` with the same options.

One server runs every method on the tiny 6-layer Qwen3 (DFlash and DSpark drafters
given, so stacked mounts both); `--verify-policy full` so no step costs decide draws.
"""

from __future__ import annotations

import json
import signal
import time

import httpx
import openai
import pytest

from specgen.serve.server import default_parallel
from support.serve import CPU, Server, generate, streamed

# servers, subprocesses or whole CLI runs: not the quick tier
pytestmark = pytest.mark.integration

METHODS = ("ar", "ngram", "dflash", "dspark", "stacked")
KEY = "test-key"
CHAT = "The quick brown fox"
RAW = "def add(a, b):"
N = 12  # tokens per answer: enough to cross several steps, cheap on 2 cores


@pytest.fixture(scope="module")
def drafters(tiny_dflash, tiny_dspark) -> dict[str, list[str]]:
    """Each method's --drafter options for `generate`."""
    d, s = ["--drafter", str(tiny_dflash)], ["--drafter", str(tiny_dspark)]
    return {"ar": [], "ngram": [], "dflash": d, "dspark": s, "stacked": d + s}


@pytest.fixture(scope="module")
def server(tiny_qwen3_deep, tiny_dflash, tiny_dspark):
    srv = Server(
        "--model", str(tiny_qwen3_deep), "--methods", ",".join(METHODS),
        "--drafter", str(tiny_dflash), "--drafter", str(tiny_dspark),
        "--verify-policy", "full", *CPU, key=KEY,
    )  # fmt: skip
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return server.client()


def reference(model, drafters, method: str, prompt: str, *args: str) -> dict:
    opts = ["--method", method, *drafters[method], "--verify-policy", "full", "-n", str(N)]
    return generate(str(model), prompt, *opts, *args)


def spec(method: str) -> dict:
    return {"specgen": {"method": method}}


def test_ready_line_models_and_health(server, client):
    models = client.models.list().data
    assert len(models) == 1
    said = f"{', '.join(METHODS)}, {default_parallel()} slots"
    assert server.ready == f"serving {models[0].id} ({said}) on {server.base}"
    assert models[0].model_extra["specgen"]["methods"] == list(METHODS)
    health = httpx.get(server.url + "/health").json()  # open without the key
    assert health["status"] == "ok" and health["methods"] == list(METHODS)


def test_the_api_key_is_required_except_on_health(server):
    for path in ("/v1/models", "/metrics"):
        r = httpx.get(server.url + path)
        assert r.status_code == 401, path
        assert r.json()["error"]["code"] == "invalid_api_key"
        assert (
            httpx.get(server.url + path, headers={"Authorization": "Bearer nope"}).status_code
            == 401
        )
        assert httpx.get(server.url + path, headers=server.headers).status_code == 200
    r = httpx.post(server.url + "/v1/completions", json={"prompt": RAW, "max_tokens": 2})
    assert r.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.base, api_key="wrong", max_retries=0).models.list()
    assert httpx.get(server.url + "/health").status_code == 200


@pytest.mark.parametrize("method", METHODS)
def test_greedy_answers_are_generate_s(method, server, client, drafters, tiny_qwen3_deep):
    """Chat (through the chat template) and completions (raw text), streamed and not:
    exactly the text and token count of `specgen generate --json`."""
    chat_ref = reference(tiny_qwen3_deep, drafters, method, CHAT)
    raw_ref = reference(tiny_qwen3_deep, drafters, method, RAW, "--raw")
    messages = [{"role": "user", "content": CHAT}]
    r = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=messages,
        max_tokens=N,
        extra_body=spec(method),
    )
    assert r.choices[0].message.content == chat_ref["text"]
    assert r.usage.completion_tokens == len(chat_ref["token_ids"])
    assert r.usage.prompt_tokens == chat_ref["stats"]["prompt_tokens"]
    assert r.model_extra["specgen"]["method"] == method
    assert r.choices[0].finish_reason == chat_ref["stats"]["finish_reason"]  # length or stop
    s = streamed(client.chat.completions.create(
        model="", messages=messages, max_tokens=N, stream=True, extra_body=spec(method)
    ))  # fmt: skip
    assert s.text == chat_ref["text"] and s.finish == r.choices[0].finish_reason
    c = client.completions.create(model="", prompt=RAW, max_tokens=N, extra_body=spec(method))
    assert c.choices[0].text == raw_ref["text"]
    assert c.usage.completion_tokens == len(raw_ref["token_ids"])
    s = streamed(client.completions.create(
        model="", prompt=RAW, max_tokens=N, stream=True, extra_body=spec(method)
    ))  # fmt: skip
    assert s.text == raw_ref["text"]
    for chunk in s.chunks:  # the running stats on every text chunk
        run = chunk.model_extra["specgen"]
        assert 0 <= run["drafted_chars"] <= len(chunk.choices[0].text)
        assert run["tau"] >= 1 and run["tokens"] >= 1


def test_stop_strings_are_exact_even_across_chunks(server, client):
    full = streamed(client.completions.create(model="", prompt=RAW, max_tokens=24, stream=True))
    text = full.text
    ends = []  # where each chunk's text ends in the answer
    for chunk in full.chunks:
        ends.append((ends[-1] if ends else 0) + len(chunk.choices[0].text))
    cut = next(b for b in ends[:-1] if b >= 1 and text.find(text[b - 1 : b + 1]) == b - 1)
    stop = text[cut - 1 : cut + 1]  # two characters from two chunks
    for stops in (stop, [stop, "\x00never\x00"]):
        s = streamed(client.completions.create(
            model="", prompt=RAW, max_tokens=24, stream=True, stop=stops
        ))  # fmt: skip
        assert s.text == text[: cut - 1] and s.finish == "stop", (stops, s.text, text)
        whole = client.completions.create(model="", prompt=RAW, max_tokens=24, stop=stops)
        assert whole.choices[0].text == text[: cut - 1]
        assert whole.choices[0].finish_reason == "stop"
    s = streamed(client.completions.create(
        model="", prompt=RAW, max_tokens=24, stream=True, stop=["\x00never\x00"]
    ))  # fmt: skip
    assert s.text == text and s.finish == "length"


@pytest.mark.parametrize("method", ["ar", "dflash"])
def test_a_seed_gives_generate_s_sample(method, server, client, drafters, tiny_qwen3_deep):
    ref = reference(tiny_qwen3_deep, drafters, method, CHAT, "--temperature", "0.9", "--seed", "11")
    messages = [{"role": "user", "content": CHAT}]
    texts = [
        client.chat.completions.create(
            model="", messages=messages, max_tokens=N, temperature=0.9, seed=11,
            extra_body=spec(method),
        ).choices[0].message.content
        for _ in range(2)
    ]  # fmt: skip
    assert texts == [ref["text"], ref["text"]]


def test_usage_counts_cached_prompt_tokens(server, client):
    first = [{"role": "user", "content": CHAT}]
    r1 = client.chat.completions.create(
        model="", messages=first, max_tokens=6, extra_body=spec("ar")
    )
    again = first + [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": RAW},
    ]
    r2 = client.chat.completions.create(
        model="", messages=again, max_tokens=6, extra_body=spec("ar")
    )
    u = r2.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 1 > 0
    stats = r2.model_extra["specgen"]
    assert stats["cached_tokens"] == u.prompt_tokens_details.cached_tokens
    assert stats["prefill_tokens"] == u.prompt_tokens - stats["cached_tokens"]


@pytest.mark.parametrize("method", ["dflash", "stacked"])
def test_the_stats_object(method, server, client):
    r = client.completions.create(
        model="", prompt=RAW, max_tokens=N, extra_body=spec(method),
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    s = streamed(r)
    stats = s.usage.model_extra["specgen"]
    assert stats == s.final.model_extra["specgen"]
    for key in (
        "method", "verify_policy", "mean_acceptance_length", "num_spec_steps", "num_draft_tokens",
        "num_accepted_draft_tokens", "acceptance_histogram", "mean_verify_length",
        "acceptance_per_position", "tokens_per_second", "ttft_seconds", "drafters",
        "prefill_tokens", "cached_tokens", "speedup_vs_ar_modeled",
    ):  # fmt: skip
        assert key in stats, key
    # modeled from the cost table on both sides: stacked decides from one (it chooses
    # between drafters), dflash verifying every draft has none, so nothing is claimed
    speedup = stats["speedup_vs_ar_modeled"]
    assert (speedup > 0) if method == "stacked" else (speedup is None)
    hist, steps = stats["acceptance_histogram"], stats["num_spec_steps"]
    assert sum(hist) == steps > 1
    assert sum(k * n for k, n in enumerate(hist)) == stats["num_accepted_draft_tokens"]
    tau = 1 + stats["num_accepted_draft_tokens"] / steps
    assert stats["mean_acceptance_length"] == pytest.approx(tau, abs=1e-3)
    assert stats["num_draft_tokens"] > 0 and stats["verify_policy"] == "full"
    assert s.usage.usage.completion_tokens == stats["tokens"]
    if method == "stacked":
        # the learned drafters given, and the copy drafter suffix a stacked server mounts
        assert set(stats["drafters"]) <= {"dflash", "dspark", "suffix"} and stats["drafters"]


def _metrics(server) -> dict[str, float]:
    text = httpx.get(server.url + "/metrics", headers=server.headers).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_metrics(server, client):
    client.completions.create(model="", prompt=RAW, max_tokens=4, extra_body=spec("dflash"))
    httpx.post(server.url + "/v1/completions", headers=server.headers, content=b"{")
    m = _metrics(server)
    assert m['specgen_requests_total{route="/v1/completions",status="200"}'] >= 1
    assert m['specgen_requests_total{route="/v1/completions",status="400"}'] >= 1
    assert m['specgen_spec_decode_num_draft_tokens_total{method="dflash"}'] > 0
    assert m['specgen_mean_acceptance_length{method="ar"}'] == 1
    assert m["specgen_generation_tokens_total"] >= 4 and m["specgen_prompt_tokens_total"] > 0
    assert m['specgen_tokens_per_second{method="dflash"}'] > 0
    assert m["specgen_queue_depth"] == 0


HI = [{"role": "user", "content": "x"}]
BAD = [  # (route, body, status, param or code the error names)
    ("/v1/chat/completions", b"{not json", 400, "invalid_json"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, 400,
     "messages[0].content"),
    ("/v1/chat/completions", {"messages": "hello"}, 400, "messages"),
    ("/v1/completions", {"prompt": RAW, "max_tokens": "8"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": RAW, "temperature": True}, 400, "temperature"),
    ("/v1/completions", {"prompt": RAW, "n": 2}, 400, "n"),
    ("/v1/completions", {"prompt": RAW, "logprobs": 6}, 400, "logprobs"),
    ("/v1/chat/completions", {"messages": HI, "logprobs": True, "top_logprobs": 21}, 400,
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": HI, "tools": [{"type": "function"}]}, 400,
     "tools[0].function"),
    ("/v1/completions", {"prompt": RAW, "frequency_penalty": 2.5}, 400, "frequency_penalty"),
    ("/v1/completions", {"prompt": RAW, "model": "gpt-4o"}, 404, "model"),
    ("/v1/completions", {"prompt": RAW, "specgen": {"method": "eagle"}}, 400, "specgen.method"),
    ("/v1/completions", {"prompt": "fox " * 400}, 400, "context_length_exceeded"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": [RAW, RAW]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 99999]}, 400, "prompt"),
    ("/v1/nowhere", {}, 404, "not_found"),
]  # fmt: skip


@pytest.mark.parametrize("route, body, status, names", BAD, ids=[f"{b[0]}:{b[3]}" for b in BAD])
def test_errors_are_one_json_line_and_the_server_keeps_serving(route, body, status, names, server):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with server.http() as http:
        r = http.post(route, content=content, headers={"Content-Type": "application/json"})
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert names in (error["param"], error["code"]), error
        assert "\n" not in error["message"] and "Traceback" not in r.text
        ok = http.post("/v1/completions", json={"prompt": RAW, "max_tokens": 2})
        assert ok.status_code == 200


def test_harmless_fields_are_accepted(server, client):
    r = client.chat.completions.create(
        model="", messages=[{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": [{"type": "text", "text": CHAT}]}],
        max_completion_tokens=3, user="u1", logprobs=False, presence_penalty=0,
        frequency_penalty=0.0, logit_bias={}, response_format={"type": "text"}, n=1,
        parallel_tool_calls=True, metadata={"a": "b"}, store=False, top_p=1.0,
    )  # fmt: skip
    assert r.usage.completion_tokens == 3


def test_a_client_that_leaves_stops_its_answer(server, client, drafters, tiny_qwen3_deep):
    ref = reference(tiny_qwen3_deep, drafters, "ar", RAW, "--raw")
    before = _metrics(server).get('specgen_finished_total{reason="cut_client"}', 0)
    with server.http() as http:
        body = {"prompt": "The quick", "max_tokens": 200, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as r:
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data:")
                if seen == 3:
                    break  # the client goes away mid-stream
        with pytest.raises(httpx.TimeoutException):  # a non-streamed one, left waiting
            http.post("/v1/completions", json={"prompt": "The", "max_tokens": 200}, timeout=0.3)
    c = client.completions.create(model="", prompt=RAW, max_tokens=N, extra_body=spec("ar"))
    assert c.choices[0].text == ref["text"]  # the session was left consistent
    for _ in range(50):  # both cut at their next step
        if _metrics(server).get('specgen_finished_total{reason="cut_client"}', 0) >= before + 2:
            break
        time.sleep(0.1)
    assert _metrics(server)['specgen_finished_total{reason="cut_client"}'] >= before + 2


def test_sigterm_lets_the_answer_in_flight_finish_and_exits_0(server):
    """Last in this module: it stops the server."""
    with server.http() as http:
        body = {"prompt": RAW, "max_tokens": 40, "stream": True}
        lines = []
        with http.stream("POST", "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    lines.append(line)
                    if len(lines) == 2:
                        server.proc.send_signal(signal.SIGTERM)
    assert lines[-1] == "data: [DONE]"
    final = json.loads(lines[-2][len("data: ") :])
    assert final["choices"][0]["finish_reason"] in ("length", "stop")  # not cut: it had time
    assert server.stop() == 0
    assert "Traceback" not in "".join(server.log)
