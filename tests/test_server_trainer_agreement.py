"""Rollout server logprobs vs Megatron trainer recomputation, before and after a weight update."""

import asyncio

import pytest
import torch

from areal_cli.models.tiny import build_tiny_model, chat_prompt_ids, load_tokenizer
from areal_cli.rollout.client import RolloutClient
from areal_cli.rollout.protocol import SamplingParams
from areal_cli.rollout.server import EmbeddedServer
from areal_cli.tasks import tiny_arith
from areal_cli.trainer.batch import build_train_batch
from areal_cli.trainer.megatron_engine import MegatronEngine

pytestmark = pytest.mark.multiproc  # every test here starts processes


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = build_tiny_model(tmp_path_factory.mktemp("m") / "base", seed=3, corpus=tiny_arith.tokenizer_corpus())
    tok = load_tokenizer(d)
    prompts = [chat_prompt_ids(tok, p.prompt) for p in tiny_arith.sample_problems("train", 6, seed=0)]
    engine = MegatronEngine(d, lr=1e-2, seed=0)
    with EmbeddedServer.launch(d, seed=0) as srv:
        yield d, prompts, engine, srv, tmp_path_factory.mktemp("w")


def _generate(srv, prompts, vocab, temperature):
    async def go():
        c = RolloutClient([srv.url], vocab_size=vocab)
        try:
            groups = await asyncio.gather(*(c.generate_group(p, 2, SamplingParams(12, temperature=temperature))
                                            for p in prompts))
        finally:
            await c.aclose()
        return [s for g in groups for s in g]

    return asyncio.run(go())


def _max_diff(engine, comps, temperature):
    batch = build_train_batch([(c.prompt_ids, c.output_ids, c.output_logprobs, c.output_versions) for c in comps])
    recomputed = engine.logprobs(batch, temperature=temperature)
    m = batch.loss_mask.bool()
    return (recomputed[m] - batch.behaviour_logprobs[m]).abs().max().item(), int(m.sum())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_server_logprobs_match_trainer_recomputation(setup, temperature):
    d, prompts, engine, srv, _ = setup
    comps = _generate(srv, prompts, engine.vocab_size, temperature)
    diff, n = _max_diff(engine, comps, temperature)
    assert n > 50
    assert diff <= 1e-4, diff


def test_after_a_train_step_and_weight_update_server_logprobs_match_new_trainer_weights(setup):
    d, prompts, engine, srv, wdir = setup
    comps = _generate(srv, prompts, engine.vocab_size, 1.0)
    batch = build_train_batch([(c.prompt_ids, c.output_ids, c.output_logprobs, c.output_versions) for c in comps])
    n = batch.n_loss_tokens
    before = engine.logprobs(batch)
    engine.train_step([batch], lambda lp, mb: -(lp * mb.loss_mask).sum() / n)
    after = engine.logprobs(batch)
    assert (after - before).abs().max() > 1e-2  # the update really changed the policy
    path = engine.save_hf(wdir / "v1")

    async def sync():
        c = RolloutClient([srv.url], vocab_size=engine.vocab_size)
        try:
            await c.update_weights_from_disk(str(path), 1)
        finally:
            await c.aclose()

    asyncio.run(sync())
    comps2 = _generate(srv, prompts, engine.vocab_size, 1.0)
    assert {v for c in comps2 for v in c.output_versions} == {1}
    diff, _ = _max_diff(engine, comps2, 1.0)
    assert diff <= 1e-4, diff
    torch.testing.assert_close(after, engine.logprobs(batch))  # recomputation is deterministic
