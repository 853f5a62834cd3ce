"""Small additions for SmolLM2-135M-Instruct, a task it can partly do (greedy ~0.25 before training).

Prompt: ``Compute {a}+{b}. Reply with the result only.`` (a, b in 2..49), in the model's chat template. Reward: 1.0
iff the last number in the completion equals a + b (the model often writes ``26 + 30 = 56``). Held out: pairs whose
``(a * 31 + b) % 10 == 0``, never trained on.
"""

from __future__ import annotations

import random
import re


def _pair_heldout(a: int, b: int) -> bool:
    return (a * 31 + b) % 10 == 0


def records(split: str, seed: int):
    """``fn(split, seed)`` dataset (areal_cli.api.records): endless training pairs, or the held-out pairs."""
    if split == "heldout":
        return [{"id": f"{a}+{b}", "prompt": f"Compute {a}+{b}. Reply with the result only.", "answer": a + b}
                for a in range(2, 50) for b in range(2, 50) if _pair_heldout(a, b)]

    def stream():
        rng = random.Random(f"smollm2-arith:{seed}")
        while True:
            a, b = rng.randint(2, 49), rng.randint(2, 49)
            if not _pair_heldout(a, b):
                yield {"id": f"{a}+{b}", "prompt": f"Compute {a}+{b}. Reply with the result only.", "answer": a + b}
    return stream()


def reward(prompt, completion, prompt_ids, completion_ids, *, answer, **fields):
    numbers = re.findall(r"-?\d+", completion)
    return 1.0 if numbers and int(numbers[-1]) == int(answer) else 0.0
