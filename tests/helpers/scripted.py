"""Rollout clients that answer from a script (no model, no server), the reward pool stand-in that records
each call, and the episode clients the workflow and agent tests drive with them."""

from __future__ import annotations

from areal_cli.api.types import Item
from areal_cli.reward.pool import RewardResult
from areal_cli.rollout.client import Completion
from areal_cli.rollout.episode import EpisodeClient
from areal_cli.rollout.protocol import SamplingParams


class ScriptedEngine:
    """A rollout client answering turn k of every conversation with ``outputs[k]`` (ids), logprob -0.25 - k and
    version 3 + k; records every prompt it was given. The turn is read off the prompt: ChatML opens two messages
    (``<|im_start|>``, id 1) per turn."""

    def __init__(self, outputs, im_start: int = 1):
        self.outputs = outputs
        self.im_start = im_start
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids, params, rid=None):
        self.prompts.append(list(prompt_ids))
        k = list(prompt_ids).count(self.im_start) // 2 - 1
        out = list(self.outputs[min(k, len(self.outputs) - 1)])
        return Completion(list(prompt_ids), out, [-0.25 - k] * len(out), [3 + k] * len(out), "stop", 0, "fake")

    async def generate_group(self, prompt_ids, n, params, rid=None):
        return [await self.generate(prompt_ids, params, f"{rid}.{i}") for i in range(n)]


class Rewards:
    """The reward pool's ``call``: ``verdict(completion_text, turn)`` per call, counted per conversation by the
    number of calls seen so far (one conversation at a time)."""

    def __init__(self, verdict):
        self.verdict = verdict
        self.calls: list[tuple[str, list[int], list[int]]] = []

    async def call(self, fn, spec, code_dir, prompt, completion, prompt_ids, completion_ids, fields):
        self.calls.append((completion, list(prompt_ids), list(completion_ids)))
        return RewardResult(float(self.verdict(completion, len(self.calls) - 1, fields)), "ok")


def episode_client(engine, tokenizer, verdict, *, group_size=1, rid_prefix="g", max_new_tokens=8):
    """(EpisodeClient over ``engine`` scored by ``Rewards(verdict)``, that Rewards): stops at the EOS id."""
    pool = Rewards(verdict)
    stop = [tokenizer.eos_token_id]
    return EpisodeClient(engine, pool, "tests:reward", tokenizer, SamplingParams(max_new_tokens, stop_token_ids=stop),
                         group_size, rid_prefix=rid_prefix), pool


def item_of(tokenizer, text="reverse 123", answer="321"):
    """An Item whose prompt is ``text`` as a user message under the chat template (generation prompt added)."""
    msgs = [{"role": "user", "content": text}]
    rendered = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return Item("q", tokenizer(rendered, add_special_tokens=False)["input_ids"], rendered, {"answer": answer})


def ids_of(tokenizer, *pieces):
    """Token ids of single pieces (each must be one token of the vocabulary)."""
    out = []
    for p in pieces:
        i = tokenizer.convert_tokens_to_ids(p)
        assert isinstance(i, int) and i != tokenizer.unk_token_id, p
        out.append(i)
    return out


class Scripted:
    """A rollout client answering the k-th request of the test with ``outputs[k]`` (token ids), logprob
    -0.5 - k and version 7 + k; records every prompt."""

    def __init__(self, outputs):
        self.outputs, self.prompts, self.params = outputs, [], []

    async def generate(self, prompt_ids, params, rid=None):
        k = len(self.prompts)
        self.prompts.append(list(prompt_ids))
        self.params.append(params)
        out = list(self.outputs[min(k, len(self.outputs) - 1)])
        return Completion(list(prompt_ids), out, [-0.5 - k] * len(out), [7 + k] * len(out), "stop", 0, "fake")


def episode(engine, tok, verdict=lambda *a: 1.0, group_size=1, max_new_tokens=16):
    """(EpisodeClient of episode 5 over ``engine`` scored by ``Rewards(verdict)``, that Rewards)."""
    pool = Rewards(verdict)
    return EpisodeClient(engine, pool, "t:r", tok, SamplingParams(max_new_tokens, stop_token_ids=[tok.eos_token_id]),
                         group_size, episode_id=5), pool


def text_ids(tok, text):
    """Token ids of ``text`` without special tokens."""
    return tok(text, add_special_tokens=False)["input_ids"]
