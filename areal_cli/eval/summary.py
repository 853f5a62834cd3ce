"""Per-dataset metrics of ``areal eval`` from graded samples (the numbers AReaL's
``eval_and_aggregate.py`` prints, as fractions in [0, 1]).

Per dataset, from the ``"sample"`` pass (n samples per problem):
- ``pass@1`` (mean correctness) and ``pass@1_stderr`` (:func:`areal_cli.eval.metrics.pass1_mean_and_stderr`),
- ``pass@k`` for k = 1, 2, 4, ... <= n (unbiased estimator, Chen et al. 2021),
- ``maj@k`` for the same k and for k = n (majority vote over the first k samples' extracted answers,
  AReaL ``eval_maj_k_metrics``; math only: code has no answer to vote on),
- ``mean_output_tokens`` (AReaL ``sample_length``), ``n_truncated`` (finish reason "length"; present when every
  record carries a finish reason), ``n_no_answer`` (no extracted answer or code);
from the ``"greedy"`` pass when the protocol runs one (AReaL ``greedy_acc`` / ``greedy_length``):
- ``greedy_acc``, ``greedy_mean_output_tokens``, ``greedy_n_truncated``, ``greedy_n_no_answer`` (the same counts
  for the greedy completions: a greedy accuracy is never shown without them);
counters over every graded completion of the dataset (both passes): ``n_grader_errors``,
``n_grader_timeouts``, ``n_equivalence_failures``; code: ``code_status_counts``;
with problem metadata: ``breakdown`` by difficulty / platform (LiveCodeBench) and, for the ``codeforces``
benchmark, ``codeforces`` (estimated rating and percentile, or what is needed to compute it).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from areal_cli.eval.benchmarks import Problem
from areal_cli.eval.grading import EQUIVALENT_FN, problem_kind, problem_meta
from areal_cli.eval.metrics import maj_at_k, mean_pass_at_k, pass1_mean_and_stderr, pass_k_values
from areal_cli.reward.pool import RewardPool

CODEFORCES_BENCHMARK = "codeforces"
BREAKDOWN_KEYS = ("difficulty", "platform")
CF_DATA_NEEDED = "needs --cf-data DIR"


class _PoolEquivalence:
    """``(reference, candidate) -> bool`` through the pool (math-verify, hard timeout), memoised (maj@k
    for several k asks the same pairs again); failures count as "not equivalent" and are counted in
    :attr:`failures`."""

    def __init__(self, pool: RewardPool) -> None:
        self.pool = pool
        self.failures = 0
        self._memo: dict[tuple[str, str], bool] = {}

    def __call__(self, reference: str, candidate: str) -> bool:
        if (reference, candidate) not in self._memo:
            (res,) = self.pool.score_many([(reference, candidate)], fn=EQUIVALENT_FN)
            if res.status != "ok":
                self.failures += 1
            self._memo[(reference, candidate)] = res.status == "ok" and bool(res.value)
        return self._memo[(reference, candidate)]


def maj_metrics(probs: dict[str, list[dict[str, Any]]], n: int, equivalent: Any, normalize: Any) -> dict[str, float]:
    """``maj@k`` for k in :func:`pass_k_values` (n) and k = n: fraction of problems whose vote over the
    first k samples (:func:`areal_cli.eval.metrics.maj_at_k`) is correct."""
    ks = list(dict.fromkeys([*pass_k_values(n), n]))
    correct = dict.fromkeys(ks, 0)
    for samples in probs.values():
        answers = [s.get("extracted") for s in samples]
        verdicts = [bool(s["correct"]) for s in samples]
        for k in ks:
            correct[k] += int(maj_at_k(answers, verdicts, k, normalize=normalize, equivalent=equivalent).correct)
    return {f"maj@{k}": correct[k] / len(probs) for k in ks}


def group_samples(graded: Sequence[dict[str, Any]], pass_name: str) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """``{dataset: {problem_id: [records sorted by sample_index]}}`` of one pass (records without a
    ``pass`` field belong to ``"sample"``), datasets and problems in order of first appearance."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in graded:
        if r.get("pass", "sample") != pass_name:
            continue
        out.setdefault(str(r["dataset"]), {}).setdefault(str(r["problem_id"]), []).append(r)
    for problems in out.values():
        for pid in problems:
            problems[pid].sort(key=lambda s: int(s["sample_index"]))
    return out


def check_sample_counts(dataset: str, problems: dict[str, list[dict[str, Any]]]) -> int:
    """The common number n of samples per problem.

    Raises:
        ValueError: problems with different counts, or indices that are not 0..n-1 (names the problem).
    """
    sizes = {len(s) for s in problems.values()}
    if len(sizes) != 1:
        raise ValueError(f"dataset {dataset}: problems have different numbers of samples {sorted(sizes)}")
    (n,) = sizes
    for pid, samples in problems.items():
        if [int(s["sample_index"]) for s in samples] != list(range(n)):
            raise ValueError(f"dataset {dataset} problem {pid}: sample indices are not 0..{n - 1}")
    return n


def summarize(
    graded: Sequence[dict[str, Any]],
    *,
    pool: RewardPool | None = None,
    problems: dict[str, list[Problem]] | None = None,
    cf_data: str | Path | None = None,
) -> dict[str, dict[str, Any]]:
    """Per-dataset metrics from graded samples (see module docstring for the keys).

    Args:
        graded: records with ``dataset``, ``problem_id``, ``sample_index``, ``extracted``, ``correct``,
            ``grader_status``; optional ``pass`` ("sample" default | "greedy"), ``output_ids``,
            ``finish_reason``, ``code_status``. Every problem needs the same number n of samples 0..n-1.
        pool: the math pool; if given, maj@n also merges answers that math-verify finds equivalent.
        problems: the benchmarks' problems (kind and metadata: enables the code-aware metrics, the
            difficulty/platform breakdown and the Codeforces rating).
        cf_data: directory of Codeforces contest data (rating); None -> the rating says what it needs.

    Returns:
        ``{dataset: {metric: value}}`` in order of first appearance.

    Raises:
        ValueError: inconsistent sample counts or indices.
    """
    from areal_cli.reward.math_grader import normalize_answer_string

    sampled = group_samples(graded, "sample")
    greedy = group_samples(graded, "greedy")
    by_id = {ds: {p.id: p for p in ps} for ds, ps in (problems or {}).items()}
    out: dict[str, dict[str, Any]] = {}
    for ds, probs in sampled.items():
        n = check_sample_counts(ds, probs)
        kind = _dataset_kind(by_id.get(ds, {}))
        verdicts = {pid: [bool(s["correct"]) for s in samples] for pid, samples in probs.items()}
        counts = [sum(v) for v in verdicts.values()]
        metrics: dict[str, Any] = {f"pass@{k}": mean_pass_at_k(counts, n, k) for k in pass_k_values(n)}
        metrics["pass@1_stderr"] = pass1_stderr(list(verdicts.values()))
        equiv = _PoolEquivalence(pool) if pool is not None and kind == "math" else None
        if kind == "math":
            metrics.update(maj_metrics(probs, n, equiv, normalize_answer_string))
        if ds in greedy:
            g = greedy[ds]
            check_sample_counts(f"{ds} (greedy pass)", g)
            metrics["greedy_acc"] = sum(bool(s[0]["correct"]) for s in g.values()) / len(g)
            g_flat = [s for ss in g.values() for s in ss]
            if all("output_ids" in s for s in g_flat):
                metrics["greedy_mean_output_tokens"] = sum(len(s["output_ids"]) for s in g_flat) / len(g_flat)
            metrics.update({f"greedy_{k}": v for k, v in output_counts(g_flat).items()})
        metrics["n_problems"] = len(probs)
        metrics["n_samples"] = n
        flat = [s for ss in probs.values() for s in ss]
        every = flat + [s for ss in greedy.get(ds, {}).values() for s in ss]
        metrics["n_grader_errors"] = sum(s.get("grader_status") == "error" for s in every)
        metrics["n_grader_timeouts"] = sum(s.get("grader_status") == "timeout" for s in every)
        metrics["n_equivalence_failures"] = equiv.failures if equiv is not None else 0
        if kind == "code":
            metrics["code_status_counts"] = dict(Counter(str(s.get("code_status")) for s in every))
        if all("output_ids" in s for s in flat):
            metrics["mean_output_tokens"] = sum(len(s["output_ids"]) for s in flat) / len(flat)
        metrics.update(output_counts(flat))
        if kind == "reward":  # a custom task's reward function: no answer to extract; its mean score instead
            scores = [s["reward"] for s in flat if isinstance(s.get("reward"), (int, float))]
            metrics["mean_reward"] = sum(scores) / len(scores) if scores else None
            for k in ("n_no_answer", "greedy_n_no_answer"):  # nothing is extracted: not a count of anything
                metrics.pop(k, None)
        if ds in by_id:
            metas = {pid: problem_meta(by_id[ds][pid]) for pid in probs if pid in by_id[ds]}
            keys = [k for k in BREAKDOWN_KEYS if any(k in m for m in metas.values())]
            if keys:
                metrics["breakdown"] = breakdown_by(verdicts, metas, keys)
            if ds == CODEFORCES_BENCHMARK:
                metrics["codeforces"] = codeforces_rating(verdicts, metas, cf_data)
        out[ds] = metrics
    return out


def output_counts(records: Sequence[dict[str, Any]]) -> dict[str, int]:
    """What a pass's completions hide behind its accuracy: ``n_no_answer`` (no extracted answer or code) and
    ``n_truncated`` (finish reason ``"length"``: cut by the token budget; only when every record carries a
    finish reason, so that an unknown count is absent rather than 0)."""
    out = {"n_no_answer": sum(r.get("extracted") is None for r in records)}
    if all("finish_reason" in r for r in records):
        out["n_truncated"] = sum(r["finish_reason"] == "length" for r in records)
    return out


def _dataset_kind(problems_by_id: dict[str, Problem]) -> str:
    kinds = {problem_kind(p) for p in problems_by_id.values()}
    return kinds.pop() if len(kinds) == 1 and kinds <= {"code", "reward"} else "math"


# ------------------------------------------------------------------ call sites of areal_cli.eval.metrics / codeforces
def pass1_stderr(verdicts: list[list[bool]]) -> float | None:
    """Standard error of mean pass@1 over problems (:func:`areal_cli.eval.metrics.pass1_mean_and_stderr`);
    None with fewer than 2 problems (JSON has no NaN)."""
    _, stderr = pass1_mean_and_stderr(verdicts)
    return float(stderr) if math.isfinite(stderr) else None


def breakdown_by(verdicts: dict[str, list[bool]], metas: dict[str, dict[str, Any]],
                 keys: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """pass@1 etc. per value of each metadata key (:func:`areal_cli.eval.metrics.breakdown`), e.g.
    ``{"difficulty": {"easy": {"n_problems": .., "n_samples": .., "pass@1": .., "stderr": .., "pass@2": ..},
    ...}, "platform": {...}}``."""
    from areal_cli.eval.metrics import breakdown

    records = [{"problem_id": pid, "correct": v, "meta": metas.get(pid, {})} for pid, v in verdicts.items()]
    return breakdown(records, keys=tuple(keys))


def codeforces_rating(verdicts: dict[str, list[bool]], metas: dict[str, dict[str, Any]],
                      cf_data: str | Path | None) -> dict[str, Any]:
    """Estimated Codeforces rating and percentile (:func:`areal_cli.eval.codeforces.rating_from_verdicts`,
    AReaL ``cf_elo_caculator.py`` / CodeElo method), or ``{"rating": "needs --cf-data DIR"}``.

    A rating that cannot be computed (no contest of the run in the data, too few rated participants, a
    malformed data file) is reported as ``{"rating": None, "error": "<one line>"}``: it is a property of
    the result, and the graded samples stay valid.
    """
    if cf_data is None:
        return {"rating": CF_DATA_NEEDED}
    from areal_cli.foundations.errors import UserError
    from areal_cli.eval.codeforces import rating_from_verdicts

    try:
        return rating_from_verdicts(verdicts, metas, Path(cf_data))
    except UserError as exc:
        return {"rating": None, "error": str(exc)}


def check_cf_data(cf_data: str | Path | None) -> None:
    """Fail early (before any generation) when ``--cf-data`` lacks a file the rating reads.

    Raises:
        UserError: ``DIR: --cf-data needs all_contest_data.json, sorted_rating.json (missing: ...)``.
    """
    if cf_data is None:
        return
    from areal_cli.foundations.errors import UserError
    from areal_cli.eval.codeforces import CONTEST_CACHE_FILE, SORTED_RATINGS_FILE

    d = Path(cf_data)
    missing = [f for f in (CONTEST_CACHE_FILE, SORTED_RATINGS_FILE) if not (d / f).is_file()]
    if missing:
        raise UserError(f"{d}: --cf-data needs {CONTEST_CACHE_FILE} and {SORTED_RATINGS_FILE} "
                        f"(missing: {', '.join(missing)}; layout: evaluation/codeforces/README.md)")
