"""Claims about the tiny-longtail task: answer lengths are set by the problem and heavy-tailed (max/median >= 8 in
a batch), the reward is exact, the held-out split never leaks into training, the preset and recipe resolve, and a
short supervised warm start learns the answer format."""

from __future__ import annotations

import re
import statistics
from collections import Counter

import pytest
import torch

from areal_cli.tasks import tiny_longtail as tl

REGEX = re.compile(r"^\d{5}( \d{5})*$")


# ------------------------------------------------------------------------------------------------ the problems


def test_answer_counts_down_to_the_previous_hundred_and_its_length_is_set_by_the_problem():
    p = tl.make_problem(48302)
    assert (p.prompt, p.answer, p.m) == ("countdown 48302", "48302 48301 48300", 3)
    assert tl.make_problem(10000).answer == "10000" and tl.make_problem(10000).m == 1
    q = tl.make_problem(99963)
    assert q.answer.split() == [str(x) for x in range(99963, 99899, -1)] and q.m == 64 == tl.M_MAX
    for s in (12345, 50000, 77731):
        p = tl.make_problem(s)
        nums = [int(x) for x in p.answer.split()]
        assert nums[0] == s and nums[-1] == s - s % 100 and all(a - b == 1 for a, b in zip(nums, nums[1:]))
        assert p.answer_tokens == tl.answer_tokens(p.m) == 6 * p.m  # 5 digits + space per number, eos last
    for bad in (9999, 100000, 12364, 12399, "12345", True):
        with pytest.raises(ValueError):
            tl.make_problem(bad)


def test_answer_tokens_match_the_tiny_tokenizer(tmp_path):
    from areal_cli.models.tiny import build_tiny_model, load_tokenizer

    tok = load_tokenizer(build_tiny_model(tmp_path / "m", seed=0, corpus=tl.tokenizer_corpus(200)))
    for s in (10000, 48302, 99963):
        p = tl.make_problem(s)
        _, target = tl.sft_example(p)
        ids = tok(target, add_special_tokens=False)["input_ids"]
        assert len(ids) == p.answer_tokens and ids[-1] == tok.eos_token_id
    assert len(tok("countdown", add_special_tokens=False)["input_ids"]) == 1


def test_lengths_are_lognormal_with_a_tail_in_every_batch():
    stats = tl.length_stats()
    assert stats["max_over_median"] >= 8 and stats["max"] == tl.MAX_ANSWER_TOKENS == 384
    assert stats["median"] == 24 and 40 < stats["mean"] < 50 and stats["p90"] >= 100
    # the stream's marginal distribution of m is the truncated lognormal (stratified sampling keeps it)
    stream = tl.iter_problems("train", seed=3)
    ms = Counter(next(stream).m for _ in range(16 * 1500))
    probs = tl.m_probabilities()
    assert abs(sum(probs.values()) - 1) < 1e-9
    tv = 0.5 * sum(abs(ms[m] / (16 * 1500) - p) for m, p in probs.items())
    assert tv < 0.03, tv
    # every block of 16 consecutive training prompts (one batch of the recipe) holds the tail: max/median >= 8 in
    # most of them; i.i.d. draws of the same distribution only about half the time
    stream = tl.iter_problems("train", seed=1)
    blocks = [[next(stream) for _ in range(tl.STRATA)] for _ in range(600)]
    ratios = [tl.block_length_ratio(b) for b in blocks]
    assert sum(r >= 8 for r in ratios) / len(ratios) >= 0.8
    assert statistics.median(ratios) >= 8
    iid = tl.iid_problems("train", seed=1)
    iid_ratios = [tl.block_length_ratio([next(iid) for _ in range(tl.STRATA)]) for _ in range(600)]
    assert sum(r >= 8 for r in iid_ratios) / 600 < sum(r >= 8 for r in ratios) / 600
    # each block takes one m from each 1/16 quantile: its longest answer is from the top one
    for b in blocks[:50]:
        assert max(p.m for p in b) >= tl.m_quantile(15 / 16)


def test_quantiles_cover_1_to_m_max():
    assert tl.m_quantile(0.0) == 1 and tl.m_quantile(0.999999) == tl.M_MAX
    assert [tl.m_quantile(u / 100) for u in range(100)] == sorted(tl.m_quantile(u / 100) for u in range(100))
    with pytest.raises(ValueError):
        tl.m_quantile(1.0)


# ------------------------------------------------------------------------------------------------ reward


@pytest.mark.parametrize("completion, expected", [
    ("48302 48301 48300<|im_end|>", 1.0),
    ("48302 48301 48300", 1.0),
    (" 48302 48301 48300 \n<|im_end|>", 1.0),
    ("48302 48301 48300<|endoftext|>", 1.0),
    ("48302 48301 48300<|im_end|>48299", 1.0),  # text after the eos is not part of the answer
    ("48302 48301<|im_end|>", 0.0),  # stopped early
    ("48302 48301 48300 48299<|im_end|>", 0.0),  # did not stop at the hundred
    ("48302 48300<|im_end|>", 0.0),  # skipped a number
    ("48302  48301 48300<|im_end|>", 0.0),  # two spaces
    ("48302,48301,48300", 0.0),
    ("", 0.0),
])
def test_reward_is_exact_match_of_the_text_before_eos(completion, expected):
    p = tl.make_problem(48302)
    assert tl.reward(p.prompt, completion, [1], [2], answer=p.answer) == expected
    assert tl.reward(p.prompt, completion, [1], [2], answer=p.answer, id="x", m=3) == expected


def test_echoing_the_number_is_right_only_for_one_number_answers():
    stream = tl.iter_problems("train", seed=5)
    probs = [next(stream) for _ in range(16 * 500)]
    echo = sum(tl.is_correct(p.prompt.removeprefix(tl.PROMPT_PREFIX), p.answer) for p in probs) / len(probs)
    assert abs(echo - tl.echo_accuracy()) < 0.02 and 0.2 < tl.echo_accuracy() < 0.3


# ------------------------------------------------------------------------------------------------ splits


def test_heldout_problems_never_appear_in_training():
    held = tl.all_problems("heldout")
    train = tl.all_problems("train")
    assert len(held) + len(train) == 900 * tl.M_MAX
    assert abs(len(held) / (len(held) + len(train)) - tl.HELDOUT_PERCENT / 100) < 0.01
    held_starts = {p.start for p in held}
    for seed in (0, 1, 2):
        stream = tl.iter_problems("train", seed=seed)
        assert not any(next(stream).start in held_starts for _ in range(5000))
    for split in ("train", "sft"):
        recs = tl.records(split, seed=4)
        assert not any(int(next(recs)["id"].removeprefix(tl.PROMPT_PREFIX)) in held_starts for _ in range(2000))


def test_heldout_records_are_fixed_distinct_and_have_the_task_distribution():
    def first(split: str, seed: int, n: int) -> list[dict]:
        it = tl.records(split, seed)
        return [next(it) for _ in range(n)]

    a, b = first("heldout", 1, 128), first("heldout", 9, 128)
    assert a == b  # independent of the run's seed
    assert len({r["id"] for r in a}) == 128 and all(tl.is_heldout(int(r["id"].split()[1])) for r in a)
    assert all(set(r) == {"id", "prompt", "answer", "m"} and r["answer"] == tl.solve(int(r["prompt"].split()[1]))
               for r in a)
    lengths = [tl.answer_tokens(r["m"]) for r in a]
    assert statistics.median(lengths) <= 36 and max(lengths) >= 8 * statistics.median(lengths)
    sft = first("sft", 1, 500)
    assert len({r["id"] for r in sft}) == 500 and first("sft", 1, 50) == sft[:50] != first("sft", 2, 50)
    with pytest.raises(ValueError):
        tl.records("test", 0)


# ------------------------------------------------------------------------------------------------ the kit


def test_preset_and_recipe_resolve():
    from areal_cli.recipes import load_train_config
    from areal_cli.tasks.registry import get_preset
    from areal_cli.tasks.task import Task

    preset = get_preset("tiny-longtail")
    assert preset.dataset == "areal_cli.tasks.tiny_longtail:records" and preset.sft_target_field == "answer"
    cfg, _ = load_train_config("tiny-longtail")
    assert cfg.task.preset == "tiny-longtail" and cfg.rollout.max_new_tokens >= tl.MAX_ANSWER_TOKENS
    assert cfg.rollout.batch_size == tl.STRATA  # one stratified block per training batch
    task = Task(cfg)
    assert task.reward_spec == "areal_cli.tasks.tiny_longtail:reward"
    assert "countdown" in " ".join(task.tokenizer_corpus()[:4])


@pytest.mark.slow
def test_a_short_warm_start_learns_the_answer_format(tmp_path):
    """Teacher-forced SFT with the recipe's warm-start settings (batch 64, lr 3e-3) on distinct training problems:
    after 80 steps greedy answers to held-out prompts are countdowns of 5-digit numbers that start with the prompt's
    prefix (the format). Measured: ~23 s on one core, 31/32 well formed and 30/32 exact on these short problems;
    40 steps were not enough (1/32 well formed)."""
    from transformers import AutoModelForCausalLM

    from areal_cli.models.tiny import build_tiny_model, chat_prompt_ids, load_tokenizer

    torch.manual_seed(0)
    d = build_tiny_model(tmp_path / "m", seed=1, corpus=tl.tokenizer_corpus())
    tok = load_tokenizer(d)
    model = AutoModelForCausalLM.from_pretrained(str(d))
    eos, pad = tok.eos_token_id, tok.pad_token_id
    it = tl.records("sft", seed=1)
    data = [next(it) for _ in range(1500)]
    short = [r for r in data if r["m"] <= 12]  # the format; the batch stays cheap on one core
    enc = [(chat_prompt_ids(tok, r["prompt"]), tok(r["answer"], add_special_tokens=False)["input_ids"] + [eos])
           for r in short]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(80):
        batch = [enc[i] for i in torch.randint(len(enc), (64,), generator=g).tolist()]
        L = max(len(p) + len(a) for p, a in batch)
        x = torch.full((64, L), pad)
        y = torch.full((64, L), -100)
        m = torch.zeros_like(x)
        for j, (p, a) in enumerate(batch):
            x[j, :len(p) + len(a)] = torch.tensor(p + a)
            m[j, :len(p) + len(a)] = 1
            y[j, len(p):len(p) + len(a)] = torch.tensor(a)
        loss = model(input_ids=x, attention_mask=m, labels=y).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    held = [r for r in (lambda h: [next(h) for _ in range(64)])(tl.records("heldout", 0)) if r["m"] <= 12][:32]
    ids = [chat_prompt_ids(tok, r["prompt"]) for r in held]
    L = max(map(len, ids))
    x = torch.full((len(ids), L), pad)
    m = torch.zeros_like(x)
    for j, s in enumerate(ids):
        x[j, L - len(s):] = torch.tensor(s)
        m[j, L - len(s):] = 1
    with torch.no_grad():
        out = model.generate(x, attention_mask=m, max_new_tokens=90, do_sample=False, eos_token_id=eos,
                             pad_token_id=pad)
    texts = [tok.decode(row, skip_special_tokens=True).strip() for row in out[:, L:]]
    well_formed = sum(bool(REGEX.match(t)) and t.split()[0][:3] == r["prompt"].split()[1][:3]
                      for t, r in zip(texts, held))
    exact = sum(t == r["answer"] for t, r in zip(texts, held))
    print(f"warm start, 80 steps: loss {loss.item():.3f}, well-formed {well_formed}/{len(held)}, exact {exact}/{len(held)}")
    assert loss.item() < 0.5
    assert well_formed / len(held) >= 0.8, texts[:5]
