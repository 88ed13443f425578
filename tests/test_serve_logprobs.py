"""The server's logprobs, echo, penalties and tokenizer routes, on real tiny pipelines in
this process: OpenAI's shapes, the library's values (the target's raw distribution, the
same with a drafter), text and tokens kept in step across stop strings and streaming."""

from __future__ import annotations

import json
from contextlib import contextmanager

import openai
import pytest
from starlette.testclient import TestClient

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig
from specgen.serve.app import Service, build_app
from specgen.serve.metrics import Metrics
from specgen.serve.openai_api import Defaults
from specgen.serve.worker import Worker
from support.serve_stub import StubPipe, codec_with, stub_app

MSG = [{"role": "user", "content": "The quick brown fox"}]
RAW = "one two one two"
N = 12


@pytest.fixture(scope="module")
def pipes(tiny_qwen3_deep, tiny_dflash):
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    spec = SpecConfig(method="dflash", drafter=str(tiny_dflash), verify_policy="full")
    return {"ar": ar, "dflash": ar.with_spec(spec)}


@contextmanager
def served(pipes, **defaults):
    worker = Worker(lambda: pipes, queue_size=8)
    worker.start()
    service = Service(worker, "m", frozenset({"m"}), Defaults(max_tokens=N, **defaults),
                      Metrics(tuple(pipes)))  # fmt: skip
    worker.metrics = service.metrics
    try:
        with TestClient(build_app(service)) as http:
            yield http
    finally:
        worker.close()


@pytest.fixture(scope="module")
def http(pipes):
    with served(pipes) as client:
        yield client


def library(pipe, ids, n=N, **sampling):
    """(token ids, logprobs, text) of the library's answer on a fresh session."""
    out, logprobs, text = [], [], ""
    for chunk in pipe.stream_ids(
        ids, sampling=SamplingParams(**sampling), max_new_tokens=n, session=pipe.new_session()
    ):
        out += chunk.token_ids
        logprobs += chunk.logprobs
        text += chunk.text
    return out, logprobs, text


def named(pipe, token: int) -> str:
    """A token's text as OpenAI shows it: a part of a character as its bytes."""
    text = pipe.codec.tokenizer.decode([token])
    return "bytes:" if "\ufffd" in text else text


def same_name(shown: str, pipe, token: int) -> bool:
    want = named(pipe, token)
    return shown.startswith(want) if want == "bytes:" else shown == want


def assert_same_entries(got: list[dict], want: list[dict]) -> None:
    """Chat entries alike, values up to fp32 rounding (a request that reuses the cached
    prompt prefills fewer rows in one forward than one that does not)."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert (a["token"], a["bytes"]) == (b["token"], b["bytes"])
        assert a["logprob"] == pytest.approx(b["logprob"], abs=1e-5)
        assert [t["token"] for t in a["top_logprobs"]] == [t["token"] for t in b["top_logprobs"]]
        assert [t["logprob"] for t in a["top_logprobs"]] == pytest.approx(
            [t["logprob"] for t in b["top_logprobs"]], abs=1e-5
        )


def events(r) -> list[dict]:
    assert r.status_code == 200, r.text
    return [json.loads(e[6:]) for e in r.text.split("\n\n") if e.startswith("data: {")]


def post(http, route, **body):
    return http.post(route, json=body)


@pytest.mark.parametrize("method", ["ar", "dflash"])
def test_chat_logprobs_are_the_library_s_whole_and_streamed(http, pipes, method):
    pipe = pipes[method]
    ids, want, text = library(pipe, pipe.encode(MSG), logprobs=3)
    body = dict(messages=MSG, logprobs=True, top_logprobs=3, specgen={"method": method})
    r = post(http, "/v1/chat/completions", **body)
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == text
    content = choice["logprobs"]["content"]
    assert choice["logprobs"]["refusal"] is None and len(content) == len(ids)
    for entry, lp in zip(content, want, strict=True):
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["logprob"] == pytest.approx(lp.logprob, abs=1e-5)
        assert same_name(entry["token"], pipe, lp.token)
        tops = entry["top_logprobs"]
        assert [t["logprob"] for t in tops] == pytest.approx([v for _, v in lp.top], abs=1e-5)
        assert all(same_name(t["token"], pipe, i) for t, (i, _) in zip(tops, lp.top, strict=True))
    # byte-level BPE: the tokens' bytes are the answer's (random weights write invalid
    # UTF-8 too, which the text shows as U+FFFD)
    assert bytes(b for e in content for b in e["bytes"]).decode(errors="replace") == text
    chunks = events(post(http, "/v1/chat/completions", stream=True, **body))
    streamed = [e for c in chunks for e in (c["choices"][0]["logprobs"] or {}).get("content", [])]
    assert_same_entries(streamed, content)
    assert chunks[0]["choices"][0]["logprobs"] is None  # the role chunk


def test_the_openai_client_reads_them(http):
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http)
    r = client.chat.completions.create(
        model="m", messages=MSG, logprobs=True, top_logprobs=2, max_tokens=4
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and len(content[0].top_logprobs) == 2
    c = client.completions.create(model="m", prompt=RAW, logprobs=2, max_tokens=4, echo=True)
    assert c.choices[0].logprobs.token_logprobs[0] is None
    assert c.choices[0].text.startswith(RAW)


@pytest.mark.parametrize("method", ["ar", "dflash"])
def test_completion_logprobs_offsets_and_echo(http, pipes, method):
    pipe = pipes[method]
    prompt = pipe.encode(RAW, raw=True)
    ids, want, text = library(pipe, prompt, logprobs=2)
    body = dict(prompt=RAW, logprobs=2, specgen={"method": method})
    choice = post(http, "/v1/completions", **body).json()["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"] == text and len(lp["tokens"]) == len(ids)
    assert lp["token_logprobs"] == pytest.approx([t.logprob for t in want], abs=1e-5)
    for top, t in zip(lp["top_logprobs"], want, strict=True):
        assert len(top) in (2, 3)  # the 2 likeliest and the chosen token
        chosen = [v for k, v in top.items() if same_name(k, pipe, t.token)]
        assert t.logprob == pytest.approx(chosen[0], abs=1e-5)
    offsets = lp["text_offset"] + [len(text)]
    assert offsets == sorted(offsets) and offsets[0] == 0
    streamed = events(post(http, "/v1/completions", stream=True, **body))
    shown = [c["choices"][0]["logprobs"] for c in streamed if c["choices"][0]["logprobs"]]
    assert streamed[-1]["choices"][0]["logprobs"] is None  # the finish chunk
    joined = {k: [x for one in shown for x in one[k]] for k in lp}
    assert (joined["tokens"], joined["text_offset"]) == (lp["tokens"], lp["text_offset"])
    assert joined["token_logprobs"] == pytest.approx(lp["token_logprobs"], abs=1e-5)
    assert [list(t) for t in joined["top_logprobs"]] == [list(t) for t in lp["top_logprobs"]]
    # echo: the prompt's tokens first (the first with nothing before it), then the answer
    scored = pipe.prompt_logprobs(prompt, top=2, session=pipe.new_session())
    echo = post(http, "/v1/completions", echo=True, **body).json()["choices"][0]
    assert echo["text"] == pipe.codec.decode(prompt) + text
    lp = echo["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    used = post(http, "/v1/completions", echo=True, **body).json()["usage"]
    assert used["prompt_tokens_details"]["cached_tokens"] == 0  # scored in this request
    assert lp["token_logprobs"][1 : len(prompt)] == pytest.approx(
        [s.logprob for s in scored], abs=1e-5
    )
    assert lp["token_logprobs"][len(prompt) :] == pytest.approx([t.logprob for t in want], abs=1e-5)
    assert lp["text_offset"][len(prompt)] == len(pipe.codec.decode(prompt))


def test_lm_eval_s_loglikelihood_request(http, pipes):
    """What lm-eval's local-completions sends for a loglikelihood request: token ids as a
    batch of one, echo, one new token, logprobs 1; it reads token_logprobs[ctxlen:-1]
    and calls a continuation greedy when each token's value is its top's largest."""
    pipe = pipes["ar"]
    context, continuation = pipe.encode("one two", raw=True), pipe.encode(" one two", raw=True)
    tokens = context + continuation
    body = dict(model="m", prompt=[tokens], max_tokens=1, logprobs=1, echo=True, temperature=0,
                seed=1234)  # fmt: skip
    for method in ("ar", "dflash"):
        lp = post(http, "/v1/completions", specgen={"method": method}, **body).json()
        lp = lp["choices"][0]["logprobs"]
        assert len(lp["token_logprobs"]) == len(tokens) + 1
        scored = pipe.prompt_logprobs(tokens, top=1, session=pipe.new_session())
        want = [s.logprob for s in scored][len(context) - 1 :]
        assert lp["token_logprobs"][len(context) : -1] == pytest.approx(want, abs=1e-5)
        greedy = [s.token == s.top[0][0] for s in scored][len(context) - 1 :]
        tops = lp["top_logprobs"][len(context) : -1]
        values = lp["token_logprobs"][len(context) : -1]
        assert [v == max(t.values()) for v, t in zip(values, tops, strict=True)] == greedy


def test_a_stop_token_as_the_one_new_token_is_still_reported(http, pipes, monkeypatch):
    """lm-eval drops the last entry as the new token's: when the model's next token ends
    the answer, it must still be there (vLLM and OpenAI report the stop token too)."""
    pipe = pipes["ar"]
    tokens = pipe.encode("one two one two", raw=True)
    nxt = library(pipe, tokens, n=1)[0][0]
    monkeypatch.setattr(pipe.codec, "stop_ids", frozenset({nxt}))
    body = dict(prompt=[tokens], max_tokens=1, logprobs=1, echo=True)
    choice = post(http, "/v1/completions", **body).json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["text"] == pipe.codec.decode(tokens)
    lp = choice["logprobs"]
    assert len(lp["token_logprobs"]) == len(tokens) + 1
    assert lp["text_offset"][-1] == len(choice["text"])
    chat = post(http, "/v1/chat/completions", messages=MSG, logprobs=True, max_tokens=3)
    assert chat.status_code == 200


def test_echo_with_no_new_tokens_scores_the_prompt_only(http, pipes):
    pipe = pipes["ar"]
    prompt = pipe.encode(RAW, raw=True)
    r = post(http, "/v1/completions", prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    body = r.json()
    assert body["choices"][0]["text"] == pipe.codec.decode(prompt)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 0
    lp = body["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(prompt) and lp["token_logprobs"][0] is None
    plain = post(http, "/v1/completions", prompt=RAW, echo=True).json()["choices"][0]
    assert plain["logprobs"] is None and plain["text"].startswith(pipe.codec.decode(prompt))


def test_a_stop_string_cuts_text_and_logprobs_alike(http, pipes):
    whole = post(http, "/v1/completions", prompt=RAW, logprobs=0, max_tokens=24).json()
    text, lp = whole["choices"][0]["text"], whole["choices"][0]["logprobs"]
    cut = len(text) // 2
    stop = text[cut : cut + 2]
    start = text.index(stop)
    for stream in (False, True):
        r = post(http, "/v1/completions", prompt=RAW, logprobs=0, max_tokens=24, stop=stop,
                 stream=stream)  # fmt: skip
        if stream:
            chunks = events(r)
            got = "".join(c["choices"][0]["text"] for c in chunks)
            offsets = [o for c in chunks if c["choices"][0]["logprobs"]
                       for o in c["choices"][0]["logprobs"]["text_offset"]]  # fmt: skip
        else:
            got = r.json()["choices"][0]["text"]
            offsets = r.json()["choices"][0]["logprobs"]["text_offset"]
        assert got == text[:start]
        assert offsets == [o for o in lp["text_offset"] if o < start]


@pytest.mark.parametrize("method", ["ar", "dflash"])
def test_penalties_are_the_library_s(http, pipes, method):
    pipe = pipes[method]
    penalties = dict(presence_penalty=0.5, frequency_penalty=0.8, repetition_penalty=1.3)
    prompt = pipe.encode(RAW, raw=True)
    _, _, want = library(pipe, prompt, n=20, **penalties)
    _, _, plain = library(pipe, prompt, n=20)
    assert want != plain
    r = post(http, "/v1/completions", prompt=RAW, max_tokens=20, specgen={"method": method},
             **penalties)  # fmt: skip
    assert r.json()["choices"][0]["text"] == want


def test_the_server_s_default_penalties(pipes):
    prompt = pipes["ar"].encode(RAW, raw=True)
    _, _, want = library(pipes["ar"], prompt, frequency_penalty=1.5)
    with served({"ar": pipes["ar"]}, frequency_penalty=1.5) as client:
        assert post(client, "/v1/completions", prompt=RAW).json()["choices"][0]["text"] == want
        unpenalised = post(client, "/v1/completions", prompt=RAW, frequency_penalty=0)
        assert unpenalised.json()["choices"][0]["text"] == library(pipes["ar"], prompt)[2]


BAD = [  # (route, body, status, param)
    ("/v1/chat/completions", {"messages": MSG, "logprobs": True, "top_logprobs": 21}, 400,
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": MSG, "top_logprobs": 2}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MSG, "logprobs": 3}, 400, "logprobs"),
    ("/v1/completions", {"prompt": RAW, "logprobs": 6}, 400, "logprobs"),
    ("/v1/completions", {"prompt": RAW, "logprobs": True}, 400, "logprobs"),
    ("/v1/completions", {"prompt": RAW, "logprobs": -1}, 400, "logprobs"),
    ("/v1/completions", {"prompt": RAW, "echo": "yes"}, 400, "echo"),
    ("/v1/completions", {"prompt": RAW, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": RAW, "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": RAW, "frequency_penalty": "high"}, 400, "frequency_penalty"),
    ("/v1/chat/completions", {"messages": MSG, "repetition_penalty": 0}, 400,
     "repetition_penalty"),
    ("/tokenize", {"prompt": 3}, 400, "prompt"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "no"}, 400, "add_special_tokens"),
    ("/detokenize", {"tokens": [1, 99999]}, 400, "tokens"),
    ("/detokenize", {"tokens": "1 2"}, 400, "tokens"),
]  # fmt: skip


@pytest.mark.parametrize("route, body, status, param", BAD, ids=[b[3] for b in BAD])
def test_bad_values_are_one_line_400s(http, route, body, status, param):
    r = http.post(route, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and "\n" not in error["message"]
    assert post(http, "/v1/completions", prompt=RAW, max_tokens=2).status_code == 200


def test_penalty_errors_say_the_library_s_rule(http):
    r = post(http, "/v1/completions", prompt=RAW, presence_penalty=2.5)
    assert r.json()["error"]["message"] == "presence_penalty must be in [-2, 2] (got 2.5)"
    r = post(http, "/v1/chat/completions", messages=MSG, logprobs=True, top_logprobs=21)
    assert r.json()["error"]["message"] == "top_logprobs must be in [0, 20] (got 21)"


def test_logprobs_with_tools_are_refused(tmp_path):
    from support.serve_tools import SPECIAL, WEATHER, template

    codec = codec_with(tmp_path, template("qwen3"), SPECIAL["qwen3"])
    with stub_app(StubPipe(codec, context=4096)) as client:
        body = dict(messages=MSG, tools=[WEATHER], logprobs=True)
        r = post(client, "/v1/chat/completions", **body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
        assert (
            post(client, "/v1/chat/completions", messages=MSG, tools=[WEATHER]).status_code == 200
        )


def test_tokenizer_routes_are_vllm_s(http, pipes):
    pipe = pipes["ar"]
    r = post(http, "/tokenize", prompt=RAW).json()
    assert r["tokens"] == pipe.codec.encode_raw(RAW) and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == pipe.context
    assert post(http, "/tokenize", messages=MSG).json()["tokens"] == pipe.encode(MSG)
    bare = post(http, "/tokenize", prompt=RAW, add_special_tokens=False).json()["tokens"]
    assert post(http, "/detokenize", tokens=bare).json()["prompt"] == RAW
    info = http.get("/tokenizer_info").json()
    assert info["eos_token"] == pipe.codec.tokenizer.eos_token
    assert info["chat_template"] == pipe.codec.tokenizer.chat_template
