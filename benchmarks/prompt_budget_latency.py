"""A short request sent while three long prompts are being read: its time to first token
against the same request alone, and the long answers' own times, through `specgen serve`
(`--parallel 4`, AR), four rounds, every request tagged anew so none is read from a cache.

    python benchmarks/prompt_budget_latency.py TAG

TAG keeps one run's requests apart from another's on the same machine. The long requests
count as being read once their first streamed chunk (the role, sent at once) has come.
"""

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_concurrency import SAMPLE, Served, new_client, prompts, tagged  # noqa: E402

texts = sorted(prompts(SAMPLE), key=len)[-3:]
tag = sys.argv[1] if len(sys.argv) > 1 else "run"
srv = Served(
    [
        sys.executable,
        "-m",
        "specgen",
        "serve",
        "--model",
        "smollm2-135m",
        "--methods",
        "ar",
        "--parallel",
        "4",
        "--context",
        "2048",
        "--quiet",
        "--port",
        "0",
        "--threads",
        "2",
    ]
)


def ask(http, prompt, n, seen=None):
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": n,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    t = time.perf_counter()
    first = None
    with http.stream("POST", srv.url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            if seen is not None:
                seen.set()
            ev = json.loads(line[6:])
            for ch in ev.get("choices") or []:
                if (ch.get("delta") or {}).get("content") and first is None:
                    first = time.perf_counter() - t
    return first, time.perf_counter() - t


def one_round(http, r: int) -> None:
    short = "What is the capital of France?"
    alone, _ = ask(http, tagged(f"{tag}a{r}", 0, 0, short), 8)
    seen = [threading.Event() for _ in range(3)]
    longs: list = [None] * 3

    def long_one(i: int) -> None:
        with new_client() as h:
            longs[i] = ask(h, tagged(f"{tag}l{r}", i, 0, texts[i]), 64, seen[i])

    threads = [threading.Thread(target=long_one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for e in seen:
        e.wait()
    behind, _ = ask(http, tagged(f"{tag}b{r}", 0, 0, short), 8)
    for t in threads:
        t.join()
    firsts = [round(x[0], 2) for x in longs]
    totals = [round(x[1], 2) for x in longs]
    print(f"alone {alone * 1e3:.0f} ms  behind {behind * 1e3:.0f} ms "
          f"({behind / alone:.1f}x)  long ttft {firsts}  long total {totals}", flush=True)


try:
    http = new_client()
    ask(http, tagged("warm", 0, 0, "Hello"), 4)
    for r in range(4):
        one_round(http, r)
finally:
    srv.stop()
