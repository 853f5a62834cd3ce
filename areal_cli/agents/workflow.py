"""AgentWorkflow: a rollout workflow that runs an agent written against the ``openai`` Python client.

AReaL's proxy mode (AP@HEAD ``areal/experimental/openai/proxy/workflow.py``, ``OpenAIProxyWorkflow``): an agent
is anything with ``async run(client, item) -> reward``. Per episode the workflow runs ``rollout.group_size`` sessions
concurrently; each gets ``client = openai.AsyncOpenAI(base_url=<its session>, api_key=...)`` and the
:class:`~areal_cli.api.types.Item` (``item.fields`` is the dataset record, ``item.prompt`` the rendered prompt).
What ``run`` returns decides the rewards (AReaL: a float applies to the last completion, a dict maps completion
ids to rewards, any other type is an error):

- a number: the reward of the session's last response;
- a dict ``{response_id: reward}`` (``ChatCompletion.id``);
- None (added): the last response is scored by the task's reward function in the reward pool (the recipe's
  ``task.reward``, with the record's fields), like the single-turn workflow -- a failed call drops the episode as a
  reward failure, never a silent 0.

Then :meth:`AgentSession.apply_discount` (``turn_discount``) and :meth:`AgentSession.export` (``export_style``:
``concat`` one sample per conversation with a loss mask, or ``individual`` one per response) give the Group.
In a held-out evaluation (``client.evaluating``) each conversation is one sample (``concat``), so accuracy
counts conversations.

Recipe::

    workflow: areal_cli.agents.workflow:AgentWorkflow
    workflow_args: {agent: my_pkg.agents:MathAgent, agent_args: {max_turns: 3}, export_style: concat,
                    turn_discount: 0.9}
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from typing import Any

from areal_cli.agents.proxy import EXPORT_STYLES, AgentSession, OpenAIProxy
from areal_cli.api.loading import load_object
from areal_cli.api.types import Group, Item, Trajectory, WorkflowError, gather_runs
from areal_cli.foundations.errors import UserError


def _bad(name: str, why: str, value: Any) -> UserError:
    return UserError(f"field 'task.workflow_args.{name}': {why} (got {value!r})")


def resolve_agent(agent: Any, agent_args: dict | None = None) -> Any:
    """The agent object: ``agent`` as ``module:attr`` / ``file.py:attr`` or an object; a class is instantiated
    with ``agent_args``; a bare ``async def run(client, item)`` function is used as the run method.

    Raises:
        UserError: not importable, the class refuses ``agent_args``, or no ``async run(client, item)``.
    """
    what = "field 'task.workflow_args.agent'"
    obj = load_object(agent, what) if isinstance(agent, str) else agent
    args = dict(agent_args or {})
    if inspect.isclass(obj):
        try:
            obj = obj(**args)
        except Exception as e:  # noqa: BLE001 - user constructor
            raise UserError(f"{what}: {agent}(**agent_args) raised {type(e).__name__}: {e}") from None
    elif args:
        raise _bad("agent_args", "the agent is not a class, so agent_args cannot be applied", args)
    if inspect.iscoroutinefunction(obj):
        fn = obj

        class _FunctionAgent:
            async def run(self, client: Any, item: Item) -> Any:
                return await fn(client, item)
        obj = _FunctionAgent()
    run = getattr(obj, "run", None)
    if run is None or not inspect.iscoroutinefunction(run):
        raise UserError(f"{what}: {agent!r} has no 'async def run(self, client, item)'")
    return obj


class AgentWorkflow:
    """``async arun_episode(client, item) -> Group | None`` around an OpenAI-client agent (module docstring).

    Args:
        agent: ``module:attr`` (or an object): a class with ``async run(client, item)``, an instance, or an async
            function ``(client, item)``.
        agent_args: keyword arguments of the agent class.
        turn_discount: in [0, 1] (AReaL ``AgentConfig.turn_discount``, default 1.0).
        export_style: ``"concat"`` (one sample per conversation, environment tokens masked) or
            ``"individual"`` (one per response; AReaL's default).
        n_samples: sessions per prompt (default the run's ``rollout.group_size``).
        max_new_tokens: budget of a request that names none (default the run's ``rollout.max_new_tokens``).
        max_total_tokens: cap on one request's prompt + completion (e.g. the servers' context length).
        request_timeout_s: the agent's OpenAI client timeout per request.
        turn_end_token: the token ending an assistant turn (default the tokenizer's eos).
    Raises:
        UserError: one line naming the bad argument.
    """

    def __init__(self, agent: Any, agent_args: dict | None = None, turn_discount: float = 1.0,
                 export_style: str = "concat", n_samples: int | None = None, max_new_tokens: int | None = None,
                 max_total_tokens: int | None = None, request_timeout_s: float = 3600.0,
                 turn_end_token: str | None = None) -> None:
        self.agent = resolve_agent(agent, agent_args)
        if isinstance(turn_discount, bool) or not isinstance(turn_discount, (int, float)) \
                or not 0.0 <= turn_discount <= 1.0:
            raise _bad("turn_discount", "must be a number in [0, 1]", turn_discount)
        self.turn_discount = float(turn_discount)
        if export_style not in EXPORT_STYLES:
            raise _bad("export_style", f"must be one of {', '.join(EXPORT_STYLES)}", export_style)
        self.export_style = export_style
        for name, v in (("n_samples", n_samples), ("max_new_tokens", max_new_tokens),
                        ("max_total_tokens", max_total_tokens)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise _bad(name, "must be an integer >= 1 or null", v)
        self.n_samples, self.max_new_tokens, self.max_total_tokens = n_samples, max_new_tokens, max_total_tokens
        if isinstance(request_timeout_s, bool) or not isinstance(request_timeout_s, (int, float)) \
                or request_timeout_s <= 0:
            raise _bad("request_timeout_s", "must be a positive number", request_timeout_s)
        self.request_timeout_s = float(request_timeout_s)
        self.turn_end_token = turn_end_token
        self._proxies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._starting: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    async def proxy(self) -> OpenAIProxy:
        """The HTTP proxy of the running event loop (started on first use)."""
        loop = asyncio.get_running_loop()
        if loop not in self._proxies:
            if loop not in self._starting:
                self._starting[loop] = asyncio.ensure_future(OpenAIProxy.start())
            proxy = await self._starting[loop]
            self._proxies[loop] = proxy
            self._starting.pop(loop, None)
        return self._proxies[loop]

    async def aclose(self) -> None:
        """Stop the proxy of the running event loop (if any)."""
        proxy = self._proxies.pop(asyncio.get_running_loop(), None)
        if proxy is not None:
            await proxy.aclose()

    async def run_session(self, client: Any, item: Item, style: str | None = None) -> list[Trajectory]:
        """One agent run on ``item`` in its own session -> its exported samples (empty when it made no request).

        Raises:
            WorkflowError: ``run`` returned a reward of the wrong type, or rewarded a response that does not exist.
            RewardFailed: the task's reward function failed on the last response (``run`` returned None).
        """
        import httpx
        import openai

        proxy = await self.proxy()
        sess: AgentSession = proxy.open_session(client, max_total_tokens=self.max_total_tokens,
                                                default_max_tokens=self.max_new_tokens,
                                                turn_end_token=self.turn_end_token)
        try:
            http = httpx.AsyncClient(trust_env=False, timeout=self.request_timeout_s)  # never an HTTP(S)_PROXY
            oai = openai.AsyncOpenAI(base_url=sess.base_url, api_key="areal", max_retries=0,
                                     timeout=self.request_timeout_s, http_client=http)
            try:
                result = await self.agent.run(oai, item)
            finally:
                await oai.close()
                await http.aclose()
        finally:
            proxy.close_session(sess)
        await self._apply(client, item, sess, result)
        sess.apply_discount(self.turn_discount)
        return sess.export(style or self.export_style, group_id=client.episode_id)

    async def _apply(self, client: Any, item: Item, sess: AgentSession, result: Any) -> None:
        name = type(self.agent).__name__
        if result is None:
            if not sess.interactions:
                return
            last = next(reversed(sess.interactions.values()))
            r = await client.reward(client.decode(last.prompt_ids, skip_special_tokens=False), last.text,
                                    last.prompt_ids, last.output_ids, **item.fields)
            sess.set_reward(last.id, r)
        elif isinstance(result, dict):
            for rid, r in result.items():
                try:
                    sess.set_reward(rid, r)
                except (KeyError, ValueError) as e:
                    raise WorkflowError(f"field 'task.workflow_args.agent': {name}.run returned a reward for "
                                        f"{rid!r}: {e}") from None
        elif isinstance(result, (int, float)) and not isinstance(result, bool):
            try:
                sess.set_last_reward(result)
            except ValueError as e:
                raise WorkflowError(f"field 'task.workflow_args.agent': {name}.run returned {result!r}: {e}") from None
        else:
            raise WorkflowError(f"field 'task.workflow_args.agent': {name}.run returned a {type(result).__name__}; "
                                f"expected a number, a {{response_id: reward}} dict or None")

    async def arun_episode(self, client: Any, item: Item) -> Group | None:
        """``n`` concurrent agent runs on ``item`` -> their samples as one Group; None (rejected, counted) when no
        run made a request. A failed reward is raised after every run finished (each outcome counted)."""
        n = self.n_samples or client.group_size
        style = "concat" if getattr(client, "evaluating", False) else None
        results = await gather_runs([self.run_session(client, item, style) for _ in range(n)])
        samples = [s for r in results for s in r]
        return Group(client.episode_id, item, samples) if samples else None
