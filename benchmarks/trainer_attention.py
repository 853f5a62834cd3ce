"""A PPO trainer step with megatron's DotProductAttention vs the fused SdpaDotProductAttention, side by side; and the
fused one with the packed micro-batch split into width classes (the default) vs one width for all sequences.

One batch of the tiny-longtail task as the recipe trains it: the first stratified block of the task's training
stream (16 prompts, one per length stratum of its lognormal, rendered with the recipe's tokenizer and template) x
4 samples, each answer the exact expected answer plus eos; the recipe's model shape (hidden 128, 2 layers, GQA 4/2
heads), packed into micro-batches as the recipe trains, one thread. The three variants (megatron's attention, the fused
one, the fused one with ``ppo.pack_width_classes: false``) alternate on the same engine and batch; prints seconds per step and their ratio and writes JSON. Run: ``.venv/bin/python benchmarks/trainer_attention.py [--repeats 9] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=9, help="timed steps per variant (default 9)")
    ap.add_argument("--out", default="benchmarks/results/trainer_attention.json", help="JSON result file")
    args = ap.parse_args()

    import torch
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from areal_cli.models.tiny import build_tiny_model, load_tokenizer
    from areal_cli.recipes import load_train_config
    from areal_cli.tasks.task import Task
    from areal_cli.tasks.tiny_longtail import STRATA
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
    tok = load_tokenizer(base)
    task.bind(tok)
    stream = task.train_stream()
    items = [next(stream) for _ in range(STRATA)]
    samples = []
    for it in items:
        answer = tok.encode(it.fields["answer"], add_special_tokens=False) + [tok.eos_token_id]
        for _ in range(cfg.rollout.group_size):
            samples.append((list(it.prompt_ids), answer, [-1.0] * len(answer), [0] * len(answer)))
    lengths = sorted(len(s[1]) for s in samples[::cfg.rollout.group_size])
    batch = build_train_batch(samples, pad_id=tok.pad_token_id)
    batch.advantages = broadcast_to_tokens(torch.randn(len(samples), generator=g), batch.loss_mask)
    cores = [layer.self_attention.core_attention for layer in eng.model.decoder.layers]

    one_width = cfg.with_values({"ppo.pack_width_classes": False})

    def step(cls, width_classes: bool = True) -> float:
        for c in cores:
            c.__class__ = cls
        b = copy.deepcopy(batch)
        t = time.perf_counter()
        ppo_update(eng, b, cfg if width_classes else one_width, trainer_version=0)
        return time.perf_counter() - t

    classes = {"megatron": (DotProductAttention, True), "fused": (SdpaDotProductAttention, True),
               "fused_one_width": (SdpaDotProductAttention, False)}
    for cls, wc in classes.values():  # warm-up
        step(cls, wc)
    times: dict[str, list[float]] = {k: [] for k in classes}
    for _ in range(args.repeats):
        for name, (cls, wc) in classes.items():
            times[name].append(step(cls, wc))
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {"tokens": int(batch.attention_mask.sum()), "answer_lengths": lengths,
           "s_per_step": times, "median_s": med, "megatron_over_fused": med["megatron"] / med["fused"],
           "one_width_over_width_classes": med["fused_one_width"] / med["fused"], "torch": torch.__version__}
    print(f"PPO step, {res['tokens']} tokens: megatron attention {med['megatron']:.3f} s, fused "
          f"{med['fused']:.3f} s, ratio {res['megatron_over_fused']:.2f}x; fused with one packing width "
          f"{med['fused_one_width']:.3f} s, {res['one_width_over_width_classes']:.2f}x the width classes'")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
