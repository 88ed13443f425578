"""`specgen generate`: answer one prompt, a file of prompts, or stdin."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer

from specgen.cli.common import user_errors
from specgen.cli.options import GROUPS, JsonOpt, Run, run_options
from specgen.core.config import SamplingParams
from specgen.core.errors import PromptError, SpecgenError
from specgen.terminal import display
from specgen.text.prompts import PromptLine, read_prompts, read_stdin_prompt

if TYPE_CHECKING:
    from specgen.api.pipeline import Pipeline
    from specgen.core.stats import GenStats

EXAMPLES = """
Examples:

  specgen generate "Why is the sky blue?"

  echo "Summarise: ..." | specgen generate --json

  specgen generate --prompt-file data/smollm2-135m/calibration-prompts.jsonl --json \
      --max-new-tokens 128
"""


@run_options(*GROUPS)  # every shared option: the command they are documented on
def generate(
    prompt: Annotated[
        str | None, typer.Argument(help="The prompt; omit it to use --prompt-file or stdin.")
    ] = None,
    prompt_file: Annotated[
        str | None,
        typer.Option(
            "--prompt-file",
            "-f",
            help=".txt (one prompt per line) or .jsonl (`prompt`, or `turns`: answered as one "
            "conversation); - for stdin lines.",
        ),
    ] = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")
    ] = False,
    json_out: JsonOpt = False,
    trace: Annotated[
        bool,
        typer.Option(
            "--trace", help="With --json: one record per step (draft, verify length, ...)."
        ),
    ] = False,
    *,
    run: Run,
) -> None:
    """Generate an answer for each prompt and stream it to stdout."""
    with user_errors(run.debug):
        if trace and not json_out:
            # The trace is a field of the JSON record; without --json the run would print
            # nothing of what was asked for, so say so before loading anything.
            raise SpecgenError("--trace adds a per-step record to the --json output: add --json")
        sampling = run.sampling()
        prompts = _collect_prompts(prompt, prompt_file)
        pipe = run.load(run.spec(trace=trace), quick=True)
        answer = _Answerer(pipe, sampling, run.max_new_tokens, json_out, run.quiet, run.show_drafts)
        failures = 0
        for p in prompts:  # one bad line or prompt in a file must not lose the others
            try:
                if p.error is not None:
                    raise PromptError(p.error)
                if p.turns:
                    _converse(answer, p, raw, run.think)
                else:
                    answer(p.text, pipe.encode(p.text, raw=raw, think=run.think))
            except PromptError as e:  # reported in its place; the exit says so at the end
                failures += 1
                _report_failure(p, str(e), prompt_file, json_out)
        if failures:
            raise typer.Exit(2)


generate.__doc__ = (generate.__doc__ or "") + EXAMPLES


def _collect_prompts(prompt: str | None, prompt_file: str | None) -> list[PromptLine]:
    """The prompts to answer, in order; a file's bad lines come back with their error."""
    if prompt is not None and prompt_file is not None:
        raise SpecgenError("give either a PROMPT argument or --prompt-file, not both")
    if prompt is not None:
        if not prompt.strip():
            raise PromptError("empty prompt")
        return [PromptLine(prompt, None, 1)]
    if prompt_file is not None:
        return read_prompts(prompt_file, keep_bad=True)
    if sys.stdin.isatty():
        raise PromptError("no prompt: give a PROMPT argument, --prompt-file FILE, or pipe text in")
    return [PromptLine(read_stdin_prompt(), None, 1)]


def _converse(answer: _Answerer, p: PromptLine, raw: bool, think: bool | None) -> None:
    """A line of several turns, answered as one conversation: each turn with the answers
    before it, on one session so each turn prefills only what is new (`specgen chat`'s
    way). Its answers come one after another (with --json, a record a turn)."""
    if raw:
        raise PromptError(
            f"it has {len(p.turns)} turns: --raw answers one prompt; drop --raw to answer "
            "them as a conversation"
        )
    conversation: list[dict[str, str]] = []
    for i, turn in enumerate(p.turns, start=1):
        conversation.append({"role": "user", "content": turn})
        ids = answer.pipe.encode(conversation, think=think)
        text = answer(turn, ids, turn=i, last=i == len(p.turns))
        conversation.append({"role": "assistant", "content": text})


def _report_failure(p: PromptLine, message: str, prompt_file: str | None, json_out: bool) -> None:
    """One `error:` line, and with --json a record in the answer's place, naming the file's
    line (a bad line's message does already; an unanswerable prompt's does not)."""
    record: dict[str, object] = {"prompt": p.text or None}
    if prompt_file is not None:
        if p.error is None:
            message = (
                f"{'stdin' if prompt_file == '-' else prompt_file}: line {p.number}: {message}"
            )
        record["line"] = p.number
    if json_out:
        display.write_json({**record, "error": message})
    display.error(message)


@dataclass(frozen=True)
class _Answerer:
    """Streams one answer (or prints its JSON record); Ctrl-C keeps what was generated."""

    pipe: Pipeline
    sampling: SamplingParams
    max_new_tokens: int
    json_out: bool
    quiet: bool
    show_drafts: bool = False

    def __call__(self, prompt: str, ids: list[int], *, turn: int | None = None,
                 last: bool = True) -> str:  # fmt: skip
        """The answer's text; `turn`: its place in a conversation (a field of the record;
        piped, the turns are separated by a blank line, as `specgen chat` does)."""
        tokens: list[int] = []
        stats: GenStats | None = None
        view = None
        if not self.json_out:
            from specgen.terminal.live import answer_view  # Rich: only once there is a view

            view = answer_view(self.pipe, quiet=self.quiet, show_drafts=self.show_drafts)
        try:
            for chunk in self.pipe.stream_ids(
                ids, sampling=self.sampling, max_new_tokens=self.max_new_tokens
            ):
                tokens.extend(chunk.token_ids)
                stats = chunk.stats
                if view is not None:
                    view.push(chunk)
        except KeyboardInterrupt:
            if stats is not None:
                stats.finish_reason = "interrupted"
            self._finish(prompt, tokens, stats, view, turn)
            raise
        self._finish(prompt, tokens, stats, view, turn)
        if view is not None and not last:
            display.write("\n")  # a blank line between a conversation's answers
        return self.pipe.codec.decode(tokens)

    def _finish(self, prompt: str, tokens: list[int], stats: GenStats | None, view,
                turn: int | None) -> None:  # fmt: skip
        if view is not None:
            view.close(stats)
            return
        text = self.pipe.codec.decode(tokens)
        if stats is None:  # interrupted before the first token
            record = {"prompt": prompt, "text": text, "token_ids": tokens, "stats": None}
        else:
            from specgen.api.chunks import Completion

            record = Completion(prompt, text, tokens, stats).to_dict()
        if turn is not None:
            record = {"turn": turn, **record}
        display.write_json(record)
