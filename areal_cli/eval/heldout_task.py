"""After a training run of one's own task: its held-out records as an evaluation task and the one ``areal eval``
command that evaluates the final weights on them (printed by the run's summary, ``summary.json`` ``eval_command``).

The task file is the format of :mod:`areal_cli.eval.custom_task`: ``RUN/eval-task/<recipe>-heldout.yaml`` beside
``heldout.jsonl``, graded by the run's own reward (``pass_threshold`` 1.0: a 0/1 reward agrees with the run's held-out
accuracy; a partial-credit reward counts as correct only at full credit).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from areal_cli.eval.custom_task import DEFAULT_TASK_PROTOCOL
from areal_cli.foundations.atomic import write_atomic_many


def write_heldout_task(task: Any, out_dir: Path, *, protocol: str = DEFAULT_TASK_PROTOCOL,
                       name: str | None = None) -> Path | None:
    """Write a training task's held-out records and a task YAML that evaluates them with the task's own reward:
    ``out_dir/heldout.jsonl`` and ``out_dir/<task>.yaml`` (what ``areal eval --data`` takes).

    Args:
        task: the run's :class:`areal_cli.tasks.task.Task` (records read from files: ``heldout_records``).
        out_dir: the folder to write into (created).
        protocol: the task's ``default_protocol``.
        name: the eval task's name (default: the task's).
    Returns:
        the task YAML, or None when the task has no held-out records of its own (a record function, a prompt that is
        a messages list).
    """
    records = getattr(task, "heldout_records", None)
    if not records or not all(isinstance(r.fields.get(task.prompt_field), str) for r in records):
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    id_field = task.id_field or ""
    rows = []
    for r in records:
        row = dict(r.fields)
        if not id_field and row.get("id") is None:
            row["id"] = r.id
        rows.append(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    name = re.sub(r"[^\w.-]", "_", str(name or task.name)) or "task"
    yaml_path = out_dir / f"{name}.yaml"
    lines = [
        "# written by areal train: the run's held-out records, graded by its reward (areal eval --data THIS_FILE)",
        f"name: {json.dumps(name)}",
        "records: heldout.jsonl",
        f"id_field: {json.dumps(id_field or 'id')}",
        f"prompt_field: {json.dumps(task.prompt_field)}",
        f"grader: {json.dumps(task.reward_spec)}",
        "pass_threshold: 1.0",
        f"default_protocol: {json.dumps(protocol)}",
    ]
    if task.code_dir:
        lines.append(f"code_dir: {json.dumps(str(Path(task.code_dir).resolve()))}")
    write_atomic_many({out_dir / "heldout.jsonl": "".join(rows), yaml_path: "\n".join(lines) + "\n"})
    return yaml_path


#: The training side's default single-turn workflow: the only one whose episodes ``areal eval`` reproduces.
SINGLE_TURN_WORKFLOW = "areal_cli.workflows.rlvr:RLVRWorkflow"


def heldout_eval_command(task: Any, cfg: Any, run_dir: Path, weights: Path) -> tuple[str | None, str]:
    """After a training run of one's own task: write its held-out records as a task (:func:`write_heldout_task`,
    into ``run_dir/eval-task/``) and return the ``areal eval`` command that evaluates ``weights`` on them with the
    run's reward, prompt and evaluation sampling (``loop.eval_temperature``, ``rollout.top_p`` / ``top_k``), paths
    shell-quoted.

    Args:
        task: the run's :class:`areal_cli.tasks.task.Task`.
        cfg: the run's TrainConfig (``loop.eval_temperature``, ``loop.eval_n_samples``, ``rollout.max_new_tokens``).
        run_dir: the run's folder.
        weights: the final weights (a Hugging Face directory).
    Returns:
        ``(command, "")``, or ``(None, why not)`` when ``areal eval`` cannot reproduce the run's evaluation: no held-out
        records read from files, a multi-turn or custom workflow, a prompt template that no protocol reproduces.
    """
    from areal_cli.eval.protocols import PROTOCOLS

    template = str(getattr(task, "prompt_template", "") or "")
    workflow = str(getattr(task, "workflow_spec", "") or "")
    if workflow and workflow != SINGLE_TURN_WORKFLOW:
        return None, f"the task's workflow {workflow} is not the single-turn one areal eval runs"
    if template == "chat":
        protocol = DEFAULT_TASK_PROTOCOL
    elif template in PROTOCOLS and PROTOCOLS[template].template is not None:
        protocol = template
    else:
        return None, f"no areal eval protocol renders prompt_template {template!r} as the run did"
    path = write_heldout_task(task, run_dir / "eval-task", protocol=protocol,
                              name=f"{getattr(cfg, 'recipe', '') or task.name}-heldout")
    if path is None:
        return None, "the task has no held-out records read from files (a record function, or messages prompts)"
    # the run's held-out sampling: loop.eval_temperature with the rollout's top_p / top_k (never a protocol preset's)
    temperature = float(cfg.loop.eval_temperature)
    q = shlex.quote
    command = (f"areal eval --model {q(str(weights))} --data {q(str(path))} --protocol {protocol} "
               f"--temperature {temperature:g} --top-p {float(cfg.rollout.top_p):g} --top-k {int(cfg.rollout.top_k)} "
               f"-n {int(cfg.loop.eval_n_samples)} --max-new-tokens {int(cfg.rollout.max_new_tokens)} "
               f"--out {q(str(run_dir / 'eval-final'))}")
    return command, ""
