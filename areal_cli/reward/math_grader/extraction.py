"""The final answer of a completion: the text after the reasoning block, cut at an end of turn, then
its last boxes or, without a box, its clearly stated answer (package docstring, "Extraction")."""

from __future__ import annotations

import re

from areal_cli.reward.math_grader.boxes import MAX_JOINED_BOXES, boxes_belong_together, find_boxes
from areal_cli.reward.math_grader.stated import minerva_answer, stated_answer

_TURN_END_RE = re.compile(r"<\|im_start\|>|<\|im_end\|>|<\|endoftext\|>|<\|eot_id\|>|<｜end▁of▁sentence｜>|</s>")


def strip_turn_end(text: str) -> str:
    """``text`` up to the first end-of-turn token after its first character (``<|im_start|>``,
    ``<|im_end|>``, ``<|endoftext|>``, ``<|eot_id|>``, ``</s>``, DeepSeek's end of sentence): what follows
    is a hallucinated next turn (Math-Verify's suite has such completions: "... is 2/3. <|im_start|>user"),
    not part of the answer."""
    lead = len(text) - len(text.lstrip())
    m = _TURN_END_RE.search(text, lead + 1)
    return text[: m.start()] if m else text


def final_answer_region(completion: str) -> str | None:
    """The part of a completion that may hold the final answer.

    Returns the text after the last ``</think>`` if there is one; ``None`` if ``<think>`` was opened but
    never closed (the model was cut off while thinking); otherwise the whole completion. Either way cut at
    an end-of-turn token (:func:`strip_turn_end`). An empty string (nothing after ``</think>``) means no
    answer: an answer given only inside the think block does not count (package docstring).
    """
    end = completion.rfind("</think>")
    if end >= 0:
        return strip_turn_end(completion[end + len("</think>") :])
    if "<think>" in completion:
        return None
    return strip_turn_end(completion)


def extract_answer(completion: str) -> str | None:
    """The final answer of a completion (package docstring, "Extraction").

    After the last ``</think>`` (cut at an end-of-turn token): the last box joined with the boxes directly
    before it that belong to it (:func:`boxes_belong_together`), joined with ``", "``; without a complete
    box, the clearly stated final answer (:func:`stated_answer`), else None.

    Raises:
        TypeError: ``completion`` is not a string.
    """
    if not isinstance(completion, str):
        raise TypeError(f"completion must be a string, got {type(completion).__name__}")
    region = final_answer_region(completion)
    if region is None:
        return None
    boxes = find_boxes(region)
    if not boxes:
        return stated_answer(region)
    minerva = minerva_answer(region, boxes[-1].end)
    if minerva is not None:
        return minerva
    group = [boxes[-1]]
    for prev in reversed(boxes[-MAX_JOINED_BOXES:-1]):
        if not boxes_belong_together(region[prev.end : group[0].start]):
            break
        group.insert(0, prev)
    return ", ".join(b.content for b in group)
