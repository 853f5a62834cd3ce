"""Evaluation prompts through the model's own chat template (protocol ``chat-template``; the fixed
AReaL / DeepSeek-R1 prompt strings are in :mod:`areal_cli.eval.protocols`).

The math user message is the Qwen-style boxed-answer instruction used by AReaL's math evaluation
(``evaluation/utils.py`` PROMPT_TEMPLATES ``qwen3-think`` / ``r1-distilled-qwen``, and the
Qwen2.5-Math ``qwen-boxed`` template)::

    {problem}
    Please reason step by step, and put your final answer within \\boxed{}.

A code problem's text already carries its answer-format instruction (the benchmark's declared
``question_format``, e.g. LiveCodeBench's), so the code user message is the problem text itself.

AReaL hard-codes the chat wrapping per model family; here the model's tokenizer applies its own
``chat_template`` with ``add_generation_prompt=True``, so any chat model (the tiny default, Qwen3,
R1-Distill) gets its native format.
"""

from __future__ import annotations

from typing import Any

from areal_cli.foundations.errors import UserError

#: The user message; ``{problem}`` is replaced by the problem text.
USER_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def user_message(problem: str, kind: str = "math") -> str:
    """The user message for one problem: math -> :data:`USER_TEMPLATE`; code, and ``raw`` (a custom task's own
    template or reward: :func:`areal_cli.eval.grading.prompt_kind`) -> the problem text."""
    if kind in ("code", "raw"):
        return problem
    return USER_TEMPLATE.format(problem=problem)


def prompt_text(tokenizer: Any, problem: str, kind: str = "math") -> str:
    """The full prompt string: the tokenizer's chat template applied to one user message
    (:func:`user_message`), with the assistant generation prompt appended.

    Raises:
        UserError: the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or "tokenizer"
        raise UserError(f"{name}: tokenizer has no chat_template; cannot build evaluation prompts")
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message(problem, kind)}], tokenize=False, add_generation_prompt=True
    )


def prompt_ids(tokenizer: Any, problem: str, kind: str = "math") -> list[int]:
    """Token ids of :func:`prompt_text` (no extra special tokens: the template already has them).

    Returns:
        list[int] of length = prompt tokens.
    """
    return tokenize_prompt(tokenizer, prompt_text(tokenizer, problem, kind))


def tokenize_prompt(tokenizer: Any, text: str, add_special_tokens: bool = False) -> list[int]:
    """Token ids of an already rendered prompt string.

    ``add_special_tokens=False`` for chat-template prompts (the template has them); a fixed-string
    protocol passes its ``add_special_tokens`` (True: what vLLM's ``LLM.generate(str)`` does, so e.g. the
    R1-Distill tokenizer prepends its BOS as in AReaL's harness).
    """
    ids = tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
    return [int(i) for i in ids]
