"""Constrained decoding for the server: a JSON Schema (`response_format`, the generic tool
format) compiled by llguidance into a token-level matcher, as the engine's `Constraint`.

llguidance is what llama.cpp offers for the same job (and vLLM and SGLang beside
xgrammar): it walks the grammar over bytes, so every tokenization of an allowed text is
allowed, not only the canonical one, and a greedy answer the schema already allows comes
out unchanged. Its tokenizer view takes seconds to build for a 49k vocabulary, so it is
built once per codec, off the event loop (the handlers call `compile` in the encoder
thread); a matcher is one answer's state.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from specgen.serve.errors import invalid
from specgen.verify.constraint import Constraint

if TYPE_CHECKING:
    from specgen.text.codec import TextCodec

# Whitespace between JSON tokens: a few characters, not a run without end. A small model
# held to a schema otherwise can fill max_tokens with newlines where it hesitates.
JSON_OPTIONS = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{0,24}", "lenient": True}

_TOKENIZERS: dict[int, Any] = {}  # id(codec) -> llguidance's view of its tokenizer
_LOCK = threading.Lock()


class Grammar(Constraint):
    """One answer held to a compiled grammar. Rows are computed on the host (a bitmask
    per position, microseconds each) and moved to the logits' device by `masked`."""

    def __init__(self, matcher: Any, vocab: int, stop_ids: frozenset[int]) -> None:
        self.matcher = matcher
        self.vocab = vocab
        self.stops = torch.zeros(vocab, dtype=torch.bool)
        self.stops[[t for t in stop_ids if t < vocab]] = True

    def _row(self) -> torch.Tensor:
        if self.matcher.is_error():  # cannot happen for tokens taken from masked rows
            return self.stops.clone()  # end the answer rather than sample from nothing
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        row = np.unpackbits(bits, bitorder="little")[: self.vocab].astype(bool)
        if len(row) < self.vocab:
            row = np.concatenate([row, np.zeros(self.vocab - len(row), dtype=bool)])
        return torch.from_numpy(row)

    def allowed(self, drafts: Sequence[int] = ()) -> torch.Tensor:
        rows = [self._row()]
        taken = 0
        for token in drafts:
            if self.matcher.validate_tokens([token]) != 1:
                break  # forbidden: the rows after it decide nothing
            self.matcher.consume_token(token)
            taken += 1
            rows.append(self._row())
        if taken:
            self.matcher.rollback(taken)
        while len(rows) < len(drafts) + 1:
            rows.append(torch.ones(self.vocab, dtype=torch.bool))
        return torch.stack(rows)

    def commit(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            if not self.matcher.consume_token(token):
                return  # error state: `_row` then allows only the stop tokens


def json_schema_grammar(schema: dict, param: str) -> str:
    """A JSON Schema as llguidance's grammar, or a 400 naming `param`."""
    import llguidance

    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults=dict(JSON_OPTIONS)
        )
    except (ValueError, TypeError) as e:
        raise invalid(f"{param}: not a usable JSON Schema ({_short(e)})", param) from None
    bad, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if bad:
        raise invalid(f"{param}: not a usable JSON Schema ({_short(messages[0])})", param)
    return grammar


def llguidance_regex(regex: str) -> str:
    """A regular expression as llguidance's grammar (the answer must match it whole)."""
    import llguidance

    return llguidance.LLMatcher.grammar_from_regex(regex)


def compile(codec: TextCodec, vocab: int, grammar: str, param: str) -> Grammar:
    """A fresh matcher for one answer (runs in the encoder thread: the first call per
    codec builds the tokenizer view)."""
    import llguidance

    matcher = llguidance.LLMatcher(_tokenizer(codec, vocab), grammar, log_level=0)
    if matcher.is_error():
        raise invalid(f"{param}: cannot be enforced ({_short(matcher.get_error())})", param)
    return Grammar(matcher, vocab, codec.stop_ids)


def _tokenizer(codec: TextCodec, vocab: int) -> Any:
    with _LOCK:
        found = _TOKENIZERS.get(id(codec))
        if found is None:
            import llguidance.hf

            found = llguidance.hf.from_tokenizer(
                codec.tokenizer, n_vocab=vocab, eos_token=sorted(codec.stop_ids)
            )
            _TOKENIZERS[id(codec)] = found
        return found


def _short(e: Any) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 200 else text[:197] + "..."
