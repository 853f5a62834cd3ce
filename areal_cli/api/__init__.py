"""The public API for your own data, rewards and rollout behaviour: one recipe names each by
``module:attr`` (or ``path/to/file.py:attr``) and nothing in the kit changes.

======================  =======================================================================
``task.dataset``        records from JSONL/Parquet files, ``hf:OWNER/NAME`` at a pinned revision, or
                        ``fn(split, seed) -> Iterable[dict]`` (:mod:`areal_cli.api.records`)
``task.reward``         ``reward(prompt, completion, prompt_ids, completion_ids, **fields) -> float``
                        (:mod:`areal_cli.api.reward`)
``task.workflow``       ``async arun_episode(client, item) -> Group | None`` (:mod:`areal_cli.api.workflow`;
                        default :class:`RLVRWorkflow`)
======================  =======================================================================

Names exported here (imported lazily: ``import areal_cli.api`` costs nothing): :class:`Item`,
:class:`Trajectory`, :class:`Group`, :class:`RewardFailed`, :class:`EpisodeClient`,
:class:`RolloutWorkflow`, :class:`RLVRWorkflow`, :class:`MultiTurnWorkflow` and its token-exact
:class:`Conversation`, :class:`Record`. The built-in tasks use the same API.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Item": "areal_cli.api.types", "Trajectory": "areal_cli.api.types", "Group": "areal_cli.api.types",
    "RewardFailed": "areal_cli.api.types", "WorkflowError": "areal_cli.api.types",
    "Record": "areal_cli.api.records", "RolloutWorkflow": "areal_cli.api.workflow",
    "EpisodeClient": "areal_cli.rollout.episode", "RLVRWorkflow": "areal_cli.workflows.rlvr",
    "MultiTurnWorkflow": "areal_cli.workflows.multi_turn", "Conversation": "areal_cli.workflows.conversation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'areal_cli.api' has no attribute '{name}'")
