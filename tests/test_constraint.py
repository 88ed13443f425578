"""Constrained decoding stays exact: a constraint that allows the greedy answer leaves it
unchanged, and under a constraint that changes it every method gives constrained AR's
answer token for token (the mask is applied to every row the target scores, drafts are
rejected by it as the target would reject them)."""

from __future__ import annotations

import json
import re

import pytest

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams
from specgen.serve import grammar

pytestmark = pytest.mark.integration

PROMPT = "The quick brown fox"
N = 24


def constraint(pipe: Pipeline, rules: str):
    return grammar.compile(pipe.codec, pipe.model.args.vocab_size, rules, "test")


def answer(pipe: Pipeline, rules: str | None = None, n: int = N, **kwargs) -> list[int]:
    ids = pipe.encode(PROMPT, raw=True)
    extra = {} if rules is None else {"constraint": constraint(pipe, rules)}
    out: list[int] = []
    for chunk in pipe.stream_ids(ids, max_new_tokens=n, **extra, **kwargs):
        out.extend(chunk.token_ids)
    return out


def test_a_constraint_that_allows_the_greedy_answer_leaves_it_unchanged(pipes):
    ar = pipes["ar"]
    free = answer(ar)
    decode = ar.codec.tokenizer.decode
    # the random model's answer as far as it is text (a lone byte token is no character,
    # which a grammar over text cannot allow)
    n = next((k for k in range(1, len(free) + 1) if "\ufffd" in decode(free[:k])), len(free) + 1)
    free = free[: n - 1]
    assert len(free) >= 5
    # the answer itself, or something else: every row is masked down to a few tokens
    rules = grammar.llguidance_regex(f"{re.escape(decode(free))}|zzz[0-9]+")
    for method in ("ar", "ngram", "dflash", "dspark", "eagle3"):
        assert answer(pipes[method], rules, n=len(free)) == free, method


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
          "required": ["a", "b"], "additionalProperties": False}  # fmt: skip


def test_every_method_is_constrained_ar_under_a_schema(pipes):
    rules = grammar.json_schema_grammar(SCHEMA, "test")
    ar = pipes["ar"]
    reference = answer(ar, rules)
    assert reference != answer(ar)  # the constraint changed the answer
    text = ar.codec.tokenizer.decode(reference)
    assert text.startswith("{") and re.match(r'\{\s*"a"', text)  # held to the schema
    for method, pipe in pipes.items():
        assert answer(pipe, rules) == reference, method


def test_a_complete_answer_ends_where_the_schema_does(pipes):
    """With room to finish, the answer is valid JSON of the schema and stops there."""
    ar = pipes["ar"]
    small = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
             "additionalProperties": False}  # fmt: skip
    rules = grammar.json_schema_grammar(small, "test")
    ids = ar.encode(PROMPT, raw=True)
    chunks = list(ar.stream_ids(ids, max_new_tokens=40, constraint=constraint(ar, rules)))
    text = ar.codec.tokenizer.decode([t for c in chunks for t in c.token_ids])
    assert chunks[-1].stats.finish_reason == "stop"
    assert json.loads(text) in ({"a": True}, {"a": False})


def test_seeded_sampling_under_a_constraint_keeps_to_it(pipes):
    """Sampled answers (drafts rejected by the mask, bonuses from masked residuals) are
    always what the schema allows; their distribution is the verifier's business."""
    rules = grammar.json_schema_grammar(SCHEMA, "test")
    for method in ("ar", "dflash", "dspark", "stacked"):
        for seed in range(3):
            sampling = SamplingParams(temperature=1.0, seed=seed)
            ids = answer(pipes[method], rules, sampling=sampling)
            fresh = constraint(pipes[method], rules).matcher
            assert fresh.validate_tokens(ids) == len(ids), (method, seed)


def test_a_bad_schema_is_a_400_naming_the_field():
    from specgen.serve.errors import APIError

    with pytest.raises(APIError) as e:
        grammar.json_schema_grammar({"type": "object", "properties": 3}, "response_format")
    assert e.value.status == 400 and e.value.param == "response_format"
