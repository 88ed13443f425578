"""Tool-calling fixtures for the server tests: tools, a question, each family's special
tokens and chat templates."""

from __future__ import annotations

from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "templates"



SPECIAL = {  # the tokens each family's tokenizer has (the tiny one gets them added)
    "qwen3": [], "qwen3.5": [],
    "llama-3.1": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                  "<|python_tag|>"],
    "gemma4": ["<|tool_call>", "<tool_call|>", '<|"|>', "<|turn>", "<turn|>", "<|tool>",
               "<tool|>", "<|tool_response>", "<tool_response|>", "<|channel>", "<channel|>"],
}  # fmt: skip


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
        "properties": {"zone": {"type": "string"}}}}}  # fmt: skip


ASK = [{"role": "user", "content": "Weather in Paris?"}]


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()
