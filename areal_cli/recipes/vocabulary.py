"""What a recipe may name: ``areal eval``'s protocols and benchmarks, the in-training held-out sets, the
benchmarks areal cannot evaluate yet, and the data card of each benchmark.

Protocol names come from :mod:`areal_cli.eval.protocols` and benchmark names from ``evaluation/benchmarks.json``
(:mod:`areal_cli.eval.benchmarks`), read when a recipe is validated, so recipes cannot name what ``areal eval``
lacks.
"""

from __future__ import annotations




#: Benchmarks with published numbers that ``areal eval`` cannot run yet: entries must say ``evaluated: false``.
UNSUPPORTED_BENCHMARKS = {"gpqa_diamond": "not yet supported by areal eval"}
#: Held-out sets measured inside a training run (not by ``areal eval``).
TRAINING_BENCHMARKS = ("tiny-arith", "mini-math", "mini-code", "tiny-longtail")
#: Pseudo-benchmark for wall-clock figures of a training run.
TRAINING_FIGURES = "training"
#: The data card (``data_cards/``) of every benchmark a recipe may name.
BENCHMARK_CARDS = {
    "aime24": "math-eval.md", "aime25": "math-eval.md", "amc23": "math-eval.md", "math_500": "math-eval.md",
    "lcb_v5": "lcb_v5.md", "codecontests": "codecontests.md", "codeforces": "codeforces.md",
    "gpqa_diamond": "gpqa-diamond.md", "tiny-arith": "tiny-arith.md", "mini-math": "boba-106k-mini.md",
    "mini-code": "boba2-rl-code-mini.md", "tiny-longtail": "tiny-longtail.md",
}


def eval_vocabulary() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(protocol names, benchmark names a recipe may use): ``areal eval``'s protocols; its declared
    benchmarks plus :data:`UNSUPPORTED_BENCHMARKS` and :data:`TRAINING_BENCHMARKS`."""
    from areal_cli.eval.benchmarks import load_benchmark_specs
    from areal_cli.eval.protocols import PROTOCOLS

    benchmarks = tuple(sorted(load_benchmark_specs())) + tuple(UNSUPPORTED_BENCHMARKS) + TRAINING_BENCHMARKS
    return tuple(PROTOCOLS), benchmarks
