"""`specgen bench --endpoint URL`: the SSE parser and each server's statistics on byte
streams written out by hand from their documented formats (specgen's extension, vLLM's
`metrics.speculative_decoding`, llama-server's `timings`, SGLang's `meta_info`), the client
against a mocked transport, the report's endpoint rows, and the whole command against a
real `specgen serve` on the tiny model. No timing is asserted."""

from __future__ import annotations

import io
import json
import re
import socket

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from specgen.bench.endpoint import EndpointClient, base_url, default_name
from specgen.bench.harness import BenchRun, PromptRun
from specgen.bench.report import acceptance_lines, results_table, summarize
from specgen.bench.stream import SSEDecoder, collect, served_stats
from specgen.cli import app
from specgen.core.config import SamplingParams
from specgen.core.errors import SpecgenError
from specgen.core.stats import GenStats
from support.serve import CPU, Server

# servers, subprocesses or whole CLI runs: not the quick tier
pytestmark = pytest.mark.integration

runner = CliRunner()
KEY = "bench-key"


# --- the SSE parser ------------------------------------------------------------------------


def _events(stream: bytes, cuts: list[int]) -> list[str]:
    decoder, out, last = SSEDecoder(), [], 0
    for cut in [*cuts, len(stream)]:
        out += decoder.feed(stream[last:cut])
        last = cut
    return out + decoder.close()


def test_sse_events_survive_any_split_of_the_bytes():
    stream = (
        b": keep-alive comment\r\n"
        b'event: message\r\nid: 7\r\ndata: {"a": "caf\xc3\xa9 \xe6\x9d\xb1"}\r\n\r\n'
        b'data:{"b": 1}\n\n'
        b"data: line one\rdata: line two\r\r"
        b"retry: 100\n"
        b"data: [DONE]\n\n"
    )
    want = ['{"a": "café 東"}', '{"b": 1}', "line one\nline two", "[DONE]"]
    assert _events(stream, []) == want
    for cut in range(1, len(stream)):  # a line, a CRLF or a UTF-8 character cut anywhere
        assert _events(stream, [cut]) == want, cut
    assert _events(stream, list(range(1, len(stream)))) == want  # one byte at a time


def test_a_last_event_without_its_blank_line_still_counts():
    assert _events(b'data: {"x": 1}\n\ndata: [DONE]', []) == ['{"x": 1}', "[DONE]"]
    assert _events(b"data: [DONE]\n", [3]) == ["[DONE]"]
    assert _events(b"\n\n: only comments\n\n", []) == []


# --- each server's statistics --------------------------------------------------------------

SPECGEN_FINAL = {
    "method": "dflash", "verify_policy": "full", "mean_acceptance_length": 2.0,
    "num_spec_steps": 3, "num_draft_tokens": 21, "num_accepted_draft_tokens": 3,
    "acceptance_histogram": [1, 1, 1], "mean_verify_length": 7.0,
    "acceptance_per_position": [0.667, 0.333], "tokens": 6, "ttft_seconds": 0.01,
}  # fmt: skip
VLLM_SPEC = {
    "mean_acceptance_length": 1.5, "draft_acceptance_rate": 0.1667,
    "acceptance_histogram": [2, 1, 0, 1],
    "acceptance_histogram_by_draft_length": {"3": [2, 1, 0, 1]},
    "num_spec_steps": 4, "num_accepted_draft_tokens": 4, "num_draft_tokens": 12,
    "num_spec_tokens": 3,
}  # fmt: skip


def test_specgen_and_vllm_share_the_names():
    got = served_stats({"choices": [], "usage": {}, "specgen": SPECGEN_FINAL})
    assert (got.tau, got.source, got.steps, got.accepted, got.drafted) == (
        2.0, "reported", 3, 3, 21
    )  # fmt: skip
    assert got.histogram == (1, 1, 1) and got.kind == "specgen"
    # specgen's running object on content chunks is not the final one
    assert served_stats({"specgen": {"tokens": 2, "tau": 1.5, "drafted_chars": 3}}) is None
    vllm = served_stats({"choices": [], "metrics": {"speculative_decoding": VLLM_SPEC}})
    assert (vllm.tau, vllm.steps, vllm.accepted, vllm.drafted, vllm.kind) == (
        1.5, 4, 4, 12, "vllm"
    )  # fmt: skip
    # no τ given: derived from the counts, or from a sparse histogram alone
    counts = served_stats(
        {"metrics": {"speculative_decoding": {"num_spec_steps": 4, "num_accepted_draft_tokens": 2}}}
    )
    assert (counts.tau, counts.source) == (1.5, "derived")  # fmt: skip
    sparse = served_stats({"x": {"acceptance_histogram": {"0": 1, "2": 1}, "num_spec_steps": 2}})
    assert sparse.histogram == (1, 0, 1) and sparse.accepted == 2 and sparse.tau == 2.0
    assert served_stats({"metrics": {"speculative_decoding": None}}) is None


def test_llama_cpp_timings_give_a_derived_tau():
    timings = {"prompt_n": 9, "predicted_n": 10, "predicted_per_second": 50.0,
               "draft_n": 12, "draft_n_accepted": 6}  # fmt: skip
    got = served_stats({"choices": [], "timings": timings})
    # every step commits its accepted drafts + one target token: 10 = steps + 6
    assert (got.tau, got.source, got.steps, got.accepted, got.drafted) == (
        2.5, "derived", 4, 6, 12
    )  # fmt: skip
    plain = served_stats({"timings": {"predicted_n": 10, "predicted_ms": 200.0}})
    assert plain.tau is None and plain.kind == "llama.cpp"  # whether it drafted: unknown


def test_sglang_meta_info():
    got = served_stats(
        {"choices": [{"meta_info": {"spec_accept_length": 2.5, "spec_verify_ct": 4}}]}
    )
    assert (got.tau, got.steps, got.accepted, got.kind) == (2.5, 4, 6, "sglang")


# --- whole recorded streams ----------------------------------------------------------------


def _sse(*objs) -> bytes:
    return b"".join(
        b"data: " + (o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n\n" for o in objs
    )


def _chunk(content=None, finish=None, role=False, **extra) -> dict:
    delta = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [choice], **extra}  # fmt: skip


class Tick:
    """A clock that advances 0.25 s at every reading."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.25
        return self.t


SPECGEN_STREAM = _sse(
    _chunk("", role=True),
    _chunk("Hello", specgen={"drafted_chars": 0, "tokens": 1, "tau": 1.0}),
    _chunk(" wor", specgen={"drafted_chars": 4, "tokens": 4, "tau": 2.0}),
    _chunk("ld!", specgen={"drafted_chars": 3, "tokens": 6, "tau": 2.0}),
    _chunk(None, "length", specgen=SPECGEN_FINAL),
    {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
     "usage": {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15},
     "specgen": SPECGEN_FINAL},
    b"[DONE]",
)  # fmt: skip
VLLM_STREAM = _sse(
    _chunk("", role=True, usage=None),
    *[_chunk(t, usage=None) for t in ("The", " answer", " is", " 4")],
    _chunk(None, "length", usage=None),
    {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
     "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
     "metrics": {"speculative_decoding": VLLM_SPEC}},
    b"[DONE]",
)  # fmt: skip
LLAMA_STREAM = _sse(
    *[_chunk(t) for t in ("Par", "is", ".")],
    _chunk(None, "stop", timings={"prompt_n": 12, "predicted_n": 3, "draft_n": 4,
                                  "draft_n_accepted": 1}),
    b"[DONE]",
)  # fmt: skip


def test_a_specgen_stream():
    answer = collect([SPECGEN_STREAM[:50], SPECGEN_STREAM[50:]], start=0.0, where="u",
                     clock=Tick())  # fmt: skip
    assert answer.text == "Hello world!" and answer.tokens == 6 and answer.tokens_from == "usage"
    assert answer.finish_reason == "length" and answer.stats.tau == 2.0
    # the role chunk (empty content) is not the first token; the second read brought it
    assert answer.ttft_seconds == 0.5 and answer.seconds == 0.5


def test_a_vllm_stream_read_chunk_by_chunk():
    pieces = [VLLM_STREAM[i : i + 7] for i in range(0, len(VLLM_STREAM), 7)]
    answer = collect(pieces, start=0.0, where="u", clock=Tick())
    assert answer.text == "The answer is 4" and answer.tokens == 4
    assert answer.stats.tau == 1.5 and answer.stats.histogram == (2, 1, 0, 1)
    assert 0 < answer.ttft_seconds < answer.seconds


def test_a_llama_server_stream_without_usage():
    answer = collect([LLAMA_STREAM], start=0.0, where="u", clock=Tick())
    assert answer.text == "Paris." and answer.tokens == 3 and answer.tokens_from == "timings"
    assert answer.stats.tau == 1.5 and answer.stats.source == "derived"
    no_count = collect([_sse(_chunk("a"), _chunk("b", "stop"))], start=0, where="u", clock=Tick())
    assert no_count.tokens == 2 and no_count.tokens_from == "chunks" and no_count.stats is None


@pytest.mark.parametrize(
    "stream, message",
    [
        (b"data: <html>\n\n", "u: not an OpenAI stream (an event is not JSON: '<html>')"),
        (_sse(_chunk("a"), {"error": {"message": "out of\nmemory", "code": 500}}),
         "u: the server failed mid-answer: out of memory"),
        (_sse({"object": "thing"}, b"[DONE]"),
         "u: not an OpenAI chat stream (no chunk had `choices`)"),
        (_sse(_chunk("a"), _chunk("b")), "u: the stream ended before the answer did"),
    ],
)  # fmt: skip
def test_what_is_not_an_openai_stream_is_one_line(stream, message):
    with pytest.raises(SpecgenError, match="^" + re.escape(message)):
        collect([stream], start=0.0, where="u")


# --- the client, on a mocked transport -----------------------------------------------------


def _transport(seen: list, *, models=None, status=200, chat=SPECGEN_STREAM, kind=None):
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path.endswith("/models"):
            if status != 200:
                return httpx.Response(status, json={"error": {"message": "bad key"}})
            return httpx.Response(200, json=models or {"object": "list", "data": [
                {"id": "qwen3-8b", "owned_by": "vllm"}, {"id": "other"}]})  # fmt: skip
        return httpx.Response(
            200, content=chat, headers={"content-type": kind or "text/event-stream"}
        )

    return httpx.MockTransport(handle)


def test_the_client_probes_then_asks_greedily_with_usage():
    seen: list[httpx.Request] = []
    client = EndpointClient("http://h:1/v1/", api_key="k", transport=_transport(seen))
    assert client.endpoint.model == "qwen3-8b" and client.endpoint.owned_by == "vllm"
    assert client.endpoint.name == "endpoint:h:1" and client.endpoint.url == "http://h:1/v1"
    assert [r.url.path for r in seen] == ["/v1/models", "/v1/chat/completions"]  # + warm-up
    answer = client.chat("Hi", max_tokens=64, sampling=SamplingParams(), think=False)
    body = json.loads(seen[-1].content)
    assert body == {
        "model": "qwen3-8b", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64,
        "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"enable_thinking": False},
    }  # fmt: skip
    assert seen[-1].headers["authorization"] == "Bearer k"
    assert answer.text == "Hello world!" and answer.stats.tau == 2.0
    sampled = client.chat("Hi", max_tokens=4, sampling=SamplingParams(0.7, 20, 0.9, seed=3))
    body = json.loads(seen[-1].content)
    assert (body["temperature"], body["top_k"], body["top_p"], body["seed"]) == (0.7, 20, 0.9, 3)
    assert "chat_template_kwargs" not in body and sampled.tokens == 6
    client.close()
    named = EndpointClient("http://h:1", model="other", name="mine", transport=_transport([]))
    assert named.endpoint.model == "other" and named.endpoint.url == "http://h:1/v1"
    assert named.endpoint.name == "mine"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(status=401), r"^http://h:1/v1/models: HTTP 401 Unauthorized: bad key \(give "
                           r"--api-key KEY or set OPENAI_API_KEY\)$"),
        (dict(models={"models": []}), r"http://h:1/v1/models: not an OpenAI-compatible API"),
        (dict(models={"data": []}), r"lists no model: give --endpoint-model"),
        (dict(kind="application/json", chat=b'{"choices": []}'),
         r"chat/completions: answered a streamed request with application/json, not server"),
    ],
)  # fmt: skip
def test_probe_errors_are_one_line_naming_the_url(kwargs, message):
    with pytest.raises(SpecgenError, match=message):
        EndpointClient("http://h:1/v1", transport=_transport([], **kwargs))


def test_urls_and_names():
    assert base_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert base_url("https://x.org/api/v1/") == "https://x.org/api/v1"
    assert default_name("http://user:pw@127.0.0.1:8000/v1") == "endpoint:127.0.0.1:8000"
    with pytest.raises(SpecgenError, match="give an http:// or https:// URL"):
        base_url("127.0.0.1:8000")


# --- the report ----------------------------------------------------------------------------


def _local(method, category, prompt, seconds):
    stats = GenStats(new_tokens=10, steps=10, seconds=seconds, ttft_seconds=0.1)
    return PromptRun(method, category, prompt, list(range(10)), seconds, 0.1, stats)


def _remote(name, category, prompt, seconds, served):
    stats = GenStats(new_tokens=10, steps=served.steps or 0 if served else 0,
                     accepted=served.accepted or 0 if served else 0,
                     verified=served.drafted or 0 if served else 0)  # fmt: skip
    return PromptRun(name, category, prompt, [], seconds, 0.2, stats, remote=True, served=served)


def test_endpoint_rows_beside_local_ones():
    from specgen.bench.stream import ServedStats

    served = ServedStats(2.0, "reported", 5, 5, 14, (1, 3, 1), "specgen")
    runs = [
        _local("ar", "qa", 0, 1.0), _local("ar", "code", 1, 1.0),
        _remote("endpoint:h:1", "qa", 0, 0.5, served),
        _remote("endpoint:h:1", "code", 1, 0.25, served),
        _remote("llama", "qa", 0, 0.5, None), _remote("llama", "code", 1, 0.5, None),
        _remote("endpoint:x:80", "qa", 0, 0.5, None),
        _remote("endpoint:x:80", "code", 1, 0.5, None),
    ]  # fmt: skip
    summary = summarize(BenchRun(runs=runs), {"model": "m", "suite": "s", "temperature": 0.0})
    row = summary["results"]["endpoint:h:1"]["all"]
    assert row["speedup"] == pytest.approx((20 / 0.75) / 10, abs=1e-3)
    assert (row["tau"], row["tau_source"], row["steps"]) == (2.0, "reported", 10)
    assert row["mean_verify_length"] == 2.8 and row["draft_acceptance_rate"] == round(10 / 28, 4)
    assert row["acceptance_histogram"] == {"1": 2, "2": 6, "3": 2}
    assert row["decode_tokens_per_second"] == pytest.approx(18 / 0.35, abs=1e-3)
    unknown = summary["results"]["llama"]["all"]
    assert unknown["tau"] is None and unknown["mean_verify_length"] is None
    console = Console(file=io.StringIO(), width=80, record=True)
    console.print(results_table(summary))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "endpoint:x:80" in text  # printed as it is, not as :x: markup (an emoji)
    llama = next(line for line in text.splitlines() if line.startswith("llama"))
    assert llama.split()[:8] == ["llama", "qa", "20.0", "2.00x", "-", "-", "-", "0.20"]
    lines = acceptance_lines(summary)
    assert lines[0] == "endpoint:h:1: τ reported by the server · tokens per step 1:2 2:6 3:2"
    assert lines[1] == "llama: the server reports no speculative statistics (τ unknown)"


def test_endpoints_alone_have_no_speedup(tmp_path):
    from specgen.bench.report import plot
    from specgen.bench.stream import ServedStats

    served = ServedStats(1.5, "derived", 4, 2, 8, None, "llama.cpp")
    run = BenchRun(runs=[_remote("a", "qa", 0, 0.5, served), _remote("b", "qa", 0, 1.0, None)])
    summary = summarize(run, {"model": "m", "suite": "s"})
    assert summary["methods"] == ["a", "b"] and summary["lossless"] is None
    assert summary["results"]["a"]["qa"]["speedup"] is None
    assert summary["results"]["a"]["qa"]["tau_source"] == "derived"
    pytest.importorskip("matplotlib")
    plot(summary, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


# --- the command ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line_error(result, *parts: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for part in parts:
        assert part in lines[0], lines[0]


def test_an_unreachable_endpoint_is_one_line_before_anything_loads(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    url = f"http://127.0.0.1:{_free_port()}/v1"
    # --model names nothing that exists: had it been loaded first, that would be the error
    result = runner.invoke(app, ["bench", "--endpoint", url, "--model", "/no/such/model"])
    _one_line_error(result, f"cannot reach {url}/models")


def test_bad_endpoint_options_are_one_line():
    result = runner.invoke(app, ["bench", "--methods", "none"])
    _one_line_error(result, "--methods none runs nothing: give --endpoint URL")
    result = runner.invoke(app, ["bench", "--endpoint-model", "m", "--methods", "none"])
    _one_line_error(result, "--methods none runs nothing")
    two = ["--endpoint", "http://10.0.0.1:1", "--endpoint", "http://10.0.0.1:1/x"]
    result = runner.invoke(app, ["bench", *two, "--methods", "none"])
    _one_line_error(result, "two endpoints named endpoint:10.0.0.1:1: give each an --endpoint-name")
    result = runner.invoke(app, ["bench", *two, "--endpoint-name", "x", "--methods", "none"])
    _one_line_error(result, "1 --endpoint-name for 2 --endpoint")
    result = runner.invoke(
        app, ["bench", "--endpoint", "http://10.0.0.1:1", "--endpoint-name", "ar"]
    )
    _one_line_error(result, "--endpoint-name ar is a local method's name")


@pytest.fixture(scope="module")
def server(tiny_qwen3_deep, tiny_dflash):
    srv = Server(
        "--model", str(tiny_qwen3_deep), "--method", "dflash", "--drafter", str(tiny_dflash),
        "--verify-policy", "full", "--quiet", *CPU, key=KEY,
    )  # fmt: skip
    yield srv
    srv.stop()


def _bench(*args: str, env: dict | None = None):
    return runner.invoke(
        app,
        ["bench", "--num-prompts", "3", "--max-new-tokens", "12", "--json", "--quiet", *args],
        env={"OPENAI_API_KEY": None, **(env or {})},
    )


def test_local_methods_and_the_server_side_by_side(server, tiny_qwen3_deep, tiny_dflash):
    result = _bench(
        "--model", str(tiny_qwen3_deep), "--methods", "ar,dflash", "--drafter", str(tiny_dflash),
        "--verify-policy", "full", *CPU, "--endpoint", server.base, "--api-key", KEY,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    name = "endpoint:" + server.base.split("//")[1].removesuffix("/v1")
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert last["methods"] == ["ar", "dflash", name]
    assert last["endpoints"][name]["owned_by"] == "specgen"
    assert last["endpoints"][name]["model"] == tiny_qwen3_deep.name
    row = last["results"][name]["all"]
    assert row["prompts"] == 3 and row["new_tokens"] > 3
    assert row["tokens_per_second"] > 0 and row["decode_tokens_per_second"] > 0
    assert row["ttft_seconds"] > 0 and row["speedup"] > 0
    # τ from specgen's extension: the server ran DFlash with every draft verified
    assert row["tau_source"] == "reported" and row["tau"] >= 1.0 and row["steps"] > 0
    # the same numbers as the same method run here: same prompts, drafter and policy
    local = last["results"]["dflash"]["all"]
    assert (row["tau"], row["steps"]) == (local["tau"], local["steps"])
    assert row["mean_verify_length"] == local["mean_verify_length"] > 0
    assert set(row["acceptance_histogram"]) <= {str(k) for k in range(1, 9)}
    # greedy and lossless: the server's answers are the local AR's, text for text
    assert last["lossless"][name]["match_rate"] == 1.0
    assert last["lossless"]["dflash"]["match_rate"] == 1.0
    table = result.stderr  # --json: the table goes to stderr, stdout is the JSON alone
    assert "endpoint:" in table and "3/3" in table


def test_the_server_alone(server):
    result = _bench(
        "--methods", "none", "--endpoint", server.base, "--endpoint-name", "served",
        env={"OPENAI_API_KEY": KEY},
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert last["methods"] == ["served"] and last["lossless"] is None
    assert last["device"] is None and last["model"] == last["endpoints"]["served"]["model"]
    row = last["results"]["served"]["all"]
    assert row["speedup"] is None and row["tau"] >= 1.0 and row["ttft_seconds"] > 0
    assert "served" in result.stderr  # the table; stdout is the JSON alone


def test_a_server_that_wants_a_key(server):
    result = _bench("--methods", "none", "--endpoint", server.base)
    _one_line_error(result, f"{server.base}/models: HTTP 401", "give --api-key KEY")
    result = _bench("--methods", "none", "--endpoint", server.base, "--api-key", "wrong")
    _one_line_error(result, "HTTP 401", "the --api-key given was refused")


# --- the harness ---------------------------------------------------------------------------


class _Stub:
    """An endpoint that answers from a list (what EndpointClient.chat returns)."""

    def __init__(self, answers) -> None:
        self.answers = list(answers)
        self.asked: list[tuple] = []

    def chat(self, text, *, max_tokens, sampling, think=None):
        self.asked.append((text, max_tokens, think))
        return self.answers.pop(0)


def test_endpoints_alone_in_the_harness_keep_the_median_time():
    from specgen.bench.harness import run_bench
    from specgen.bench.stream import Answer, ServedStats
    from specgen.bench.suites import BenchPrompt

    served = ServedStats(2.0, "reported", 2, 2, 6, (1, 0, 1), "specgen")
    answers = [Answer("a b", None, 4, "usage", s, 0.1, "length", served) for s in (3, 1, 2)]
    stub = _Stub(answers)
    labels: list[str] = []
    run = run_bench(
        {}, [BenchPrompt("qa", "Hi")], max_new_tokens=4, sampling=SamplingParams(),
        repeats=3, progress=labels.append, endpoints={"e": stub}, think=False,
    )  # fmt: skip
    assert stub.asked == [("Hi", 4, False)] * 3 and labels == ["e · qa 1/1"]
    (got,) = run.runs
    assert got.remote and got.seconds == 2 and got.text == "a b" and got.served is served
    assert (got.stats.new_tokens, got.stats.steps, got.stats.accepted) == (4, 2, 2)
    assert run.compared == {}  # no AR here: nothing to hold the answer to


def test_a_served_text_that_differs_from_ar_s_names_the_token(tiny_llama):
    from specgen.api.pipeline import Pipeline
    from specgen.bench.harness import _text_divergence, run_bench
    from specgen.bench.stream import Answer
    from specgen.bench.suites import BenchPrompt

    ar = Pipeline.load(str(tiny_llama), device="cpu", dtype="float32")
    want = ar.generate("The quick brown fox", max_new_tokens=10).token_ids
    text = ar.codec.decode(want)
    assert _text_divergence(ar, want, text) == len(want)
    cut = _text_divergence(ar, want, text[:3] + "\x00")
    for j in range(cut):  # every token before it is in the served text; that one is not
        assert (text[:3] + "\x00").startswith(ar.codec.decode(want[: j + 1]).rstrip("\ufffd"))
    assert cut < len(want)
    stub = _Stub([Answer(text[:3] + "\x00", None, 2, "usage", 1.0, 0.5, "length")])
    run = run_bench(
        {"ar": ar}, [BenchPrompt("qa", "The quick brown fox")], max_new_tokens=10,
        sampling=SamplingParams(), endpoints={"e": stub},
    )  # fmt: skip
    assert run.compared == {"e": 1} and run.identical == {}
    (d,) = run.divergences
    assert (d.method, d.position) == ("e", cut) and d.margin >= 0
