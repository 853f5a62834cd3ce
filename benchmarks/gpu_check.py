"""Offline GPU check of the trainer and the embedded engine on CUDA (issue 13, part 6); run by ``gpu_check.sh``.

For a machine with one NVIDIA GPU, torch and transformers preinstalled, no network and no SGLang. On a
randomly initialised model shaped like Qwen3-0.6B (28 layers, hidden 1024, 16 query / 8 KV heads of dim 128,
MLP 3072, vocab 151936, tied embeddings; ``transformers`` builds it here, nothing is downloaded):

1. ``parity_fp32``: HF ``Qwen3ForCausalLM`` vs the Megatron-core ``GPTModel`` of ``MegatronEngine`` (converted
   by ``trainer/hf_mcore.py``), both float32 on the GPU with TF32 off: max |logit difference| over
   ``--batch`` x ``--seq-len`` random tokens. Gate: <= 2e-3 (kernels differ: HF SDPA vs Megatron's
   unfused local attention; ~1e-5 on the CPU).
2. ``parity_bf16``: the same in bfloat16 (bf16 parameters and activations, logprobs in float32): max / mean
   |log-probability difference|. Gate: mean <= 0.05 (bf16 keeps 8 bits of mantissa).
3. ``ppo_step``: decoupled-PPO steps in bfloat16 through the trainer's own ``ppo_update`` (proximal
   recomputation + forward/backward + grad clip + AdamW) on ``--batch`` sequences of ``--seq-len`` tokens;
   step time, tokens/s and MFU = model FLOPs / time / peak bf16 FLOPs. Model FLOPs per token (PaLM,
   appendix B): 6N + 12 L H Q T for forward + backward and a third of that again for the proximal forward,
   N = parameters of the matmuls (embedding lookup excluded, the output layer included). Gate: finite
   loss and gradient norm, weights changed.
4. ``engine``: the embedded rollout engine (``rollout/engine/``) with its weights and KV cache on the GPU:
   float32 logits vs HF (reported; gate <= 2e-3 when it runs), and greedy decoding throughput in bf16 with
   ``--engine-requests`` concurrent requests. It is reported, not required: the check passes if the engine
   cannot run there, with the reason.

Megatron runs with none of the CPU adaptations (``cpu_compat`` is a no-op when CUDA is present; the JSON
records it). ``--dry-run`` runs the same code on the CPU with a tiny Qwen3 of the same structure (float32
and bf16) to test the script itself; CI runs it (tests/test_gpu_check.py).

Output: ``OUT/gpu_check.json`` and a table. Exit 0 iff every gate passed, 1 if one failed, 2 on bad usage
(no GPU without ``--dry-run``).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import sys
import time
import traceback
from pathlib import Path

#: dense bf16 peak FLOP/s by device-name substring (NVIDIA data sheets, SXM parts).
PEAK_BF16 = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12, "L4": 121e12}

QWEN3_0_6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rope_theta=1_000_000.0,
            rms_norm_eps=1e-6, tie_word_embeddings=True)
GATES = {"parity_fp32_max_abs_logit": 2e-3, "parity_bf16_mean_abs_logprob": 0.05, "engine_fp32_max_abs_logit": 2e-3}


def _args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/gpu_check")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny model: test the script, not a GPU")
    p.add_argument("--batch", type=int, default=None, help="sequences per PPO step (default 8; dry run 2)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 1024; dry run 64)")
    p.add_argument("--steps", type=int, default=3, help="timed PPO steps (after one warm-up step)")
    p.add_argument("--engine-requests", type=int, default=32)
    p.add_argument("--engine-new-tokens", type=int, default=128)
    p.add_argument("--peak-tflops", type=float, default=None, help="peak bf16 TFLOP/s (default: by device name)")
    a = p.parse_args(argv)
    a.batch = a.batch or (2 if a.dry_run else 8)
    a.seq_len = a.seq_len or (64 if a.dry_run else 1024)
    if a.dry_run:
        a.engine_requests, a.engine_new_tokens = min(a.engine_requests, 4), min(a.engine_new_tokens, 8)
    return a


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _free() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def build_model_dir(out: Path, shape: dict, dev) -> Path:
    """A random-init Qwen3 of ``shape`` saved as an HF directory (float32 safetensors) under ``out/model``."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    d = out / "model"
    cfg = Qwen3Config(**shape)
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg).float()
    model.save_pretrained(d, safe_serialization=True)
    del model
    _free()
    return d


def _hf(model_dir: Path, dtype, dev):
    import transformers
    from transformers import AutoModelForCausalLM

    # ``dtype`` since transformers 4.56 (``torch_dtype`` before); the machine's preinstalled version is unknown
    key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 or \
        tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56) else "torch_dtype"
    return AutoModelForCausalLM.from_pretrained(model_dir, **{key: dtype}).to(dev).eval()


def parity(model_dir: Path, dtype, dev, ids) -> dict:
    """HF vs Megatron logits / logprobs for ``ids`` [B, L] in ``dtype``; ``dtypes`` records what Megatron ran in."""
    import torch

    from areal_cli.trainer.megatron_engine import MegatronEngine

    hf = _hf(model_dir, dtype, dev)
    with torch.no_grad():
        ref = hf(ids.to(dev)).logits.float()
    del hf
    _free()
    eng = MegatronEngine(model_dir, lr=1e-6, params_dtype=dtype, device=dev, seed=0)
    with torch.no_grad():
        raw = eng.forward_logits(ids)
    ran_in = {"megatron_params": str(next(eng.model.parameters()).dtype).removeprefix("torch."),
              "megatron_logits": str(raw.dtype).removeprefix("torch.")}
    got = raw.float()[..., : ref.shape[-1]]
    del eng, raw
    _free()
    dlogit = (got - ref).abs()
    dlp = (torch.log_softmax(got, -1) - torch.log_softmax(ref, -1)).abs()
    return {"max_abs_logit": float(dlogit.max()), "mean_abs_logit": float(dlogit.mean()),
            "max_abs_logprob": float(dlp.max()), "mean_abs_logprob": float(dlp.mean()),
            "argmax_agreement": float((got.argmax(-1) == ref.argmax(-1)).float().mean()), "dtypes": ran_in}


def model_flops_per_token(shape: dict, seq_len: int) -> float:
    """PaLM (Chowdhery et al. 2022, appendix B) training FLOPs per token: 6N + 12 L H Q T, N = matmul params."""
    h, L = shape["hidden_size"], shape["num_hidden_layers"]
    nh, nkv, hd, ffn = (shape["num_attention_heads"], shape["num_key_value_heads"], shape["head_dim"],
                        shape["intermediate_size"])
    per_layer = h * nh * hd + 2 * h * nkv * hd + nh * hd * h + 3 * h * ffn
    n = L * per_layer + h * shape["vocab_size"]  # + the output layer
    return 6.0 * n + 12.0 * L * nh * hd * seq_len


def ppo_step(model_dir: Path, dev, args, shape: dict, peak: float | None) -> dict:
    """Decoupled-PPO steps (bf16) through ``trainer.steps.ppo_update``; timing and MFU."""
    import torch

    from areal_cli.trainer.batch import build_train_batch
    from areal_cli.trainer.megatron_engine import MegatronEngine
    from areal_cli.config import TrainConfig
    from areal_cli.trainer.steps import ppo_update

    eng = MegatronEngine(model_dir, lr=1e-5, params_dtype=torch.bfloat16, device=dev, seed=0)
    g = torch.Generator().manual_seed(1)
    B, L = args.batch, args.seq_len
    prompt = L // 8
    samples = []
    for i in range(B):
        toks = torch.randint(0, shape["vocab_size"], (L,), generator=g).tolist()
        samples.append((toks[:prompt], toks[prompt:], [0.0] * (L - prompt), [0] * (L - prompt)))
    adv = [1.0 if i % 2 == 0 else -1.0 for i in range(B)]
    batch = build_train_batch(samples, advantages=adv)
    # behaviour logprobs = the current policy's, perturbed (an off-policy sample a few versions old)
    lp = eng.logprobs(batch).cpu().float()
    noise = 0.05 * torch.randn(lp.shape, generator=g)
    batch.behaviour_logprobs = (lp + noise) * batch.loss_mask
    cfg = TrainConfig().with_values({"ppo.recompute_proximal": True, "rollout.temperature": 1.0,
                                     "ppo.max_tokens_per_mb": 0, "ppo.n_minibatches": 1, "ppo.eps_clip": 0.2,
                                     "ppo.behav_imp_weight_cap": 5.0})
    before = next(eng.model.parameters()).detach().float().clone()
    times, stats = [], []
    for i in range(args.steps + 1):
        _sync(dev)
        t0 = time.perf_counter()
        st = ppo_update(eng, batch, cfg)
        _sync(dev)
        if i:  # the first step warms up kernels and the allocator
            times.append(time.perf_counter() - t0)
        stats.append(st)
    changed = float((next(eng.model.parameters()).detach().float() - before).abs().max())
    n_params = eng.num_parameters()
    del eng
    _free()
    step_s = sorted(times)[len(times) // 2]
    tokens = B * L
    flops = model_flops_per_token(shape, L) * 4.0 / 3.0 * tokens  # + the proximal forward (1/3 of fwd+bwd)
    res = {"batch": B, "seq_len": L, "tokens_per_step": tokens, "step_s_median": step_s,
           "step_s_all": times, "tokens_per_s": tokens / step_s, "model_tflops_per_step": flops / 1e12,
           "achieved_tflops": flops / step_s / 1e12, "n_parameters": n_params,
           "loss": [s["loss"] for s in stats], "grad_norm": [s["grad_norm"] for s in stats],
           "max_weight_change": changed}
    res["mfu"] = flops / step_s / peak if peak else None
    res["ok"] = all(math.isfinite(s["loss"]) and math.isfinite(s["grad_norm"]) for s in stats) and changed > 0
    return res


def engine_check(model_dir: Path, dev, args, ids) -> dict:
    """The embedded engine on ``dev``: float32 logits vs HF, then bf16 greedy throughput."""
    import torch

    from areal_cli.rollout.engine import InferenceEngine
    from areal_cli.rollout.protocol import SamplingParams

    hf = _hf(model_dir, torch.float32, dev)
    row = ids[0, : min(ids.shape[1], 256)]
    with torch.no_grad():
        ref = hf(row[None].to(dev)).logits[0].float().cpu()
    del hf
    _free()
    eng = InferenceEngine(model_dir, dtype=torch.float32, device=dev, max_total_tokens=4096)
    got = eng.model.full_logits(row.tolist())
    diff = float((got - ref).abs().max())
    del eng
    _free()
    n, new = args.engine_requests, args.engine_new_tokens
    eng = InferenceEngine(model_dir, dtype=torch.bfloat16, device=dev, max_running_requests=n,
                          max_total_tokens=n * (64 + new) + 64)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, eng.vocab_size, (64,), generator=g).tolist() for _ in range(n)]
    sp = SamplingParams(max_new_tokens=new, temperature=0.0, ignore_eos=True)
    eng.generate(prompts[:1], SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True))  # warm-up
    _sync(dev)
    t0 = time.perf_counter()
    out = eng.generate(prompts, sp)
    _sync(dev)
    dt = time.perf_counter() - t0
    toks = sum(len(r.output_ids) for r in out)
    return {"fp32_max_abs_logit_vs_hf": diff, "requests": n, "new_tokens": new, "generated_tokens": toks,
            "seconds": dt, "tokens_per_s_bf16": toks / dt}


def _row(name: str, value, gate: str, ok) -> tuple[str, str, str, str]:
    v = f"{value:.3g}" if isinstance(value, float) else str(value)
    return name, v, gate, {True: "PASS", False: "FAIL", None: "-"}[ok]


def main(argv=None) -> int:
    args = _args(argv)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("error: no CUDA device visible to torch (torch.cuda.is_available() is False); "
              "use --dry-run to test the script on the CPU", file=sys.stderr)
        return 2
    import megatron.core
    import transformers

    import areal_cli
    from areal_cli.trainer import cpu_compat

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cpu") if args.dry_run else torch.device("cuda", 0)
    shape = TINY if args.dry_run else QWEN3_0_6B
    name = "cpu" if args.dry_run else torch.cuda.get_device_name(dev)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else next(
        (v for k, v in PEAK_BF16.items() if k in name and not args.dry_run), None)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    res: dict = {"device": name, "dry_run": args.dry_run, "python": platform.python_version(),
                 "torch": torch.__version__, "transformers": transformers.__version__,
                 "megatron_core": getattr(megatron.core, "__version__", "?"), "model_shape": shape,
                 "imported_from": {"areal_cli": str(Path(areal_cli.__file__).parent),
                                   "megatron": str(Path(megatron.core.__file__).parent.parent)},
                 "peak_bf16_tflops": peak / 1e12 if peak else None, "errors": {}}
    t_all = time.perf_counter()

    def stage(key, fn):
        t0 = time.perf_counter()
        print(f"[gpu_check] {key} ...", flush=True)
        try:
            res[key] = fn()
        except Exception as e:  # noqa: BLE001 -- every stage reports, one failure does not hide the others
            res[key] = None
            res["errors"][key] = f"{type(e).__name__}: {e}"
            (out / f"{key}.traceback.txt").write_text(traceback.format_exc())
            print(f"[gpu_check] {key} failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                  f"(traceback in {out / (key + '.traceback.txt')})", flush=True)
        res.setdefault("seconds", {})[key] = round(time.perf_counter() - t0, 2)
        _free()

    model_dir = build_model_dir(out, shape, dev)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, shape["vocab_size"], (2, min(args.seq_len, 512)), generator=g)
    stage("parity_fp32", lambda: parity(model_dir, torch.float32, dev, ids))
    res["cpu_adaptations_applied"] = list(cpu_compat.cpu_compat_applied())
    stage("parity_bf16", lambda: parity(model_dir, torch.bfloat16, dev, ids))
    stage("ppo_step", lambda: ppo_step(model_dir, dev, args, shape, peak))
    stage("engine", lambda: engine_check(model_dir, dev, args, ids))
    res["total_s"] = round(time.perf_counter() - t_all, 1)

    p32, p16, ppo, en = res["parity_fp32"], res["parity_bf16"], res["ppo_step"], res["engine"]
    gates = {
        "parity_fp32": p32 is not None and p32["max_abs_logit"] <= GATES["parity_fp32_max_abs_logit"],
        "parity_bf16": p16 is not None and p16["mean_abs_logprob"] <= GATES["parity_bf16_mean_abs_logprob"],
        "ppo_step": bool(ppo and ppo["ok"]),
        "no_cpu_adaptations": args.dry_run or not res["cpu_adaptations_applied"],
    }
    if en is not None:  # reported, not required: gated only when it runs
        gates["engine_fp32"] = en["fp32_max_abs_logit_vs_hf"] <= GATES["engine_fp32_max_abs_logit"]
    res["gates"] = gates
    res["ok"] = all(gates.values())
    (out / "gpu_check.json").write_text(json.dumps(res, indent=2) + "\n")

    rows = [
        _row("HF vs Megatron, fp32: max |logit diff|", p32 and p32["max_abs_logit"],
             f"<= {GATES['parity_fp32_max_abs_logit']:g}", gates["parity_fp32"]),
        _row("HF vs Megatron, bf16: mean |logprob diff|", p16 and p16["mean_abs_logprob"],
             f"<= {GATES['parity_bf16_mean_abs_logprob']:g}", gates["parity_bf16"]),
        _row("HF vs Megatron, bf16: max |logprob diff|", p16 and p16["max_abs_logprob"], "", None),
        _row("decoupled-PPO step (bf16), median s", ppo and ppo["step_s_median"], "finite, weights move",
             gates["ppo_step"]),
        _row("  tokens/s", ppo and ppo["tokens_per_s"], "", None),
        _row("  MFU", (ppo or {}).get("mfu") if ppo else None, "", None),
        _row("CPU adaptations applied", f"{len(res['cpu_adaptations_applied'])} patches", "none (on a GPU)",
             gates["no_cpu_adaptations"]),
        _row("embedded engine, fp32: max |logit diff| vs HF", en["fp32_max_abs_logit_vs_hf"] if en else
             f"did not run: {res['errors'].get('engine', '')[:60]}", f"<= {GATES['engine_fp32_max_abs_logit']:g}",
             gates.get("engine_fp32")),
        _row("embedded engine, bf16 greedy tok/s", en and en["tokens_per_s_bf16"],
             f"{args.engine_requests} concurrent", None),
    ]
    w = max(len(r[0]) for r in rows)
    print(f"\nGPU check on {name} ({'dry run, tiny model' if args.dry_run else 'Qwen3-0.6B shape'}), "
          f"{res['total_s']} s")
    for r in rows:
        print(f"  {r[0]:<{w}}  {r[1]:>12}  {r[2]:<22} {r[3]}")
    print(f"results: {out / 'gpu_check.json'}; {'all gates passed' if res['ok'] else 'FAILED'}")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
