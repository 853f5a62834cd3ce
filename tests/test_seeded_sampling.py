"""The engine's counter-based sampling noise (areal_cli.rollout.engine.sampling): the uniforms are MurmurHash3 of
(seed, position, vocabulary index), checked against an independent pure-Python MurmurHash3 (itself checked on
published test vectors); draws follow the distribution; a row depends on its own seed and position only."""

import struct
from types import SimpleNamespace

import pytest
import torch

from areal_cli.rollout.engine.sampling import sample, seeded_uniform
from areal_cli.rollout.protocol import SamplingParams


def murmur3_32(data: bytes, seed: int = 0) -> int:
    """Reference MurmurHash3 x86_32 (Austin Appleby's algorithm), written out plainly."""
    c1, c2, m = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF
    h = seed
    n = len(data) // 4 * 4
    for i in range(0, n, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * c1) & m
        k = ((k << 15) | (k >> 17)) & m
        k = (k * c2) & m
        h ^= k
        h = ((h << 13) | (h >> 19)) & m
        h = (h * 5 + 0xE6546B64) & m
    tail = data[n:]
    k = 0
    for j, b in enumerate(tail):
        k |= b << (8 * j)
    if tail:
        k = (k * c1) & m
        k = ((k << 15) | (k >> 17)) & m
        k = (k * c2) & m
        h ^= k
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & m
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & m
    h ^= h >> 16
    return h


def test_the_reference_hash_matches_published_vectors():
    assert murmur3_32(b"") == 0
    assert murmur3_32(b"", 1) == 0x514E28B7
    assert murmur3_32(b"test") == 0xBA6BD213
    assert murmur3_32(b"Hello, world!") == 0xC0363E43


@pytest.mark.parametrize("seed", [0, 1, 123, 2**40 + 7, -5, 2**63 - 1])
def test_uniforms_are_murmur3_of_seed_position_and_column(seed):
    u = seeded_uniform([seed, seed], [0, 17], 9)
    for row, pos in enumerate((0, 17)):
        s = seed & 0xFFFFFFFFFFFFFFFF
        for col in range(9):
            h = murmur3_32(struct.pack("<IIII", s & 0xFFFFFFFF, s >> 32, pos, col))
            assert float(u[row, col]) == (h + 0.5) / 2**32


def _req(seed, pos, temperature=1.0):
    return SimpleNamespace(params=SamplingParams(max_new_tokens=10, temperature=temperature), output_ids=[0] * pos,
                           stop_ids=frozenset(), seed=seed)


def test_draws_follow_the_distribution_and_depend_on_seed_and_position_only():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]])
    p = torch.softmax(logits, -1)[0].double()
    n = 20000
    reqs = [_req(i // 37, i % 37) for i in range(n)]
    toks, lps = sample(reqs, logits.repeat(n, 1))
    freq = torch.bincount(torch.tensor(toks), minlength=5).double() / n
    chi2 = float(((freq - p) ** 2 / p).sum() * n)
    assert chi2 < 18.5  # chi-square, 4 degrees of freedom: P(> 18.5) < 0.001
    assert lps[0] == pytest.approx(float(torch.log_softmax(logits, -1)[0, toks[0]]), abs=1e-6)
    # one row alone, or among others in any order: the same token
    mixed = [_req(5, 3), _req(9, 0), _req(5, 4)]
    lg = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    alone = [sample([r], lg[i:i + 1].clone())[0][0] for i, r in enumerate(mixed)]
    together = sample(mixed, lg.clone())[0]
    flipped = sample(mixed[::-1], lg.flip(0).clone())[0][::-1]
    assert alone == together == flipped
