"""`specgen serve`'s parts without a model: exact stop strings, request parsing, the
statistics object, a full queue, and its command line's one-line errors."""

from __future__ import annotations

import re
import socket
import threading
import time
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from specgen.core.stats import GenStats
from specgen.serve.errors import APIError
from specgen.serve.openai_api import Defaults, parse
from specgen.serve.report import histogram
from specgen.serve.stops import Piece, StopCut
from support.cli import assert_one_line_error, run

# --- stop strings ---------------------------------------------------------------------------


def feed(cut: StopCut, *parts: tuple[str, int]) -> list[list[Piece]]:
    return [cut.push(text, drafted) for text, drafted in parts]


def test_text_that_may_start_a_stop_is_held_until_decided():
    cut = StopCut(("END",))
    assert feed(cut, ("abcE", 0), ("N", 0)) == [[Piece("abc")], []]
    assert cut.push("x", 0) == [Piece("ENx")]  # not a stop after all: released
    assert not cut.stopped


def test_a_stop_split_across_chunks_is_cut_exactly():
    cut = StopCut(("END", "stop here"))
    assert feed(cut, ("one E", 0), ("NDtwo", 0)) == [[Piece("one ")], []]
    assert cut.stopped and cut.push("more", 0) == [] and cut.flush() == []


def test_the_earliest_stop_wins_and_a_held_tail_is_flushed_at_the_end():
    cut = StopCut(("bc", "ab"))
    assert cut.push("xabc", 0) == [Piece("x")]
    cut = StopCut(("abc",))
    assert cut.push("xab", 0) == [Piece("x")] and cut.flush() == [Piece("ab")]


def test_drafted_characters_stay_leading_in_each_piece():
    # held "E" (own) + "Nx" where "N" was drafted: two pieces, each drafted-first
    cut = StopCut(("END",))
    assert cut.push("aaE", 2) == [Piece("aa", 2)]
    assert cut.push("Nx", 1) == [Piece("E", 0), Piece("Nx", 1)]
    assert StopCut().push("abc", 3) == [Piece("abc", 3)]  # no stops: text as it came


# --- request parsing -------------------------------------------------------------------------

METHODS = ("dflash", "ar")
MSG = [{"role": "user", "content": "hi"}]


def parsed(**body):
    return parse(body, chat="messages" in body, defaults=Defaults(max_tokens=7), methods=METHODS)


def error(**body) -> APIError:
    with pytest.raises(APIError) as e:
        parsed(**body)
    return e.value


def test_defaults_and_overrides():
    r = parsed(messages=MSG)
    assert (r.method, r.max_tokens, r.sampling.greedy, r.stops, r.stream) == (
        "dflash", 7, True, (), False,
    )  # fmt: skip
    r = parsed(
        prompt="x", max_tokens=3, max_completion_tokens=5, temperature=1, top_k=-1, seed=4,
        stop="\n", stream=True, stream_options={"include_usage": True},
        specgen={"method": "ar"},
    )  # fmt: skip
    assert (r.max_tokens, r.sampling.temperature, r.sampling.top_k, r.sampling.seed) == (5, 1, 0, 4)
    assert (r.stops, r.include_usage, r.method, r.prompt) == (("\n",), True, "ar", "x")
    assert parsed(prompt=[5, 6]).prompt == [5, 6] and parsed(prompt=["x"]).prompt == "x"
    assert parsed(messages=[{"role": "developer", "content": "d"}]).prompt[0]["role"] == "system"


@pytest.mark.parametrize(
    "body, param",
    [
        (dict(messages=MSG, n=2), "n"),
        (dict(messages=MSG, n=True), "n"),
        (dict(messages=MSG, logprobs=1), "logprobs"),  # chat's is a boolean
        (dict(messages=MSG, top_logprobs=3), "top_logprobs"),  # without logprobs: true
        (dict(prompt="x", logprobs=6), "logprobs"),  # completions': OpenAI's 5 at most
        (dict(messages=MSG, tools=[{"type": "function"}]), "tools[0].function"),
        (dict(messages=MSG, response_format={"type": "xml"}), "response_format"),
        (dict(messages=MSG, presence_penalty=3), "presence_penalty"),
        (dict(messages=MSG, max_tokens=0), "max_tokens"),
        (dict(messages=MSG, max_tokens=2.5), "max_tokens"),
        (dict(messages=MSG, temperature="hot"), "temperature"),
        (dict(messages=MSG, temperature=3), "temperature"),
        (dict(messages=MSG, top_p=0), "top_p"),
        (dict(messages=MSG, seed=2**70), "seed"),
        (dict(messages=MSG, stop=[1]), "stop"),
        (dict(messages=MSG, stream_options={"include_usage": 1}), "stream_options.include_usage"),
        (dict(messages=MSG, specgen={"method": "eagle"}), "specgen.method"),
        (dict(messages=MSG, specgen={"methd": "ar"}), "specgen.methd"),
        (dict(messages=[{"role": "bot", "content": "x"}]), "messages[0].role"),
        (dict(messages=[{"role": ["user"], "content": "x"}]), "messages[0].role"),
        (dict(messages=[{"role": "user", "content": [{"type": "image"}]}]), "messages[0].content"),
        (dict(messages=[]), "messages"),
        (dict(prompt=None), "prompt"),
        (dict(prompt="x", echo="yes"), "echo"),
        (dict(prompt="x", max_tokens=0), "max_tokens"),  # 0 only scores an echoed prompt
    ],
)  # fmt: skip
def test_what_cannot_be_honoured_is_a_400_naming_the_field(body, param):
    e = error(**body)
    assert (e.status, e.param) == (400, param), e.message
    assert "\n" not in e.message


@pytest.mark.parametrize(
    "field, value, option",
    [("temperature", 2.5, "--temperature"), ("temperature", 1e-300, "--temperature"),
     ("top_p", 0.0, "--top-p"), ("top_k", -2, "--top-k"),
     ("seed", 2**64, "--seed"), ("max_tokens", 0, "--max-new-tokens"),
     ("presence_penalty", 2.5, "--presence-penalty"),
     ("frequency_penalty", -3.0, "--frequency-penalty"),
     ("repetition_penalty", 0.0, "--repetition-penalty")],
)  # fmt: skip
def test_the_server_holds_requests_to_the_command_lines_rule(field, value, option):
    """One rule in the library: a request's field and the option that sets its default are
    refused alike, in the same words (each named as its own interface calls it)."""
    e = error(messages=MSG, **{field: value})
    result = run("serve", "--model", "gpt-9", option, str(value))
    assert_one_line_error(result, 2, e.message.replace(field, option, 1))


def test_harmless_fields_pass():
    parsed(
        messages=MSG, user="u", logprobs=False, top_logprobs=0, presence_penalty=0.0,
        frequency_penalty=0, logit_bias={}, response_format={"type": "text"}, n=1,
        tool_choice="none", parallel_tool_calls=False, metadata={}, store=False, unknown=1,
    )  # fmt: skip


# --- the statistics object --------------------------------------------------------------------


def test_histogram_counts_steps_by_accepted_drafts():
    stats = GenStats()
    for accepted in (0, 3, 1, 0, 3):
        stats.record_step(accepted + 1, 4, accepted, None)
    assert histogram(stats) == [2, 1, 0, 2]
    assert histogram(GenStats()) == [0]


# --- a full queue ------------------------------------------------------------------------------


def test_a_full_queue_answers_503_with_retry_after():
    from specgen.serve.app import Service, build_app
    from specgen.serve.job import Overloaded
    from specgen.serve.metrics import Metrics

    def submit(job):
        raise Overloaded(3)

    pipe = SimpleNamespace(encode=lambda *a, **k: [1, 2, 3], context=64)
    worker = SimpleNamespace(pipes={"ar": pipe}, queued=4, running=1, submit=submit)
    service = Service(worker, "m", frozenset({"m"}), Defaults(), Metrics(("ar",)))
    with TestClient(build_app(service)) as http:
        r = http.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        assert r.status_code == 503 and r.headers["retry-after"] == "3"
        assert r.json()["error"]["code"] == "overloaded"
        service.draining = True
        assert http.post("/v1/completions", json={"prompt": "hi"}).status_code == 503
        assert "specgen_queue_depth 0" in http.get("/metrics").text  # the stub's gauges


# --- the command line ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--port", "70000"], "--port"),
        (["--queue-size", "0"], "--queue-size"),
        (["--api-key", " "], "--api-key"),
        (["--methods", "ar,eagle"], "unknown method 'eagle'"),
        (["--temperature", "-1"], "--temperature"),
    ],
)
def test_serve_refuses_bad_options_in_one_line(args, fragment, tiny_llama):
    result = run("serve", "--model", str(tiny_llama), *args)
    assert_one_line_error(result, 2, fragment)


def test_serve_says_a_busy_port_in_one_line(tiny_llama):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run("serve", "--model", str(tiny_llama), "--port", str(port))
    assert_one_line_error(result, 2, f"cannot listen on 127.0.0.1:{port}")


def test_serve_refuses_a_drafter_no_method_uses(tiny_qwen3_deep, tiny_dspark):
    args = ["--methods", "ar,dflash", "--drafter", str(tiny_dspark), "--port", "0"]
    result = run("serve", "--model", str(tiny_qwen3_deep), *args)
    assert_one_line_error(result, 2, "--drafter of kind dspark given, but --methods has no dspark")


# --- the worker behind the routes, with a scripted pipeline ------------------------------------


class ScriptedPipe:
    """Stands in for a Pipeline: each prompt's answer is a script of text pieces; "boom"
    raises before the first step, "late boom" after it."""

    context = 64
    costs = None  # no cost table: no modeled speedup
    model = SimpleNamespace(args=SimpleNamespace(vocab_size=100))
    scripts = {"ok": ["ab", "cE", "ND", "x"], "boom": [], "late boom": ["a", "b"], "held": ["h"]}

    def __init__(self) -> None:
        self.closed = 0  # streams closed (a stop or a bug ends them at once)
        self.hold = threading.Event()  # "held" answers wait for it before their step
        self.hold.set()
        self.busy_at_end: list[bool] = []  # `busy` as each "held" answer ended

    def encode(self, prompt, raw=False, think=None):
        return [list(self.scripts).index(prompt)] * 3

    def stream_ids(self, ids, sampling=None, max_new_tokens=256, cancel=None, **kwargs):
        from specgen.api.pipeline import Chunk
        from specgen.core.errors import Cancelled

        name = list(self.scripts)[ids[0]]
        stats = GenStats(prompt_tokens=len(ids), prefill_tokens=len(ids))
        try:
            if cancel is not None and cancel():  # as between prefill chunks
                raise Cancelled("cancelled before the prefill")
            if name == "boom":
                raise RuntimeError("boom")
            pieces = self.scripts[name][:max_new_tokens]
            for i, text in enumerate(pieces):
                if name == "late boom" and i == 1:
                    raise RuntimeError("late boom")
                if name == "held":  # where a Pipeline judges its costs, it asks `busy`
                    self.hold.wait(30)
                    self.busy_at_end.append(self.busy())
                stats.record_step(1, 0, 0, "length" if i == len(pieces) - 1 else None)
                yield Chunk(text, (i,), stats)
        finally:
            self.closed += 1


@pytest.fixture
def scripted():
    from specgen.serve.app import Service, build_app
    from specgen.serve.metrics import Metrics
    from specgen.serve.worker import Worker

    pipe = ScriptedPipe()
    worker = Worker(lambda: {"ar": pipe}, queue_size=4)
    worker.start()
    service = Service(worker, "m", frozenset({"m"}), Defaults(), Metrics(("ar",)))
    worker.metrics = service.metrics
    with TestClient(build_app(service)) as http:
        yield http, pipe, worker
    worker.close()


def test_a_bug_in_an_answer_is_a_500_line_and_the_next_answer_comes(scripted):
    http, pipe, _ = scripted
    r = http.post("/v1/completions", json={"prompt": "boom"})
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    message = r.json()["error"]["message"]  # with where it was raised, for a bug report
    assert re.fullmatch(r"internal error: RuntimeError: boom at test_serve_units\.py:\d+", message)
    r = http.post("/v1/completions", json={"prompt": "ok"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "abcENDx"


def test_a_bug_mid_stream_is_an_error_event_then_done(scripted):
    http, _, _ = scripted
    r = http.post("/v1/completions", json={"prompt": "late boom", "stream": True})
    events = [line for line in r.text.split("\n\n") if line]
    assert '"text": "a"' in events[0] and '"error"' in events[1] and events[2] == "data: [DONE]"


def test_a_stop_string_ends_the_generation_at_that_step(scripted):
    http, pipe, _ = scripted
    r = http.post("/v1/completions", json={"prompt": "ok", "stop": "END"}).json()
    assert r["choices"][0]["text"] == "abc" and r["choices"][0]["finish_reason"] == "stop"
    assert r["usage"]["completion_tokens"] == 3 and pipe.closed == 1  # step 4 never ran


def test_once_cut_an_answer_not_started_is_a_503_and_never_runs(scripted):
    http, pipe, worker = scripted
    worker.cut_all()
    r = http.post("/v1/completions", json={"prompt": "ok"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
    assert pipe.closed == 0


def test_a_pipelines_cost_measurement_gives_way_to_the_requests_queued(scripted):
    """The worker tells its pipelines when requests wait (`Pipeline.busy`): a cost table
    measured again after an answer stops for them (tests/test_costs.py) instead of holding
    the queue up for its few seconds."""
    http, pipe, worker = scripted
    assert pipe.busy() is False  # idle
    pipe.hold.clear()
    answers = []

    def ask(prompt: str) -> None:
        answers.append(http.post("/v1/completions", json={"prompt": prompt}))

    first = threading.Thread(target=ask, args=("held",))
    first.start()
    while worker.running < 1:
        time.sleep(0.01)
    second = threading.Thread(target=ask, args=("ok",))  # one slot: it waits in the queue
    second.start()
    while worker.queued < 1:
        time.sleep(0.01)
    pipe.hold.set()
    first.join(30), second.join(30)
    assert [r.status_code for r in answers] == [200, 200]
    assert pipe.busy_at_end == [True]  # the held answer ended with a request queued
    assert pipe.busy() is False
    worker.cut_all()
    assert pipe.busy() is True  # stopping: nothing is measured any more
