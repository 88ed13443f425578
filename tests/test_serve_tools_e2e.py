"""Tools against a real `specgen serve`: the tiny 6-layer Qwen3 with Qwen3's published
chat template, AR and DFlash loaded. What the tiny random model writes is no tool call,
so this checks what an end-to-end run can: the `openai` and `langchain-openai` clients
run unchanged with tools; the prompt is the template's rendering (its token count, the
forced opener included); and every method gives AR's answer with tools in play (only the
rendering and the parsing are new, decoding is untouched). The parsing of real calls is
tested on scripted answers in test_serve_tools.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specgen.serve import tools as T
from support.serve import CPU, Server
from support.serve_stub import codec_with
from support.serve_tools import ASK, TIME, WEATHER, template

# servers, subprocesses or whole CLI runs: not the quick tier
pytestmark = pytest.mark.integration

N = 10
NAMED = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def qwen3_tools(tiny_qwen3_deep, tmp_path_factory) -> Path:
    """The tiny Qwen3 with Qwen3's own chat template, and room for its tool prompt (the
    tiny tokenizer spends a token per 1-2 characters: ~700 for two tools)."""
    path = tmp_path_factory.mktemp("tools") / "tiny-qwen3-tools"
    shutil.copytree(tiny_qwen3_deep, path)
    codec_with(path, template("qwen3"))  # rewrites the tokenizer files in place
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = 2048  # RoPE: no weight depends on it
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def server(qwen3_tools, tiny_dflash):
    srv = Server(
        "--model", str(qwen3_tools), "--methods", "ar,dflash", "--drafter", str(tiny_dflash),
        "--verify-policy", "full", "--quiet", *CPU,
    )  # fmt: skip
    yield srv
    srv.stop()


def ask(client, method: str, **kwargs):
    return client.chat.completions.create(
        model="", messages=ASK, tools=[WEATHER, TIME], max_tokens=N,
        extra_body={"specgen": {"method": method}}, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("choice", ["auto", "required", NAMED], ids=["auto", "required", "named"])
def test_every_method_gives_ar_s_answer_with_tools(choice, server, qwen3_tools):
    client = server.client()
    ar, dflash = (ask(client, m, tool_choice=choice) for m in ("ar", "dflash"))
    assert ar.choices[0].message == dflash.choices[0].message  # content and any calls
    assert ar.model_extra["specgen"]["method"] == "ar"
    # the prompt is the template's rendering, the forced opener included
    codec = codec_with(qwen3_tools.parent / f"check-{id(choice)}", template("qwen3"))
    tools = T.parse_tools({"tools": [WEATHER, TIME], "tool_choice": choice})
    rendered = T.render(codec, ASK, tools, think=False)
    assert ar.usage.prompt_tokens == len(rendered.ids)
    if choice != "auto":
        assert rendered.primed.startswith("<tool_call>")


def test_streamed_with_tools_is_the_whole_answer(server):
    client = server.client()
    whole = ask(client, "dflash").choices[0]
    text, finish = "", None
    for chunk in ask(client, "dflash", stream=True):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert (text, finish) == ((whole.message.content or ""), whole.finish_reason)


def test_a_history_with_calls_and_results_is_answered(server):
    client = server.client()
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    ]
    r = client.chat.completions.create(model="", messages=messages, tools=[WEATHER], max_tokens=4)
    assert r.usage.completion_tokens >= 1 and r.choices[0].finish_reason in ("length", "stop")


def test_langchain_openai_runs_unchanged_with_tools(server):
    lc = pytest.importorskip("langchain_openai")
    from langchain_core.messages import AIMessage

    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    chat = lc.ChatOpenAI(
        base_url=server.base, api_key="none", model="tiny-qwen3-tools", max_tokens=N,
        temperature=0, max_retries=0,
    )  # fmt: skip
    plain = chat.bind_tools([get_weather]).invoke("Weather in Paris?")
    forced = chat.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Paris?")
    for answer in (plain, forced):
        assert isinstance(answer, AIMessage)
        assert answer.usage_metadata["output_tokens"] >= 1
        for call in answer.tool_calls:  # a random model rarely makes one; if so, well formed
            assert call["name"] == "get_weather" and isinstance(call["args"], dict)
    chunks = list(chat.bind_tools([get_weather]).stream("Weather in Paris?"))
    assert "".join(c.content for c in chunks) == plain.content
