"""OpenAI-compatible agents (AReaL's ``ArealOpenAI`` / proxy mode): an agent written against the ``openai`` Python
client becomes trainable trajectories with no token handling of its own.

- :mod:`.openai_schema`: the Chat Completions wire format (requests, responses, Qwen/Hermes tool calls, errors),
  shared with the embedded server's ``/v1/chat/completions``;
- :mod:`.proxy`: :class:`AgentSession` (per-episode endpoint recording token ids, logprobs and versions per
  response; rewards, discount, export) and :class:`OpenAIProxy` (the HTTP server);
- :mod:`.workflow`: :class:`AgentWorkflow`, the rollout workflow running ``async run(client, item)`` agents;
- :mod:`.python_tool`: a math agent with a sandboxed ``python`` tool (tool-integrated reasoning).
"""

from areal_cli.agents.proxy import AgentSession, Interaction, OpenAIProxy
from areal_cli.agents.workflow import AgentWorkflow

__all__ = ["AgentSession", "AgentWorkflow", "Interaction", "OpenAIProxy"]
