"""`specgen serve` under a bounded load on loopback: 8 concurrent clients x 4 requests,
mixed methods, chat and completions, streamed and not, some streams dropped halfway.

Every completed greedy answer must be its single-client answer, a dropped stream a prefix
of it; nothing fails; the server's memory stays flat from one round to the next; it
answers afterwards; and SIGTERM cuts what is in flight cleanly and exits 0. The figures
(requests, failures, p50/p95 latency, RSS) are printed for the record.
"""

from __future__ import annotations

import json
import signal
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from support.serve import CPU, Server, streamed

# servers, subprocesses or whole CLI runs: not the quick tier
pytestmark = pytest.mark.integration

METHODS = ("ar", "ngram", "dflash")
PROMPTS = ("The quick brown fox", "def add(a, b):", "Speculative decoding", "Café, naïve")
CLIENTS, PER_CLIENT, N = 8, 4, 16
# Memory is "flat" when the second measured round ends within 8 MiB of the first. Each
# round sends the same 32 requests as the one before, so anything kept per request (a
# session, a stream, a queued job) grows RSS by 32 of it every round: one 256-token KV
# cache of this model is 0.75 MiB (24 MiB a round). What remains is allocator noise
# (glibc arenas of the server's threads, torch's CPU allocator): under 1 MiB here.
FLAT_KIB = 8 * 1024


@pytest.fixture(scope="module")
def server(tiny_qwen3_deep, tiny_dflash):
    srv = Server(
        "--model", str(tiny_qwen3_deep), "--methods", ",".join(METHODS),
        "--drafter", str(tiny_dflash), "--verify-policy", "full", "--shutdown-timeout", "0",
        "--quiet", "--parallel", "1", *CPU,  # one slot: the queue is what the SIGTERM test holds
    )  # fmt: skip
    yield srv
    srv.stop()


def ask(client, method: str, prompt: str, chat: bool, stream: bool = False, drop: bool = False):
    """One request; its text (a dropped stream: what arrived before it was dropped)."""
    extra = {"extra_body": {"specgen": {"method": method}}}
    if chat:
        messages = [{"role": "user", "content": prompt}]
        make = client.chat.completions.create
        args = dict(model="", messages=messages, max_tokens=N, stream=stream, **extra)
    else:
        make = client.completions.create
        args = dict(model="", prompt=prompt, max_tokens=N, stream=stream, **extra)
    if not stream:
        answer = make(**args)
        choice = answer.choices[0]
        return choice.message.content if chat else choice.text
    events = make(**args)
    if not drop:
        return streamed(events).text
    text = ""
    for i, chunk in enumerate(events):
        if chunk.choices:
            delta = chunk.choices[0]
            text += (delta.delta.content if chat else delta.text) or ""
        if i == 2:
            events.close()  # the client goes away mid-answer
            break
    return text


def plan(client_id: int) -> list[tuple[str, str, bool, bool, bool]]:
    """A client's requests: (method, prompt, chat, stream, drop halfway)."""
    out = []
    for j in range(PER_CLIENT):
        stream = (client_id + j) % 2 == 1
        out.append((
            METHODS[(client_id + j) % len(METHODS)], PROMPTS[(client_id * 3 + j) % len(PROMPTS)],
            client_id % 2 == 0, stream, stream and (client_id + j) % 4 == 1,
        ))  # fmt: skip
    return out


def one_round(server, expected) -> dict:
    latencies, failures = [], []

    def work(client_id: int) -> None:
        client = server.client()
        for method, prompt, chat, stream, drop in plan(client_id):
            start = time.perf_counter()
            try:
                text = ask(client, method, prompt, chat, stream, drop)
            except Exception as e:  # counted, and shown below
                failures.append(f"{method} {prompt!r}: {type(e).__name__}: {e}")
                continue
            latencies.append(time.perf_counter() - start)
            want = expected[(method, prompt, chat)]
            if (drop and not want.startswith(text)) or (not drop and text != want):
                failures.append(f"{method} {prompt!r} chat={chat}: {text!r} != {want!r}")

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(work, range(CLIENTS)))
    latencies.sort()
    return {
        "requests": CLIENTS * PER_CLIENT,
        "failures": failures,
        "p50": statistics.median(latencies),
        "p95": latencies[max(0, round(0.95 * len(latencies)) - 1)],
        "rss_kib": server.rss_kib(),
    }


def test_concurrent_clients_get_their_single_client_answers(server, capsys):
    client = server.client()
    expected = {
        (m, p, chat): ask(client, m, p, chat)
        for m in METHODS
        for p in PROMPTS
        for chat in (True, False)
    }
    rounds = [one_round(server, expected) for _ in range(3)]  # a warm-up, then two measured
    with capsys.disabled():
        print()
        for i, r in enumerate(rounds):
            print(
                f"serve load round {i} ({'warm-up' if i == 0 else 'measured'}): "
                f"{r['requests']} requests ({CLIENTS} clients x {PER_CLIENT}), "
                f"{len(r['failures'])} failures, latency p50 {r['p50']:.3f} s "
                f"p95 {r['p95']:.3f} s, server RSS {r['rss_kib'] / 1024:.1f} MiB"
            )
    for r in rounds:
        assert not r["failures"], r["failures"][:5]
    growth = rounds[2]["rss_kib"] - rounds[1]["rss_kib"]
    assert growth <= FLAT_KIB, f"RSS grew {growth / 1024:.1f} MiB in a round"
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["queued"] == health["running"] == 0
    assert ask(client, "dflash", PROMPTS[1], False) == expected[("dflash", PROMPTS[1], False)]


def test_sigterm_cuts_the_running_and_the_queued_answer_and_exits_0(server):
    """Last: it stops the server (started with --shutdown-timeout 0, so cut at once)."""
    results: dict[str, list[str]] = {}

    def stream(name: str, first: threading.Event | None = None) -> None:
        body = {"prompt": PROMPTS[0], "max_tokens": 200, "stream": True}
        lines = results.setdefault(name, [])
        with httpx.stream("POST", server.base + "/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data:"):
                    lines.append(line)
                    if first is not None:
                        first.set()

    started = threading.Event()
    running = threading.Thread(target=stream, args=("running", started))
    running.start()
    assert started.wait(30)
    queued = threading.Thread(target=stream, args=("queued",))
    queued.start()
    for _ in range(100):  # until the second one waits in the queue
        if httpx.get(server.url + "/health").json()["queued"] == 1:
            break
        time.sleep(0.05)
    server.proc.send_signal(signal.SIGTERM)
    running.join(30)
    queued.join(30)
    for name in ("running", "queued"):
        lines = results[name]
        assert lines[-1] == "data: [DONE]", name
        final = json.loads(lines[-2][len("data: ") :])
        if name == "running":  # cut short: an OpenAI reason, who cut it in specgen.cut
            assert final["choices"][0]["finish_reason"] == "length"
            assert final["specgen"]["cut"] == "shutdown"
        else:  # never started: the stream's error event, then [DONE]
            assert final["error"]["code"] == "shutting_down", final
    assert server.stop() == 0
