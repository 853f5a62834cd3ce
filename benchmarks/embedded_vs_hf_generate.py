"""Embedded server vs HF model.generate: 32 prompts, per-prompt max_new_tokens, greedy, ignore_eos.
Both single-threaded (torch.set_num_threads(1) / --num-threads 1). Tokens/s = useful generated tokens / wall s."""
import asyncio, sys, tempfile, time
import torch
torch.set_num_threads(1)
from transformers import AutoModelForCausalLM
from areal_cli.models.tiny import build_tiny_model
from areal_cli.rollout.client import RolloutClient
from areal_cli.rollout.protocol import SamplingParams
from areal_cli.rollout.server import EmbeddedServer

d = build_tiny_model(tempfile.mkdtemp(prefix="areal-bench-") + "/model", seed=0)
g = torch.Generator().manual_seed(0)
V = AutoModelForCausalLM.from_pretrained(d).config.vocab_size
prompts = [torch.randint(3, V, (4 + (i * 7) % 37,), generator=g).tolist() for i in range(32)]
budgets = [16 + (i * 37) % 241 for i in range(32)]  # 16..256
useful = sum(budgets)

with EmbeddedServer.launch(d, num_threads=1) as srv:
    async def run():
        c = RolloutClient([srv.url], vocab_size=V)
        await c.generate(prompts[0], SamplingParams(4, temperature=0.0))  # warm-up
        t = time.perf_counter()
        outs = await asyncio.gather(*(c.generate(p, SamplingParams(m, temperature=0.0, ignore_eos=True))
                                      for p, m in zip(prompts, budgets)))
        dt = time.perf_counter() - t
        await c.aclose()
        return outs, dt
    outs, dt_srv = asyncio.run(run())
assert sum(len(o.output_ids) for o in outs) == useful

hf = AutoModelForCausalLM.from_pretrained(d).eval()
hf.generation_config.eos_token_id = None  # = ignore_eos (min_new_tokens would MASK eos instead)
pad = hf.config.pad_token_id
L = max(map(len, prompts))
ids = torch.full((32, L), pad); mask = torch.zeros(32, L, dtype=torch.long)
for i, p in enumerate(prompts):  # left padding; HF derives position_ids from the mask
    ids[i, L - len(p):] = torch.tensor(p); mask[i, L - len(p):] = 1
with torch.no_grad():
    hf.generate(ids[:2], attention_mask=mask[:2], max_new_tokens=4, do_sample=False)  # warm-up
    t = time.perf_counter()
    out = hf.generate(ids, attention_mask=mask, max_new_tokens=max(budgets),
                      do_sample=False, pad_token_id=pad)
    dt_hf = time.perf_counter() - t
    # per-prompt sequential HF (each prompt only as long as its own budget)
    t = time.perf_counter()
    seq_outs = [hf.generate(torch.tensor([p]), max_new_tokens=m, do_sample=False,
                            pad_token_id=pad)[0, len(p):].tolist() for p, m in zip(prompts, budgets)]
    dt_hf_seq = time.perf_counter() - t
same = sum(o.output_ids == s for o, s in zip(outs, seq_outs))
print(f"model: {d} vocab {V}, 32 prompts len 4..40, max_new_tokens 16..256, {useful} useful tokens")
print(f"embedded server (32 concurrent /generate): {dt_srv:6.2f} s  {useful/dt_srv:8.0f} tok/s")
print(f"HF generate, one left-padded batch of 32 (to {max(budgets)} tokens): {dt_hf:6.2f} s  {useful/dt_hf:8.0f} useful tok/s ({32*max(budgets)/dt_hf:.0f} computed tok/s)")
print(f"HF generate, one prompt at a time: {dt_hf_seq:6.2f} s  {useful/dt_hf_seq:8.0f} tok/s")
print(f"greedy outputs identical to HF (per-prompt): {same}/32")
