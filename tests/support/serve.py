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

    def __init__(
        self, *args: str, key: str | None = None, timeout: float = 180, early: bool = False
    ) -> None:
        """`early`: answer from a fast-start image while loading when one is there
        (serve/early.py); off by default, so that whether an earlier test wrote one never
        changes which engine answers."""
        cmd = [sys.executable, "-m", "specgen", "serve", *args, "--port", "0"]
        if key is not None:
            cmd += ["--api-key", key]
        self.key = key
        env = {**os.environ, **({} if early else {"SPECGEN_QUICK": "0"})}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
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


FIELDS = {
    "model": ["m", "", None, 3, "other"],
    "max_tokens": [1, 4, 0, -1, 2**70, "8", 2.5, None, True],
    "max_completion_tokens": [2, 0, None, []],
    "temperature": [0, 0.7, 2, 3, -1, "hot", None, float("1e308"), 1e-300, 1e-4, 5e-324],
    "top_p": [1, 0.5, 0, 2, None, {}, 1e-300],
    "top_k": [0, -1, 5, -2, "x", 10**12, 2**63 - 1, 1],
    "seed": [0, 7, -1, 2**64, 2**70, None, 1.5, 2**64 - 1, -(2**63)],
    "ignore_eos": [True, False, "x"],
    "stop": ["\n", ["a", "b"], [1], ["x"] * 20, "", None, {"a": 1}],
    "stream": [True, False, None, "yes", 1],
    "stream_options": [{"include_usage": True}, {"include_usage": 1}, [], None],
    "n": [1, 2, None, True],
    "logprobs": [False, True, None, 3, 0, 5, 6, 20, -1],
    "top_logprobs": [0, 3, 20, 21, -1, "x", None],
    "echo": [True, False, "x", None],
    "presence_penalty": [0, 1.5, -2, 3, "x", None, float("nan")],
    "frequency_penalty": [0, -1.0, 2, 2.01, None, []],
    "repetition_penalty": [1, 1.2, 0, 0.01, 100, 1e9, None],
    "user": ["u", 5],
    "specgen": [{"method": "ar"}, {"method": "eagle"}, {"x": 1}, "ar", None],
    "chat_template_kwargs": [{"enable_thinking": True}, {"enable_thinking": "no"}, 3],
    "tools": [
        None,
        [],
        [{"type": "function", "function": {"name": "f"}}],
        "x",
        [1],
        [
            {
                "function": {
                    "name": "f",
                    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
                }
            },
            {"function": {"name": "g"}},
        ],
        [{"function": {"name": "f", "parameters": [1]}}],
    ],
    "tool_choice": [
        "auto",
        "none",
        "required",
        {"type": "function"},
        3,
        {"type": "function", "function": {"name": "f"}},
        {"type": "function", "function": {"name": "nope"}},
    ],
    "parallel_tool_calls": [True, False, "x"],
    "response_format": [
        {"type": "text"}, {"type": "json_object"}, {"type": "xml"}, "json", {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
         "properties": {"a": {"type": "integer"}}, "required": ["a"]}}},
        {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": 3}}},
    ],
}


# the model's scripted answers on the tool templates: calls, broken calls, plain text
TOOL_ANSWERS = {
    "qwen3": ['<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
              "<tool_call>\n{broken\n</tool_call>", "plain", '<tool_call>\n{"name": "f"',
              '{"a": 1}}\n</tool_call>', '{"name": "f", "arguments": {"a": 2}}\n</tool_call>'],
    "gemma4": ['<|tool_call>call:f{a:1}<tool_call|>', '<|tool_call>call:f{a:[<|"|>x',
               "plain <|tool_call>", "<|tool_call>call:g{}<tool_call|>", "a:3}<tool_call|>",
               "f{a:4}<tool_call|>"],
}  # fmt: skip
