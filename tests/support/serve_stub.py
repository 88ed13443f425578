"""The server's routes in this process, with a stand-in pipeline: a real tokenizer and
chat template (the tiny one, or one given), and answers scripted per call. Fast enough
to drive thousands of requests (the fuzz test) and to check rendering and parsing
without a model."""

from __future__ import annotations

import copy
from contextlib import contextmanager
from pathlib import Path

from starlette.testclient import TestClient

from specgen.api.pipeline import Chunk
from specgen.core.events import TokenLogprob
from specgen.core.stats import GenStats
from specgen.serve.app import Service, build_app
from specgen.serve.metrics import Metrics
from specgen.serve.openai_api import Defaults
from specgen.serve.worker import Worker
from specgen.text.codec import TextCodec
from support.targets import tiny_tokenizer


class StubPipe:
    """What the server reads of a Pipeline. `answers` is a list of texts, one per
    answer in turn (cycled); each streams a token a step."""

    costs = None
    thinking = False

    def __init__(self, codec: TextCodec, context: int = 256, answers: list[str] | None = None):
        self.codec = codec
        self.context = context
        self.answers = answers or ["ok"]
        self.vocab_size = len(codec.tokenizer)
        self.prompts: list[list[int]] = []  # what each answer was asked
        self.constraints: list = []  # each answer's constraint (None: free text)

    def encode(self, prompt, raw=False, think=None):
        if isinstance(prompt, str):
            return (
                self.codec.encode_raw(prompt)
                if raw
                else self.codec.encode_chat([{"role": "user", "content": prompt}])
            )
        return self.codec.encode_chat(prompt, think=bool(think))

    def stream_ids(self, ids, sampling=None, max_new_tokens=256, ignore_eos=False, cancel=None,
                   constraint=None):  # fmt: skip
        """The scripted answer's tokens, one a step, as the pipeline streams them (its
        text decoded without special tokens); with logprobs asked for, each token's is
        -(its position + 1), its top tokens the token itself and the ids after it (mod 256)."""
        from specgen.text.codec import Detokenizer

        self.prompts.append(list(ids))
        self.constraints.append(constraint)
        if cancel is not None and cancel():  # as between prefill chunks
            from specgen.core.errors import Cancelled

            raise Cancelled("cancelled before the prefill")
        text = self.answers[(len(self.prompts) - 1) % len(self.answers)]
        stats = GenStats(prompt_tokens=len(ids), prefill_tokens=len(ids))
        tokens = (self.codec.encode_raw(text) if text else [])[:max_new_tokens]
        detok = Detokenizer(self.codec)
        top = None if sampling is None else sampling.logprobs
        for i, token in enumerate(tokens or [None]):
            last = i >= len(tokens) - 1
            reason = ("length" if len(tokens) == max_new_tokens else "stop") if last else None
            stats.record_step(1, 0, 0, reason)
            step = () if token is None else (token,)
            piece = detok.push(list(step)) + (detok.flush() if last else "")
            if top is None or not step:
                yield Chunk(piece, step, stats)
            else:
                yield Chunk(piece, step, stats, 0, (scripted(token, -(i + 1.0), top),), (piece,))

    def prompt_logprobs(self, ids, top=0, session=None):
        return [scripted(t, -0.5, top) for t in ids[1:]]


def scripted(token: int, logprob: float, top: int) -> TokenLogprob:
    return TokenLogprob(token, logprob, tuple(((token + k) % 256, logprob - k) for k in range(top)))


def codec_with(tmp: Path, template: str | None = None, special: list[str] = ()) -> TextCodec:
    """A TextCodec of the tiny tokenizer, with `template` and extra special tokens."""
    tok = copy.deepcopy(tiny_tokenizer())
    if special:
        tok.add_special_tokens({"additional_special_tokens": list(special)})
    if template is not None:
        tok.chat_template = template
    tok.save_pretrained(tmp)
    return TextCodec(tmp, "stub")


@contextmanager
def stub_app(pipe: StubPipe, max_tokens: int = 16, **service):
    worker = Worker(lambda: {"ar": pipe}, queue_size=64)
    worker.start()
    svc = Service(worker, "m", frozenset({"m"}), Defaults(max_tokens=max_tokens), Metrics(("ar",)),
                  **service)  # fmt: skip
    worker.metrics = svc.metrics
    try:
        with TestClient(build_app(svc)) as http:
            yield http
    finally:
        worker.close()

