"""Parity run of MegatronEngine: logprobs, 3 PPO-like train steps, final HF weights -> RANK's .pt file.

Run under torchrun (e.g. ``--nproc-per-node 2``, gloo) with ``--tp`` / ``--pp`` (DP = world / (TP * PP)), or as a plain
process (world 1, the single-process reference). Every rank calls the engine with the SAME full batch
(SPMD) and writes ``<out>/rank<R>.pt`` = {"logprobs0", "logprobs", "losses", "grad_norms", "hf", "tp",
"dp", "world"} so the caller can compare each rank with the reference. Used by tests/test_parallel_engine.py.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch


def parity_batch(vocab: int):
    """Five right-padded rows (prompt/response lengths differ) with advantages and behaviour logprobs."""
    from areal_cli.trainer.batch import build_train_batch

    g = torch.Generator().manual_seed(3)
    samples, adv = [], []
    for i, (p_len, r_len) in enumerate(((3, 6), (5, 2), (2, 9), (7, 4), (4, 5))):
        ids = torch.randint(3, vocab, (p_len + r_len,), generator=g).tolist()
        behav = (-2.0 + 0.3 * torch.randn(r_len, generator=g)).tolist()
        samples.append((ids[:p_len], ids[p_len:], behav, [0] * r_len))
        adv.append(1.0 if i % 2 == 0 else -0.5)
    return build_train_batch(samples, pad_id=0, advantages=adv)


def run_parity(model_dir: str | Path, *, tp: int = 1, pp: int = 1, steps: int = 3, lr: float = 1e-4, grad_clip: float = 0.1,
               save_dir: str | Path | None = None) -> dict:
    """Build the engine, record logprobs / PPO-like train steps / HF weights; optionally ``save_hf``."""
    from areal_cli.trainer.decoupled_ppo import decoupled_ppo_loss
    from areal_cli.trainer.kl import freeze_reference, reference_logprobs
    from areal_cli.trainer.megatron_engine import MegatronEngine

    eng = MegatronEngine(model_dir, lr=lr, weight_decay=0.1, grad_clip=grad_clip, seed=0, tensor_parallel=tp,
                         pipeline_parallel=pp)
    hf_loaded = eng.hf_state_dict()  # load_hf sharded, then gathered back
    batch = parity_batch(eng.vocab_size)
    lp0 = eng.logprobs(batch)
    freeze_reference(eng)  # the KL reference (ppo.kl_ctl > 0): the weights before training, kept on every rank
    batch.proximal_logprobs = lp0 * batch.loss_mask
    n_global = batch.n_loss_tokens

    def loss_fn(lp, mb):
        return decoupled_ppo_loss(lp, mb.proximal_logprobs, mb.behaviour_logprobs, mb.advantages, mb.loss_mask,
                                  n_global)[0]

    losses, norms = [], []
    for _ in range(steps):
        # rows 2+2+1: with DP = 2 the last micro-batch leaves DP rank 1 with no rows
        out = eng.train_step(batch.split(3), loss_fn)
        losses.append(out["loss"])
        norms.append(out["grad_norm"])
    res = {"hf_loaded": hf_loaded, "logprobs0": lp0, "logprobs": eng.logprobs(batch, n_micro=2), "losses": losses,
           "grad_norms": norms, "hf": eng.hf_state_dict(), "tp": eng.tp, "pp": eng.pp, "dp": eng.dp, "world": eng.world_size}
    res["ref_logprobs"] = reference_logprobs(eng, batch, 1.0)  # the frozen weights swapped in ...
    res["logprobs_after_ref"] = eng.logprobs(batch, n_micro=2)  # ... and back
    if pp == 1:  # the critic (critic.enabled) beside the policy: values, 3 value-loss steps, values after
        res.update(critic_parity(eng, batch, n_global, steps, grad_clip))
    if save_dir is not None:
        eng.save_hf(save_dir)
    return res


def critic_parity(eng, batch, n_global: int, steps: int, grad_clip: float) -> dict:
    """The critic on ``eng`` (areal_cli.trainer.critic): its values (0: the zero head), ``steps`` optimiser steps of
    the clipped value loss towards fixed returns, the values after."""
    from areal_cli.trainer.critic import attach_critic, value_loss

    attach_critic(eng, lr=1e-3, weight_decay=0.1, grad_clip=grad_clip, seed=0)
    v0 = eng.critic.values(batch)
    batch.values, batch.returns = v0 * batch.loss_mask, (batch.advantages + 0.3) * batch.loss_mask

    def loss_fn(v, mb):
        return value_loss(v, mb.values, mb.returns, mb.loss_mask.bool(), 0.2, n_global)[0]

    losses, norms = [], []
    for _ in range(steps):
        out = eng.critic.train_step(batch.split(3), loss_fn)
        losses.append(out["loss"])
        norms.append(out["grad_norm"])
    return {"critic_values0": v0, "critic_values": eng.critic.values(batch, n_micro=2), "critic_losses": losses,
            "critic_norms": norms}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--grad-clip", type=float, default=0.1)
    a = ap.parse_args()
    torch.set_num_threads(1)
    out_dir = Path(a.out)
    res = run_parity(a.model_dir, tp=a.tp, pp=a.pp, steps=a.steps, lr=a.lr, grad_clip=a.grad_clip, save_dir=out_dir / "saved")
    torch.save(res, out_dir / f"rank{int(os.environ.get('RANK', 0))}.pt")


if __name__ == "__main__":
    main()
