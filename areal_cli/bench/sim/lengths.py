"""Response lengths of the cluster model: lognormal with a per-prompt shared part, or an empirical list.

Lengths are truncated at ``max_new_tokens`` (a truncated sample ends at the cap: the long tail that makes a
synchronous batch wait for its longest sample). ``response_prompt_corr`` is the share of the log-length variance
common to the samples of one prompt (hard prompts give long answers for all their samples): a sample's standard
normal score is ``z = sqrt(rho) * z_prompt + sqrt(1 - rho) * eps``; its length is ``exp(log(median) + sigma * z)``,
or, with an empirical list, the list's quantile at ``Phi(z)`` (the same Gaussian copula). With
``response_strata = S > 0`` the prompt scores come in blocks of ``S`` prompts, one from each equal-probability
stratum of the standard normal in a shuffled order (``z_prompt = Phi^-1((j + U) / S)``), as the ``tiny-longtail``
task draws its problems (:mod:`areal_cli.tasks.tiny_longtail`).
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist

import numpy as np

from areal_cli.bench.sim.scenario import Scenario
from areal_cli.foundations.errors import UserError

_NORMAL = NormalDist()


class ResponseLengths:
    """Draws response lengths group by group (numpy blocks, so per-group cost stays small)."""

    def __init__(self, sc: Scenario, rng: np.random.Generator, empirical: np.ndarray | None):
        self.sc, self.rng = sc, rng
        self.empirical = None if empirical is None else np.sort(empirical)  # quantiles are read from it
        self.block: list[list[int]] = []

    def _refill(self, n_groups: int = 1024) -> None:
        sc, g, rng = self.sc, self.sc.group_size, self.rng
        rho, strata = sc.response_prompt_corr, sc.response_strata
        if strata:
            n_groups = max(1, n_groups // strata) * strata
            j = np.concatenate([rng.permutation(strata) for _ in range(n_groups // strata)])
            u = (j + rng.random(n_groups)) / strata
            zp = np.array([_NORMAL.inv_cdf(min(max(x, 1e-12), 1 - 1e-12)) for x in u])[:, None]
        else:
            zp = rng.standard_normal((n_groups, 1))
        z = math.sqrt(rho) * zp + math.sqrt(1 - rho) * rng.standard_normal((n_groups, g))
        if self.empirical is not None:
            emp = self.empirical
            q = np.vectorize(_NORMAL.cdf)(z)
            arr = emp[np.minimum((q * len(emp)).astype(np.int64), len(emp) - 1)]
        else:
            arr = np.exp(math.log(sc.response_median_tokens) + sc.response_sigma * z)
        arr = np.clip(np.rint(arr), 1, sc.max_new_tokens).astype(np.int64)
        self.block = arr.tolist()[::-1]

    def group(self) -> list[int]:
        """The response lengths (tokens, 1..``max_new_tokens``) of the next group's ``group_size`` samples."""
        if not self.block:
            self._refill()
        return self.block.pop()


def load_empirical_lengths(sc: Scenario) -> np.ndarray | None:
    """The scenario's ``response_length_counts`` as a list of lengths, else its ``response_lengths_file``
    (relative to the scenario file), or None (lognormal).

    Raises:
        UserError: missing file or a line that is not a positive integer (file:line).
    """
    if sc.response_length_counts:
        keys = sorted(sc.response_length_counts)
        return np.repeat(np.asarray(keys, dtype=np.int64), [sc.response_length_counts[k] for k in keys])
    if not sc.response_lengths_file:
        return None
    p = Path(sc.response_lengths_file)
    if not p.is_absolute() and sc.source:
        p = Path(sc.source).parent / p
    if not p.is_file():
        loc = f"{sc.source}:{sc.lines.get('response_lengths_file', 1)}" if sc.source else "scenario"
        raise UserError(f"{loc}: field 'response_lengths_file': file not found: {p}")
    out = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            v = int(line)
        except ValueError:
            v = -1
        if v <= 0:
            raise UserError(f"{p}:{i}: expected a positive integer response length, got {line.strip()!r}")
        out.append(v)
    if not out:
        raise UserError(f"{p}:1: no response lengths")
    return np.asarray(out, dtype=np.int64)


def length_stats(sc: Scenario, n: int = 200_000, seed: int = 0) -> dict:
    """Mean, percentiles and truncated fraction of the response-length distribution (Monte Carlo)."""
    rng = np.random.default_rng(seed)
    emp = load_empirical_lengths(sc)
    if emp is not None:
        x = np.minimum(rng.choice(emp, n), sc.max_new_tokens)
    else:
        x = np.clip(np.rint(np.exp(math.log(sc.response_median_tokens) + sc.response_sigma * rng.standard_normal(n))),
                    1, sc.max_new_tokens)
    return {"mean": float(x.mean()), "p50": float(np.percentile(x, 50)), "p90": float(np.percentile(x, 90)),
            "p99": float(np.percentile(x, 99)), "truncated_frac": float((x >= sc.max_new_tokens).mean()),
            "mean_sequence_tokens": float(x.mean() + sc.prompt_tokens)}

