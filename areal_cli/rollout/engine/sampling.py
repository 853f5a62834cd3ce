"""Sampling one token per running request, and the logprob the server reports for it.

Temperature 0 = greedy argmax; else softmax(logits / T) restricted by top_k / top_p. A draw is an exponential
race: token i wins with probability p_i / sum(p) (``argmax(p / q)``, q_i ~ Exp(1) independent). The noise is
counter-based, as SGLang's seeded sampler (``multinomial_with_seed``, python/sglang/srt/layers/sampler.py, PR
#10678): q_i = -log(u_i) with u_i from a 32-bit MurmurHash3 of (the request's ``seed``, its position = tokens it has
generated, the vocabulary index i) (:func:`seeded_uniform`). So one batched computation serves every row, and a
request's samples still depend only on its seed (given, or drawn from the engine seed in submission order) and its
own logits, not on what else is in the batch or when it was admitted. (It replaced one ``torch.Generator`` draw
per request and step: ~20% of a 32-sequence decode step of the tiny model.)
Reported logprob of an output token = log_softmax(logits / T)[token] for T > 0, log_softmax(logits)[token]
for T == 0 (before top_k/top_p truncation; after the min_new_tokens mask), as SGLang reports them.
"""

from __future__ import annotations

import torch

from areal_cli.rollout.protocol import SamplingParams


def sample(reqs: list, logits: torch.Tensor) -> tuple[list[int], list[float]]:
    """One token per request from its row of ``logits`` [B, V] float32 -> (token ids, reported logprobs).

    Each request (the scheduler's) has ``params`` (:class:`SamplingParams`), ``output_ids`` (its position is
    their number), ``stop_ids`` and ``seed``. Rows of requests below their ``min_new_tokens`` get their stop ids
    masked to -inf in place first.
    """
    B, V = logits.shape
    temps = [1.0] * B
    rows: list[int] = []  # rows that sample (temperature > 0); the others stay greedy
    seeds: list[int] = []
    positions: list[int] = []
    need_filter = False
    for i, r in enumerate(reqs):
        p = r.params
        n_out = len(r.output_ids)
        if n_out < p.min_new_tokens and r.stop_ids:
            logits[i, [t for t in r.stop_ids if 0 <= t < V]] = float("-inf")
        if p.temperature > 0:
            temps[i] = p.temperature
            rows.append(i)
            seeds.append(r.seed)
            positions.append(n_out)
            need_filter = need_filter or p.top_k > 0 or p.top_p < 1.0
    scaled = logits if all(t == 1.0 for t in temps) else logits / torch.tensor(temps, dtype=logits.dtype)[:, None]
    logp = torch.log_softmax(scaled, dim=-1)  # [B, V]
    tokens = logits.argmax(dim=-1)  # greedy rows keep this
    if rows:
        every = len(rows) == B
        probs = (logp if every else logp[torch.tensor(rows)]).exp()
        if need_filter:
            probs = top_k_top_p(probs, [reqs[i].params for i in rows])
        q = (-torch.log(seeded_uniform(seeds, positions, V))).to(probs.dtype).clamp_(min=1e-20)  # Exp(1)
        drawn = torch.argmax(probs / q, dim=-1)  # exponential race: P(i) = p_i / sum p
        if every:
            tokens = drawn
        else:
            tokens[torch.tensor(rows)] = drawn
    lps = logp.gather(1, tokens[:, None])[:, 0]
    return tokens.tolist(), lps.tolist()


_M32 = 0xFFFFFFFF
_C1, _C2 = 0xCC9E2D51, 0x1B873593  # MurmurHash3 x86_32 constants
_COLS: dict[int, torch.Tensor] = {}  # vocabulary size -> the column keys' block mix (the same for every row)


def _rotl(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _M32


def _key(k: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's scrambling of a 32-bit key (int64 tensors holding uint32 values; products wrap, masked)."""
    return (_rotl((k * _C1) & _M32, 15) * _C2) & _M32


def _mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return (_rotl(h ^ _key(k), 13) * 5 + 0xE6546B64) & _M32


def seeded_uniform(seeds: list[int], positions: list[int], vocab: int) -> torch.Tensor:
    """Uniforms in (0, 1), [len(seeds), vocab] float64: u[r, i] = (MurmurHash3_32 of the words seed_lo, seed_hi,
    position, i, finalised with length 16 + 0.5) / 2^32 -- a function of (seed, position, i) alone (counter-based, as
    SGLang's ``multinomial_with_seed``). ``seeds``: int64 (any sign); ``positions``: >= 0."""
    lo = torch.tensor([int(x) & _M32 for x in seeds], dtype=torch.int64)
    hi = torch.tensor([(int(x) >> 32) & _M32 for x in seeds], dtype=torch.int64)
    pos = torch.tensor([int(p) & _M32 for p in positions], dtype=torch.int64)
    row = _mix(_mix(_mix(torch.zeros_like(lo), lo), hi), pos)  # [B]
    cols = _COLS.get(vocab)
    if cols is None:
        cols = _COLS[vocab] = _key(torch.arange(vocab, dtype=torch.int64))
    h = (_rotl(row[:, None] ^ cols[None, :], 13) * 5 + 0xE6546B64) & _M32  # the 4th block: the column
    h = h ^ 16  # length in bytes
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    h = h ^ (h >> 16)
    return (h.to(torch.float64) + 0.5) / 4294967296.0


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
