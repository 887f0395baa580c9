"""A model's chat template applied to a conversation, as transformers' apply_chat_template renders it
(utils/chat_template_utils.py: a sandboxed Jinja environment with trim_blocks and lstrip_blocks), so an
instruction-tuned model sees its prompt in the form it was trained on."""
from __future__ import annotations

from functools import cache

from kvviz.errors import InputError


@cache
def _compiled(template: str):  # noqa: ANN202 - a jinja2 Template
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise InputError("chat.template_error", reason=message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template)
    except TemplateError as exc:
        raise InputError("chat.template_error", reason=str(exc)) from None


def render_chat(template: str, messages: list[dict[str, str]], *, add_generation_prompt: bool = True,
                **special_tokens: str) -> str:
    """The conversation as the text the model reads, its special tokens written out (<|im_start|>user …)."""
    from jinja2 import TemplateError

    try:
        return _compiled(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                          **special_tokens)
    except TemplateError as exc:
        raise InputError("chat.template_error", reason=str(exc)) from None


def chat_prompt(template: str, user_text: str) -> str:
    """One user turn, ready for the assistant's answer."""
    return render_chat(template, [{"role": "user", "content": user_text}])
