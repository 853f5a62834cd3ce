r"""Samples you can read during training: every ``loop.log_samples_every`` RL steps, ``loop.log_samples_n`` of the
trajectories the step trains on, as text, appended to ``RUN/samples.jsonl`` and shown as a table in TensorBoard /
W&B (:meth:`~areal_cli.train_loop.tracking.Tracker.log_samples`).

One JSON object per line (:data:`FIELDS`)::

    {"step": 3, "group_id": 17, "item_id": "reverse 1234", "reward": 1.0, "finish_reason": "stop",
     "version_first": 1, "version_last": 2, "turns": 1, "solved_at_turn": null,
     "prompt": "<|im_start|>user\nreverse 1234<|im_end|>\n<|im_start|>assistant\n", "completion": "4321"}

- ``prompt``: the item's prompt text (what the reward function receives); for a multi-turn conversation, the
  whole conversation before its last answer (prompt, earlier answers, feedback and chat-template tokens,
  decoded with special tokens).
- ``completion``: the generated text (special tokens skipped, as the reward function sees it); for a
  conversation, its last answer (or, in the concatenated layout, everything after the first prompt).
- ``reward``: the sample's reward as trained on (a conversation: its last trained sample's).
- ``version_first`` / ``version_last``: the policy versions that generated the first and the last token
  (a conversation: of its first and last generated token; differ when a weight update interrupted it);
  None when nothing was generated.
- ``finish_reason``: ``stop``, ``length`` or ``abort`` (a conversation: its last turn's).
- ``turns``: assistant turns (1 for a single-turn sample; a concatenated agent sample: its runs of trained
  tokens); ``solved_at_turn`` (multi-turn workflows only): the first turn (1-based) whose answer was right, or
  None.

Samples are taken one per group, from as many groups as the batch has, before a second one of any group; the
choice is deterministic (no random state is used, so resumed runs stay reproducible). Lines are appended in one
write (:func:`~areal_cli.foundations.jsonl.append_json_lines`); a resumed run first drops the lines after its
checkpoint (:func:`cut_samples`).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Sequence

from areal_cli.api.types import Group, Trajectory
from areal_cli.foundations.atomic import write_atomic_many
from areal_cli.foundations.jsonl import append_json_lines, cut_torn_tail, lines_up_to_step

#: The run folder's file of logged samples.
SAMPLES_FILE = "samples.jsonl"
#: The fields of a logged sample, in the order of the table columns.
FIELDS = ("step", "group_id", "item_id", "reward", "finish_reason", "version_first", "version_last", "turns",
          "solved_at_turn", "prompt", "completion")
#: Characters of a text cell shown in the TensorBoard table (samples.jsonl keeps the whole text).
CELL_CHARS = 1500


def due(loop: Any, step: int) -> bool:
    """Whether RL step ``step`` logs samples: ``loop.log_samples_every`` and ``loop.log_samples_n`` both > 0 and
    ``step`` a multiple of ``log_samples_every``."""
    every, n = int(loop.log_samples_every), int(loop.log_samples_n)
    return every > 0 and n > 0 and step % every == 0


def _generated_versions(samples: Sequence[Trajectory]) -> tuple[int | None, int | None]:
    """The policy versions of the first and the last generated token of ``samples`` (in order); version -1
    (prompt, template and tool tokens) is skipped."""
    gen = [v for s in samples for v in s.versions if v >= 0]
    return (gen[0], gen[-1]) if gen else (None, None)


def _runs_of_ones(mask: Sequence[int]) -> int:
    """Maximal runs of 1 in a loss mask: the assistant turns of a concatenated sample."""
    return sum(1 for i, m in enumerate(mask) if m == 1 and (i == 0 or mask[i - 1] != 1))


def _units(group: Group) -> list[tuple[list[int], Any]]:
    """The loggable units of a group: ``(sample indices, conversation outcome or None)``: one per conversation
    when the workflow reported them, else one per sample."""
    if group.conversations and all(c.samples for c in group.conversations):
        return [(list(c.samples), c) for c in group.conversations]
    return [([i], None) for i in range(len(group.samples))]


def _record(group: Group, indices: list[int], outcome: Any, tokenizer: Any, step: int) -> dict:
    """One logged sample (module docstring)."""
    members = [group.samples[i] for i in indices]
    last = members[-1]
    if list(last.prompt_ids) == list(group.item.prompt_ids):
        prompt = group.item.prompt
    else:  # the conversation so far, its turns' template tokens shown
        prompt = tokenizer.decode(list(last.prompt_ids), skip_special_tokens=False)
    completion = tokenizer.decode(list(last.output_ids), skip_special_tokens=last.loss_mask is None)
    first, final = _generated_versions(members)
    if outcome is not None:
        turns = int(outcome.turns)
        solved = None if outcome.first_success is None else int(outcome.first_success) + 1
    else:
        turns = _runs_of_ones(last.loss_mask) if last.loss_mask is not None else 1
        solved = None
    return {"step": int(step), "group_id": int(group.group_id), "item_id": group.item.id, "reward": float(last.reward),
            "finish_reason": last.finish_reason, "version_first": first, "version_last": final, "turns": turns,
            "solved_at_turn": solved, "prompt": prompt, "completion": completion}


def pick_samples(groups: Sequence[Group], n: int, tokenizer: Any, step: int) -> list[dict]:
    """Up to ``n`` logged samples (module docstring) of the batch ``groups`` trained on at RL step ``step``:
    the first unit (conversation or sample) of each group in batch order, then the second of each, and so on.

    Args:
        groups: the batch (:class:`~areal_cli.api.types.Group`; a group with ``conversations`` gives one sample
            per conversation).
        n: samples at most (<= 0: none).
        tokenizer: decodes token ids (``decode(ids, skip_special_tokens=...)``).
        step: the RL step, written into each record.
    Returns:
        the records, each with every key of :data:`FIELDS`.
    """
    units = [_units(g) for g in groups]
    out: list[dict] = []
    depth = 0
    while len(out) < n and any(depth < len(u) for u in units):
        for g, u in zip(groups, units):
            if depth < len(u) and len(out) < n:
                out.append(_record(g, u[depth][0], u[depth][1], tokenizer, step))
        depth += 1
    return out


def write_samples(run_dir: Path, records: Sequence[dict]) -> None:
    """Append ``records`` to ``run_dir/samples.jsonl``, one JSON object per line, in one write of whole lines
    (:func:`~areal_cli.foundations.jsonl.append_json_lines`)."""
    append_json_lines(Path(run_dir) / SAMPLES_FILE, records)


def cut_samples(path: Path, step: int) -> int:
    """Keep the lines of a ``samples.jsonl`` up to RL step ``step`` (a run resumed from that step's checkpoint
    logs the later steps again) and drop a torn last line; rewritten atomically. A missing file is left alone.
    Returns the number of lines dropped."""
    path = Path(path)
    if not path.exists():
        return 0
    cut_torn_tail(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line, _ in lines_up_to_step(lines, step)]
    if len(kept) != len(lines):
        write_atomic_many({path: "".join(line + "\n" for line in kept)})
    return len(lines) - len(kept)


def _cell(value: Any, limit: int = CELL_CHARS) -> str:
    """A table cell: the value as text, cut to ``limit`` characters, HTML and the table's ``|`` escaped,
    newlines as line breaks."""
    if value is None:
        return ""
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    if len(text) > limit:
        text = text[:limit] + f" ... ({len(text) - limit} more characters)"
    return html.escape(text, quote=False).replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def markdown_table(records: Sequence[dict]) -> str:
    """The records as one Markdown table (TensorBoard's text plugin renders it): a column per field of
    :data:`FIELDS` except ``step`` (the step is TensorBoard's own), long texts cut to :data:`CELL_CHARS`."""
    cols = [c for c in FIELDS if c != "step"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in records]
    return "\n".join(lines)
