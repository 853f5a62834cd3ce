"""Built-in task presets: default dataset, reward, workflow and prompt settings, by ``task`` name.

A preset is only defaults: every key can be set in the recipe (or ``-o``) instead, and a ``custom`` task
sets them all itself. The built-in tasks go through the same API as user code (:mod:`areal_cli.api`).

=============  ===========================================================================================
``tiny-arith``  reverse a digit string (generated; :mod:`areal_cli.tasks.tiny_arith`), the CPU recipe
``math-rl``     AReaL-boba-106k math records (``prompt``, ``task``, ``query_id``, ``solutions``), graded by the
                math grader of ``areal eval`` (:mod:`areal_cli.tasks.math_rl`)
``code-rl``     AReaL-boba-2-RL-Code records (``prompt``, ``query_id``, ``input_output`` JSON), graded by the
                sandboxed code grader of ``areal eval`` (:mod:`areal_cli.tasks.code_rl`)
``custom``      nothing preset: ``task.dataset`` and ``task.reward`` are required
=============  ===========================================================================================

``tiny-arith-multiturn``: tiny-arith's problems as a conversation -- after a wrong answer a feedback turn and
another try (:mod:`areal_cli.tasks.tiny_arith_multiturn`, :mod:`areal_cli.workflows.multi_turn`).
``tiny-longtail``: count down to the previous hundred; the answer's length (6-384 tokens, lognormal) is set by the
problem, like a reasoning model's trace (:mod:`areal_cli.tasks.tiny_longtail`; ``areal bench throughput`` /
``areal bench staleness`` scenarios).
``math-multi-turn``: ``math-rl``'s records and reward with boba²'s multi-turn math agent
(:class:`areal_cli.workflows.multi_turn.Boba2MathMultiTurnAgent`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from areal_cli.api.workflow import DEFAULT_WORKFLOW
from areal_cli.foundations.errors import UserError


@dataclass(frozen=True)
class Preset:
    """Defaults of a built-in task (``""`` / empty = no default).

    Attributes:
        kind: ``math``, ``code`` or ``any`` (which ``areal eval`` protocols fit its prompts).
        record_check: ``module:attr`` of ``check(record: dict) -> None`` raising ``ValueError("field 'x': why")``.
        corpus: ``module:attr`` of ``corpus() -> list[str]`` for the embedded tiny model's tokenizer (default:
            the text fields of the training records).
        sft_target_field / sft_target: the warm start's target completion: a record field, or ``module:attr``
            of ``target(prompt, fields) -> str`` (CPU miniatures: a tiny model needs a warm start where a real
            run starts from a reasoning model).
    """

    name: str
    kind: str = "any"
    dataset: str = ""
    reward: str = ""
    workflow: str = DEFAULT_WORKFLOW
    prompt_field: str = "prompt"
    prompt_template: str = "chat"
    id_field: str = ""
    required_fields: tuple[str, ...] = ()
    record_check: str = ""
    corpus: str = ""
    sft_target_field: str = ""
    sft_target: str = ""
    doc: str = ""
    extra: dict = field(default_factory=dict)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("tiny-arith", dataset="areal_cli.tasks.tiny_arith:records", reward="areal_cli.tasks.tiny_arith:reward",
           id_field="id", corpus="areal_cli.tasks.tiny_arith:tokenizer_corpus", sft_target_field="answer",
           required_fields=("prompt", "answer"),
           doc="reverse a 3-4 digit string (generated), the CPU recipe"),
    Preset("tiny-arith-multiturn", dataset="areal_cli.tasks.tiny_arith_multiturn:records",
           reward="areal_cli.tasks.tiny_arith:reward", workflow="areal_cli.workflows.multi_turn:MultiTurnWorkflow",
           id_field="id", corpus="areal_cli.tasks.tiny_arith_multiturn:tokenizer_corpus", sft_target_field="answer",
           required_fields=("prompt", "answer"),
           doc="tiny-arith as a conversation: a wrong answer gets feedback and another try (multi-turn workflow)"),
    Preset("tiny-longtail", dataset="areal_cli.tasks.tiny_longtail:records",
           reward="areal_cli.tasks.tiny_longtail:reward", id_field="id",
           corpus="areal_cli.tasks.tiny_longtail:tokenizer_corpus", sft_target_field="answer",
           required_fields=("prompt", "answer"),
           doc="count down to the previous hundred: answer lengths heavy-tailed (lognormal, 6-384 tokens)"),
    Preset("math-rl", kind="math", reward="areal_cli.tasks.math_rl:reward", id_field="query_id",
           prompt_template="chat-template", required_fields=("prompt", "solutions"),
           record_check="areal_cli.tasks.math_rl:check_record", sft_target="areal_cli.tasks.math_rl:sft_target",
           doc="AReaL-boba-106k math records, graded by the areal eval math grader"),
    Preset("math-multi-turn", kind="math", reward="areal_cli.tasks.math_rl:reward", id_field="query_id",
           workflow="areal_cli.workflows.multi_turn:Boba2MathMultiTurnAgent",
           prompt_template="chat-template", required_fields=("prompt", "solutions"),
           record_check="areal_cli.tasks.math_rl:check_record", sft_target="areal_cli.tasks.math_rl:sft_target",
           doc="math-rl records with boba2's multi-turn math agent: 5 turns, feedback, per-turn returns"),
    Preset("code-rl", kind="code", reward="areal_cli.tasks.code_rl:reward", id_field="query_id",
           required_fields=("prompt", "input_output"), record_check="areal_cli.tasks.code_rl:check_record",
           sft_target="areal_cli.tasks.code_rl:sft_target",
           doc="AReaL-boba-2-RL-Code records (stdin and call-based tests), graded by the sandboxed code grader"),
    Preset("custom", doc="your own dataset, reward and workflow (module:attr)"),
)}


def known_tasks() -> list[str]:
    return list(PRESETS)


def get_preset(name: str) -> Preset:
    """The preset called ``name``.

    Raises:
        UserError: unknown task name (lists the known ones).
    """
    if name not in PRESETS:
        raise UserError(f"field 'task.preset': unknown task '{name}' (known: {', '.join(PRESETS)}; your own data, "
                        f"reward and workflow go in a 'custom' task)")
    return PRESETS[name]
