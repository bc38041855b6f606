"""Chat templates: a policy's prompt as its tokenizer's Jinja chat template renders it.

A policy's ``template:`` (``PolicyConfig``) is ``auto`` (the tokenizer's ``chat_template`` when it
has one: a Qwen, Llama-3, Gemma... checkpoint; nothing for the project's byte-level models), ``none``
(the plain text templates of :class:`agentrt.policies.lm.PromptTemplate`), or a Jinja template
(the text, or the path of a file holding it). ``system:`` is an optional system message put first.

With a template, a prompt is the conversation rendered with ``add_generation_prompt=True`` and
encoded without added special tokens, which is what ``tokenizer.apply_chat_template(messages,
tokenize=True, add_generation_prompt=True)`` returns, token for token. In an env, an agent's turn
is a user message (the observation through the env's template text) and its earlier responses are
assistant messages; :meth:`Chat.extend` keeps a later prompt an extension of the earlier prompt
and response ids (the generated ids are never re-tokenized) where the template allows it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

AUTO, NONE = "auto", "none"
Messages = list[dict[str, str]]


def template_text(value: str) -> str:
    """The Jinja text of a ``template:`` value that is neither ``auto`` nor ``none``: the value
    itself when it holds Jinja markup, else the file it names. Raises ValueError (one line naming
    the field) when it is neither, or when the Jinja does not parse."""
    import jinja2

    text = value
    if "{{" not in value and "{%" not in value:
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(f"template: {value!r} is not auto, none, a Jinja chat template nor "
                             f"a file holding one; set one of those")
        text = path.read_text(encoding="utf-8")
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as err:
        raise ValueError(f"template: the Jinja chat template does not parse (line {err.lineno}: "
                         f"{err.message})") from None
    return text


def check_template(value: str) -> str:
    """``value`` when it is a valid ``template:`` setting (raises ValueError naming the field)."""
    if value not in (AUTO, NONE):
        template_text(value)
    return value


@dataclass(frozen=True)
class Chat:
    """A tokenizer with the chat template and system prompt a policy renders its prompts with."""

    tokenizer: Any
    template: str
    system: str | None = None

    def conversation(self, messages: Messages) -> Messages:
        """``messages`` with the system prompt first (unless they start with their own)."""
        if self.system is None or (messages and messages[0]["role"] == "system"):
            return list(messages)
        return [{"role": "system", "content": self.system}] + list(messages)

    def text(self, messages: Messages, generation: bool = True) -> str:
        """The conversation (system prompt included) as the template renders it."""
        return self.tokenizer.apply_chat_template(
            self.conversation(messages), chat_template=self.template, tokenize=False,
            add_generation_prompt=generation)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def ids(self, messages: Messages) -> list[int]:
        """Prompt ids of a conversation, ending with the generation prompt."""
        return self.encode(self.text(messages))

    def extend(self, messages: Messages, response_ids: list[int], response: str, user: str
               ) -> tuple[Messages, str | None]:
        """The next user turn of a conversation whose last prompt was ``messages`` and whose
        answer was ``response_ids`` (decoded: ``response``).

        Returns ``(messages + [assistant, user], suffix)``: ``suffix`` is the text whose ids
        (:meth:`encode`) follow the previous prompt and response ids (the end of the assistant
        turn, the user message, the generation prompt; in ChatML and Llama-3 it starts at a special
        token, so it encodes as it would inside the whole text), or None when the template does not render
        the longer conversation as an extension of the shorter (a template that rewrites earlier turns, such as one that
        drops the reasoning of earlier answers): the caller then renders the whole conversation
        afresh and the turn trains as its own sequence.
        """
        longer = list(messages) + [{"role": "assistant", "content": response},
                                   {"role": "user", "content": user}]
        head, full = self.text(messages) + response, self.text(longer)
        if not full.startswith(head):
            log.warning("chat template: the conversation's next prompt does not extend the "
                        "previous one; it is rendered afresh (each turn trains on its own)")
            return longer, None
        suffix = full[len(head):]
        if response_ids and response_ids[-1] in self.tokenizer.all_special_ids:
            # the response stopped on the template's end-of-turn token (Qwen's <|im_end|>):
            # it is in the ids already
            end = self.tokenizer.convert_ids_to_tokens(response_ids[-1])
            suffix = suffix[len(end):] if suffix.startswith(end) else suffix
        return longer, suffix


def chat_of(tokenizer: Any, template: str = AUTO, system: str | None = None) -> Chat | None:
    """The :class:`Chat` of a ``template:`` setting, or None where prompts stay plain text
    (``none``, or ``auto`` on a tokenizer without a chat template)."""
    if template == NONE:
        return None
    if template == AUTO:
        text = getattr(tokenizer, "chat_template", None)
        if not isinstance(text, str) or not text:  # a dict of named templates: the default one
            text = text.get("default") if isinstance(text, dict) else None
        return Chat(tokenizer, text, system) if text else None
    return Chat(tokenizer, template_text(template), system)


def policy_chat(cfg: Any, tokenizer: Any) -> Chat | None:
    """The chat of a policy config (``template``, ``system``), None without one."""
    return chat_of(tokenizer, getattr(cfg, "template", AUTO), getattr(cfg, "system", None))
