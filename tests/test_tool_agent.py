"""The tool-integrated math agent (areal_cli/agents/python_tool.py) with a scripted model:

- the model calls the ``python`` tool (Qwen/Hermes ``<tool_call>``), the call runs in the sandbox, the result
  comes back as a ``tool`` message, the model answers; the answer is scored by the task's reward function;
- the tool output's tokens are never trained: loss mask 0 (logprob 0, version -1) in the concat export, prompt
  tokens in the individual export;
- hostile tool calls (fork bomb, a write outside its directory, a network connection) are contained and come
  back to the model as error texts; the episode goes on.
"""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from areal_cli.agents import AgentWorkflow
from areal_cli.agents.python_tool import PYTHON_TOOL, PythonToolMathAgent, run_python_tool
from areal_cli.api.types import Item

from helpers.scripted import Scripted, episode, text_ids

pytestmark = pytest.mark.multiproc  # every test here starts processes


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from areal_cli.models.tiny import build_tiny_model, load_tokenizer

    return load_tokenizer(build_tiny_model(tmp_path_factory.mktemp("tool") / "m"))


def call_ids(tok, code: str, before: str = "") -> list[int]:
    body = json.dumps({"name": "python", "arguments": {"code": code}})
    return text_ids(tok, f"{before}<tool_call>\n{body}\n</tool_call>") + [tok.eos_token_id]


def run_episode(tok, outputs, style, verdict, **agent_args):
    engine = Scripted(outputs)
    wf = AgentWorkflow(PythonToolMathAgent, {"system_prompt": "", **agent_args}, export_style=style, n_samples=1)
    item = Item("q", [1, 2], "p", {"question": "What is 6*7?", "answer": "42"})

    async def run():
        ep, pool = episode(engine, tok, verdict=verdict)
        try:
            return await wf.arun_episode(ep, item), pool
        finally:
            await wf.aclose()

    group, pool = asyncio.run(run())
    return engine, group, pool, wf.agent


def test_a_tool_call_runs_in_the_sandbox_and_its_output_is_masked(tok):
    eos = tok.eos_token_id
    outputs = [call_ids(tok, "print(6*7)", "Let me compute. "), text_ids(tok, "\\boxed{42}") + [eos]]
    engine, group, pool, agent = run_episode(tok, outputs, "concat",
                                             lambda text, k, f: float(text == "\\boxed{42}"))
    assert agent.tool_calls == 1 and agent.tool_errors == 0
    # the first request offered the tool; the second prompt = first prompt + the call ids + the tool turn
    p0, p1 = engine.prompts
    assert p1[: len(p0) + len(outputs[0])] == p0 + outputs[0]
    tool_turn = tok.decode(p1[len(p0) + len(outputs[0]):], skip_special_tokens=False)
    assert tool_turn == "\n<|im_start|>tool\n42\n<|im_end|>\n<|im_start|>assistant\n"
    (s,) = group.samples
    assert s.reward == 1.0 and s.check() is None and pool.calls[0][0] == "\\boxed{42}"
    n_tool = len(p1) - len(p0) - len(outputs[0])
    assert s.loss_mask == [1] * len(outputs[0]) + [0] * n_tool + [1] * len(outputs[1])
    tool_span = slice(len(outputs[0]), len(outputs[0]) + n_tool)
    assert set(s.versions[tool_span]) == {-1} and set(s.behaviour_logprobs[tool_span]) == {0.0}

    _, group, _, _ = run_episode(tok, outputs, "individual", lambda text, k, f: float(text == "\\boxed{42}"))
    a, b = group.samples
    assert b.prompt_ids == p1 and b.output_ids == outputs[1]  # the tool output is a prompt token
    assert a.output_ids == outputs[0] and a.reward == 1.0 and b.reward == 1.0  # turn_discount 1


def test_hostile_tool_calls_are_contained_and_answered_with_an_error(tok, tmp_path):
    eos = tok.eos_token_id
    target = tmp_path / f"pwned-{uuid.uuid4().hex}.txt"
    fork_bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    write = f"open({str(target)!r}, 'w').write('x')\nprint('written')"
    net = "import socket\ns = socket.create_connection(('1.1.1.1', 80), timeout=2)\nprint('connected')"
    outputs = [call_ids(tok, fork_bomb), call_ids(tok, write), call_ids(tok, net), text_ids(tok, "42") + [eos]]
    engine, group, _, agent = run_episode(tok, outputs, "concat", lambda text, k, f: 0.0, tool_wall_s=1.5,
                                          max_turns=4)
    assert len(engine.prompts) == 4 and agent.tool_calls == 3 and agent.tool_errors == 3
    results = []
    for k in range(3):
        start = len(engine.prompts[k]) + len(outputs[k])
        results.append(tok.decode(engine.prompts[k + 1][start:], skip_special_tokens=True))
    assert "Error:" in results[0] and ("time limit" in results[0] or "killed" in results[0] or "refused" in results[0])
    assert "Error:" in results[1] and "written" not in results[1] and not target.exists()
    assert "Error:" in results[2] and "connected" not in results[2]
    (s,) = group.samples
    assert s.check() is None and sum(s.loss_mask) == sum(len(o) for o in outputs)


def test_the_tool_schema_and_bad_calls():
    assert PYTHON_TOOL["function"]["name"] == "python" and PYTHON_TOOL["function"]["parameters"]["required"] == ["code"]
    assert asyncio.run(run_python_tool("print(1+1)")) == "2\n"
    assert asyncio.run(run_python_tool("")).startswith("Error:")
    assert asyncio.run(run_python_tool("1/0")) == "Error: ZeroDivisionError: division by zero"
