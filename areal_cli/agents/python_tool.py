"""A math agent with a Python tool (tool-integrated reasoning), written against the ``openai`` client.

The agent offers one tool, ``python`` (OpenAI ``tools`` schema: a function taking ``{"code": str}``). The model
calls it in the Qwen / Hermes format (``<tool_call>{"name": "python", "arguments": {"code": ...}}</tool_call>``,
parsed into ``tool_calls`` by the endpoint); each call runs in the kit's sandbox
(:func:`areal_cli.sandbox.run_python`: its own process group, resource limits, no network, a private working
directory, the same isolation as a graded program -- so a hostile call, a fork bomb, a write outside its directory
or a connection attempt, is contained and comes back to the model as an error text), and its output is appended
as a ``tool`` message; the model continues until it answers without a tool call or ``max_turns`` responses.

Training: the tool output, like every token the model did not generate, is never trained on -- in the
``individual`` export it is a prompt token of the next response, in the ``concat`` export it has loss mask 0
(logprob 0, version -1); see :mod:`areal_cli.agents.proxy`. ``run`` returns None, so the final answer is scored by
the task's reward function (:class:`~areal_cli.agents.workflow.AgentWorkflow`), e.g. the math grader.

Recipe::

    workflow: areal_cli.agents.workflow:AgentWorkflow
    workflow_args: {agent: areal_cli.agents.python_tool:PythonToolMathAgent, agent_args: {max_turns: 4},
                    export_style: concat}
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from areal_cli.sandbox import Limits, SandboxError, run_python

#: The tool, in the OpenAI ``tools`` schema (API reference, "function calling").
PYTHON_TOOL: dict = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a Python 3 program in a sandbox (a few seconds, little memory, no network, no files "
                       "outside its own directory) and return what it printed. Use print() to see results.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The complete program to run."}},
            "required": ["code"],
        },
    },
}

#: Limits of one tool call: 3 s wall clock, 256 MiB address space, 8 tasks, 1 MiB files / output.
TOOL_LIMITS = Limits(wall_s=3.0, memory_bytes=256 * 2**20, max_procs=8, max_file_bytes=2**20, max_open_files=32,
                     work_bytes=4 * 2**20)

SYSTEM_PROMPT = ("You can run Python with the `python` tool to check calculations. Put your final answer "
                 "within \\boxed{}.")


def format_result(res: Any, limits: Limits, max_chars: int) -> str:
    """The tool message of one sandbox run: its stdout, then one ``Error: ...`` line when it did not end
    normally (timeout, killed by a signal, an exception, a non-zero exit), cut to ``max_chars`` characters."""
    out = res.stdout or ""
    if res.stdout_truncated:
        out += "\n[output truncated]"
    err = ""
    if res.timed_out:
        err = f"Error: the program was stopped after {limits.wall_s:g} s (time limit)"
    elif res.killed_by:
        err = f"Error: the program was killed by {res.killed_by} (a resource limit)"
    elif res.error:
        err = f"Error: {res.error}"
    elif res.exit_code not in (None, 0) or (res.exit_code is None and res.returncode not in (0, None)):
        tail = (res.stderr or "").strip().splitlines()[-1:] or [""]
        err = f"Error: the program exited with status {res.exit_code if res.exit_code is not None else res.returncode}" \
              + (f": {tail[0]}" if tail[0] else "")
    text = (out + ("\n" if out and err and not out.endswith("\n") else "") + err) or "(no output)"
    return text if len(text) <= max_chars else text[: max_chars - 20] + "\n[output truncated]"


async def run_python_tool(code: str, limits: Limits = TOOL_LIMITS, max_chars: int = 2000) -> str:
    """Run ``code`` in the sandbox (a worker thread, so the event loop keeps serving) -> the tool message text.

    Never raises for the program's behaviour: a hostile or broken program is an ``Error: ...`` text; a sandbox that
    cannot run at all is ``Error: the sandbox could not run the program (...)``.
    """
    if not isinstance(code, str) or not code.strip():
        return "Error: the python tool needs a non-empty 'code' string"
    try:
        res = await asyncio.to_thread(run_python, code, limits=limits)
    except SandboxError as e:
        return f"Error: the sandbox could not run the program ({e})"
    return format_result(res, limits, max_chars)


class PythonToolMathAgent:
    """``async run(client, item) -> None``: a tool-integrated math agent (module docstring).

    Args:
        max_turns: responses per episode (>= 1); the last may still be a tool call (then it is the answer scored).
        question_field: the record field holding the question (else ``item.prompt`` is used).
        system_prompt: a system message, or "" for none.
        tool_wall_s, tool_memory_mb: limits of one tool call.
        max_output_chars: a tool result is cut to this many characters.
        temperature, max_tokens: per request (None: the run's sampling, rollout.temperature; another temperature is
            refused by the proxy, :func:`areal_cli.agents.proxy.run_sampling`).
    """

    def __init__(self, max_turns: int = 4, question_field: str = "question", system_prompt: str = SYSTEM_PROMPT,
                 tool_wall_s: float = 3.0, tool_memory_mb: int = 256, max_output_chars: int = 2000,
                 temperature: float | None = None, max_tokens: int | None = None) -> None:
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
        self.max_turns = max_turns
        self.question_field = question_field
        self.system_prompt = system_prompt
        self.limits = Limits(wall_s=float(tool_wall_s), memory_bytes=int(tool_memory_mb) * 2**20, max_procs=8,
                             max_file_bytes=2**20, max_open_files=32, work_bytes=4 * 2**20)
        self.max_output_chars = int(max_output_chars)
        self.temperature, self.max_tokens = temperature, max_tokens
        self.tool_calls = 0  # counters over all runs of this agent object
        self.tool_errors = 0

    async def call_tool(self, call: Any) -> str:
        """The tool message for one ``tool_calls`` item (an unknown tool or bad arguments: an error text)."""
        fn = call.function
        if fn.name != "python":
            self.tool_errors += 1
            return f"Error: unknown tool {fn.name!r}; the only tool is 'python'"
        try:
            args = json.loads(fn.arguments) if fn.arguments else {}
        except json.JSONDecodeError as e:
            self.tool_errors += 1
            return f"Error: the arguments are not valid JSON ({e})"
        code = args.get("code") if isinstance(args, dict) else None
        self.tool_calls += 1
        out = await run_python_tool(code, self.limits, self.max_output_chars)
        if out.startswith("Error:") or "\nError:" in out:
            self.tool_errors += 1
        return out

    async def run(self, client: Any, item: Any) -> None:
        """Answer ``item``'s question, calling the python tool as the model asks; returns None (the last answer
        is scored by the task's reward function)."""
        question = item.fields.get(self.question_field) if isinstance(item.fields, dict) else None
        msgs: list[dict] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        msgs.append({"role": "user", "content": str(question) if question is not None else item.prompt})
        extra = {k: v for k, v in (("temperature", self.temperature), ("max_tokens", self.max_tokens)) if v is not None}
        for _ in range(self.max_turns):
            r = await client.chat.completions.create(model="areal", messages=msgs, tools=[PYTHON_TOOL], **extra)
            m = r.choices[0].message
            msgs.append(m.model_dump(exclude_none=True))
            if not m.tool_calls:
                break
            for call in m.tool_calls:
                msgs.append({"role": "tool", "tool_call_id": call.id, "content": await self.call_tool(call)})
        return None
