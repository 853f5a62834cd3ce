"""A PPO trainer step with megatron's DotProductAttention vs the fused SdpaDotProductAttention, side by side.

One tiny-longtail-shaped batch (16 prompts x 4 samples; answer lengths 6 m tokens with m the 16 quantiles of the
task's lognormal, median 3, log-sd 1.5, capped at 64: 6-294 tokens), the recipe's model shape (hidden 128, 2
layers, GQA 4/2 heads), packed into micro-batches of 4096 tokens as the recipe trains, one thread. The two
attention classes alternate (ABAB...) on the same engine and batch; prints seconds per step and their ratio and
writes JSON. Run: ``.venv/bin/python benchmarks/trainer_attention.py [--repeats 5] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from statistics import NormalDist


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="timed steps per attention class (default 5)")
    ap.add_argument("--out", default="benchmarks/results/trainer_attention.json", help="JSON result file")
    args = ap.parse_args()

    import torch
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from areal_cli.models.tiny import build_tiny_model
    from areal_cli.recipes import load_train_config
    from areal_cli.tasks.task import Task
    from areal_cli.trainer.advantages import broadcast_to_tokens
    from areal_cli.trainer.batch import build_train_batch
    from areal_cli.trainer.megatron_engine import MegatronEngine
    from areal_cli.trainer.sdpa_attention import SdpaDotProductAttention
    from areal_cli.trainer.steps import ppo_update

    torch.set_num_threads(1)
    cfg, _ = load_train_config("tiny-longtail")
    task = Task(cfg)
    base = build_tiny_model(Path(tempfile.mkdtemp()) / "base", seed=1, corpus=task.tokenizer_corpus(),
                            vocab_size=cfg.model.vocab_size, hidden_size=cfg.model.hidden_size,
                            num_layers=cfg.model.num_layers)
    eng = MegatronEngine(base, lr=cfg.ppo.lr, seed=1)
    g = torch.Generator().manual_seed(0)
    ms = [min(64, max(1, round(3 * math.exp(1.5 * NormalDist().inv_cdf((i + 0.5) / 16))))) for i in range(16)]
    vocab = eng.vocab_size
    samples = []
    for m in ms:
        for _ in range(cfg.rollout.group_size):
            n = 6 * m
            ids = torch.randint(3, vocab, (12 + n,), generator=g).tolist()
            samples.append((ids[:12], ids[12:], [-1.0] * n, [0] * n))
    batch = build_train_batch(samples, pad_id=0)
    batch.advantages = broadcast_to_tokens(torch.randn(len(samples), generator=g), batch.loss_mask)
    cores = [layer.self_attention.core_attention for layer in eng.model.decoder.layers]

    def step(cls) -> float:
        for c in cores:
            c.__class__ = cls
        b = copy.deepcopy(batch)
        t = time.perf_counter()
        ppo_update(eng, b, cfg, trainer_version=0)
        return time.perf_counter() - t

    classes = {"megatron": DotProductAttention, "fused": SdpaDotProductAttention}
    for cls in classes.values():  # warm-up
        step(cls)
    times: dict[str, list[float]] = {k: [] for k in classes}
    for _ in range(args.repeats):
        for name, cls in classes.items():
            times[name].append(step(cls))
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {"tokens": int(batch.attention_mask.sum()), "answer_lengths": sorted(6 * m for m in ms),
           "s_per_step": times, "median_s": med, "megatron_over_fused": med["megatron"] / med["fused"],
           "torch": torch.__version__}
    print(f"PPO step, {res['tokens']} tokens: megatron attention {med['megatron']:.3f} s, fused "
          f"{med['fused']:.3f} s, ratio {res['megatron_over_fused']:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
