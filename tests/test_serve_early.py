"""The server's first second (serve/early.py): with a fast-start image there, `serve` is up
before its pipelines load and answers plain greedy AR requests from the image, the
engine's tokens exactly; every other request waits for the engine; a load that fails
then stops the server with its error."""

from __future__ import annotations

import json
import threading
import time

import pytest
from starlette.testclient import TestClient

from specgen.api.pipeline import Pipeline
from specgen.api.quick import open_quick, write_image
from specgen.core.config import SpecConfig
from specgen.core.errors import SpecgenError
from specgen.hub import resolve_model
from specgen.kernels.packed import cpu_library
from specgen.serve.app import Service, build_app
from specgen.serve.metrics import Metrics
from specgen.serve.openai_api import Defaults
from specgen.serve.worker import Worker
from support.cold_start import imported, run_cli
from support.packed import LLAMA_MIXES, write_tiny_gguf
from support.serve import CPU, Server

pytestmark = pytest.mark.skipif(cpu_library() is None, reason="no C compiler")

PROMPTS = ["Hello there", "A different start entirely", "Hello there, how"]


@pytest.fixture(scope="module")
def loaded(tiny_dirs, tmp_path_factory):
    """A tiny GGUF's full pipeline and the image's pipeline of the same file."""
    gguf = tmp_path_factory.mktemp("early") / "t.gguf"
    write_tiny_gguf(tiny_dirs["qwen3"], gguf, LLAMA_MIXES["q4_1"])
    pipe = Pipeline.load(str(gguf), device="cpu", context=64)
    assert write_image(pipe.model, gguf) is not None
    quick = open_quick(resolve_model(str(gguf)), 64, None, None)
    assert quick is not None
    return pipe, quick


def served(worker: Worker):
    service = Service(worker, "m", frozenset({"m"}), Defaults(), Metrics(("ar", "ngram")))
    worker.metrics = service.metrics
    return TestClient(build_app(service))


def completion(http, prompt: str, **body) -> dict:
    r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 10, **body})
    assert r.status_code == 200, r.text
    return r.json()


def streamed_text(http, prompt: str) -> str:
    r = http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 10, "stream": True})
    events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
    assert events[-1] == "[DONE]", r.text
    return "".join(c["choices"][0]["text"] for c in map(json.loads, events[:-1]) if c["choices"])


def in_background(results: dict, key: str, ask) -> threading.Thread:
    """`ask()` in a thread, its result in `results[key]`."""
    thread = threading.Thread(target=lambda: results.__setitem__(key, ask()))
    thread.start()
    return thread


def wait_for(condition, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_greedy_answers_come_before_the_load_and_are_the_engines(loaded):
    pipe, quick = loaded
    release = threading.Event()

    def load():
        assert release.wait(120)  # the load ends only when the test says
        return {"ar": pipe, "ngram": pipe.with_spec(SpecConfig(method="ngram"))}

    worker = Worker(load, queue_size=8, parallel=2, early=quick, methods=("ar", "ngram"))
    assert set(worker.start()) == {"ar", "ngram"}
    worker.go()
    try:
        with served(worker) as http:
            health = http.get("/health").json()
            assert health["loading"] is True and health["methods"] == ["ar", "ngram"]
            # the routes that read the model answer from the image's pipeline meanwhile
            assert http.get("/v1/models").json()["data"][0]["max_model_len"] == 64
            assert http.post("/tokenize", json={"prompt": "Hello"}).json()["tokens"] == (
                pipe.codec.encode_raw("Hello", special=True))  # fmt: skip
            assert http.get("/metrics").status_code == 200
            early = [completion(http, p)["choices"][0]["text"] for p in PROMPTS]
            long = completion(http, PROMPTS[0], max_tokens=40, ignore_eos=True)
            assert long["usage"]["completion_tokens"] == 40  # stop tokens let through
            assert worker.loading  # all answered while the load waited

            # what the image cannot answer waits for the engine
            waiting: dict[str, dict] = {}
            asks = {
                "sampled": {"temperature": 0.8, "seed": 3},
                "ngram": {"specgen": {"method": "ngram"}},
                "logprobs": {"logprobs": 2},
            }
            threads = [
                in_background(waiting, k, lambda b=b: completion(http, PROMPTS[0], **b))
                for k, b in asks.items()
            ]
            wait_for(lambda: worker.queued == len(asks))
            time.sleep(0.2)
            assert worker.queued == len(asks) and not waiting
            release.set()
            for t in threads:
                t.join(120)
            assert set(waiting) == set(asks) and not worker.loading
            assert http.get("/health").json()["loading"] is False
            assert waiting["ngram"]["specgen"]["method"] == "ngram"
            assert waiting["ngram"]["choices"][0]["text"] == early[0]  # lossless

            engine = [completion(http, p)["choices"][0]["text"] for p in PROMPTS]
            assert early == engine
            again = completion(http, PROMPTS[0], max_tokens=40, ignore_eos=True)
            assert again["choices"] == long["choices"]
            again = completion(http, PROMPTS[0], temperature=0.8, seed=3)
            assert again["choices"][0]["text"] == waiting["sampled"]["choices"][0]["text"]
    finally:
        release.set()
        worker.close()


def test_the_image_answers_are_the_engines_for_each_prompt_in_turn(loaded):
    """Prompt after prompt (the image keeps the prefix each shares with the last, as a
    session does), streamed and whole, against the engine's own answers."""
    pipe, quick = loaded
    gate = threading.Event()
    worker = Worker(lambda: gate.wait(120) and {"ar": pipe}, queue_size=4, early=quick,
                    methods=("ar",))  # fmt: skip
    worker.start()
    worker.go()
    try:
        with served(worker) as http:
            got = [streamed_text(http, prompt) for prompt in PROMPTS]
            assert worker.loading
            gate.set()
            wait_for(lambda: not worker.loading)
            want = [completion(http, p)["choices"][0]["text"] for p in PROMPTS]
            assert got == want
    finally:
        gate.set()
        worker.close()


def test_a_load_that_fails_after_the_start_ends_the_waiting_and_says_so(loaded):
    _, quick = loaded
    gate = threading.Event()

    def load():
        gate.wait(120)
        raise SpecgenError("no such drafter: nowhere")

    failures: list[BaseException] = []
    worker = Worker(load, queue_size=4, early=quick, methods=("ar",))
    worker.on_failure = failures.append
    worker.start()
    worker.go()
    try:
        with served(worker) as http:
            result: dict = {}
            body = {"prompt": "Hi", "temperature": 0.7, "seed": 1}
            t = in_background(result, "r", lambda: http.post("/v1/completions", json=body))
            wait_for(lambda: worker.queued == 1)
            gate.set()
            t.join(60)
            assert result["r"].status_code == 503
            assert [str(e) for e in failures] == ["no such drafter: nowhere"]
            assert str(worker.load_error) == "no such drafter: nowhere"
    finally:
        gate.set()
        worker.close()


def test_the_server_starts_without_torch():
    done = run_cli("serve", "--help")
    assert done.returncode == 0
    code = (
        "import sys\n"
        "import specgen.cli.serve, specgen.serve.server, specgen.serve.early\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_serve_writes_the_image_then_answers_from_it_at_once(tiny_dirs, tmp_path, monkeypatch):
    gguf = tmp_path / "t.gguf"
    write_tiny_gguf(tiny_dirs["llama"], gguf, LLAMA_MIXES["q4_1"])
    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path / "home"))
    args = ("--model", str(gguf), "--context", "64", *CPU)
    first = Server(*args, early=True)
    try:
        with first.http() as http:
            wait_for(lambda: http.get("/health").json()["loading"] is False)
            want = http.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 8})
    finally:
        first.stop()
    assert "built a fast-start image" in "".join(first.log)
    second = Server(*args, early=True)
    try:
        with second.http() as http:
            got = http.post("/v1/completions", json={"prompt": "Hello there", "max_tokens": 8})
            assert got.json()["choices"] == want.json()["choices"]
            wait_for(lambda: http.get("/health").json()["loading"] is False)
    finally:
        assert second.stop() == 0
    assert "built" not in "".join(second.log)
    generated = run_cli("generate", "Hello there", "--model", str(gguf), "-n", "8", "--raw",
                        "--context", "64", "--json")  # fmt: skip
    assert "torch" not in imported(generated)  # the image serve wrote answers generate too
