"""Locked recipes: one YAML file per published result, its expected metrics, and the pass/fail comparison.

A *locked recipe* (``recipes/<name>.yaml``) pins everything needed to re-run one published number: the
model and data (Hub repo + 40-hex commit, or a built-in), every training hyperparameter, the resources
and the evaluation protocol. Its *expected-metrics file* (``recipes/<name>.expected.yaml``) carries each
published number with its source and a tolerance derived from sampling error (``recipes/README.md``).

Modules, each one idea (lower ones never import higher ones):

- :mod:`~areal_cli.recipes.vocabulary`: benchmarks, protocols and data cards a recipe may name.
- :mod:`~areal_cli.recipes.build`: strict dataclass building from YAML mappings, errors at ``file:line``.
- :mod:`~areal_cli.recipes.schema`: the sections of a recipe file (:class:`PublishedTrainSpec`, ...).
- :mod:`~areal_cli.recipes.tolerance`: tolerances from sampling error (binomial means, Codeforces ratings).
- :mod:`~areal_cli.recipes.expected`: the entries of an expected-metrics file, each tolerance checked against
  its formula.
- :mod:`~areal_cli.recipes.loader`: finding and loading a recipe and its expected file into a validated
  :class:`Recipe`.
- :mod:`~areal_cli.recipes.compare`: measured figures against the expected ones (:func:`compare`).
- :mod:`~areal_cli.recipes.gpu_train`: a published GPU recipe as an ``areal train`` run.
- :mod:`~areal_cli.recipes.train_config`: what ``areal train`` runs from a recipe (:func:`load_train_config`), and
  whether a GPU recipe can run here (:func:`check_runs_here`).

The YAML reader itself (line numbers, duplicate keys) is the foundation :mod:`areal_cli.foundations.typed_yaml`.
"""

from areal_cli.recipes.build import build, where
from areal_cli.recipes.compare import Check, Measured, compare
from areal_cli.recipes.expected import (
    EVAL_OVERRIDE_KEYS,
    ExpectedFile,
    ExpectedMetric,
    expected_tolerance,
)
from areal_cli.recipes.gpu_train import gpu_train_config
from areal_cli.recipes.loader import (
    Recipe,
    allocation_gpus,
    find_recipe_file,
    headline,
    load_expected,
    load_recipe,
    recipe_names,
    recipe_path,
)
from areal_cli.recipes.schema import (
    AREAL_KEYS,
    DataFile,
    DataRef,
    EvalSpec,
    HubRef,
    PublishedTrainSpec,
    RecipeFile,
    Resources,
    SftSpec,
    Source,
    Variant,
)
from areal_cli.recipes.tolerance import (
    CF_CONTESTS,
    CF_PERCENTILE_PER_ELO,
    CF_SIGMA_CONTEST,
    Z_DEFAULT,
    Mode,
    Tolerance,
    binomial_tolerance,
    codeforces_rating_tolerance,
)
from areal_cli.recipes.train_config import (check_runs_here, gpu_recipe_edits, load_train_config, recipe_ref,
                                            train_config_from_recipe)
from areal_cli.recipes.vocabulary import (
    BENCHMARK_CARDS,
    TRAINING_BENCHMARKS,
    TRAINING_FIGURES,
    UNSUPPORTED_BENCHMARKS,
    eval_vocabulary,
)

__all__ = [
    "AREAL_KEYS", "BENCHMARK_CARDS", "CF_CONTESTS", "CF_PERCENTILE_PER_ELO", "CF_SIGMA_CONTEST", "Check",
    "DataFile", "DataRef", "EVAL_OVERRIDE_KEYS", "EvalSpec", "ExpectedFile", "ExpectedMetric", "HubRef", "Measured",
    "Mode", "PublishedTrainSpec", "Recipe", "RecipeFile", "Resources", "SftSpec", "Source", "TRAINING_BENCHMARKS",
    "TRAINING_FIGURES", "Tolerance", "UNSUPPORTED_BENCHMARKS", "Variant", "Z_DEFAULT", "allocation_gpus",
    "binomial_tolerance", "build", "check_runs_here", "codeforces_rating_tolerance", "compare", "eval_vocabulary", "expected_tolerance",
    "find_recipe_file", "gpu_recipe_edits", "gpu_train_config", "headline", "load_expected", "load_recipe", "load_train_config",
    "recipe_names", "recipe_path", "recipe_ref", "train_config_from_recipe", "where",
]
