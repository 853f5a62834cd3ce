"""Claims: chat-template evaluation prompts are the model's own chat template around the Qwen-style
boxed-answer instruction (math) or the code problem's own text (code), tokenised without extra special
tokens unless asked; a tokenizer without a chat template is a UserError."""

from __future__ import annotations

import pytest

from areal_cli.foundations.errors import UserError
from areal_cli.eval.prompts import USER_TEMPLATE, prompt_ids, prompt_text, tokenize_prompt, user_message


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from areal_cli.models.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)
    return AutoTokenizer.from_pretrained(str(model_dir))


def test_user_message_is_qwen_boxed_instruction():
    assert user_message("What is 1+1?") == (
        "What is 1+1?\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    assert "{problem}" in USER_TEMPLATE


def test_prompt_uses_the_model_chat_template_with_generation_prompt(tokenizer):
    text = prompt_text(tokenizer, "What is $1+1$?")
    assert text == (
        "<|im_start|>user\nWhat is $1+1$?\nPlease reason step by step, and put your final answer within "
        "\\boxed{}.<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = prompt_ids(tokenizer, "What is $1+1$?")
    assert tokenizer.decode(ids) == text
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>") and ids.count(ids[0]) == 2


def test_prompt_ids_match_the_tiny_model_helper(tokenizer):
    from areal_cli.models.tiny import chat_prompt_ids

    problem = "Find $\\frac{14}{3} + \\sqrt{2}$."
    assert prompt_ids(tokenizer, problem) == chat_prompt_ids(tokenizer, user_message(problem))


def test_tokenizer_without_chat_template_is_a_user_error(tokenizer):
    saved = tokenizer.chat_template
    tokenizer.chat_template = None
    try:
        with pytest.raises(UserError, match="tokenizer has no chat_template"):
            prompt_ids(tokenizer, "x")
    finally:
        tokenizer.chat_template = saved


def test_code_problems_are_their_own_user_message(tokenizer):
    code = "### Question:\nPrint 1.\n\n### Answer: (use the provided format with backticks)\n\n"
    assert user_message(code, kind="code") == code
    assert prompt_text(tokenizer, code, kind="code") == f"<|im_start|>user\n{code}<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(prompt_ids(tokenizer, code, kind="code")) == prompt_text(tokenizer, code, kind="code")


def test_tokenize_prompt_adds_special_tokens_only_when_asked(tokenizer):
    calls = []

    class Recording:
        def __call__(self, text, add_special_tokens):
            calls.append(add_special_tokens)
            return tokenizer(text, add_special_tokens=add_special_tokens)

    text = prompt_text(tokenizer, "x")
    assert tokenize_prompt(Recording(), text) == tokenize_prompt(Recording(), text, add_special_tokens=True)
    assert calls == [False, True]  # the tiny tokenizer has no BOS: both give the same ids
