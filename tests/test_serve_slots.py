"""`specgen serve --parallel N`: requests answered at once in slots, their steps batched.
Each answer is its single-client answer; a client that leaves frees its slot at the next
step while the others go on; /metrics shows each slot and the batches."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from support.serve import CPU, Server

pytestmark = pytest.mark.integration

SLOTS = 3
ASKS = [  # (route, body): greedy and seeded, chat and text, two methods
    ("/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 14}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hello there"}],
                              "max_tokens": 9, "specgen": {"method": "dflash"}}),
    ("/v1/completions", {"prompt": "one two one two", "max_tokens": 12, "temperature": 0.8,
                         "seed": 5, "specgen": {"method": "dflash"}}),
    ("/v1/completions", {"prompt": "a b c d e", "max_tokens": 16, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a colour"}],
                              "max_tokens": 11, "temperature": 1.0, "seed": 9}),
    ("/v1/completions", {"prompt": "Count: 1 2 3", "max_tokens": 7, "echo": True,
                         "logprobs": 2, "specgen": {"method": "dflash"}}),
]  # fmt: skip


@pytest.fixture(scope="module")
def server(tiny_qwen3_deep, tiny_dflash):
    srv = Server("--model", str(tiny_qwen3_deep), "--methods", "ar,dflash",
                 "--drafter", str(tiny_dflash), "--parallel", str(SLOTS), *CPU)  # fmt: skip
    yield srv
    srv.stop()


def answer(http, route: str, body: dict):
    r = http.post(route, json=body)
    assert r.status_code == 200, r.text
    if body.get("stream"):
        return r.text.count("data: {"), _text_of_stream(r.text)
    choice = r.json()["choices"][0]
    content = choice["message"]["content"] if "message" in choice else choice["text"]
    return content, choice.get("logprobs"), choice["finish_reason"]


def _text_of_stream(text: str) -> str:
    import json

    out = ""
    for event in text.split("\n\n"):
        if event.startswith("data: {"):
            choices = json.loads(event[6:])["choices"]
            out += (choices[0].get("text") or "") if choices else ""
    return out


def _rounded(value):
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_rounded(v) for v in value)
    return value


def metrics(http) -> dict[str, float]:
    out = {}
    for line in http.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_answers_at_once_are_each_its_single_client_answer(server):
    with server.http() as http:
        alone = [answer(http, route, body) for route, body in ASKS]  # one at a time
        before = metrics(http)
        with ThreadPoolExecutor(len(ASKS)) as pool:
            together = list(pool.map(lambda a: answer(http, *a), ASKS))
        after = metrics(http)
    # tokens and text exactly; logprobs to float noise: on this dense fp32 target a
    # verify block's rows and a decode step's differ in their last bits, and under the
    # cost policy how many drafts a step verifies depends on what shares it (the packed
    # targets' rows are exact: tests/test_batch_engine.py holds them bit for bit)
    assert _rounded(together) == _rounded(alone)
    shared = sum(
        after.get(f'specgen_batch_steps_by_size_total{{answers="{n}"}}', 0)
        - before.get(f'specgen_batch_steps_by_size_total{{answers="{n}"}}', 0)
        for n in range(2, SLOTS + 1)
    )
    assert shared > 0  # some steps did carry several answers
    assert after["specgen_slots"] == SLOTS


def test_a_client_that_leaves_frees_its_slot_while_the_others_go_on(server):
    # (the tiny target's context is 256)
    long = {"prompt": "Count to a thousand:", "max_tokens": 200, "stream": True,
            "ignore_eos": True}  # fmt: skip
    with server.http() as http:
        want = answer(http, "/v1/completions", {**long, "max_tokens": 30})
    done: list = []

    def stays() -> None:
        with server.http() as http:
            done.append(answer(http, "/v1/completions", {**long, "max_tokens": 30}))

    with server.http() as http:
        with http.stream("POST", "/v1/completions", json=long) as r:
            lines = r.iter_lines()
            while not next(lines).startswith("data: {"):
                pass
            other = threading.Thread(target=stays)
            other.start()
            busy = 0
            for _ in range(400):
                busy = sum(v for k, v in metrics(http).items() if k.startswith("specgen_slot_busy"))
                if busy == 2:
                    break
                time.sleep(0.02)
            assert busy == 2
        # the leaving client's stream is closed here: its slot frees within a step or two
        for _ in range(400):
            m = metrics(http)
            if sum(v for k, v in m.items() if k.startswith("specgen_slot_busy")) <= 1:
                break
            time.sleep(0.02)
        assert m['specgen_finished_total{reason="cut_client"}'] >= 1
        other.join(120)
    assert done == [want]  # the one that stayed got its whole answer, as alone


def test_metrics_show_every_slot(server):
    with server.http() as http:
        text = http.get("/metrics").text
    for family in ("slot_busy", "slot_context_tokens", "slot_answers_total",
                   "slot_generation_tokens_total", "slot_prompt_tokens_cached_total"):  # fmt: skip
        found = re.findall(rf'^specgen_{family}{{slot="(\d+)"}} ', text, re.M)
        assert sorted(map(int, found)) == list(range(SLOTS)), family
    assert re.search(r"^specgen_batch_rows_total \d+", text, re.M)
    assert re.search(r"^specgen_batch_steps_held_total \d+", text, re.M)
