"""Tool calls in `specgen serve`: `tools` rendered through each family's published chat
template (tests/fixtures/templates, on the tiny tokenizer), the model's calls parsed back
into `tool_calls` (whole and streamed), `tool_choice` and `parallel_tool_calls`, and
clear 400s. The answers are scripted (a stand-in pipeline): a tiny random model does not
write tool calls by itself. The real server with a model is in test_serve_tools_e2e.py."""

from __future__ import annotations

import json

import pytest

from specgen.serve import tools as T
from specgen.serve.tool_calls import Call, ToolStream, split
from specgen.serve.tool_formats import format_of
from support.serve_stub import StubPipe, codec_with, stub_app
from support.serve_tools import ASK, SPECIAL, TIME, WEATHER, template

# what a model of each family writes to call get_weather(city="Paris", days=2), then
# get_time(zone="CET"), after a line of text
CALLS = {
    "qwen3": 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
             '"days": 2}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
             '{"zone": "CET"}}\n</tool_call>',
    "qwen3.5": "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
               "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n"
               "<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n"
               "</function>\n</tool_call>",
    "gemma4": 'Let me check.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>'
              '<|tool_call>call:get_time{zone:<|"|>CET<|"|>}<tool_call|>',
}  # fmt: skip
LLAMA_CALLS = '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; ' \
              '{"name": "get_time", "parameters": {"zone": "CET"}}'  # fmt: skip
SCHEMAS = {"get_weather": WEATHER["function"]["parameters"], "get_time": {}}
EXPECTED = [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"zone": "CET"})]


@pytest.fixture(scope="module")
def codecs(tmp_path_factory):
    return {
        name: codec_with(tmp_path_factory.mktemp(name), template(name), SPECIAL[name])
        for name in SPECIAL
    }


def calls_of(found: list[Call]) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in found]


# --- parsing texts ------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen3", "qwen3.5", "gemma4", "llama-3.1"])
def test_each_format_is_read_whole_and_streamed_a_character_at_a_time(family):
    fmt = format_of(template(family))
    text = LLAMA_CALLS if family == "llama-3.1" else CALLS[family]
    content, found = split(text, fmt, SCHEMAS)
    assert calls_of(found) == EXPECTED
    assert content.strip() == ("" if family == "llama-3.1" else "Let me check.")
    stream = ToolStream(fmt, SCHEMAS)
    events = [e for ch in text for e in stream.push(ch)] + stream.flush()
    assert calls_of([e for e in events if isinstance(e, Call)]) == EXPECTED
    assert [c.index for c in events if isinstance(c, Call)] == [0, 1]
    streamed_text = "".join(e.text for e in events if not isinstance(e, Call))
    assert streamed_text == content
    _, single = split(text, fmt, SCHEMAS, single=True)  # parallel_tool_calls: false
    assert calls_of(single) == EXPECTED[:1]


def test_the_formats_are_told_apart_by_their_templates():
    names = {f: format_of(template(f)).name for f in SPECIAL}
    assert names == {"qwen3": "hermes", "qwen3.5": "qwen_xml", "llama-3.1": "llama_json",
                     "gemma4": "gemma4"}  # fmt: skip
    assert format_of("{% for m in messages %}{{ m.content }}{% endfor %}") is None


@pytest.mark.parametrize(
    "family, text",
    [
        ("qwen3", "<tool_call>\n{not json}\n</tool_call>"),
        ("qwen3", 'Sure <tool_call>\n{"name": "get_weather", "arguments": {"ci'),  # cut short
        ("gemma4", '<|tool_call>call:get_weather{city:<|"|>Par'),
        ("llama-3.1", "{the answer is 4}"),
        ("llama-3.1", "Plain text, with {braces} later."),
    ],
)
def test_text_that_is_not_a_call_comes_back_as_content(family, text):
    content, found = split(text, format_of(template(family)), SCHEMAS)
    assert found == [] and content == text


def test_text_that_may_start_an_opener_is_held_then_released():
    stream = ToolStream(format_of(template("qwen3")), SCHEMAS)
    assert [e.text for e in stream.push("a <tool_")] == ["a "]
    assert [e.text for e in stream.push("box>")] == ["<tool_box>"]


def test_qwen_xml_values_follow_the_schema():
    fmt = format_of(template("qwen3.5"))
    params = [("n", "007"), ("s", "007"), ("b", "True"), ("o", '{"a": [1]}'), ("x", "not a number")]
    inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    text = f"<tool_call>\n<function=f>\n{inner}</function>\n</tool_call>"
    props = {"n": {"type": "string"}, "s": {"type": "string"}, "b": {"type": "boolean"},
             "o": {"type": "object"}, "x": {"type": "integer"}}  # fmt: skip
    _, found = split(text, fmt, {"f": {"properties": props}})
    assert json.loads(found[0].arguments) == {"n": "007", "s": "007", "b": True,
                                              "o": {"a": [1]}, "x": "not a number"}  # fmt: skip


def test_gemma4_values_nest():
    fmt = format_of(template("gemma4"))
    text = ('<|tool_call>call:f{a:[1,2.5,<|"|>x, y<|"|>],b:{c:true,d:null},e:-3,'
            'g:<|"|>{not: a brace}<|"|>}<tool_call|>')  # fmt: skip
    _, found = split(text, fmt, {})
    assert json.loads(found[0].arguments) == {"a": [1, 2.5, "x, y"], "b": {"c": True, "d": None},
                                              "e": -3, "g": "{not: a brace}"}  # fmt: skip


# --- rendering through the templates --------------------------------------------------------------

HISTORY = ASK + [
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
]  # fmt: skip
TURN = {"qwen3": ("<|im_start|>assistant\n", "<|im_end|>"),
        "qwen3.5": ("<|im_start|>assistant\n", "<|im_end|>"),
        "llama-3.1": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
        "gemma4": ("<|turn>model\n", "<|tool_response>")}  # fmt: skip


def history(messages: list[dict]) -> list[dict]:
    from specgen.serve.openai_api import parse_messages

    return parse_messages({"messages": messages})


@pytest.mark.parametrize("family", list(SPECIAL))
def test_tools_render_as_the_template_does_and_its_calls_parse_back(family, codecs):
    """The prompt is transformers' own rendering; and an assistant call in the history,
    written by the template in the family's format, reads back as the same call: the
    parser reads what the template teaches."""
    codec = codecs[family]
    tools = T.parse_tools({"tools": [WEATHER, TIME]})
    rendered = T.render(codec, history(HISTORY), tools, think=False)
    text = codec.tokenizer.decode(rendered.ids)
    assert "get_weather" in text and "get_time" in text and rendered.primed == ""
    assert "21" in text  # the tool's result is in the prompt
    if family != "gemma4":  # Gemma 4 takes results as tool_responses (moved there)
        own = codec.tokenizer.apply_chat_template(
            history(HISTORY), tools=list(tools.tools), add_generation_prompt=True,
            enable_thinking=False, tokenize=True, return_dict=True,
        )["input_ids"]  # fmt: skip
        assert rendered.ids == list(own)
    written = codec.tokenizer.apply_chat_template(
        history(HISTORY[:2]), tools=list(tools.tools), tokenize=False, enable_thinking=False
    )
    opener, closer = TURN[family]
    turn = written[written.rindex(opener) + len(opener) :]
    turn = turn[: turn.index(closer)] if closer in turn else turn
    _, found = split(turn.split("</think>")[-1], rendered.fmt, SCHEMAS)
    assert calls_of(found) == EXPECTED[:1]


def test_gemma4_tool_results_go_to_the_calling_turn(codecs):
    codec = codecs["gemma4"]
    rendered = T.render(codec, history(HISTORY), T.parse_tools({"tools": [WEATHER]}), False)
    text = codec.tokenizer.decode(rendered.ids)
    assert text.endswith(
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>'
        "<|tool_response>response:get_weather{temp:21}<tool_response|><|channel>thought\n<channel|>"
    )


@pytest.mark.parametrize("family", list(SPECIAL))
def test_a_required_or_named_call_starts_the_answer_with_its_opener(family, codecs):
    codec = codecs[family]
    body = {"tools": [WEATHER, TIME], "tool_choice": "required"}
    free = T.render(codec, history(ASK), T.parse_tools({"tools": [WEATHER, TIME]}), False)
    forced = T.render(codec, history(ASK), T.parse_tools(body), False)
    choice = {"type": "function", "function": {"name": "get_time"}}
    named = T.render(codec, history(ASK), T.parse_tools({**body, "tool_choice": choice}), False)
    dec = codec.tokenizer.decode
    assert dec(forced.ids) == dec(free.ids) + forced.primed and forced.primed
    assert dec(named.ids) == dec(free.ids) + named.primed and "get_time" in named.primed
    # the model writes the rest; together they read as the call
    rest = {
        "qwen3": '{"zone": "CET"}}\n</tool_call>',
        "qwen3.5": "<parameter=zone>\nCET\n</parameter>\n</function>\n</tool_call>",
        "llama-3.1": '{"zone": "CET"}}',
        "gemma4": 'zone:<|"|>CET<|"|>}<tool_call|>',
    }[family]
    _, found = split(rest, named.fmt, SCHEMAS, primed=named.primed)
    assert calls_of(found) == [("get_time", {"zone": "CET"})]


def test_tool_choice_none_leaves_the_tools_out_and_parses_nothing(codecs):
    codec = codecs["qwen3"]
    r = T.render(
        codec, history(ASK), T.parse_tools({"tools": [WEATHER], "tool_choice": "none"}), False
    )
    assert "get_weather" not in codec.tokenizer.decode(r.ids) and r.fmt is None


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tools": "x"}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
        ({"tools": [{"function": {"name": "a<b"}}]}, "tools[0].function.name"),
        ({"tools": [{"function": {"name": "f", "parameters": []}}]},
         "tools[0].function.parameters"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ],
)  # fmt: skip
def test_bad_tools_are_a_400_naming_the_field(body, param):
    from specgen.serve.errors import APIError

    with pytest.raises(APIError) as e:
        T.parse_tools(body)
    assert (e.value.status, e.value.param) == (400, param), e.value.message


# --- over HTTP, with the openai client ----------------------------------------------------------


@pytest.fixture
def served(codecs):
    """An app on `family`'s template whose model answers `answers` in turn."""

    def make(family: str, answers: list[str]):
        return stub_app(StubPipe(codecs[family], context=4096, answers=answers), max_tokens=500)

    return make


def client_of(http):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http,
                         max_retries=0)  # fmt: skip


@pytest.mark.parametrize("family", ["qwen3", "qwen3.5", "gemma4"])
def test_the_openai_client_reads_tool_calls_whole_and_streamed(family, served):
    with served(family, [CALLS[family]]) as http:
        client = client_of(http)
        r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME])
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content.strip() == "Let me check."
        got = [
            (c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls
        ]
        assert got == EXPECTED and all(c.id.startswith("call_") for c in choice.message.tool_calls)
        events = client.chat.completions.create(
            model="m", messages=ASK, tools=[WEATHER, TIME], stream=True
        )
        text, calls, finish = "", {}, None
        for chunk in events:
            delta = chunk.choices[0].delta
            text += delta.content or ""
            for c in delta.tool_calls or []:
                calls.setdefault(c.index, ["", ""])
                calls[c.index][0] += c.function.name or ""
                calls[c.index][1] += c.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        assert finish == "tool_calls" and text.strip() == "Let me check."
        assert [(n, json.loads(a)) for n, a in calls.values()] == EXPECTED


def test_a_call_round_trip_with_the_tool_s_result(served):
    """The client sends back the assistant's calls and the tool's result; the model's next
    answer is plain text (finish_reason stop, no tool_calls)."""
    with served("qwen3", [CALLS["qwen3"], "It is 21 degrees."]) as http:
        client = client_of(http)
        first = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, TIME])
        msg = first.choices[0].message
        results = [{"role": "tool", "tool_call_id": c.id, "content": '{"temp": 21}'}
                   for c in msg.tool_calls]  # fmt: skip
        follow = ASK + [msg.model_dump(exclude_none=True)] + results
        second = client.chat.completions.create(model="m", messages=follow, tools=[WEATHER, TIME])
        assert second.choices[0].message.content == "It is 21 degrees."
        assert (
            second.choices[0].finish_reason == "stop" and not second.choices[0].message.tool_calls
        )


def test_parallel_tool_calls_false_keeps_the_first(served):
    with served("qwen3", [CALLS["qwen3"]]) as http:
        r = client_of(http).chat.completions.create(
            model="m", messages=ASK, tools=[WEATHER, TIME], parallel_tool_calls=False
        )
        assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]


def test_a_named_tool_choice_is_forced_in_the_prompt(served, codecs):
    with served("qwen3", ['{"zone": "CET"}}\n</tool_call>']) as http:
        pipe_prompts = http.app.app.state.service.pipes["ar"].prompts
        r = client_of(http).chat.completions.create(
            model="m", messages=ASK, tools=[WEATHER, TIME],
            tool_choice={"type": "function", "function": {"name": "get_time"}},
        )  # fmt: skip
        choice = r.choices[0]
        assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
            ("get_time", '{"zone": "CET"}')
        ]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        prompt = codecs["qwen3"].tokenizer.decode(pipe_prompts[-1])
        assert prompt.endswith('<tool_call>\n{"name": "get_time", "arguments": ')


GENERIC_CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'


def test_a_template_without_tools_gets_the_generic_format(tmp_path):
    """The tiny ChatML template never reads `tools`: the tools go into a system message,
    the answer is held to the call-or-reply JSON (a grammar on the job), and both shapes
    are read back. The stub writes what a constrained model would."""
    pipe = StubPipe(codec_with(tmp_path), 4096, answers=[GENERIC_CALL, '{"response": "Sunny."}'])
    with stub_app(pipe) as http:
        body = {"messages": ASK, "tools": [WEATHER], "max_tokens": 200}
        r = http.post("/v1/chat/completions", json=body).json()
        choice = r["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        call = choice["message"]["tool_calls"][0]["function"]
        assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
        prompt = pipe.codec.tokenizer.decode(pipe.prompts[-1])
        assert "You have these tools" in prompt and '"get_weather"' in prompt
        assert pipe.constraints[-1] is not None
        r = http.post("/v1/chat/completions", json=body).json()
        assert r["choices"][0]["message"]["content"] == "Sunny."
        assert r["choices"][0]["finish_reason"] == "stop"


def test_tool_choice_none_is_never_refused_and_leaves_the_tools_out(tmp_path):
    pipe = StubPipe(codec_with(tmp_path), answers=["plain"])
    with stub_app(pipe) as http:
        body = {"messages": ASK, "tools": [WEATHER], "tool_choice": "none"}
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "plain"
        assert "get_weather" not in pipe.codec.tokenizer.decode(pipe.prompts[-1])
        assert pipe.constraints[-1] is None
        r = http.post("/v1/chat/completions", json={"messages": ASK, "tool_choice": "auto"})
        assert r.status_code == 200  # harmless without tools, as before


def test_a_generic_history_renders_calls_and_results_as_json(tmp_path):
    pipe = StubPipe(codec_with(tmp_path), 4096, answers=['{"response": "It is sunny."}'])
    with stub_app(pipe) as http:
        body = {"messages": history(HISTORY), "tools": [WEATHER], "max_tokens": 200}
        r = http.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "It is sunny."
        prompt = pipe.codec.tokenizer.decode(pipe.prompts[-1])
        assert '"tool_calls"' in prompt and '"tool_response"' in prompt


def test_the_generic_grammar_allows_calls_and_replies_only(tmp_path):
    from specgen.serve import generic_tools, grammar

    codec = codec_with(tmp_path)
    vocab = len(codec.tokenizer)
    for choice, allowed, refused in [
        ("auto", [GENERIC_CALL, '{"response": "hi"}'], ["hi", '{"tool_calls": []}']),
        ("required", [GENERIC_CALL], ['{"response": "hi"}']),
    ]:
        tools = T.parse_tools({"tools": [WEATHER, TIME], "tool_choice": choice})
        rules = grammar.json_schema_grammar(generic_tools.schema(tools), "tools")
        for text, ok in [(t, True) for t in allowed] + [(t, False) for t in refused]:
            g = grammar.compile(codec, vocab, rules, "tools")
            ids = codec.tokenizer(text, add_special_tokens=False)["input_ids"]
            rows = g.allowed(ids)  # row j: what may follow ids[:j]
            fits = all(bool(rows[j, t]) for j, t in enumerate(ids))
            ends = fits and bool(g.allowed(())[0].any())
            if fits:
                g.commit(ids)
                ends = bool(g.allowed(())[0, sorted(codec.stop_ids)].all())
            assert (fits and ends) == ok, (choice, text)


def test_bad_tool_messages_are_a_400_naming_them(served):
    with served("qwen3", ["x"]) as http:
        bad = [
            (ASK + [{"role": "assistant", "tool_calls": [{"function": {"name": "f",
              "arguments": "{oops"}}]}], "messages[1].tool_calls[0].function.arguments"),
            (ASK + [{"role": "user", "content": "x", "tool_calls": [{}]}],
             "messages[1].tool_calls"),
            (ASK + [{"role": "tool", "content": "x", "tool_call_id": 3}],
             "messages[1].tool_call_id"),
        ]  # fmt: skip
        for messages, param in bad:
            r = http.post("/v1/chat/completions", json={"messages": messages})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
