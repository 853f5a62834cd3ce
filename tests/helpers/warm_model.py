"""The warm model of the training tests: the tiny-arith recipe's model after 30 SFT warm-start steps, so that
RL rewards are neither all 0 nor all 1 and a training step has a gradient to follow."""

from __future__ import annotations

from pathlib import Path

# `areal train` overrides for a deterministic 3-step run from the warm model (eta 0, greedy, global advantage
# normalisation, no warm start): runs that differ only in their parallel layout must match step by step
SYNC = ["rollout.max_head_offpolicyness=0", "rollout.temperature=0", "ppo.adv_norm=global", "rollout.success_rate_lb=0", "rollout.success_rate_ub=1",
        "rollout.group_size=1", "sft.max_steps=0", "rollout.batch_size=8", "loop.eval_n_prompts=16", "loop.target_accuracy=0",
        "parallel.torch_threads=1", "loop.max_steps=3"]


def build_warm_model(d: Path) -> Path:
    """The tiny recipe's model after 30 warm-start (SFT stage) steps, saved as HF under ``d / "warm"``
    (its base under ``d / "base"``): rewards are neither all 0 nor all 1."""
    from areal_cli.recipes import load_train_config
    from areal_cli.models.tiny import build_tiny_model, load_tokenizer
    from areal_cli.sft.stage import SftConfig, SftStage
    from areal_cli.tasks.task import Task
    from areal_cli.trainer.megatron_engine import MegatronEngine

    cfg, _ = load_train_config("tiny-arith")
    task = Task(cfg)
    base = build_tiny_model(d / "base", seed=cfg.seed, corpus=task.tokenizer_corpus())
    tok = load_tokenizer(base)
    task.bind(tok)
    eng = MegatronEngine(base, lr=cfg.sft.lr, seed=cfg.seed)
    exs = [(item.prompt_ids, tok.encode(t, add_special_tokens=False) + [tok.eos_token_id])
           for item, t in task.sft_examples(cfg.sft.n_examples)]
    stage = SftStage(eng, exs, SftConfig.from_train_config(cfg), pad_id=tok.pad_token_id)
    for _ in range(30):
        stage.step()
    return eng.save_hf(d / "warm")
