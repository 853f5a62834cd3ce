"""The rollout-workflow contract (AReaL ``areal/api/workflow_api.py``)::

    class MyWorkflow:
        async def arun_episode(self, client: EpisodeClient, item: Item) -> Group | None: ...

``client`` (:class:`~areal_cli.rollout.episode.EpisodeClient`) generates through the rollout servers
(``await client.generate(prompt_ids, n=...)``), scores through the reward pool (``await client.reward(...)``
or ``client.score(item, completions)``) and builds the :class:`~areal_cli.api.types.Group` to return
(``client.group(item, completions, rewards)``). Returning ``None`` rejects the episode (counted as
``groups_rejected``); raising :class:`~areal_cli.api.types.RewardFailed` drops it as a reward failure; any
other exception ends the run with one line naming the workflow.

A recipe names the workflow as ``module:attr`` / ``file.py:attr`` (``task.workflow``) with keyword arguments
(``task.workflow_args``): a class is instantiated with them, an instance or module-level object is used as is.
The controller only admits, schedules and collects episodes; what an episode does is the workflow's.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol, runtime_checkable

from areal_cli.api.loading import load_object
from areal_cli.api.types import Group, Item
from areal_cli.foundations.errors import UserError

#: The built-in single-turn workflow (:class:`areal_cli.workflows.rlvr.RLVRWorkflow`).
DEFAULT_WORKFLOW = "areal_cli.workflows.rlvr:RLVRWorkflow"


@runtime_checkable
class RolloutWorkflow(Protocol):
    """Anything with ``async arun_episode(client, item) -> Group | None``."""

    async def arun_episode(self, client: Any, item: Item) -> Group | None: ...


def make_workflow(spec: str, args: dict | None = None, what: str = "field 'task.workflow'") -> RolloutWorkflow:
    """The workflow named by ``spec``: a class instantiated with ``args``, or an object used as is.

    Raises:
        UserError: not importable, the class refuses ``args``, or no ``async arun_episode(client, item)``.
    """
    obj = load_object(spec, what)
    args = dict(args or {})
    if inspect.isclass(obj):
        try:
            obj = obj(**args)
        except TypeError as e:
            raise UserError(f"{what}: {spec}(**workflow_args) failed: {e}") from None
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - user constructor
            raise UserError(f"{what}: {spec}(**{args}) raised {type(e).__name__}: {e}") from None
    elif args:
        raise UserError(f"{what}: {spec} is not a class, so 'task.workflow_args' {sorted(args)} cannot be applied")
    method = getattr(obj, "arun_episode", None)
    if method is None or not inspect.iscoroutinefunction(method):
        raise UserError(f"{what}: {spec} has no 'async def arun_episode(self, client, item)'")
    try:
        inspect.signature(method).bind(None, None)
    except TypeError:
        raise UserError(f"{what}: {spec}.arun_episode{inspect.signature(method)} cannot take (client, item)") from None
    return obj
