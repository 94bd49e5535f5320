"""Renders chat requests through a Jinja chat template with the settings Hugging Face's
apply_chat_template uses (sandboxed environment, trim_blocks, lstrip_blocks, loop controls,
a json.dumps-based tojson), i.e. the behaviour of tools/fixtures/render_chat_template.py,
so training text matches what megactx's renderer produces from the same template."""
import json
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)


class ChatRenderer:
    def __init__(self, template_text: str):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.template = env.from_string(template_text)

    def render(self, messages, tools=None, add_generation_prompt=False, **kwargs) -> str:
        return self.template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs)

    @staticmethod
    def from_file(path: str) -> "ChatRenderer":
        with open(path, encoding="utf-8") as f:
            return ChatRenderer(f.read())
