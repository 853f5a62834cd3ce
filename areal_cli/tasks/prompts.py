"""Training prompts: a record's prompt field -> prompt text and token ids, with the same protocol objects as
``areal eval`` (:mod:`areal_cli.eval.protocols`).

``task.prompt_template`` (recipe key) says how the field is wrapped:

- ``chat``: the model's chat template around the field as one user message (a ``messages`` list of
  ``{role, content}`` is rendered as is), with the generation prompt; special tokens come from the template.
- ``none``: the field is the prompt text, verbatim.
- an ``areal eval`` protocol (``r1-distill``, ``qwen3-think``, ``qwen3-think-pure``, ``chat-template``, ...):
  that protocol's prompt for the task's kind (math: the boxed-answer instruction), tokenised as the
  protocol says (``add_special_tokens``).

Baked templates: a prompt string that already carries a chat template (AReaL-boba-106k rows hold
DeepSeek-R1's ``<｜User｜>...<｜Assistant｜><think>``) is detected by its markers and used verbatim -- never
wrapped twice -- and tokenised as AReaL does (the raw string with the tokenizer's special tokens, e.g.
R1's BOS). Its markers must be tokens of the model's tokenizer, and a fixed-template protocol must be of
the same family; otherwise the record and the recipe disagree: a prompt template mismatch (one line,
naming the record).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from areal_cli.foundations.errors import UserError

#: Chat-template families and the markers that identify a baked-in template.
FAMILIES: dict[str, tuple[str, ...]] = {
    "r1": ("<｜User｜>", "<｜Assistant｜>"),
    "chatml": ("<|im_start|>",),
    "llama3": ("<|start_header_id|>",),
}
MODES = ("chat", "none")


def baked_family(text: str) -> str | None:
    """The chat-template family whose markers ``text`` carries (None: a plain prompt)."""
    for family, markers in FAMILIES.items():
        if any(m in text for m in markers):
            return family
    return None


def opens_think(prompt: str) -> bool:
    """The prompt ends inside an open ``<think>`` (R1 / Qwen3-think templates): the completion continues the
    thinking, so graders read ``"<think>" + completion`` (the rule of ``areal eval``)."""
    return prompt.rstrip().endswith("<think>")


@dataclass(frozen=True)
class PromptRenderer:
    """Renders records' prompt fields for one run.

    Args:
        tokenizer: the model's tokenizer.
        field: the record field holding the prompt (a string, or a ``messages`` list for ``chat``).
        template: ``chat``, ``none`` or a protocol name (module docstring).
        kind: the task's kind for protocol prompts (``math``, ``code`` or ``any``).
    """

    tokenizer: Any
    field: str
    template: str
    kind: str = "any"

    def check(self) -> None:
        """Check the template against the tokenizer once, before any record.

        Raises:
            UserError: unknown template, a protocol for another kind of task, a protocol whose markers
                the tokenizer lacks, ``chat`` with a tokenizer without a chat template.
        """
        if self.template in MODES:
            if self.template == "chat" and not getattr(self.tokenizer, "chat_template", None):
                raise UserError(f"field 'task.prompt_template': chat: {_name(self.tokenizer)} has no chat template "
                                f"(use 'none' or a protocol)")
            return
        from areal_cli.eval.protocols import PROTOCOLS, TEMPLATE_MARKERS, check_kind

        if self.template not in PROTOCOLS:
            raise UserError(f"field 'task.prompt_template': unknown template {self.template!r} (known: "
                            f"{', '.join(MODES + tuple(PROTOCOLS))})")
        proto = PROTOCOLS[self.template]
        if self.kind != "any":
            try:
                check_kind(proto, self.kind, f"this {self.kind} task")
            except UserError as e:
                raise UserError(f"field 'task.prompt_template': {e}") from None
        vocab = self.tokenizer.get_vocab()
        for marker in TEMPLATE_MARKERS:
            if marker in (proto.template or "") and marker not in vocab:
                raise UserError(f"field 'task.prompt_template': protocol '{self.template}' uses {marker}, which is not a "
                                f"token of the model's tokenizer (model.path / model.chat_template); use 'chat' (the "
                                f"model's own template) or a protocol of the model's family")

    def render(self, fields: dict, where: str) -> tuple[str, list[int]]:
        """``(prompt text, token ids)`` of one record.

        Raises:
            UserError: ``where: field 'prompt': ...`` (missing, wrong type, template mismatch).
        """
        value = fields.get(self.field)
        if value is None:
            raise UserError(f"{where}: field '{self.field}': missing (the prompt field)")
        if isinstance(value, list):
            if self.template != "chat":
                raise UserError(f"{where}: field '{self.field}': a messages list needs task.prompt_template 'chat' "
                                f"(got {self.template!r})")
            return self._chat(value, where)
        if not isinstance(value, str):
            raise UserError(f"{where}: field '{self.field}': expected a string or a messages list, got "
                            f"{type(value).__name__}")
        if not value.strip():
            raise UserError(f"{where}: field '{self.field}': empty prompt")
        family = baked_family(value)
        if family is not None:
            return self._baked(value, family, where)
        if self.template == "chat":
            return self._chat([{"role": "user", "content": value}], where)
        if self.template == "none":
            return value, _ids(self.tokenizer, value, False)
        from areal_cli.eval.protocols import PROTOCOLS, prompt_token_ids, render_prompt

        proto = PROTOCOLS[self.template]
        text = render_prompt(proto, value, self.tokenizer, kind=None if self.kind == "any" else self.kind)
        return text, prompt_token_ids(proto, self.tokenizer, text)

    def _chat(self, messages: list, where: str) -> tuple[str, list[int]]:
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise UserError(f"{where}: field '{self.field}[{i}]': expected {{role: str, content: str}}")
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001 - jinja errors of the model's template
            raise UserError(f"{where}: field '{self.field}': the chat template of {_name(self.tokenizer)} failed: "
                            f"{type(e).__name__}: {e}") from None
        return text, _ids(self.tokenizer, text, False)

    def _baked(self, text: str, family: str, where: str) -> tuple[str, list[int]]:
        vocab = self.tokenizer.get_vocab()
        missing = [m for m in FAMILIES[family] if m in text and m not in vocab]
        if missing:
            raise UserError(f"{where}: field '{self.field}': prompt template mismatch: the record carries the {family} "
                            f"chat template ({missing[0]}), which is not a token of {_name(self.tokenizer)}; use a "
                            f"model of that family or records without a template")
        if self.template not in MODES:
            from areal_cli.eval.protocols import PROTOCOLS

            want = baked_family(PROTOCOLS[self.template].template or "")
            if want is not None and want != family:
                raise UserError(f"{where}: field '{self.field}': prompt template mismatch: the record carries the "
                                f"{family} chat template but task.prompt_template '{self.template}' is the {want} one")
        return text, _ids(self.tokenizer, text, True)


def _ids(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    return [int(i) for i in tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]]


def _name(tokenizer: Any) -> str:
    return getattr(tokenizer, "name_or_path", "") or "the model's tokenizer"
