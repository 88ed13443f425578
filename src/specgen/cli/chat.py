"""`specgen chat`: a multi-turn conversation with the model's chat template.

History is re-rendered through the chat template every turn; the session's KV cache
keeps the shared prefix, so only the new turn is prefilled. Ctrl-C stops the answer (the
partial answer stays in the history) but not the session; Ctrl-D or /exit ends it.

When the conversation outgrows the context, `--on-full` decides: reset (forget it and
answer the turn afresh) or stop (end the chat). Either way the error is said once, and a
turn that could not be answered makes the exit status 2. Piped turns get their answers
separated by a blank line.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Annotated

import typer

from specgen.cli.common import user_errors
from specgen.cli.options import GROUPS, Run, run_options
from specgen.cli.terminal import typing_held
from specgen.core.config import SamplingParams
from specgen.core.errors import ContextLimitError, SpecgenError
from specgen.core.stats import GenStats
from specgen.terminal import display
from specgen.terminal.display import plural

if TYPE_CHECKING:
    from specgen.api.pipeline import Pipeline
    from specgen.terminal.live import AnswerView

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
            f"{plural(self.turns, 'answer')} · {plural(self.new_tokens, 'token')} · "
            f"{rate:.1f} tok/s · "
            f"τ {tau:.2f} (incl. bonus) · verify {verify:.2f}/step"
        )


class OnFull(str, Enum):
    reset = "reset"
    stop = "stop"


@run_options(
    *GROUPS,
    max_new_tokens=512,
    helps={"quiet": "No live view, status lines or stats: only the answers."},
)
def chat(
    on_full: Annotated[
        OnFull | None,
        typer.Option(
            "--on-full",
            help="When the conversation outgrows the context: reset (forget it, say so once, "
            "answer the turn afresh) or stop (end the chat, exit 2). Default: reset on a "
            "terminal, stop when turns are piped in.",
        ),
    ] = None,
    *,
    run: Run,
) -> None:
    """Chat with the model; reads turns from the terminal or, line by line, from a pipe.

    Exits 2 at the end if a turn could not be answered."""
    with user_errors(run.debug):
        sampling = run.sampling()
        pipe = run.load()
        interactive = sys.stdin.isatty()
        if interactive and not run.quiet:
            display.status(f"{pipe.name} · {HELP}")
        # A person at a terminal wants the chat to go on; a script's later turns may lean on
        # what a reset would forget, so it stops there and its exit status says so.
        policy = on_full or (OnFull.reset if interactive else OnFull.stop)
        repl = ChatRepl(
            pipe, sampling, run.max_new_tokens, run.think, run.quiet, run.show_drafts, policy
        )
        repl.run(interactive)
        if repl.failed:
            raise typer.Exit(2)


class ChatRepl:
    def __init__(
        self,
        pipe: Pipeline,
        sampling: SamplingParams,
        max_new_tokens: int,
        think: bool,
        quiet: bool,
        show_drafts: bool = False,
        on_full: OnFull = OnFull.stop,
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
        self.on_full = on_full
        self.failed = False  # a turn could not be answered: the exit status says so
        self.answers = 0  # answers printed, for the separator between piped ones

    def run(self, interactive: bool) -> None:
        while True:
            line = _read_turn(interactive)
            if line is None or line.strip() == "/exit":
                return
            text = line.strip()
            if text.startswith("/"):
                self.command(text)
            elif text and not self.turn(text):
                return

    def command(self, text: str) -> None:
        if text == "/reset":
            self.forget()
            display.status("conversation forgotten")
        elif text == "/stats":
            display.status(self.totals.line())
        else:
            display.error(f"unknown command {text}; {HELP}")

    def forget(self) -> None:
        self.messages = []
        self.session.reset()

    def turn(self, text: str) -> bool:
        """Answer one user turn; False when the session must end."""
        messages = self.messages + [{"role": "user", "content": text}]
        try:
            tokens, stats = self._answer(messages)
        except ContextLimitError as e:
            if self.on_full is OnFull.reset and self.messages:
                # said once: this turn, and the ones after it, go on in a fresh conversation
                display.note("context full: the conversation so far is forgotten")
                self.forget()
                return self.turn(text)
            self.failed = True
            if self.on_full is OnFull.stop:
                hint = " (--on-full reset starts over instead)" if self.messages else ""
                display.error(f"{e}; ending the chat{hint}")
                return False
            display.error(str(e))  # this turn alone does not fit: no reset can help it
            return True
        except SpecgenError as e:
            self.failed = True
            display.error(str(e))
            return True
        answer = self.pipe.codec.decode(tokens)
        self.messages = messages + [{"role": "assistant", "content": answer}]
        if stats is not None:
            self.totals.add(stats)
        return True

    def _answer(self, messages: list[dict[str, str]]) -> tuple[list[int], GenStats | None]:
        """Stream the answer to `messages`; Ctrl-C stops it and keeps what came."""
        ids = self.pipe.encode(messages, think=self.think)
        chunks = self.pipe.stream_ids(
            ids, sampling=self.sampling, max_new_tokens=self.max_new_tokens, session=self.session
        )
        tokens: list[int] = []
        stats: GenStats | None = None
        view: AnswerView | None = None  # opened at the first chunk: a refused turn prints none
        stopped = False
        try:
            with typing_held():
                for chunk in chunks:
                    view = view or self._open_view()
                    tokens.extend(chunk.token_ids)
                    stats = chunk.stats
                    view.push(chunk)
        except KeyboardInterrupt:  # stop the answer, keep it and the session
            stopped = True
        finally:
            if view is not None:
                view.close(stats)
        if stopped:
            display.note("[answer stopped]")
        return tokens, stats

    def _open_view(self) -> AnswerView:
        if self.answers and not display.stdout_is_tty():
            display.write("\n")  # piped answers: a blank line between them
        self.answers += 1
        from specgen.terminal.live import answer_view  # Rich: only once there is a view

        return answer_view(self.pipe, quiet=self.quiet, show_drafts=self.show_drafts)


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
