"""Chat templates: the Jinja2 program a checkpoint ships (GGUF ``tokenizer.chat_template``,
Hugging Face ``chat_template.jinja`` or tokenizer_config.json's ``chat_template``) that turns a
list of messages into the prompt text the model was fine-tuned on.

Rendered in Jinja2's sandbox with the conventions the published templates are written against
(those of transformers' ``apply_chat_template``): ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension (``break``/``continue``), a ``tojson`` filter that keeps non-ASCII
text and does not escape HTML, ``raise_exception(msg)`` and ``strftime_now(fmt)``, and the
tokenizer's special tokens (``bos_token``, ``eos_token``, ...) as variables.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

from pto.errors import UsageError


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML, which would change the prompt text
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def compile_template(source: str, where: str):
    """The compiled template (cached: a template is rendered once per conversation turn)."""
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise UsageError("chat templates need the `jinja2` package (pip install 'pto[model]')") from None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise UsageError(f"{where}: its chat template is not valid Jinja2 (line {e.lineno}: {e.message})") from None


def render_chat(source: str, messages: list[dict], where: str, add_generation_prompt: bool = True,
                **variables) -> str:
    """The prompt text of ``messages`` (``[{"role": "user", "content": "..."}, ...]``) under
    template ``source``; ``add_generation_prompt`` appends the header of the assistant's turn
    (what the model completes); ``variables`` (special tokens, tools, ...) are the template's.
    A template that raises (a role it does not accept, ...) is one UsageError line."""
    import jinja2

    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise UsageError("chat messages must be a list of {'role': ..., 'content': ...} objects")
    template = compile_template(source, where)
    try:
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.exceptions.TemplateError as e:
        raise UsageError(f"{where}: the chat template refused the messages: {e}") from None


__all__ = ["render_chat", "compile_template"]
