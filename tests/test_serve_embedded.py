"""`specgen serve` end to end on the embedded default model and its shipped DFlash
drafter: greedy answers are `generate`'s, accepted drafts are marked in the stream, and a
full queue answers 503 with Retry-After while the answers before it complete."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from support.serve import CPU, Server, generate, streamed

pytestmark = pytest.mark.slow

QUESTION = "Name three primary colours."
N = 24


@pytest.fixture(scope="module")
def server(embedded_dir):
    srv = Server(
        "--model", "smollm2-135m", "--methods", "dflash,ar", "--verify-policy", "full",
        "--queue-size", "1", "--parallel", "1", *CPU,  # one slot, one place in the queue
    )  # fmt: skip
    yield srv
    srv.stop()


def test_greedy_answers_are_generate_s_and_drafts_are_marked(server):
    ref = generate("smollm2-135m", QUESTION, "--method", "dflash", "--verify-policy", "full",
                   "-n", str(N))  # fmt: skip
    client = server.client()
    messages = [{"role": "user", "content": QUESTION}]
    r = client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=N)
    assert r.choices[0].message.content == ref["text"]
    assert r.usage.completion_tokens == len(ref["token_ids"])
    s = streamed(client.chat.completions.create(
        model="HuggingFaceTB/SmolLM2-135M-Instruct", messages=messages, max_tokens=N,
        stream=True, stream_options={"include_usage": True},
    ))  # fmt: skip
    assert s.text == ref["text"]
    stats = s.usage.model_extra["specgen"]
    assert stats["method"] == "dflash" and stats["num_accepted_draft_tokens"] > 0
    drafted = [c.model_extra["specgen"]["drafted_chars"] for c in s.chunks]
    assert any(drafted) and all(
        d <= len(c.choices[0].delta.content) for d, c in zip(drafted, s.chunks, strict=True)
    )


def test_a_full_queue_answers_503_and_the_others_complete(server):
    client = server.client()
    first = threading.Event()
    texts: dict[str, str] = {}

    def long_answer() -> None:
        events = client.completions.create(
            model="", prompt="Count from one to fifty:", max_tokens=64, stream=True
        )
        text = ""
        for chunk in events:
            first.set()
            text += chunk.choices[0].text if chunk.choices else ""
        texts["long"] = text

    def queued() -> None:
        texts["queued"] = (
            client.completions.create(model="", prompt="Hi", max_tokens=4).choices[0].text
        )

    a = threading.Thread(target=long_answer)
    a.start()
    assert first.wait(60)
    b = threading.Thread(target=queued)
    b.start()
    for _ in range(100):
        if httpx.get(server.url + "/health").json()["queued"] == 1:
            break
        time.sleep(0.02)
    with pytest.raises(openai.InternalServerError) as e:  # 503: the queue of 1 is full
        client.completions.create(model="", prompt="Hi", max_tokens=4)
    assert e.value.status_code == 503 and int(e.value.response.headers["retry-after"]) >= 1
    a.join(120)
    b.join(120)
    assert texts["long"] and "queued" in texts
