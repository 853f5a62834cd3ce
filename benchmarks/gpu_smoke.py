"""GPU smoke run of the scale path (issue 6); `benchmarks/gpu_smoke.sh` installs what it needs and calls this.

1. A small Qwen3 (built here from a config, head_dim 64 so every SGLang attention kernel takes it; or
   ``--model DIR``) is trained by ``areal train`` with ``rollout.engine: sglang``: one real SGLang server
   (``python -m sglang.launch_server``) and the Megatron-core trainer on the GPU(s), a short SFT warm start,
   then ``--steps`` asynchronous RL steps (eta ``--eta``). Weight sync: ``xccl`` (NCCL broadcast) when there
   are >= 2 GPUs (the server on GPU 1, the trainer on GPU 0), else from disk -- NCCL refuses two ranks on
   one device.
2. Agreement: a fresh SGLang server on the final weights samples 32 completions (T = 1); the trainer engine
   recomputes their logprobs; max / mean |difference| per token are reported (float32 on both sides by
   default; thresholds below).
3. Step times (train, weight sync, wait for a batch) from the run's metrics.jsonl.

Output: ``OUT/gpu_smoke.json`` and a table. Exit 0 only if the run finished and the agreement is within
the thresholds. ``--cpu-rehearsal`` runs the same script without a GPU against whatever ``sglang`` package is
importable (the tests use tests/fake_sglang, which serves with our embedded engine) to check the orchestration.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

# float32 on both sides: kernels differ (SGLang vs Megatron), so ~1e-4 is expected, 1e-2 would be a bug
THRESHOLDS = {"float32": {"max": 5e-3, "mean": 5e-4}, "bfloat16": {"max": 0.25, "mean": 0.03}}


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/gpu_smoke")
    p.add_argument("--model", default=None, help="HF model directory (default: build a small Qwen3 here)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--eta", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=sorted(THRESHOLDS))
    p.add_argument("--weight-update-mode", default="auto", choices=["auto", "disk", "xccl"])
    p.add_argument("--cpu-rehearsal", action="store_true", help="no GPU: check the orchestration only")
    return p.parse_args(argv)


def _median(xs):
    return statistics.median(xs) if xs else None


def agreement(model_dir: Path, run_dir: Path, dtype: str, rehearsal: bool, extra_args: list[str]) -> dict:
    """Sample 8 prompts x 4 on a fresh SGLang server with ``model_dir``; recompute with the trainer engine."""
    import torch

    from areal_cli.models.tiny import chat_prompt_ids, load_tokenizer
    from areal_cli.rollout.client import RolloutClient
    from areal_cli.rollout.fleet import FleetSpec, launch_fleet
    from areal_cli.rollout.protocol import SamplingParams
    from areal_cli.rollout.sglang_launcher import sglang_args_from_config
    from areal_cli.tasks import tiny_arith
    from areal_cli.trainer.batch import build_train_batch
    from areal_cli.trainer.megatron_engine import MegatronEngine

    tok = load_tokenizer(model_dir)
    prompts = [chat_prompt_ids(tok, p.prompt) for p in tiny_arith.sample_problems("heldout", 8, seed=123)]
    sg = sglang_args_from_config(str(model_dir), mem_fraction_static=0.3, max_prompt_tokens=256,
                                 max_new_tokens=64, dtype=dtype, seed=7, extra_args=extra_args)
    fleet = launch_fleet(FleetSpec(engine="sglang", n_servers=1, model_path=model_dir, sglang=sg,
                                   gpu_ids=None if rehearsal else [[0]], run_dir=run_dir), wait=True)
    try:
        engine = MegatronEngine(model_dir, lr=1e-6, seed=0)

        async def go():
            c = RolloutClient(fleet.urls, vocab_size=engine.vocab_size)
            try:
                groups = await asyncio.gather(*(c.generate_group(p, 4, SamplingParams(48, temperature=1.0))
                                                for p in prompts))
            finally:
                await c.aclose()
            return [s for g in groups for s in g]

        comps = asyncio.run(go())
    finally:
        fleet.stop()
    batch = build_train_batch([(c.prompt_ids, c.output_ids, c.output_logprobs, c.output_versions) for c in comps],
                              pad_id=tok.pad_token_id)
    recomputed = engine.logprobs(batch, temperature=1.0)
    m = batch.loss_mask.bool()
    diff = (recomputed[m] - batch.behaviour_logprobs[m]).abs()
    return {"samples": len(comps), "tokens": int(m.sum()), "max_abs_diff": float(diff.max()),
            "mean_abs_diff": float(diff.mean()), "device": str(engine.device),
            "torch": torch.__version__}


def main(argv=None) -> int:
    a = _args(argv)
    t0 = time.monotonic()
    import torch
    from rich.console import Console
    from rich.table import Table

    from areal_cli.foundations.atomic import write_json_atomic
    from areal_cli.config import apply_overrides
    from areal_cli.recipes import load_train_config
    from areal_cli.models.tiny import build_tiny_model
    from areal_cli.tasks import tiny_arith
    from areal_cli.train_loop import run_training

    n_gpus = torch.cuda.device_count()
    if not n_gpus and not a.cpu_rehearsal:
        print("error: no CUDA device visible to torch (use --cpu-rehearsal to check the orchestration)", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model = Path(a.model) if a.model else build_tiny_model(
        out / "model", seed=1, corpus=tiny_arith.tokenizer_corpus(), hidden_size=256, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, intermediate_size=768)
    mode = a.weight_update_mode if a.weight_update_mode != "auto" else ("xccl" if n_gpus >= 2 else "disk")
    if mode == "xccl" and n_gpus == 1:
        print("error: --weight-update-mode xccl needs 2 GPUs (NCCL refuses two ranks on one device)", file=sys.stderr)
        return 2
    # no CUDA graphs: their capture costs more than the whole smoke run saves
    extra = [] if a.cpu_rehearsal else ["--disable-cuda-graph"]
    cfg, _ = load_train_config("tiny-arith")
    cfg = apply_overrides(cfg, [
        f"model.path={model}", "rollout.engine=sglang", "rollout.n_servers=1", f"rollout.weight_update_mode={mode}",
        f"rollout.sglang_dtype={a.dtype}", f"rollout.sglang_mem_fraction_static={0.3 if n_gpus <= 1 else 0.8}",
        f"rollout.sglang_extra_args={' '.join(extra)}", f"loop.max_steps={a.steps}", f"rollout.max_head_offpolicyness={a.eta}",
        "loop.target_accuracy=0", f"loop.eval_every={a.steps}", "loop.eval_n_prompts=32", "rollout.batch_size=8", "rollout.group_size=4",
        "sft.max_steps=6", "sft.eval_every=3", "parallel.torch_threads=4",
        "rollout.success_rate_lb=0", "rollout.success_rate_ub=1"])  # an untrained model scores 0: keep every group
    train_dir = out / "train"
    if train_dir.exists():
        import shutil

        shutil.rmtree(train_dir)
    t_train = time.monotonic()
    summary = run_training(cfg, train_dir, live=False)
    train_wall = time.monotonic() - t_train
    rows = [json.loads(x) for x in (train_dir / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl"]
    agree = agreement(Path(summary["final_weights"]), out / "agreement", a.dtype, a.cpu_rehearsal, extra)
    thr = THRESHOLDS[a.dtype]
    checks = {
        "run finished all steps": summary["final_version"] == a.steps and len(rl) == a.steps,
        f"max |logprob diff| <= {thr['max']}": agree["max_abs_diff"] <= thr["max"],
        f"mean |logprob diff| <= {thr['mean']}": agree["mean_abs_diff"] <= thr["mean"],
    }
    result = {
        "gpus": n_gpus, "gpu_name": torch.cuda.get_device_name(0) if n_gpus else None, "rehearsal": a.cpu_rehearsal,
        "model": str(model), "dtype": a.dtype, "weight_update_mode": mode, "eta": a.eta, "steps": a.steps,
        "train_wall_s": round(train_wall, 2),
        "step_times_s": {k: _median([r[k] for r in rl]) for k in ("train_s", "sync_s", "wait_s")},
        "step_times_max_s": {k: max((r[k] for r in rl), default=None) for k in ("train_s", "sync_s", "wait_s")},
        "staleness_max": max((r["staleness_max"] for r in rl), default=None),
        "agreement": agree, "checks": checks, "ok": all(checks.values()),
        "total_wall_s": round(time.monotonic() - t0, 2),
    }
    write_json_atomic(out / "gpu_smoke.json", result)
    t = Table(title=f"GPU smoke ({'CPU rehearsal' if a.cpu_rehearsal else result['gpu_name']}), {out / 'gpu_smoke.json'}")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in result["step_times_s"].items():
        t.add_row(f"median {k} per RL step", f"{v:.3f} s" if v is not None else "-")
    t.add_row("weight update mode", mode)
    t.add_row("logprob |diff| max / mean (SGLang vs trainer)",
              f"{agree['max_abs_diff']:.2e} / {agree['mean_abs_diff']:.2e} over {agree['tokens']} tokens")
    t.add_row("wall time (training / all)", f"{train_wall:.0f} s / {result['total_wall_s']:.0f} s")
    for name, ok in checks.items():
        t.add_row(name, "PASS" if ok else "FAIL")
    Console().print(t)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
