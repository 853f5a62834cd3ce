"""The OpenAI-compatible agent path (areal_cli/agents/, AReaL's ArealOpenAI / proxy mode):

- an agent written against the real ``openai`` client gets OpenAI-schema responses (parsed by the library's own
  models: content, tool_calls, usage, logprobs) from a per-episode endpoint;
- the proxy records, per response, the exact ids / logprobs / versions; a continued conversation reuses the
  previous prompt + output ids verbatim and appends only the template's new ids (never re-tokenised text);
- rewards: set per response, discounted backwards (AReaL's example by hand); export concat / individual;
- AgentWorkflow turns an agent into a Group (also by ``module:attr``, and with the task's reward function);
- bad input: a 400 with an OpenAI error body (the library raises BadRequestError), never a traceback;
- the embedded server's own /v1/chat/completions; the proxy in front of a real embedded server and of the SGLang
  stand-in (tests/fake_sglang), through the RolloutClient, with a weight update inside a response.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch

from areal_cli.agents import AgentWorkflow, OpenAIProxy
from areal_cli.agents.openai_schema import OpenAIError, parse_chat_request, parse_tool_calls
from areal_cli.api.types import Item, WorkflowError
from areal_cli.api.workflow import make_workflow
from areal_cli.rollout.client import RolloutClient
from areal_cli.rollout.episode import EpisodeClient
from areal_cli.rollout.protocol import SamplingParams

from helpers.scripted import Scripted, episode, ids_of, text_ids
from helpers.servers import spawn_server, wait_generating

torch.set_num_threads(1)
FAKE_SGLANG = str(Path(__file__).resolve().parent / "fake_sglang")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from areal_cli.models.tiny import build_tiny_model, load_tokenizer

    return load_tokenizer(build_tiny_model(tmp_path_factory.mktemp("oai") / "m"))


def oai(base_url):
    return openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0,
                              http_client=httpx.AsyncClient(trust_env=False))


async def with_session(engine, tok, fn, **kw):
    proxy = await OpenAIProxy.start()
    try:
        ep, _ = episode(engine, tok)
        sess = proxy.open_session(ep, **kw)
        client = oai(sess.base_url)
        try:
            return sess, await fn(client, sess)
        finally:
            await client.close()
    finally:
        await proxy.aclose()


# ------------------------------------------------------------------------------------------- token-exact
def test_a_continued_conversation_reuses_the_ids_verbatim_and_appends_only_template_ids(tok):
    eos = tok.eos_token_id
    spelled = ids_of(tok, "r", "e", "v", "e", "r", "s", "e") + [eos]  # decode -> encode gives other ids
    assert text_ids(tok, tok.decode(spelled[:-1])) != spelled[:-1]
    engine = Scripted([spelled, ids_of(tok, "3", "2", "1") + [eos]])
    msgs = [{"role": "user", "content": "reverse 123"}]

    async def agent(client, sess):
        r1 = await client.chat.completions.create(model="m", messages=msgs, temperature=1.0, max_tokens=9)
        assert r1.choices[0].message.content == "reverse" and r1.choices[0].finish_reason == "stop"
        assert r1.usage.completion_tokens == len(spelled) and r1.object == "chat.completion"
        r2 = await client.chat.completions.create(
            model="m", messages=msgs + [r1.choices[0].message.model_dump(exclude_none=True),
                                        {"role": "user", "content": "Wrong. Try again."}])
        return r1, r2

    sess, (r1, r2) = asyncio.run(with_session(engine, tok, agent))
    first = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert engine.prompts[0] == text_ids(tok, first)
    assert engine.params[0].temperature == 1.0 and engine.params[0].max_new_tokens == 9
    p2 = engine.prompts[1]
    assert p2[: len(engine.prompts[0]) + len(spelled)] == engine.prompts[0] + spelled  # verbatim, not re-tokenised
    new = p2[len(engine.prompts[0]) + len(spelled):]
    assert new == text_ids(tok, "\n<|im_start|>user\nWrong. Try again.<|im_end|>\n<|im_start|>assistant\n")
    its = list(sess.interactions.values())
    assert its[1].parent == its[0].id == r1.id and r2.id == its[1].id
    assert its[0].output_ids == spelled and its[0].completion.output_logprobs == [-0.5] * len(spelled)

    # rewards: the last one set, discounted backwards (0.9); export both ways
    sess.set_reward(r2.id, 1.0)
    with pytest.raises(ValueError, match="no reward"):
        sess.export("individual")
    sess.apply_discount(0.9)
    assert [it.reward for it in its] == [pytest.approx(0.9), 1.0]
    (c,) = sess.export("concat", group_id=3)
    assert c.check() is None and c.group_id == 3 and c.reward == 1.0
    assert c.prompt_ids == engine.prompts[0] and c.prompt_ids + c.output_ids == p2 + its[1].output_ids
    assert c.loss_mask == [1] * len(spelled) + [0] * len(new) + [1] * 4
    assert c.versions == [7] * len(spelled) + [-1] * len(new) + [8] * 4
    assert c.behaviour_logprobs == [-0.5] * len(spelled) + [0.0] * len(new) + [-1.5] * 4
    ind = sess.export("individual")
    assert [(s.prompt_ids, s.output_ids, s.reward) for s in ind] == [
        (engine.prompts[0], spelled, pytest.approx(0.9)), (p2, its[1].output_ids, 1.0)]
    with pytest.raises(ValueError, match="once"):
        sess.apply_discount(0.9)


def test_discount_by_hand_arealopenai_example_and_edited_history_starts_a_new_conversation(tok):
    eos = tok.eos_token_id
    engine = Scripted([ids_of(tok, "a") + [eos], ids_of(tok, "b") + [eos], ids_of(tok, "c") + [eos],
                       ids_of(tok, "d") + [eos]])

    async def agent(client, sess):
        msgs = [{"role": "user", "content": "go"}]
        out = []
        for _ in range(3):
            r = await client.chat.completions.create(model="m", messages=msgs)
            out.append(r)
            msgs = msgs + [{"role": "assistant", "content": r.choices[0].message.content},
                           {"role": "user", "content": "more"}]
        # the agent edits the history (drops the answers): no parent, rendered whole -> its own conversation
        out.append(await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "new"}]))
        return out

    sess, rs = asyncio.run(with_session(engine, tok, agent))
    its = list(sess.interactions.values())
    assert [it.parent for it in its] == [None, rs[0].id, rs[1].id, None]
    sess.set_reward(rs[2].id, 1.0)  # C = 1: B = 0.9, A = 0.81 (AReaL docs/en/reference/agent_workflow.md)
    sess.set_reward(rs[3].id, 0.5)
    sess.apply_discount(0.9)
    assert [it.reward for it in its] == [pytest.approx(0.81), pytest.approx(0.9), 1.0, 0.5]
    concat = sess.export("concat")
    assert [s.reward for s in concat] == [1.0, 0.5] and sum(concat[0].loss_mask) == 6
    with pytest.raises(KeyError):
        sess.set_reward("chatcmpl-nope", 1.0)


# ------------------------------------------------------------------------------------------- tools / schema
def test_tool_calls_are_parsed_into_the_openai_schema(tok):
    eos = tok.eos_token_id
    call = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6*7)"}}\n</tool_call>'
    engine = Scripted([text_ids(tok, "Let me compute.\n" + call) + [eos], text_ids(tok, "42") + [eos]])
    tools = [{"type": "function", "function": {"name": "python", "description": "run python",
                                               "parameters": {"type": "object",
                                                              "properties": {"code": {"type": "string"}}}}}]

    async def agent(client, sess):
        msgs = [{"role": "user", "content": "6*7?"}]
        r1 = await client.chat.completions.create(model="m", messages=msgs, tools=tools, logprobs=True)
        m = r1.choices[0].message
        msgs += [m.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "42\n"}]
        r2 = await client.chat.completions.create(model="m", messages=msgs, tools=tools)
        return r1, r2

    sess, (r1, r2) = asyncio.run(with_session(engine, tok, agent))
    ch = r1.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content == "Let me compute."
    (tc,) = ch.message.tool_calls
    assert tc.type == "function" and tc.function.name == "python" and tc.id.startswith("call_")
    assert json.loads(tc.function.arguments) == {"code": "print(6*7)"}
    assert [x.logprob for x in ch.logprobs.content] == [-0.5] * len(engine.outputs[0])
    assert r2.choices[0].message.content == "42" and r2.choices[0].message.tool_calls is None
    its = list(sess.interactions.values())
    assert its[1].parent == its[0].id  # the tool turn continued token-exactly
    new = engine.prompts[1][len(engine.prompts[0]) + len(engine.outputs[0]):]
    assert tok.decode(new, skip_special_tokens=False) == "\n<|im_start|>tool\n42\n<|im_end|>\n<|im_start|>assistant\n"


def test_parse_tool_calls_keeps_what_does_not_parse():
    assert parse_tool_calls("hi") == ("hi", [])
    content, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
                                      '<tool_call>{broken</tool_call>')
    assert content == "<tool_call>{broken</tool_call>" and calls[0]["function"] == {"name": "f", "arguments": '{"x": 1}'}


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": True}, "stream"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "frobnicate": 1}, "frobnicate"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice"),
])
def test_bad_requests_name_the_parameter(body, param):
    with pytest.raises(OpenAIError) as e:
        parse_chat_request(body)
    assert e.value.status == 400 and e.value.param == param and e.value.body()["error"]["type"] == "invalid_request_error"


def test_a_request_samples_at_the_runs_settings_and_other_settings_are_refused_naming_the_rollout_key(tok):
    """Issue 41's holes: an agent that sends no temperature sampled at OpenAI's 1.0 while the trainer recomputed
    at rollout.temperature (weights 0.77-1.46 with unchanged weights); top_p 0.8 was served with untruncated
    behaviour logprobs (w = 1 where the true ratio averages 0.8)."""
    from areal_cli.agents.openai_schema import ChatRequest
    from areal_cli.agents.proxy import run_sampling

    base = SamplingParams(16, temperature=0.6)
    msgs = [{"role": "user", "content": "x"}]
    assert run_sampling(ChatRequest(msgs), base) == {"temperature": 0.6, "top_p": 1.0, "top_k": -1}
    assert run_sampling(ChatRequest(msgs, temperature=0.6, top_p=1.0, top_k=-1), base)["temperature"] == 0.6
    for kw, param in (({"temperature": 1.0}, "temperature"), ({"top_p": 0.8}, "top_p"), ({"top_k": 20}, "top_k")):
        with pytest.raises(OpenAIError) as e:
            run_sampling(ChatRequest(msgs, **kw), base)
        assert e.value.status == 400 and e.value.param == param and "rollout." + param in e.value.message
        assert "leave '" + param + "' out" in e.value.message
        # a held-out evaluation trains on nothing: the agent's own settings are used there
        assert run_sampling(ChatRequest(msgs, **kw), base, evaluating=True)[param] == kw[param]
    assert run_sampling(ChatRequest(msgs), base, evaluating=True) == {"temperature": 0.6, "top_p": 1.0, "top_k": -1}

    engine = Scripted([[tok.eos_token_id]])

    async def agent(client, sess):
        with pytest.raises(openai.BadRequestError, match="'top_p' 0.8 differs from the run's sampling"):
            await client.chat.completions.create(model="m", messages=msgs, top_p=0.8)
        await client.chat.completions.create(model="m", messages=msgs)  # no temperature: the run's
        return None

    asyncio.run(with_session(engine, tok, agent))
    assert len(engine.params) == 1 and engine.params[0].temperature == 1.0 and engine.params[0].top_p == 1.0


#: Bodies that once gave 500s with tracebacks: invalid UTF-8, an integer past Python's 4300-digit limit, nesting too
#: deep to parse, and a lone surrogate (which no tokenizer can encode).
HOSTILE_BODIES = (
    b'{"messages": "\xff"}',
    b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": ' + b"9" * 5000 + b"}",
    b"[" * 100_000,
    b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
)


def test_bad_input_is_a_400_with_an_openai_error_body_never_a_traceback(tok):
    engine = Scripted([[tok.eos_token_id]])

    async def agent(client, sess):
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], n=2)
        assert e.value.status_code == 400 and e.value.body["param"] == "n"
        with pytest.raises(openai.BadRequestError, match="single-token stop"):
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                 stop=["two words"])
        async with httpx.AsyncClient(trust_env=False) as h:
            r = await h.post(sess.base_url + "/chat/completions", content=b"{not json")
            assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
            for raw in HOSTILE_BODIES:
                r = await h.post(sess.base_url + "/chat/completions", content=raw)
                assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", (raw[:40], r.text)
            r = await h.post(sess.base_url.replace(sess.id, "nope") + "/chat/completions", json={})
            assert r.status_code == 404 and r.json()["error"]["message"]
        return None

    sess, _ = asyncio.run(with_session(engine, tok, agent))
    assert not sess.interactions and not engine.prompts


def test_max_total_tokens_caps_the_budget_and_refuses_a_full_context(tok):
    engine = Scripted([[tok.eos_token_id]])
    msgs = [{"role": "user", "content": "x"}]
    n_prompt = len(text_ids(tok, tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)))

    async def agent(client, sess):
        await client.chat.completions.create(model="m", messages=msgs, max_tokens=100)
        sess.max_total_tokens = n_prompt
        with pytest.raises(openai.BadRequestError, match="no room left"):
            await client.chat.completions.create(model="m", messages=msgs)

    asyncio.run(with_session(engine, tok, agent, max_total_tokens=n_prompt + 3))
    assert engine.params[0].max_new_tokens == 3


# ------------------------------------------------------------------------------------------- the workflow
class TwoTurnAgent:
    """Answers, is told it is wrong, answers again; returns 1.0 iff the last answer is '321'."""

    def __init__(self, feedback: str = "Wrong. Try again."):
        self.feedback = feedback

    async def run(self, client, item):
        msgs = [{"role": "user", "content": item.fields["question"]}]
        r = await client.chat.completions.create(model="m", messages=msgs)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": self.feedback}]
        r = await client.chat.completions.create(model="m", messages=msgs)
        return 1.0 if r.choices[0].message.content == "321" else 0.0


async def final_only_agent(client, item):
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
    return None  # scored by the task's reward function


def test_agent_workflow_turns_an_agent_into_a_group(tok):
    eos = tok.eos_token_id
    engine = Scripted([ids_of(tok, "1") + [eos], ids_of(tok, "3", "2", "1") + [eos]] * 2)
    item = Item("q", [1, 2], "p", {"question": "reverse 123", "answer": "321"})
    wf = AgentWorkflow("test_openai_agent:TwoTurnAgent", turn_discount=0.5, export_style="individual", n_samples=1)

    async def run():
        ep, _ = episode(engine, tok)
        try:
            return await wf.arun_episode(ep, item)
        finally:
            await wf.aclose()

    g = asyncio.run(run())
    assert g.group_id == 5 and [s.reward for s in g.samples] == [0.5, 1.0]
    assert all(s.check() is None for s in g.samples)

    wf2 = make_workflow("areal_cli.agents.workflow:AgentWorkflow",
                        {"agent": "test_openai_agent:final_only_agent", "export_style": "concat"})

    async def run2():
        ep, pool = episode(Scripted([ids_of(tok, "7") + [eos]]), tok, verdict=lambda text, k, f: float(text == "7"),
                           group_size=2)
        try:
            return await wf2.arun_episode(ep, item), pool
        finally:
            await wf2.aclose()

    g2, pool = asyncio.run(run2())
    assert [s.reward for s in g2.samples] == [1.0, 1.0] and len(pool.calls) == 2
    assert pool.calls[0][0] == "7" and pool.calls[0][2] == ids_of(tok, "7") + [eos]


class BadAgent:
    async def run(self, client, item):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
        return "great"


def test_a_reward_of_the_wrong_type_and_bad_workflow_args_are_one_line_errors(tok):
    from areal_cli.foundations.errors import UserError

    wf = AgentWorkflow(BadAgent)

    async def run():
        ep, _ = episode(Scripted([[tok.eos_token_id]]), tok)
        try:
            return await wf.arun_episode(ep, Item("q", [1], "p", {}))
        finally:
            await wf.aclose()

    with pytest.raises(WorkflowError, match="returned a str"):
        asyncio.run(run())
    with pytest.raises(UserError, match="workflow_args.export_style"):
        AgentWorkflow(BadAgent, export_style="flat")
    with pytest.raises(UserError, match="workflow_args.agent"):
        AgentWorkflow("test_openai_agent:NoSuchAgent")
    with pytest.raises(UserError, match="has no 'async def run"):
        AgentWorkflow(object())


# ------------------------------------------------------------------------------------------- real servers
@pytest.fixture(scope="module")
def server(dirs, tmp_path_factory):
    srv = spawn_server(dirs[0], tmp_path_factory, max_total_tokens=4096, step_delay_s=0.01)
    yield srv
    srv.stop()


@pytest.mark.multiproc
def test_embedded_server_serves_v1_chat_completions_to_the_openai_client(server, dirs):
    from areal_cli.models.tiny import load_tokenizer

    tok = load_tokenizer(dirs[0])
    msgs = [{"role": "user", "content": "reverse 123"}]

    async def run():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0,
                                    http_client=httpx.AsyncClient(trust_env=False))
        try:
            r = await client.chat.completions.create(model="tiny", messages=msgs, temperature=0, max_tokens=12,
                                                     logprobs=True)
            with pytest.raises(openai.BadRequestError) as e:
                await client.chat.completions.create(model="tiny", messages=msgs, n=3)
            async with httpx.AsyncClient(trust_env=False) as h:
                for raw in HOSTILE_BODIES:
                    bad = await h.post(server.url + "/v1/chat/completions", content=raw)
                    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error", bad.text
            return r, e.value
        finally:
            await client.close()

    r, err = asyncio.run(run())
    prompt = text_ids(tok, tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
    assert r.usage.prompt_tokens == len(prompt) and 1 <= r.usage.completion_tokens <= 12
    assert r.choices[0].finish_reason in ("stop", "length") and len(r.choices[0].logprobs.content) == \
        r.usage.completion_tokens and r.model == "tiny"
    # the same greedy tokens as /generate on the rendered prompt
    g = httpx.post(server.url + "/generate", json={"input_ids": prompt, "return_logprob": True, "sampling_params": {
        "max_new_tokens": 12, "temperature": 0, "stop_token_ids": [tok.eos_token_id]}}, trust_env=False).json()
    assert r.usage.completion_tokens == len(g["output_ids"])
    assert [x.logprob for x in r.choices[0].logprobs.content] == pytest.approx(
        [t[0] for t in g["meta_info"]["output_token_logprobs"]], abs=1e-5)
    assert err.status_code == 400 and err.body["param"] == "n"


def _proxy_against(url: str, dirs, update: bool):
    """Two greedy turns through the proxy + RolloutClient to ``url``; with ``update`` a weight update lands
    inside the second response. Returns (session, the raw /generate answer of the first prompt)."""
    from areal_cli.models.tiny import load_tokenizer

    tok = load_tokenizer(dirs[0])
    vocab = json.loads((dirs[0] / "config.json").read_text())["vocab_size"]

    async def run():
        rc = RolloutClient([url], vocab_size=vocab)
        proxy = await OpenAIProxy.start()
        ep = EpisodeClient(rc, None, "", tok, SamplingParams(40, temperature=0.0, ignore_eos=True), 1)
        sess = proxy.open_session(ep)
        client = oai(sess.base_url)
        try:
            msgs = [{"role": "user", "content": "reverse 5303"}]
            r1 = await client.chat.completions.create(model="m", messages=msgs, temperature=0)
            msgs += [r1.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
            task = asyncio.create_task(client.chat.completions.create(model="m", messages=msgs, temperature=0))
            if update:
                await wait_generating(url)  # >= 5 tokens into the second response, far from its 40
                await rc.update_weights_from_disk(str(dirs[1]), 1)
            await task
            return sess
        finally:
            if update:
                await rc.update_weights_from_disk(str(dirs[0]), 0)
            await client.close()
            await proxy.aclose()
            await rc.aclose()

    sess = asyncio.run(run())
    first = list(sess.interactions.values())[0]
    g = httpx.post(url + "/generate", json={"input_ids": first.prompt_ids, "return_logprob": True, "sampling_params": {
        "max_new_tokens": 40, "temperature": 0, "ignore_eos": True}}, trust_env=False).json()
    return sess, g


@pytest.mark.multiproc
def test_proxy_records_exact_ids_and_versions_through_a_weight_update(server, dirs):
    sess, g = _proxy_against(server.url, dirs, update=True)
    a, b = sess.interactions.values()
    assert a.output_ids == g["output_ids"]  # what the server generated, verbatim
    assert a.completion.output_logprobs == pytest.approx([t[0] for t in g["meta_info"]["output_token_logprobs"]],
                                                         abs=1e-5)
    vers = b.completion.output_versions
    assert b.parent == a.id and b.completion.n_interruptions == 1 and vers[0] == 0 and vers[-1] == 1
    sess.set_reward(b.id, 1.0)
    sess.apply_discount(1.0)
    (c,) = sess.export("concat")
    assert c.check() is None and c.head_version == 0 and sum(c.loss_mask) == 80


@pytest.mark.multiproc
def test_an_agent_that_sets_no_temperature_gets_importance_weights_of_1_at_the_runs_temperature(server, dirs):
    """Issue 41 item 5: at rollout.temperature 0.6 with unchanged weights, the agent path gave behaviour weights of
    0.77-1.46 (the proxy sampled at OpenAI's 1.0, the trainer recomputed at 0.6). Now the agent's request without a
    temperature samples at the run's, and the trainer's recompute (HF, log_softmax(logits / 0.6)) gives w = 1."""
    from transformers import AutoModelForCausalLM

    from areal_cli.models.tiny import load_tokenizer
    from helpers.hf_reference import hf_logprobs

    tok = load_tokenizer(dirs[0])
    vocab = json.loads((dirs[0] / "config.json").read_text())["vocab_size"]

    async def run():
        rc = RolloutClient([server.url], vocab_size=vocab)
        proxy = await OpenAIProxy.start()
        ep = EpisodeClient(rc, None, "", tok, SamplingParams(24, temperature=0.6, ignore_eos=True, seed=3), 1)
        sess = proxy.open_session(ep)
        client = oai(sess.base_url)
        try:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "reverse 5303"}])
            return sess
        finally:
            await client.close()
            await proxy.aclose()
            await rc.aclose()

    (it,) = asyncio.run(run()).interactions.values()
    model = AutoModelForCausalLM.from_pretrained(dirs[0], torch_dtype=torch.float32).eval()
    behaviour = torch.tensor(it.completion.output_logprobs, dtype=torch.float64)
    at_run = torch.tensor(hf_logprobs(model, it.prompt_ids, it.output_ids, 0.6), dtype=torch.float64)
    at_openai_default = torch.tensor(hf_logprobs(model, it.prompt_ids, it.output_ids, 1.0), dtype=torch.float64)
    w = (at_run - behaviour).exp()
    assert len(it.output_ids) == 24 and float((w - 1).abs().max()) < 1e-3, w
    assert float((at_openai_default - behaviour).exp().sub(1).abs().max()) > 0.05  # the test can tell them apart


@pytest.mark.multiproc
def test_proxy_in_front_of_the_sglang_stand_in(dirs, tmp_path):
    from areal_cli.foundations.ports import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([FAKE_SGLANG, str(Path(__file__).resolve().parents[1])])}
    log = open(tmp_path / "sglang.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--model-path", str(dirs[0]), "--port",
                             str(port), "--skip-tokenizer-init", "--max-total-tokens", "4096"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            assert proc.poll() is None and time.monotonic() - t0 < 120, (tmp_path / "sglang.log").read_text()[-2000:]
            try:
                if httpx.get(url + "/health", trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        sess, g = _proxy_against(url, dirs, update=False)
        a, b = sess.interactions.values()
        assert a.output_ids == g["output_ids"] and b.parent == a.id
        assert b.prompt_ids[: len(a.prompt_ids) + 40] == a.prompt_ids + a.output_ids
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=10)
        log.close()


def test_a_request_the_server_refuses_as_too_long_is_the_clients_400_not_a_502(tok):
    """The rollout server answers HTTP 400 for a prompt or budget beyond its context: the agent gets an OpenAI
    400 ``context_length_exceeded`` (so it can shorten its history), not a 502 server error."""
    from areal_cli.rollout.protocol import ServerError

    class TooLong(Scripted):
        async def generate(self, prompt_ids, params, rid=None):
            raise ServerError(400, "Requested token count exceeds the model's maximum context length of 2048 tokens",
                              "http://127.0.0.1:1")

    async def agent(client, sess):
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                                 max_tokens=10**12)
        assert e.value.status_code == 400 and e.value.body["code"] == "context_length_exceeded"
        return None

    asyncio.run(with_session(TooLong([[tok.eos_token_id]]), tok, agent))
