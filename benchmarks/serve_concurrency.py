"""`specgen serve` under 1/2/4/8 clients at once, speculation off and on, and llama-server
with parallel slots on the same GGUF, side by side in one run.

    python benchmarks/serve_concurrency.py --clients 1,2,4,8 --methods ar,ngram
    python benchmarks/serve_concurrency.py --llama-server ~/llama.cpp/build/bin/llama-server

One specgen server (`--parallel` = the most clients, every method loaded on the one
target) and, with --llama-server, llama.cpp's server on the embedded default's GGUF (or
--gguf) with `--parallel 4` (the issue's comparison; --llama-parallel). Each
configuration (method, clients) runs in turn, round after round (--rounds), so all see
the same machine load: each client sends --requests chat requests one after another
(by default every prompt of the sample once, client c starting at prompt c, so every
client count gives each client the same work: the sample's prompts run from 40 to 700
tokens, and a client count whose clients drew the long ones would look slower). Each
request's message starts with a tag naming its run, client and place (`tagged`), as
distinct users' requests differ: without it the clients, in step, asked the prompt another had
just answered, and a server that keeps answered prompts cached (both do) read each prompt
once for all eight, which flattered whatever kept the clients in step. Greedy,
`ignore_eos` with `max_tokens` --max-tokens (every answer the same length, so the work is
the same whatever the engine says), streamed. Reported per configuration:
aggregate tokens/s (every answer's tokens / the wall time of the whole run), fastest and
median over rounds, as a ratio to one client of the same method and, at the clients
llama-server has slots for, to it; the mean time to first token. Every specgen greedy
answer is checked against the same method's answer to the same prompt asked alone after
the timed runs.

Then the latency of a short request behind long ones: three clients start long answers
(--long-tokens), and once all three are decoding a short one is sent; its time to first
token against the same request alone (fastest of --rounds each).

The last line is one JSON object. Timings are this machine's at this moment: the load
average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
SAMPLE = HERE / "prompts" / "spec_bench_sample.jsonl"


def prompts(path: Path) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows]


class Served:
    """A server process on a loopback port, up once it answers /health."""

    def __init__(self, cmd: list[str], url: str | None = None, timeout: float = 600) -> None:
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)  # fmt: skip
        self.url = url or self._ready_line(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        self.stop()
        raise SystemExit(f"server did not start: {' '.join(cmd)}")

    def _ready_line(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                if line.startswith("serving "):
                    return line.split(" on ", 1)[1].strip().removesuffix("/v1")
            if self.proc.poll() is not None:
                break
        raise SystemExit("specgen serve did not print its ready line")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def ask(http: httpx.Client, url: str, prompt: str, max_tokens: int, method: str | None) -> dict:
    """One streamed chat request: its text, tokens, time to first token, total time.
    `http`: the client's own `httpx` client, kept between its requests as real clients
    keep theirs (a new one per request built a TLS context each time: 20 ms of CPU a
    request, a fifth of the 2 cores at 8 clients, taken from the server being timed)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    if method is not None:
        body["specgen"] = {"method": method}
    start = time.perf_counter()
    first, text, tokens = None, "", 0
    with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text += piece
    end = time.perf_counter()
    return {"text": text, "tokens": tokens, "ttft": (first or end) - start, "seconds": end - start}


def run(url: str, method: str | None, clients: int, requests: int, max_tokens: int,
        texts: list[str], round_: int) -> dict:  # fmt: skip
    """`clients` clients at once, `requests` each, in round `round_`: aggregate figures and
    every answer."""
    answers: list[list[tuple[str, dict]]] = [[] for _ in range(clients)]
    errors: list[str] = []

    def client(c: int, http: httpx.Client) -> None:
        with http:
            for k in range(requests):  # every client the same prompts, each from its own place
                prompt = tagged(f"{round_}.{clients}", c, k, texts[(c + k) % len(texts)])
                try:
                    answers[c].append((prompt, ask(http, url, prompt, max_tokens, method)))
                except Exception as e:  # counted, never hidden
                    errors.append(f"{type(e).__name__}: {e}")

    https = [new_client() for _ in range(clients)]  # made before the clock starts
    threads = [threading.Thread(target=client, args=(c, h)) for c, h in enumerate(https)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    done = [a for per in answers for a in per]
    tokens = sum(a["tokens"] for _, a in done)
    return {"tokens_per_second": tokens / wall, "wall": wall, "tokens": tokens,
            "ttft": statistics.mean(a["ttft"] for _, a in done) if done else None,
            "answers": done, "errors": errors}  # fmt: skip


def behind_long_ones(url: str, method: str | None, long_tokens: int, texts: list[str],
                     round_: int) -> dict:  # fmt: skip
    """A short request's time to first token alone, and sent once three long answers are
    decoding (every request tagged anew, so none finds its prompt cached)."""
    short = "What is the capital of France?"
    run = f"{method}.{round_}"
    http = new_client()
    alone = ask(http, url, tagged(f"short.{run}", 0, 0, short), 8, method)["ttft"]
    firsts = [threading.Event() for _ in range(3)]

    def long_one(i: int) -> None:
        body = {"messages": [{"role": "user", "content": tagged(f"long.{run}", i, 0, texts[i])}],
                "max_tokens": long_tokens, "temperature": 0, "ignore_eos": True,
                "stream": True}  # fmt: skip
        if method is not None:
            body["specgen"] = {"method": method}
        with longs[i].stream("POST", url + "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():  # decoding once text came (the first chunk
                if not line.startswith("data: {"):  # may be a role alone, sent at once)
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    firsts[i].set()

    longs = [new_client() for _ in range(3)]
    threads = [threading.Thread(target=long_one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for e in firsts:
        e.wait(600)
    behind = ask(http, url, tagged(f"short.{run}", 0, 1, short), 8, method)["ttft"]
    for t in threads:
        t.join()
    for h in (http, *longs):
        h.close()
    return {"alone": alone, "behind": behind}


def tagged(run: str, client: int, k: int, prompt: str) -> str:
    """Client `client`'s `k`th request in `run` (a round and a client count): `prompt` after
    a tag of its own, new in each run (llama-server keeps earlier prompts in memory, and
    would read a run's prompts from an earlier run's)."""
    return f"[request {run}.{client}.{k}] {prompt}"


def new_client() -> httpx.Client:
    """A client whose requests each open a new connection (a loopback connect is cheap;
    llama-server drops idle kept-alive ones, and a request sent on one that was dropped
    fails) but share one TLS context."""
    return httpx.Client(timeout=900, limits=httpx.Limits(max_keepalive_connections=0))


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--methods", default="ar,ngram", help="specgen methods (ar: speculation off)")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=0,
                    help="requests per client per run (0: each sample prompt once)")  # fmt: skip
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--long-tokens", type=int, default=192)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="--threads of both servers")
    ap.add_argument("--llama-server", type=Path, default=None, help="llama-server binary")
    ap.add_argument("--llama-parallel", type=int, default=4)
    ap.add_argument("--gguf", type=Path, default=None, help="llama-server's model file")
    ap.add_argument("--context", type=int, default=2048, help="tokens per slot, both servers")
    args = ap.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    methods = args.methods.split(",")
    texts = prompts(SAMPLE)
    args.requests = args.requests or len(texts)
    threads = ["--threads", str(args.threads)] if args.threads else []
    print(f"load average at start: {load()}", flush=True)
    servers = {"specgen": Served([sys.executable, "-m", "specgen", "serve", "--model", args.model,
                                  "--methods", ",".join(methods), "--parallel", str(max(clients)),
                                  "--context", str(args.context), "--quiet", "--port", "0",
                                  *threads])}  # fmt: skip
    configs = [("specgen", m, c) for m in methods for c in clients]
    if args.llama_server is not None:
        gguf = args.gguf or _default_gguf()
        port = 8791
        cmd = [str(args.llama_server), "-m", str(gguf), "--parallel", str(args.llama_parallel),
               "-c", str(args.context * args.llama_parallel), "--port", str(port),
               "--host", "127.0.0.1", *(["-t", str(args.threads)] * bool(threads))]  # fmt: skip
        servers["llama-server"] = Served(cmd, url=f"http://127.0.0.1:{port}")
        configs += [("llama-server", None, c) for c in clients if c <= args.llama_parallel]
    results: dict[tuple, list[dict]] = {key: [] for key in configs}
    try:
        for r in range(args.rounds):
            for key in configs if r % 2 == 0 else configs[::-1]:
                name, method, n = key
                got = run(servers[name].url, method, n, args.requests, args.max_tokens, texts, r)
                results[key].append(got)
                print(f"round {r}: {name} {method or ''} x{n}: {got['tokens_per_second']:.1f} "
                      f"tok/s, errors {len(got['errors'])}", flush=True)  # fmt: skip
        latency = {}
        for method in methods:
            runs = [behind_long_ones(servers["specgen"].url, method, args.long_tokens, texts, r)
                    for r in range(args.rounds)]  # fmt: skip
            latency[method] = {k: min(x[k] for x in runs) for k in ("alone", "behind")}
        # every answer's answer alone, per method (what each answer at once is held to),
        # asked after the timed runs so that none of them finds its prompt cached
        alone: dict[str, dict[str, str]] = {m: {} for m in methods}
        with new_client() as http:
            for (name, method, _), runs in results.items():
                for p, _ in (a for x in runs for a in x["answers"] if name == "specgen"):
                    if p not in alone[method]:
                        alone[method][p] = ask(http, servers["specgen"].url, p,
                                               args.max_tokens, method)["text"]  # fmt: skip
    finally:
        for s in servers.values():
            s.stop()
    report(results, latency, alone, clients, args)


def _default_gguf() -> Path:
    from specgen.hub import embedded_gguf
    from specgen.registry import DEFAULT_ALIAS, MODELS

    return embedded_gguf(MODELS[DEFAULT_ALIAS])


def report(results: dict, latency: dict, alone: dict, clients: list[int], args) -> None:
    print(f"load average at end: {load()}")
    rows, summary = [], {}
    for (name, method, n), runs in results.items():
        best = max(x["tokens_per_second"] for x in runs)
        median = statistics.median(x["tokens_per_second"] for x in runs)
        errors = sum(len(x["errors"]) for x in runs)
        ttft = statistics.mean(x["ttft"] for x in runs if x["ttft"] is not None)
        identical = None
        if name == "specgen":
            answers = [(p, a["text"]) for x in runs for p, a in x["answers"]]
            identical = sum(alone[method][p] == t for p, t in answers), len(answers)
        summary[f"{name}:{method or ''}:{n}"] = {"best": round(best, 2), "median": round(median, 2),
                                                 "ttft": round(ttft, 3), "errors": errors,
                                                 "identical": identical}  # fmt: skip
        rows.append((name, method or "", n, best, median, ttft, errors, identical))
    print(f"\n{'server':<13}{'method':<8}{'clients':>8}{'best tok/s':>12}{'median':>9}"
          f"{'x 1 client':>11}{'x llama':>9}{'ttft s':>8}{'errors':>7}  identical")  # fmt: skip
    for name, method, n, best, median, ttft, errors, identical in rows:
        one = summary.get(f"{name}:{method}:{min(clients)}", {}).get("best")
        llama = summary.get(f"llama-server::{n}", {}).get("best")
        x1 = f"{best / one:.2f}x" if one else ""
        xl = f"{best / llama:.2f}x" if llama and name == "specgen" else ""
        same = f"{identical[0]}/{identical[1]}" if identical else ""
        print(f"{name:<13}{method:<8}{n:>8}{best:>12.1f}{median:>9.1f}{x1:>11}{xl:>9}"
              f"{ttft:>8.2f}{errors:>7}  {same}")  # fmt: skip
    for (name, method, n), runs in results.items():  # what went wrong, never hidden
        for error in sorted({e for x in runs for e in x["errors"]})[:3]:
            print(f"error, {name} {method or ''} x{n}: {error}")
    print("\nshort request behind three long ones (time to first token, fastest of rounds):")
    for method, t in latency.items():
        print(
            f"  {method}: alone {t['alone']:.3f} s, behind {t['behind']:.3f} s "
            f"({t['behind'] / t['alone']:.2f}x)"
        )
    print(json.dumps({"configs": summary, "latency": latency, "max_tokens": args.max_tokens,
                      "requests": args.requests, "rounds": args.rounds}))  # fmt: skip


if __name__ == "__main__":
    main()
