"""Chat templates rendered as transformers renders them (`apply_chat_template`).

The same Jinja set-up as transformers' `_compile_jinja_template` (read from transformers 5.x,
utils/chat_template_utils.py): a sandboxed environment (ImmutableSandboxedEnvironment) with
trim_blocks and lstrip_blocks, the loopcontrols extension, a `{% generation %}` block that just
renders its body, `tojson` without HTML escaping, and the globals `raise_exception` and
`strftime_now`. The template sees `messages` (keys whose value is None dropped, as transformers
drops them), `add_generation_prompt=True`, `tools=None`, `documents=None` and the tokenizer's
special tokens by name (`bos_token`, `eos_token`, ...). The rendered text is encoded without
adding special tokens (the template wrote them), as transformers does.
"""
from __future__ import annotations

import json
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template refused the conversation (raise_exception) or failed while rendering it:
    the client's error (a 400), with the template's own message."""


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; rendering
    keeps the body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def compile_template(source: str) -> jinja2.Template:
    """A compiled template; jinja2.TemplateSyntaxError for a broken one."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def render(template: jinja2.Template, messages: list[dict], special_tokens: dict[str, str]) -> str:
    """The prompt text for `messages`, ending with the assistant's header."""
    msgs = [{k: v for k, v in m.items() if v is not None} for m in messages]
    try:
        return template.render(messages=msgs, tools=None, documents=None, add_generation_prompt=True,
                               **special_tokens)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template: {e}") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        raise ChatTemplateError(f"chat template failed on these messages: {e!r}") from None
