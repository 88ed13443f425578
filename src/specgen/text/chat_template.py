"""A model's chat template rendered as transformers' `apply_chat_template` renders it,
without importing transformers (1.3 s of a cold start).

The environment is the one transformers 5 builds (`utils/chat_template_utils.py`): Jinja's
immutable sandbox with `trim_blocks` and `lstrip_blocks`, the loop controls, a
`{% generation %}` tag that renders its body, `tojson` without HTML escaping,
`raise_exception`, `strftime_now`, `dict` and a `namespace` that refuses names starting
with an underscore. The variables are the conversation (`messages`), `tools` and
`documents` (None here), `add_generation_prompt`, the tokenizer's named special tokens
(`bos_token`, ...) and the caller's keyword arguments (`enable_thinking`).
tests/test_text_fast.py renders the shipped templates both ways and compares.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from typing import Any


@cache
def compiled(template: str):
    """The template compiled once per process (a codec's template never changes)."""
    return _environment().from_string(template)


def render(template: str, messages: list[dict[str, str]], **variables: Any) -> str:
    return compiled(template).render(messages=messages, tools=None, documents=None, **variables)


@cache
def _environment():
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}` marks the assistant's text for training
        masks; rendering keeps the body as it is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):  # Jinja's signature, so `namespace(self=...)` works
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
                    f"but got {name!r}. Please rename the attribute."
                )

    class Dict:  # `dict(...)` in a template, with no attribute access to break out through
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = Dict()
    env.globals["namespace"] = Namespace
    return env
