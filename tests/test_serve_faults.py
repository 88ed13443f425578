"""`specgen serve` under faults, on the embedded default model: clients that give up
while queued or mid-prefill, a fuzz of 200 requests with clients that leave, and SIGTERM
with abandoned requests of both kinds. The server must free its worker within a prefill
chunk, answer no 5xx, and exit within its grace with no traceback."""

from __future__ import annotations

import json
import random
import re
import signal
import threading
import time

import httpx
import pytest

from support.serve import CPU, FIELDS, Server

pytestmark = pytest.mark.slow

GRACE = 2  # --shutdown-timeout
SLOTS = 2  # --parallel
BOUND = GRACE + 2 + 1 + 3  # grace, CUT_WAIT, CLOSE_WAIT, and slack for a busy machine


@pytest.fixture(scope="module")
def server(embedded_dir):
    srv = Server("--model", "smollm2-135m", "--methods", "ar", "--queue-size", "8",
                 "--parallel", str(SLOTS), "--shutdown-timeout", str(GRACE), *CPU)  # fmt: skip
    yield srv
    if srv.proc.poll() is None:
        srv.stop()


def health(srv: Server) -> dict:
    with srv.http() as http:
        return http.get("/health").json()


def wait_idle(srv: Server, seconds: float) -> float:
    """Seconds until the worker runs and queues nothing (a failure past `seconds`)."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        h = health(srv)
        if h["running"] == 0 and h["queued"] == 0:
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"the worker was still busy after {seconds} s: {h}")


def test_a_client_gone_mid_prefill_frees_the_worker_within_a_chunk(server):
    words = "alpha beta gamma delta " * 1500  # about 6 000 tokens: a dozen prefill chunks
    with server.http() as http:
        t = time.monotonic()  # one chunk's time: a 512-token prompt, one new token
        http.post("/v1/completions", json={"prompt": "word " * 500, "max_tokens": 1})
        chunk = time.monotonic() - t
        for stream in (False, True):
            body = {"prompt": words, "max_tokens": 4, "stream": stream}
            with pytest.raises(httpx.TimeoutException):
                if stream:
                    with http.stream("POST", "/v1/completions", json=body, timeout=1.5) as r:
                        for _ in r.iter_lines():
                            pass
                else:
                    http.post("/v1/completions", json=body, timeout=1.5)
            freed = wait_idle(server, 60)
            assert freed < 3 * chunk + 2, (freed, chunk)  # not the dozen chunks' time
        r = http.post("/v1/completions", json={"prompt": "The sky is", "max_tokens": 3})
        assert r.status_code == 200


def fuzz_body(rng: random.Random) -> tuple[str, dict]:
    route = rng.choice(["/v1/chat/completions", "/v1/completions", "/v1/responses"])
    body: dict = {"max_tokens": 3}
    if route == "/v1/chat/completions":
        body["messages"] = [{"role": rng.choice(["user", "system", "assistant", "tool", "x"]),
                             "content": rng.choice(["hi", "", 3, None, "Name a colour."])}
                            for _ in range(rng.randrange(1, 3))]  # fmt: skip
    elif route == "/v1/completions":
        body["prompt"] = rng.choice(["hi", "", [1, 2], ["a", "b"], [-1], None, "The sky is"])
    else:
        body = {"input": rng.choice(["hi", [], [{"role": "user", "content": "hi"}], 3]),
                "max_output_tokens": rng.choice([3, 0, -1, "x"])}  # fmt: skip
    for name in rng.sample(sorted(FIELDS), rng.randrange(4)):
        body[name] = rng.choice(FIELDS[name])
    if body.get("max_tokens") not in (None, 0, 1, 2, 3, 4):
        body["max_tokens"] = 3
    return route, body


def test_a_fuzz_of_200_requests_gets_no_5xx_and_no_hang(server):
    rng = random.Random(49)
    statuses: dict[int, int] = {}
    with server.http() as http:
        for i in range(200):
            route, body = fuzz_body(rng)
            leave = rng.random() < 0.1  # a client that gives up at once
            try:
                r = http.post(route, content=json.dumps(body).encode(),  # NaN as Python says it
                              headers={"Content-Type": "application/json"},
                              timeout=0.05 if leave else 120)  # fmt: skip
            except httpx.TimeoutException:
                continue
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            assert r.status_code < 500, (i, body, r.text[:300])
        wait_idle(server, 60)
        metrics = http.get("/metrics").text
    assert not re.search(r'status="5\d\d"', metrics), metrics
    assert statuses.get(200, 0) > 20 and statuses.get(400, 0) > 20, statuses


def test_sigterm_with_abandoned_requests_exits_within_the_grace(server):
    """Last: it stops the server. A long answer runs in every slot; two non-streamed and
    two streamed clients give up while queued; one more waits. SIGTERM: /health says
    stopping, the long answers are cut after the grace (their streams still end), the
    waiting one gets a 503, and the process exits 0 within the bound, with no traceback."""
    streams: list[list[str]] = [[] for _ in range(SLOTS)]

    def long_answer(lines: list[str]) -> None:
        with server.http() as http:
            body = {"prompt": "Count from one to five hundred:", "max_tokens": 2000,
                    "stream": True, "ignore_eos": True}  # long, whatever the model says
            with http.stream("POST", "/v1/completions", json=body) as r:
                lines.extend(line for line in r.iter_lines() if line.startswith("data:"))

    waiting: list[httpx.Response] = []

    def wait_for_answer() -> None:
        with server.http() as http:
            waiting.append(http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 5}))

    threads = [threading.Thread(target=long_answer, args=(lines,)) for lines in streams]
    for thread in threads:
        thread.start()
    while health(server)["running"] < SLOTS:
        time.sleep(0.05)
    with server.http() as http:
        for _ in range(2):  # non-streamed, abandoned while queued
            with pytest.raises(httpx.TimeoutException):
                http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 5}, timeout=0.3)
        for _ in range(2):  # streamed, abandoned while queued
            body = {"prompt": "Hi", "max_tokens": 5, "stream": True}
            with pytest.raises(httpx.TimeoutException):
                with http.stream("POST", "/v1/completions", json=body, timeout=0.3) as r:
                    for _ in r.iter_lines():
                        pass
    threads.append(threading.Thread(target=wait_for_answer))
    threads[-1].start()
    time.sleep(0.3)
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with server.http() as http:
        r = http.get("/health")  # the listener stays open while draining
        assert r.status_code == 503 and r.json()["status"] == "stopping"
        r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
    assert server.proc.wait(BOUND + 5) == 0
    elapsed = time.monotonic() - start
    for thread in threads:
        thread.join(10)
    assert elapsed < BOUND, elapsed
    for lines in streams:  # every answer in flight ends, cut, with its finish and [DONE]
        assert lines[-1] == "data: [DONE]"
        final = json.loads(lines[-2][len("data: ") :])
        assert final["choices"][0]["finish_reason"] == "length"  # an OpenAI reason
        assert final["specgen"]["cut"] == "shutdown"
    assert waiting and waiting[0].status_code == 503
    assert waiting[0].json()["error"]["code"] == "shutting_down"
    log = "".join(server.log)
    assert "Traceback" not in log and "CancelledError" not in log, log[-2000:]
