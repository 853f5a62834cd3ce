"""Sampling one token per running request, and the logprob the server reports for it.

Temperature 0 = greedy argmax; else softmax(logits / T) restricted by top_k / top_p, drawn with a
per-request ``torch.Generator`` (seeded by the request's ``seed`` or, when None, from the engine seed in
submission order), so a request's samples do not depend on what else is in the batch.
Reported logprob of an output token = log_softmax(logits / T)[token] for T > 0, log_softmax(logits)[token]
for T == 0 (before top_k/top_p truncation; after the min_new_tokens mask), as SGLang reports them.
A draw is an exponential race: token i wins with probability p_i / sum(p) (``argmax(p / q)``, q ~ Exp(1)).
"""

from __future__ import annotations

import torch

from areal_cli.rollout.protocol import SamplingParams


def sample(reqs: list, logits: torch.Tensor) -> tuple[list[int], list[float]]:
    """One token per request from its row of ``logits`` [B, V] float32 -> (token ids, reported logprobs).

    Each request (the scheduler's) has ``params`` (:class:`SamplingParams`), ``output_ids``, ``stop_ids``,
    ``seed`` and ``generator`` (created from ``seed`` on first use, then kept). Rows of requests below their
    ``min_new_tokens`` get their stop ids masked to -inf in place first.
    """
    B, V = logits.shape
    for i, r in enumerate(reqs):
        if len(r.output_ids) < r.params.min_new_tokens and r.stop_ids:
            ban = [t for t in r.stop_ids if 0 <= t < V]
            logits[i, ban] = float("-inf")
    temps = torch.tensor([r.params.temperature if r.params.temperature > 0 else 1.0 for r in reqs],
                         dtype=logits.dtype)
    logp = torch.log_softmax(logits / temps[:, None], dim=-1)  # [B, V]
    tokens = logits.argmax(dim=-1)  # greedy rows keep this
    sample_rows = [i for i, r in enumerate(reqs) if r.params.temperature > 0]
    if sample_rows:
        rows = torch.tensor(sample_rows)
        probs = logp[rows].exp()
        need_filter = any(reqs[i].params.top_k > 0 or reqs[i].params.top_p < 1.0 for i in sample_rows)
        if need_filter:
            probs = top_k_top_p(probs, [reqs[i].params for i in sample_rows])
        for j, i in enumerate(sample_rows):
            r = reqs[i]
            if r.generator is None:
                r.generator = torch.Generator().manual_seed(r.seed)
            q = torch.empty(V, dtype=probs.dtype).exponential_(generator=r.generator).clamp_(min=1e-20)
            tokens[i] = int(torch.argmax(probs[j] / q))  # exponential race: P(i) = p_i / sum p
    lps = logp.gather(1, tokens[:, None])[:, 0]
    return [int(t) for t in tokens], [float(x) for x in lps]


def top_k_top_p(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Zero out tokens outside top_k / the top_p nucleus (the token crossing top_p is kept)."""
    n, V = probs.shape
    sp, si = probs.sort(dim=-1, descending=True)
    ks = torch.tensor([p.top_k if p.top_k > 0 else V for p in params])
    ps = torch.tensor([p.top_p for p in params], dtype=probs.dtype)
    rank = torch.arange(V)[None, :]
    cum = sp.cumsum(dim=-1)
    drop = (rank >= ks[:, None]) | ((cum - sp) > ps[:, None])
    drop[:, 0] = False
    sp = sp.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(1, si, sp)
