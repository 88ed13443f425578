"""`specgen chat`: a multi-turn conversation with the model's chat template.

History is re-rendered through the chat template every turn; the session's KV cache
keeps the shared prefix, so only the new turn is prefilled. Ctrl-C stops the answer (the
partial answer stays in the history) but not the session; Ctrl-D or /exit ends it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specgen import display
from specgen.cli.common import user_errors
from specgen.cli.options import Run, run_options
from specgen.config import SamplingParams
from specgen.errors import SpecgenError
from specgen.live import answer_view
from specgen.stats import GenStats

if TYPE_CHECKING:
    from specgen.pipeline import Pipeline

HELP = "commands: /reset (forget the conversation), /stats (session totals), /exit"


@dataclass
class SessionTotals:
    turns: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    accepted: int = 0
    verified: int = 0

    def add(self, stats: GenStats) -> None:
        self.turns += 1
        self.new_tokens += stats.new_tokens
        self.seconds += stats.seconds
        self.steps += stats.steps
        self.accepted += stats.accepted
        self.verified += stats.verified

    def line(self) -> str:
        rate = self.new_tokens / self.seconds if self.seconds else 0.0
        tau = (self.accepted + self.steps) / self.steps if self.steps else 0.0
        verify = self.verified / self.steps if self.steps else 0.0
        return (
            f"{self.turns} answers · {self.new_tokens} tokens · {rate:.1f} tok/s · "
            f"τ {tau:.2f} (incl. bonus) · verify {verify:.2f}/step"
        )


@run_options(
    "model", "method", "drafter", "draft_tokens", "block_size", "verify_policy", "engine",
    "cuda_graphs", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "device",
    "dtype", "context", "think", "show_drafts", "quiet", "threads", "measure_costs", "debug",
    max_new_tokens=512,
)  # fmt: skip
def chat(*, run: Run) -> None:
    """Chat with the model; reads turns from the terminal or, line by line, from a pipe."""
    with user_errors(run.debug):
        sampling = run.sampling()
        pipe = run.load()
        interactive = sys.stdin.isatty()
        if interactive and not run.quiet:
            display.status(f"{pipe.name} · {HELP}")
        repl = ChatRepl(pipe, sampling, run.max_new_tokens, run.think, run.quiet, run.show_drafts)
        repl.run(interactive)


class ChatRepl:
    def __init__(
        self,
        pipe: Pipeline,
        sampling: SamplingParams,
        max_new_tokens: int,
        think: bool,
        quiet: bool,
        show_drafts: bool = False,
    ) -> None:
        self.pipe = pipe
        self.show_drafts = show_drafts
        self.session = pipe.new_session()
        self.sampling = sampling
        self.max_new_tokens = max_new_tokens
        self.think = think
        self.quiet = quiet
        self.messages: list[dict[str, str]] = []
        self.totals = SessionTotals()

    def run(self, interactive: bool) -> None:
        while True:
            line = _read_turn(interactive)
            if line is None or line.strip() == "/exit":
                return
            text = line.strip()
            if text.startswith("/"):
                self.command(text)
            elif text:
                self.turn(text)

    def command(self, text: str) -> None:
        if text == "/reset":
            self.messages = []
            self.session.reset()
            display.status("conversation forgotten")
        elif text == "/stats":
            display.status(self.totals.line())
        else:
            display.error(f"unknown command {text}; {HELP}")

    def turn(self, text: str) -> None:
        messages = self.messages + [{"role": "user", "content": text}]
        tokens: list[int] = []
        stats: GenStats | None = None
        try:
            ids = self.pipe.encode(messages, think=self.think)
            chunks = self.pipe.stream_ids(
                ids,
                sampling=self.sampling,
                max_new_tokens=self.max_new_tokens,
                session=self.session,
            )
            view = answer_view(self.pipe, quiet=self.quiet, show_drafts=self.show_drafts)
            try:
                for chunk in chunks:
                    tokens.extend(chunk.token_ids)
                    stats = chunk.stats
                    view.push(chunk)
                view.close(stats)
            except KeyboardInterrupt:  # stop the answer, keep it and the session
                view.close(stats)
                display.note("[answer stopped]")
        except SpecgenError as e:  # e.g. the history outgrew the context
            display.error(f"{e} (use /reset to start over)")
            return
        answer = self.pipe.codec.decode(tokens)
        self.messages = messages + [{"role": "assistant", "content": answer}]
        if stats is not None:
            self.totals.add(stats)


def _read_turn(interactive: bool) -> str | None:
    """The next user line, or None at end of input."""
    while True:
        try:
            return input(">>> " if interactive else "")
        except EOFError:
            return None
        except KeyboardInterrupt:  # at the prompt, Ctrl-C clears the line; it does not quit
            display.write("\n")
            display.status("(Ctrl-D or /exit to quit)")
