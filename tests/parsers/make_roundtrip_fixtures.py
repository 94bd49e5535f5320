#!/usr/bin/env python3
"""Renders assistant turns with tool calls through the real chat templates
(tests/fixtures/chat/model_templates, with the reference renderer
tools/fixtures/render_chat_template.py, i.e. Debian's python3-jinja2 the way HF
does it) and cuts out exactly the text the model is trained to generate for
that turn. output_parser tests parse it back and must recover the message.

    python3 tests/parsers/make_roundtrip_fixtures.py

writes tests/parsers/fixtures/{glm,deepseek}_roundtrip.{json,txt}."""
import json
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.join(here, "..", "..")
out_dir = os.path.join(here, "fixtures")

tools = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
         "tags": {"type": "array", "items": {"type": "string"}}, "zip": {"type": "string"},
         "options": {"type": "object"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time",
     "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}},
]
assistant = {
    "role": "assistant",
    "reasoning_content": "The user wants the weather in Paris and the time in Tokyo.",
    "content": "I'll look both up.",
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {
            "city": "Paris, \"Île-de-France\"", "days": 3, "metric": True, "tags": ["rain", "wind"],
            "zip": "75001", "options": {"hourly": False, "lang": "fr"}}}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": {"zone": "Asia/Tokyo"}}},
    ],
}
request = {"messages": [{"role": "system", "content": "You are helpful."},
                        {"role": "user", "content": "Weather in Paris? And the time in Tokyo?"},
                        assistant],
           "tools": tools, "add_generation_prompt": False}


def render(template):
    path = os.path.join(out_dir, "request.tmp.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(request, f, ensure_ascii=False)
    try:
        return subprocess.run([sys.executable, os.path.join(root, "tools/fixtures/render_chat_template.py"),
                               os.path.join(root, "tests/fixtures/chat/model_templates", template),
                               path],
                              check=True, capture_output=True).stdout.decode("utf-8")
    finally:
        os.remove(path)


os.makedirs(out_dir, exist_ok=True)
# GLM: the turn starts after the last <|assistant|> (the model writes <think>... itself).
glm = render("GLM-4.6.jinja").rsplit("<|assistant|>", 1)[1]
# DeepSeek-V3.2: the prompt ends with <｜Assistant｜><think>; the turn ends with the EOS token.
deepseek = render("DeepSeek-V3.2.jinja").rsplit("<｜Assistant｜>", 1)[1]
assert deepseek.startswith("<think>")
deepseek = deepseek[len("<think>"):]
deepseek = deepseek.removesuffix("<｜end▁of▁sentence｜>")

expected = {"reasoning_content": assistant["reasoning_content"], "content": assistant["content"],
            "tool_calls": [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                           for c in assistant["tool_calls"]], "tools": tools}
for name, text, starts_in_reasoning in (("glm", glm, False), ("deepseek", deepseek, True)):
    with open(os.path.join(out_dir, f"{name}_roundtrip.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(out_dir, f"{name}_roundtrip.json"), "w", encoding="utf-8") as f:
        json.dump(dict(expected, starts_in_reasoning=starts_in_reasoning), f, ensure_ascii=False, indent=1)
