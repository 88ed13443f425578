"""The request schema fuzzed by Hypothesis (skipped without it; the seeded fuzz in
test_serve_limits.py always runs): bodies built from every field the server reads, with
values of every JSON type, on Qwen3's tool template. No answer is a 5xx; an error is
OpenAI's shape; the server answers afterwards."""

from __future__ import annotations

import json

import pytest

from support.serve import FIELDS, TOOL_ANSWERS
from support.serve_stub import StubPipe, codec_with, stub_app
from support.serve_tools import template

# servers, subprocesses or whole CLI runs: not the quick tier
pytestmark = pytest.mark.integration

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12,
)  # fmt: skip
ROLE = st.sampled_from(["user", "system", "assistant", "developer", "tool", "bot"]) | JSON
CALL = st.fixed_dictionaries(
    {"id": st.text(max_size=4) | JSON, "type": st.just("function") | JSON,
     "function": st.fixed_dictionaries({"name": st.sampled_from(["f", "g"]) | JSON,
                                        "arguments": st.sampled_from(['{"a": 1}', "{", "[]"])
                                        | JSON})},
)  # fmt: skip
MESSAGE = st.fixed_dictionaries(
    {"role": ROLE, "content": st.text(max_size=30) | JSON},
    optional={"tool_calls": st.lists(CALL, max_size=2) | JSON, "tool_call_id": JSON,
              "name": st.text(max_size=4)},
) | JSON  # fmt: skip
FIELD = st.sampled_from(sorted(FIELDS)).flatmap(
    lambda name: st.tuples(st.just(name), st.sampled_from(FIELDS[name]) | JSON)
)
BODY = st.fixed_dictionaries(
    {"messages": st.lists(MESSAGE, max_size=4) | JSON, "max_tokens": st.just(8) | JSON},
    optional={"tools": st.just([{"type": "function", "function": {"name": "f"}}]) | JSON},
).flatmap(lambda body: st.lists(FIELD, max_size=4).map(lambda fs: {**body, **dict(fs)}))


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    codec = codec_with(tmp_path_factory.mktemp("hyp"), template("qwen3"))
    with stub_app(StubPipe(codec, context=4096, answers=TOOL_ANSWERS["qwen3"])) as client:
        yield client


def test_no_request_body_gets_a_5xx(http):
    @hypothesis.settings(max_examples=600, deadline=None, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck))  # fmt: skip
    @hypothesis.given(body=BODY, chat=st.booleans())
    def check(body, chat):
        route = "/v1/chat/completions" if chat else "/v1/completions"
        if not chat:
            body = {**body, "prompt": body.pop("messages")}
        r = http.post(route, content=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"})  # fmt: skip
        assert r.status_code < 500, (body, r.text[:300])
        if r.status_code >= 400:
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}

    check()
    hi = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert http.post("/v1/chat/completions", json=hi).status_code == 200
