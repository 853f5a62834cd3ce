"""Which protocol an ``areal eval`` run follows, with which explicit overrides, and the run's other options.

A protocol (:mod:`areal_cli.eval.protocols`) fixes the prompt string and the published sampling settings
(e.g. ``r1-distill``: 64 samples, temperature 0.6, top_p 0.95, 32768 new tokens). Any option given
explicitly (``-n``, ``--temperature``, ``--top-p``, ``--top-k``, ``--max-new-tokens``, ``--greedy-pass``)
replaces the preset's value (:func:`areal_cli.eval.protocols.apply_overrides`); ``results.json`` records
the protocol in force, the names of the overridden settings and the preset's values for them, so a number
is never reported under a protocol it did not follow.

Which protocol when none is given: the tiny default model has no template but its chat template, so
``chat-template`` (unless only one's own tasks are selected and they declare one ``default_protocol``, which is then
used); any other model gets the default protocol the selected benchmarks declare
(``default_protocol`` in ``evaluation/benchmarks.json``), which must then be the same for all of them, unless its
fixed template uses chat markers that are not tokens of the model (R1's ``<｜User｜>`` or Qwen3's ``<think>`` for
SmolLM2): then the model's own chat template (``chat-template``), and the run says why. The model's tokens are read
before any conversion (a GGUF file's header) or generation, so a refusal comes first.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from areal_cli.foundations.errors import UserError
from areal_cli.eval.benchmarks import BenchmarkSpec, Problem
from areal_cli.eval.protocols import Protocol, apply_overrides, check_kind, get_protocol, missing_marker

TINY_MODEL_PROTOCOL = "chat-template"


def choose_protocol(explicit: str | None, specs: dict[str, BenchmarkSpec], benchmarks: Sequence[str],
                    tiny_model: bool, vocab: Any = None, model: str = "the model", notes: list | None = None) -> str:
    """The protocol name in force (see module docstring).

    Args:
        vocab: the model's token strings (a set or mapping), read before any conversion or download; with it an
            explicit protocol whose fixed template the model cannot read is refused here, and a benchmark default
            it cannot read gives way to the model's own chat template (said in ``notes``).
        model: the model's name, for messages.
        notes: a list the reason for a changed default is appended to.
    Raises:
        UserError: an explicit protocol with a chat marker that is not a token of ``vocab``; no explicit protocol
            and the benchmarks declare different (or no) defaults.
    """
    if explicit:
        if vocab is not None:
            marker = missing_marker(get_protocol(explicit), vocab)
            if marker is not None:
                raise UserError(f"protocol '{explicit}' uses {marker}, which is not a token of {model}; use a "
                                f"protocol for this model family (e.g. --protocol chat-template)")
        return explicit
    defaults = {b: specs[b].default_protocol for b in benchmarks}
    if tiny_model:  # the built-in tiny model reads its own chat template; one's own tasks may declare another
        task_defaults = {p for b, p in defaults.items() if specs[b].loader == "task"}
        if len(task_defaults) == 1 and len(defaults) == sum(specs[b].loader == "task" for b in benchmarks):
            return task_defaults.pop()
        return TINY_MODEL_PROTOCOL
    names = set(defaults.values())
    if len(names) == 1 and "" not in names:
        name = names.pop()
        marker = missing_marker(get_protocol(name), vocab) if vocab is not None else None
        if marker is not None:
            if notes is not None:
                notes.append(f"protocol: {TINY_MODEL_PROTOCOL}, the model's own chat template and its sampling "
                             f"settings (the benchmarks' default '{name}' uses {marker}, which is not a token of "
                             f"{model}; --protocol NAME chooses another)")
            return TINY_MODEL_PROTOCOL
        return name
    listing = ", ".join(f"{b} ({p or 'none'})" for b, p in defaults.items())
    raise UserError(f"option 'protocol': the benchmarks declare different default protocols: {listing}; "
                    "choose one with --protocol (or evaluate them separately)")


def resolve_protocol(name: str, **options: Any) -> tuple[Protocol, Protocol]:
    """``(preset, in force)``: the named protocol and the same with the explicit options (not None) applied.

    Options: n_samples, temperature, top_p, top_k, max_new_tokens, greedy_pass.

    Raises:
        UserError: unknown protocol; an out-of-range option (``option 'top_p': must be in (0, 1], got 0.0``).
    """
    preset = get_protocol(name)
    return preset, apply_overrides(preset, **options)


def check_protocol_fits(protocol: Protocol, problems_by_ds: dict[str, list[Problem]],
                        specs: dict[str, BenchmarkSpec]) -> None:
    """Every selected benchmark is of the protocol's kind (math prompts never go to code benchmarks).

    A custom task graded by its reward function takes any protocol.

    Raises:
        UserError: names the protocol, the benchmark and the benchmark's own default protocol.
    """
    for ds, problems in problems_by_ds.items():
        spec = specs.get(ds)
        kind = spec.kind if spec is not None else (problems[0].kind if problems else "math")
        if kind == "reward":  # a custom task's reward reads any prompt format
            continue
        check_kind(protocol, kind, ds, spec.default_protocol if spec is not None else "")


def protocol_record(preset: Protocol, in_force: Protocol) -> dict[str, Any]:
    """The protocol in force for results.json: its fields (:meth:`Protocol.to_dict`) plus ``preset`` =
    the preset's values of the overridden settings."""
    d = in_force.to_dict()
    d["preset"] = {k: getattr(preset, k) for k in in_force.overrides}
    return d


def _bad(name: str, value: Any, what: str) -> UserError:
    return UserError(f"option '{name}': {what}, got {value!r}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def validate_run_options(seed: Any, grader_timeout_s: Any, grader_workers: Any, max_concurrency: Any) -> None:
    """Check the options that are not protocol settings.

    Raises:
        UserError: one line naming the option, the rule and the value.
    """
    if not _is_int(seed):
        raise _bad("seed", seed, "must be an integer")
    if not isinstance(grader_timeout_s, (int, float)) or isinstance(grader_timeout_s, bool) \
            or not 0 < grader_timeout_s < math.inf:
        raise _bad("grader_timeout_s", grader_timeout_s, "must be a finite number of seconds > 0")
    if not _is_int(grader_workers) or grader_workers < 1:
        raise _bad("grader_workers", grader_workers, "must be an integer >= 1")
    if not _is_int(max_concurrency) or max_concurrency < 1:
        raise _bad("max_concurrency", max_concurrency, "must be an integer >= 1")
