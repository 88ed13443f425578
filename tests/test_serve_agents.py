"""Agent clients on the default model, whose chat template has no tools: LangChain's
`bind_tools` (tool_choice auto, required, none) and `with_structured_output` in its three
modes, and the openai SDK's `responses.create` (whole and streamed), on the generic tool
format and constrained decoding."""

from __future__ import annotations

import pytest

from support.serve import CPU, Server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(embedded_dir):
    srv = Server("--model", "smollm2-135m", "--methods", "ar", *CPU)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def llm(server):
    chat_openai = pytest.importorskip("langchain_openai").ChatOpenAI
    return chat_openai(base_url=server.base, api_key="none", model="smollm2-135m",
                       temperature=0, max_tokens=60, max_retries=0)  # fmt: skip


def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


def test_bind_tools_calls_a_tool_or_answers(llm):
    forced = llm.bind_tools([get_weather], tool_choice="get_weather")
    msg = forced.invoke("What is the weather in Paris?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "get_weather"
    assert isinstance(msg.tool_calls[0]["args"].get("city"), str)
    for choice in ("auto", "none"):
        msg = llm.bind_tools([get_weather], tool_choice=choice).invoke("Say hello.")
        assert msg.tool_calls or isinstance(msg.content, str)
    # the call's result goes back, and the model answers
    from langchain_core.messages import HumanMessage, ToolMessage

    first = forced.invoke("What is the weather in Paris?")
    call = first.tool_calls[0]
    history = [HumanMessage("What is the weather in Paris?"), first,
               ToolMessage("sunny", tool_call_id=call["id"])]  # fmt: skip
    reply = llm.bind_tools([get_weather]).invoke(history)
    assert reply.tool_calls or isinstance(reply.content, str)


@pytest.mark.parametrize("method", ["function_calling", "json_mode", "json_schema"])
def test_with_structured_output_in_every_mode(llm, method):
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str

    ask = "Give the name and country of the capital of France as JSON with keys name, country."
    out = llm.with_structured_output(City, method=method).invoke(ask)
    assert isinstance(out, City)


def test_responses_create_whole_and_streamed(server):
    client = server.client()
    r = client.responses.create(model="smollm2-135m", input="Name a colour.",
                                instructions="Be brief.", max_output_tokens=8)  # fmt: skip
    assert r.status in ("completed", "incomplete") and r.output_text
    assert r.usage.output_tokens <= 8
    tools = [{"type": "function", "name": "get_weather", "description": "The weather",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}}]  # fmt: skip
    r = client.responses.create(model="smollm2-135m", input="Weather in Paris?", tools=tools,
                                tool_choice="required", max_output_tokens=120)  # fmt: skip
    calls = [item for item in r.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather", r.output
    follow = client.responses.create(model="smollm2-135m", max_output_tokens=8, input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
         "arguments": calls[0].arguments},
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"},
    ])  # fmt: skip
    assert follow.status in ("completed", "incomplete")
    kinds, text = [], ""
    with client.responses.stream(model="smollm2-135m", input="Name a colour.",
                                 max_output_tokens=8) as stream:  # fmt: skip
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed",)
    assert text and final.output_text == text


def test_a_model_card_by_id(server):
    client = server.client()
    assert client.models.retrieve("smollm2-135m").id == "smollm2-135m"
    import openai

    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")
