"""Claims about the tiny-arith task: splits, determinism, answer format, reward, chance level."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
import torch

from areal_cli.tasks import tiny_arith as ta


def test_answer_is_reversed_digits_and_lengths_vary():
    probs = ta.sample_problems("train", 2000, seed=0)
    lengths = {len(p.answer) for p in probs}
    assert lengths == set(range(ta.MIN_DIGITS, ta.MAX_DIGITS + 1))
    for p in probs:
        digits = p.prompt.removeprefix(ta.PROMPT_PREFIX)
        assert p.prompt == ta.user_prompt(p) == "reverse " + digits
        assert p.answer == digits[::-1] and len(p.answer) == len(digits)
    assert ta.make_problem("5303") == ta.ArithProblem("reverse 5303", "3035")
    assert ta.make_problem("0120") == ta.ArithProblem("reverse 0120", "0210")  # leading zeros are kept


def test_make_problem_rejects_bad_digit_strings():
    for bad in ("12", "12345", "12a4", ""):
        with pytest.raises(ValueError):
            ta.make_problem(bad)


def test_heldout_prompts_never_appear_in_train():
    held = {p.prompt for p in ta.all_problems("heldout")}
    assert held == {p.prompt for p in ta.sample_problems("heldout", len(held), seed=0)}
    assert all(ta.is_heldout(p.removeprefix(ta.PROMPT_PREFIX)) for p in held)
    for seed in (0, 1, 2):
        train = ta.sample_problems("train", 5000, seed=seed)
        assert not any(ta.is_heldout(p.prompt.removeprefix(ta.PROMPT_PREFIX)) for p in train)
        assert held.isdisjoint(p.prompt for p in train)
    stream = ta.iter_problems("train", seed=7)
    assert not any(next(stream).prompt in held for _ in range(5000))


def test_heldout_fraction_is_about_ten_percent():
    rng = random.Random(0)
    strings = ["".join(rng.choice("0123456789") for _ in range(6)) for _ in range(20000)]
    frac = sum(map(ta.is_heldout, strings)) / len(strings)
    assert abs(frac - ta.HELDOUT_PERCENT / 100) < 0.01


def test_generators_are_deterministic_by_seed():
    assert ta.sample_problems("train", 500, seed=3) == ta.sample_problems("train", 500, seed=3)
    assert ta.sample_problems("train", 500, seed=3) != ta.sample_problems("train", 500, seed=4)
    a, b = ta.iter_problems("heldout", 5), ta.iter_problems("heldout", 5)
    assert [next(a) for _ in range(200)] == [next(b) for _ in range(200)]


def test_sample_problems_are_distinct_and_validate_arguments():
    probs = ta.sample_problems("train", 4000, seed=0)
    assert len(probs) == len({p.prompt for p in probs}) == 4000
    with pytest.raises(ValueError):
        ta.sample_problems("test", 10, seed=0)
    n_train = len(ta.all_problems("train"))
    assert n_train + len(ta.all_problems("heldout")) == 10**3 + 10**4
    with pytest.raises(ValueError):
        ta.sample_problems("train", n_train + 1, seed=0)


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("0335<|im_end|>", 1.0),
        ("0335", 1.0),
        (" 0335 \n<|im_end|>", 1.0),
        ("0335<|endoftext|>", 1.0),
        ("0335<|im_end|>9999", 1.0),  # text after the eos is not part of the answer
        ("335<|im_end|>", 0.0),
        ("03350<|im_end|>", 0.0),
        ("5330<|im_end|>", 0.0),
        ("0 3 3 5<|im_end|>", 0.0),
        ("The answer is 0335", 0.0),
        ("", 0.0),
    ],
)
def test_reward_is_exact_match_of_text_before_eos(completion, expected):
    assert ta.reward("reverse 5330", completion, [1], [2], answer="0335") == expected
    assert ta.reward("reverse 5330", completion, [1], [2], answer=ta.make_problem("5330").answer, id="x") == expected
    assert ta.is_correct(completion, "0335") == bool(expected)


def test_sft_target_is_answer_digits_then_eos_token(tmp_path):
    from areal_cli.models.tiny import build_tiny_model, load_tokenizer

    tok = load_tokenizer(build_tiny_model(tmp_path / "m", seed=0))
    prompt, target = ta.sft_example(ta.make_problem("9021"))
    assert (prompt, target) == ("reverse 9021", "1209<|im_end|>")
    ids = tok(target)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["1", "2", "0", "9", "<|im_end|>"]
    assert len(ids) == ta.MIN_MAX_NEW_TOKENS
    assert ids[-1] == tok.eos_token_id
    # the task's words are single tokens of the default tokenizer
    assert len(tok("reverse")["input_ids"]) == 1 and len(tok("assistant")["input_ids"]) == 1


def test_chance_and_echo_levels_match_monte_carlo():
    stream = ta.iter_problems("train", seed=11)
    probs = [next(stream) for _ in range(40000)]
    echo = sum(ta.is_correct(p.prompt.removeprefix(ta.PROMPT_PREFIX), p.answer) for p in probs) / len(probs)
    assert abs(echo - ta.echo_accuracy()) < 0.004
    assert ta.echo_accuracy() == pytest.approx((0.1 + 0.01) / 2)  # palindromes of length 3, 4
    assert ta.chance_accuracy() == pytest.approx((1e-3 + 1e-4) / 2)
    rng = random.Random(0)
    guess = sum(
        ta.is_correct("".join(rng.choice("0123456789") for _ in p.answer), p.answer) for p in probs
    ) / len(probs)
    assert guess <= 0.002  # expected 5.5e-4


def test_untrained_tiny_model_scores_at_chance(tmp_path):
    from transformers import AutoModelForCausalLM

    from areal_cli.models.tiny import build_tiny_model, chat_prompt_ids, load_tokenizer

    torch.set_num_threads(1)
    d = build_tiny_model(tmp_path / "m", seed=0)
    tok = load_tokenizer(d)
    model = AutoModelForCausalLM.from_pretrained(str(d)).eval()
    by_len: dict[int, list] = defaultdict(list)
    for p in ta.sample_problems("heldout", 128, seed=0):
        by_len[len(chat_prompt_ids(tok, p.prompt))].append(p)
    correct = 0
    with torch.no_grad():
        for probs in by_len.values():  # equal prompt lengths: no padding needed
            ids = torch.tensor([chat_prompt_ids(tok, p.prompt) for p in probs])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
            for p, row in zip(probs, out[:, ids.shape[1]:]):
                correct += ta.is_correct(tok.decode(row), p.answer)
    # chance is 5.5e-4: on 128 prompts the expected number of hits is 0.07
    assert correct / 128 <= 1 / 128


def test_tokenizer_corpus_is_deterministic_chat_turns():
    c = ta.tokenizer_corpus()
    assert c == ta.tokenizer_corpus() and len(c) == 4000
    assert c[0].startswith("user\nreverse ") and c[1].startswith("assistant\n")
