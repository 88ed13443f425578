"""A real `specgen serve` in a subprocess on a free loopback port, and the references its
answers are held to (`specgen generate --json` with the same options)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import openai
from typer.testing import CliRunner

from specgen.cli import app

CPU = ["--device", "cpu", "--dtype", "float32"]


class Server:
    """`python -m specgen serve ARGS --port 0`, up once its ready line is printed."""

    def __init__(self, *args: str, key: str | None = None, timeout: float = 180) -> None:
        cmd = [sys.executable, "-m", "specgen", "serve", *args, "--port", "0"]
        if key is not None:
            cmd += ["--api-key", key]
        self.key = key
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy()
        )
        self.log: list[str] = []  # stderr, drained so a chatty log never blocks the server
        threading.Thread(target=self._drain, daemon=True).start()
        self.ready = self._ready_line(timeout)
        self.base = self.ready.split(" on ", 1)[1]  # http://127.0.0.1:PORT/v1
        self.url = self.base.removesuffix("/v1")

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)

    def _ready_line(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                if line.startswith("serving "):
                    return line.strip()
            if self.proc.poll() is not None:
                break
        self.proc.kill()
        raise AssertionError(f"specgen serve did not start:\n{''.join(self.log)[-3000:]}")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def client(self, **kwargs) -> openai.OpenAI:
        """The official client; no retries, so a 503 is seen as it is."""
        return openai.OpenAI(
            base_url=self.base, api_key=self.key or "none", max_retries=0, timeout=120, **kwargs
        )

    def http(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=120, **kwargs)

    def rss_kib(self) -> int:
        """The server process's resident memory (VmRSS) in KiB."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def generate(model: str, prompt: str, *args: str) -> dict:
    """`specgen generate PROMPT --json` in this process: the reference answer."""
    result = CliRunner().invoke(app, ["generate", prompt, "--model", model, "--json", *CPU, *args])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@dataclass
class Streamed:
    text: str  # the deltas joined
    chunks: list  # the chunks that carried text
    finish: str | None  # the finish chunk's reason
    final: object  # the finish chunk
    usage: object | None  # the usage chunk (stream_options.include_usage)


def streamed(events) -> Streamed:
    """A streamed answer read to its end."""
    out = Streamed("", [], None, None, None)
    for chunk in events:
        if not chunk.choices:
            out.usage = chunk
            continue
        choice = chunk.choices[0]
        text = choice.delta.content if hasattr(choice, "delta") else choice.text
        if text:
            out.text += text
            out.chunks.append(chunk)
        if choice.finish_reason is not None:
            out.finish, out.final = choice.finish_reason, chunk
    return out
