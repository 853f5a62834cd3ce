"""Continuous batching (the embedded server) vs Hugging Face static ``generate`` on one variable-length workload."""

from __future__ import annotations

import os
import time
from pathlib import Path


def generation_workload(vocab_size: int, n_prompts: int, min_new_tokens: int, max_new_tokens: int,
                        seed: int) -> tuple[list[list[int]], list[int]]:
    """Deterministic variable-length workload: prompt i has 4 + (7i mod 37) random ids in [3, V) and a
    budget of ``min + (37 i mod (max - min + 1))`` new tokens (defaults: prompts 4-40, budgets 16-256)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab_size, (4 + (i * 7) % 37,), generator=g).tolist() for i in range(n_prompts)]
    budgets = [min_new_tokens + (i * 37) % (max_new_tokens - min_new_tokens + 1) for i in range(n_prompts)]
    return prompts, budgets


def compare_generation(model_dir: str | Path, *, n_prompts: int = 32, min_new_tokens: int = 16,
                       max_new_tokens: int = 256, seed: int = 0, hf_per_prompt: bool = True,
                       cpus: str = "") -> dict:
    """Embedded server (continuous batching, all prompts sent at once) vs HF ``generate`` on one workload.

    Greedy, ``ignore_eos``, one torch thread each; tokens/s = useful tokens (sum of budgets) / wall s. HF
    static batching: one left-padded batch decoded to the largest budget (the finished rows keep computing);
    ``hf_per_prompt`` also times HF one prompt at a time (each only as long as its budget) and checks that
    the server's greedy outputs equal HF's. ``cpus``: pin this process and the server to these cpus (both
    sides then run on the same core, one after the other).

    Returns:
        ``{"workload", "embedded_server", "hf_static_batch", "hf_per_prompt", "continuous_over_static",
        "greedy_identical"}`` with seconds and tokens/s for each side.
    Raises:
        RuntimeError: the server did not return exactly the budgeted number of tokens.
    """
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from areal_cli.config import parse_cpu_list
    from areal_cli.train_loop.processes import pin_process
    from areal_cli.rollout.client import RolloutClient
    from areal_cli.rollout.protocol import SamplingParams
    from areal_cli.rollout.server import EmbeddedServer

    pin = parse_cpu_list(cpus)
    before = os.sched_getaffinity(0) if pin else None
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if pin:
            pin_process(0, pin)
        hf_logging.disable_progress_bar()
        hf = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
        V = hf.config.vocab_size
        prompts, budgets = generation_workload(V, n_prompts, min_new_tokens, max_new_tokens, seed)
        useful = sum(budgets)
        with EmbeddedServer.launch(model_dir, num_threads=1, max_running_requests=max(64, n_prompts)) as srv:
            if pin:
                pin_process(srv.proc.pid, pin)

            async def run():
                c = RolloutClient([srv.url], vocab_size=V)
                try:
                    await c.generate(prompts[0], SamplingParams(4, temperature=0.0))  # warm-up
                    t = time.perf_counter()
                    outs = await asyncio.gather(*(
                        c.generate(p, SamplingParams(m, temperature=0.0, ignore_eos=True))
                        for p, m in zip(prompts, budgets)))
                    return outs, time.perf_counter() - t
                finally:
                    await c.aclose()

            outs, dt_srv = asyncio.run(run())
        if sum(len(o.output_ids) for o in outs) != useful:
            raise RuntimeError("the server did not generate exactly the budgeted tokens")

        hf.generation_config.eos_token_id = None  # = ignore_eos (min_new_tokens would MASK eos instead)
        pad = hf.config.pad_token_id if hf.config.pad_token_id is not None else 0
        L = max(map(len, prompts))
        ids = torch.full((n_prompts, L), pad)
        mask = torch.zeros(n_prompts, L, dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding; HF derives position_ids from the mask
            ids[i, L - len(p):] = torch.tensor(p)
            mask[i, L - len(p):] = 1
        with torch.no_grad():
            hf.generate(ids[:2], attention_mask=mask[:2], max_new_tokens=4, do_sample=False, pad_token_id=pad)
            t = time.perf_counter()
            hf.generate(ids, attention_mask=mask, max_new_tokens=max(budgets), do_sample=False, pad_token_id=pad)
            dt_hf = time.perf_counter() - t
            per_prompt = None
            if hf_per_prompt:
                t = time.perf_counter()
                seq = [hf.generate(torch.tensor([p]), max_new_tokens=m, do_sample=False,
                                   pad_token_id=pad)[0, len(p):].tolist() for p, m in zip(prompts, budgets)]
                dt_seq = time.perf_counter() - t
                per_prompt = {"seconds": dt_seq, "tokens_per_s": useful / dt_seq}
                same = sum(o.output_ids == s for o, s in zip(outs, seq))
    finally:
        torch.set_num_threads(threads)
        if before is not None:
            pin_process(0, frozenset(before))
    return {
        "workload": {"n_prompts": n_prompts, "prompt_lengths": [min(map(len, prompts)), max(map(len, prompts))],
                     "budgets": [min(budgets), max(budgets)], "useful_tokens": useful, "greedy": True,
                     "ignore_eos": True, "seed": seed, "torch_threads": 1, "cpus": cpus or None},
        "embedded_server": {"seconds": dt_srv, "tokens_per_s": useful / dt_srv},
        "hf_static_batch": {"seconds": dt_hf, "tokens_per_s": useful / dt_hf,
                            "computed_tokens_per_s": n_prompts * max(budgets) / dt_hf},
        "hf_per_prompt": per_prompt,
        "continuous_over_static": dt_hf / dt_srv,
        "greedy_identical": f"{same}/{n_prompts}" if per_prompt else None,
    }
