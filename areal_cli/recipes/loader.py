"""Loading a locked recipe: find ``recipes/NAME.yaml``, build its sections, check them against each other,
and load its expected-metrics file: a validated :class:`Recipe`.

A *locked recipe* pins everything needed to re-run one published number (``recipes/README.md``). Sections
(all keys are checked; unknown keys, wrong types and missing required keys are a
:class:`~areal_cli.foundations.errors.UserError` ``file:line: field 'section.key': ...`` at every nesting level):

- ``recipe`` (name = file stem; in a copy outside the shipped folder it may still name the recipe it was copied
  from, see "Copies" below), ``description``, ``source`` (where the settings come from),
  ``kind`` (``async-ppo`` | ``sync-ppo`` | ``sft``), ``trainer`` (``cpu`` | ``gpu``).
- ``model`` / ``published_model`` / ``data``: Hub references. ``revision`` is a 40-hex commit or
  ``null`` with a ``revision_note`` saying why (``areal download`` then refuses without ``--allow-unpinned``).
- ``train``: for ``trainer: cpu`` the settings of :class:`areal_cli.config.TrainConfig` in sections
  (``rollout: {group_size: 8}``; coerced and validated by :mod:`areal_cli.config` itself, so the CPU trainer
  and the recipe can never disagree; a variant's section overrides key by key); for
  ``trainer: gpu`` the keys of :class:`~areal_cli.recipes.schema.PublishedTrainSpec` (AReaL's settings, every
  key required: a locked recipe states each value, even when it is AReaL's default).
- ``variants`` (optional): named ``train`` overrides, e.g. the synchronous twin of an async run.
- ``sft``: :class:`~areal_cli.recipes.schema.SftSpec` (for ``kind: sft`` instead of ``train``).
- ``resources``: GPUs, nodes, AReaL allocation string (its GPU count must equal ``gpus``).
- ``eval``: protocol, benchmarks, samples, sampling settings.
- ``expected``: the expected-metrics file, relative to the recipe's folder (else the recipes folder).

Copies: a published recipe copied into a folder of one's own under another file name (``cp recipes/tiny-arith.yaml
~/mine/my-arith.yaml``; ``areal train ~/mine/my-arith.yaml``, ``areal --recipes-dir ~/mine reproduce my-arith``)
loads as it is, with no bookkeeping edit: its name is its file's stem (``my-arith``; its ``recipe`` field, still
``tiny-arith``, is kept as :attr:`Recipe.copied_from`); its expected-metrics file is ``my-arith.expected.yaml``
beside it when ``expected`` still names the original's file, else the file ``expected`` names beside it, else the
shipped one, and an expected file of the recipe it was copied from is accepted; relative paths in ``train``
(``task.dataset: data/x.jsonl``) that do not exist beside the copy are those of the shipped recipes folder. In the
shipped folder itself ``recipe`` must equal the file name.

Why the ``trainer`` key decides the schema of ``train``: the CPU trainer and AReaL's GPU system have
different settings; one file format with two strict schemas keeps both locked without a grab-bag of
optional keys. Imports: yaml and stdlib only (``areal --help`` stays fast).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from areal_cli.config import TrainConfig, note_flat_names, settings_into
from areal_cli.foundations.errors import UserError
from areal_cli.foundations.hub import REPO_ID, SHA1, SHA256
from areal_cli.recipes.build import build, where
from areal_cli.recipes.expected import EVAL_OVERRIDE_KEYS, ExpectedFile, ExpectedMetric, check_tolerance
from areal_cli.recipes.schema import DataRef, EvalSpec, HubRef, PublishedTrainSpec, RecipeFile
from areal_cli.recipes.vocabulary import TRAINING_FIGURES, UNSUPPORTED_BENCHMARKS, eval_vocabulary
from areal_cli.foundations.resources import recipe_dirs, shipped_dir
from areal_cli.foundations.typed_yaml import LineDict, read_yaml


@dataclass
class Recipe:
    """A validated locked recipe. ``train`` is a :class:`TrainConfig` (trainer cpu) or a
    :class:`PublishedTrainSpec` (trainer gpu); None for ``kind: sft`` (see ``file.sft``). ``expected`` is
    its validated expected-metrics file."""

    name: str
    path: Path
    file: RecipeFile
    train: TrainConfig | PublishedTrainSpec | None
    expected_path: Path
    expected: ExpectedFile | None = None
    copied_from: str | None = None
    """The ``recipe`` field of a copy whose file is named otherwise (the recipe it was copied from), else None."""

    @property
    def kind(self) -> str:
        return self.file.kind

    @property
    def trainer(self) -> str:
        return self.file.trainer

    def variant(self, name: str | None) -> TrainConfig | PublishedTrainSpec | None:
        """The train settings of variant ``name`` (None: the recipe's own).

        Raises:
            UserError: unknown variant (lists the known ones).
        """
        if name is None:
            return self.train
        if name not in self.file.variants:
            known = ", ".join(self.file.variants) or "none"
            raise UserError(f"{self.path}: recipe '{self.name}' has no variant '{name}' (known: {known})")
        return _apply_variant(self, name)


# --- finding recipe files ----------------------------------------------------------------------------


def find_recipe_file(name: str) -> Path | None:
    """``NAME.yaml`` in the first of :func:`areal_cli.foundations.resources.recipe_dirs` holding it (user folders first)."""
    for d in recipe_dirs():
        if (d / f"{name}.yaml").is_file():
            return d / f"{name}.yaml"
    return None


def recipe_names() -> list[str]:
    """Recipe names in the user's recipe folders and the shipped ones (``NAME.yaml``; expected-metrics files
    ``*.expected.yaml`` excluded; :mod:`areal_cli.foundations.resources`)."""
    return sorted({p.name[: -len(".yaml")] for d in recipe_dirs() if d.is_dir() for p in d.glob("*.yaml")
                   if not p.name.endswith(".expected.yaml")})


def recipe_path(name_or_path: str | Path) -> Path:
    """Resolve a recipe name (``recipes/NAME.yaml``) or a path to a ``.yaml`` file.

    Raises:
        UserError: unknown recipe name (lists the known ones) or missing file.
    """
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise UserError(f"{p}: recipe file not found")
        return p
    p = find_recipe_file(str(name_or_path))
    if p is not None and not str(name_or_path).endswith(".expected"):
        return p
    raise UserError(f"unknown recipe '{name_or_path}' (known: {', '.join(recipe_names()) or 'none'})")


# --- loading -----------------------------------------------------------------------------------------


def load_recipe(name_or_path: str | Path) -> Recipe:
    """Load and validate a locked recipe (and check its expected-metrics file exists and agrees).

    Raises:
        UserError: ``file:line: field 'x.y': what`` for any unknown key, wrong type, missing key or bad
            value at any nesting level; unknown recipe name.
    """
    path = recipe_path(name_or_path)
    raw = read_yaml(path)
    rf: RecipeFile = build(RecipeFile, raw if raw is not None else {}, path)
    name = path.name[: -len(path.suffix)]
    shipped = _is_shipped(path)
    if rf.recipe != name and shipped:
        raise UserError(f"{where(rf, 'recipe')}: field 'recipe': must equal the file name '{name}' "
                        f"(got {rf.recipe!r})")
    copied_from = rf.recipe if rf.recipe != name else None  # a copy under another name: named by its file
    _check_hub(rf.model, "model")
    if rf.published_model is not None:
        _check_hub(rf.published_model, "published_model")
    _check_hub(rf.data, "data")
    _check_data(rf.data)
    _check_resources(rf)
    _check_eval(rf.eval)

    train: TrainConfig | PublishedTrainSpec | None = None
    if rf.kind == "sft":
        if rf.sft is None:
            raise UserError(f"{path}:{raw.line}: field 'sft': required key missing (kind is sft)")
        if rf.train is not None:
            raise UserError(f"{where(rf, 'train')}: field 'train': not allowed with kind sft (use 'sft')")
        rf.sft.validate()
    else:
        if rf.train is None:
            raise UserError(f"{path}:{raw.line}: field 'train': required key missing (kind is {rf.kind})")
        if rf.sft is not None:
            raise UserError(f"{where(rf, 'sft')}: field 'sft': only allowed with kind sft")
        train = _build_train(rf, rf.train, path, kind=rf.kind, prefix="train", name=name)
    if rf.variants and rf.kind == "sft":
        raise UserError(f"{where(rf, 'variants')}: field 'variants': variants override 'train'; kind sft has none")
    recipe = Recipe(name=name, path=path, file=rf, train=train, expected_path=_expected_path(rf, path, name),
                    copied_from=copied_from)
    for vname in rf.variants:
        _apply_variant(recipe, vname)  # validates every variant now
    recipe.expected = load_expected(recipe)  # the expected file must exist and agree with the recipe
    return recipe


def _is_shipped(path: Path) -> bool:
    """True when ``path`` lies in the shipped recipes folder (where ``recipe`` must equal the file name)."""
    try:
        return path.parent.resolve() == shipped_dir("recipes").resolve()
    except OSError:
        return False


def _fallback_dirs(path: Path) -> list[Path]:
    """Where relative paths of a locked recipe's ``train`` section are looked up when they do not exist beside
    the recipe: the shipped recipes folder, for a recipe outside it (a copy keeps its original's data)."""
    return [] if _is_shipped(path) else [shipped_dir("recipes")]


def _expected_path(rf: RecipeFile, path: Path, name: str) -> Path:
    """The recipe's expected-metrics file: ``expected`` beside the recipe, else in the shipped folder; in a copy
    whose ``expected`` still names its original's file (``ORIGINAL.expected.yaml``), ``NAME.expected.yaml``
    beside the copy comes first."""
    rel = Path(rf.expected)
    shipped = shipped_dir("recipes")
    candidates = [path.parent / rel, shipped / rel]
    if rf.recipe != name and rf.expected == f"{rf.recipe}.expected.yaml":
        candidates.insert(0, path.parent / f"{name}.expected.yaml")
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise UserError(f"{where(rf, 'expected')}: field 'expected': file '{rf.expected}' not found next to the "
                    f"recipe or in {shipped}")


def _check_hub(ref: HubRef, section: str) -> None:
    if (ref.repo is None) == (ref.builtin is None):
        raise UserError(f"{where(ref)}: field '{section}': give exactly one of 'repo' (Hugging Face) or 'builtin'")
    if ref.builtin is not None:
        if ref.revision is not None:
            raise UserError(f"{where(ref, 'revision')}: field '{section}.revision': a builtin has no revision")
        return
    if not REPO_ID.match(ref.repo):
        raise UserError(f"{where(ref, 'repo')}: field '{section}.repo': not a Hub repo id 'owner/name' "
                        f"(got {ref.repo!r})")
    if ref.revision is None:
        if not ref.revision_note:
            raise UserError(f"{where(ref, 'revision')}: field '{section}.revision': null revision needs a "
                            f"'revision_note' saying why it is not pinned")
    elif not SHA1.match(ref.revision):
        raise UserError(f"{where(ref, 'revision')}: field '{section}.revision': must be a 40-hex commit SHA or "
                        f"null (got {ref.revision!r})")


def _check_data(data: DataRef) -> None:
    if data.repo is not None and not data.files:
        raise UserError(f"{where(data)}: field 'data.files': list the files the recipe trains on")
    for i, f in enumerate(data.files):
        if f.sha256 is not None and not SHA256.match(f.sha256):
            raise UserError(f"{where(f, 'sha256')}: field 'data.files[{i}].sha256': must be 64 lowercase hex "
                            f"digits or null (got {f.sha256!r})")
    if data.repo is not None and any(f.sha256 is None for f in data.files) and not data.checksum_note:
        raise UserError(f"{where(data)}: field 'data.checksum_note': files without sha256 need a note saying why")
    if not data.card:
        raise UserError(f"{where(data)}: field 'data.card': name the data card (data_cards/<card>)")


def allocation_gpus(allocation: str) -> int:
    """GPUs used by an AReaL allocation string: ``sglang.d80m2p1+d4m2p4`` -> 80*2*1 + 4*2*4 = 192
    (parsed by :func:`areal_cli.recipes.placement.parse_allocation`, the one parser of these strings).

    Raises:
        ValueError: not of that form (the message names the bad part).
    """
    from areal_cli.recipes.placement import parse_allocation

    try:
        return parse_allocation(allocation).total
    except UserError as e:
        raise ValueError(str(e)) from None


def _check_resources(rf: RecipeFile) -> None:
    r = rf.resources
    if r.gpus != r.nodes * r.gpus_per_node:
        raise UserError(f"{where(r, 'gpus')}: field 'resources.gpus': must equal nodes * gpus_per_node = "
                        f"{r.nodes * r.gpus_per_node} (got {r.gpus})")
    if rf.trainer == "cpu":
        if r.gpus != 0 or r.allocation is not None:
            raise UserError(f"{where(r, 'gpus')}: field 'resources.gpus': trainer cpu uses no GPUs and no allocation")
        return
    if r.allocation is None:
        if not r.note:
            raise UserError(f"{where(r, 'allocation')}: field 'resources.allocation': null needs a 'note' saying why")
        return
    try:
        n = allocation_gpus(r.allocation)
    except ValueError as e:
        raise UserError(f"{where(r, 'allocation')}: field 'resources.allocation': {e}") from None
    if n != r.gpus:
        raise UserError(f"{where(r, 'allocation')}: field 'resources.allocation': uses {n} GPUs but "
                        f"resources.gpus is {r.gpus}")


def _check_eval(ev: EvalSpec) -> None:
    protocols, benchmarks = eval_vocabulary()
    if ev.protocol not in protocols:
        raise UserError(f"{where(ev, 'protocol')}: field 'eval.protocol': unknown protocol {ev.protocol!r} "
                        f"(known: {', '.join(protocols)})")
    for b in ev.benchmarks:
        if b not in benchmarks:
            raise UserError(f"{where(ev, 'benchmarks')}: field 'eval.benchmarks': unknown benchmark {b!r} "
                            f"(known: {', '.join(benchmarks)})")
    for b, window in ev.date_windows.items():
        if b not in ev.benchmarks:
            raise UserError(f"{where(ev, 'date_windows')}: field 'eval.date_windows.{b}': not in eval.benchmarks")
        if not re.match(r"^\d{4}-\d{2}-\d{2}\.\.\d{4}-\d{2}-\d{2}$", window):
            raise UserError(f"{where(ev, 'date_windows')}: field 'eval.date_windows.{b}': expected "
                            f"'YYYY-MM-DD..YYYY-MM-DD' (got {window!r})")
    if ev.n_samples <= 0 or ev.max_new_tokens <= 0:
        raise UserError(f"{where(ev, 'n_samples')}: field 'eval.n_samples': n_samples and max_new_tokens must be > 0")
    if ev.temperature < 0 or not 0 < ev.top_p <= 1:
        raise UserError(f"{where(ev, 'temperature')}: field 'eval.temperature': need temperature >= 0 and "
                        f"0 < top_p <= 1")


def _build_train(rf: RecipeFile, data: dict, path: Path, *, kind: str | None,
                 prefix: str, name: str) -> TrainConfig | PublishedTrainSpec:
    """Build the train settings for ``rf.trainer``; ``kind`` (None: no kind rule) checks eta; ``name``: the
    recipe's name (its file's stem)."""
    if rf.trainer == "gpu":
        line = data.line if isinstance(data, LineDict) else 1
        spec = build(PublishedTrainSpec, data, path, prefix, line)
        spec.validate(kind=kind)
        return spec
    return _build_cpu_train(data, path, prefix, name=name, kind=kind)


def _build_cpu_train(data: dict, path: Path, prefix: str, *, name: str, kind: str | None) -> TrainConfig:
    """The ``train`` section of a ``trainer: cpu`` recipe (sections, dotted keys or flat names of earlier
    releases: :func:`areal_cli.config.settings_into`), with config's own coercion and validation
    (``TrainConfig.validate``), so a recipe and ``areal train -o`` accept the same values."""
    if isinstance(data, dict) and "recipe" in data:
        line = data.at("recipe") if isinstance(data, LineDict) else 1
        raise UserError(f"{path}:{line}: field '{prefix}.recipe': unknown key (the recipe name is the "
                        f"top-level 'recipe')")
    cfg = TrainConfig()
    lines, written = settings_into(cfg, data, path, prefix, fallback_dirs=_fallback_dirs(path))
    cfg.recipe = name
    cfg.validate(str(path), lines)
    refuse_unknown_preset(cfg, path, lines.get("task.preset", getattr(data, "line", 1)), f"{prefix}.")
    note_flat_names(str(path), written)
    eta = "rollout.max_head_offpolicyness"
    eta_line = f"{path}:{lines.get(eta, data.line if isinstance(data, LineDict) else 1)}"
    if kind == "sync-ppo" and cfg.rollout.max_head_offpolicyness != 0:
        raise UserError(f"{eta_line}: field '{prefix}.{eta}': kind sync-ppo needs eta = 0")
    if kind == "async-ppo" and cfg.rollout.max_head_offpolicyness == 0:
        raise UserError(f"{eta_line}: field '{prefix}.{eta}': kind async-ppo needs eta > 0")
    return cfg


def refuse_unknown_preset(cfg: TrainConfig, path: Path, line: int, prefix: str = "") -> None:
    """Refuse a task preset the registry does not know, at ``path:line`` (where the recipe names it).

    Raises:
        UserError: ``file:line: field 'prefix.task.preset': unknown task 'x' (known: ...)``.
    """
    from areal_cli.tasks.registry import known_tasks

    if cfg.task.preset not in known_tasks():
        raise UserError(f"{path}:{line}: field '{prefix}task.preset': unknown task '{cfg.task.preset}' (known: "
                        f"{', '.join(known_tasks())}; your own data, reward and workflow go in a 'custom' task)")


def _apply_variant(recipe: Recipe, name: str) -> TrainConfig | PublishedTrainSpec:
    """The recipe's ``train`` with variant ``name``'s overrides, validated (no kind/eta rule: a variant
    may be the synchronous twin of an async recipe)."""
    rf = recipe.file
    base, over = rf.train or LineDict(), rf.variants[name].train
    if rf.trainer != "gpu":  # the variant's settings over the base's (a section in both: merged key by key)
        cfg = TrainConfig()
        fallback = _fallback_dirs(recipe.path)
        lines, written = settings_into(cfg, base, recipe.path, "train", fallback_dirs=fallback)
        more, written2 = settings_into(cfg, over or LineDict(), recipe.path, f"variants.{name}.train",
                                       fallback_dirs=fallback)
        cfg.recipe = recipe.name
        cfg.validate(str(recipe.path), {**lines, **more})
        note_flat_names(str(recipe.path), written + written2)
        return cfg
    merged = LineDict({**base, **over})
    merged.line = getattr(base, "line", 1)
    merged.lines = {**getattr(base, "lines", {}), **getattr(over, "lines", {})}
    return _build_train(rf, merged, recipe.path, kind=None, prefix=f"variants.{name}.train", name=recipe.name)


# --- expected metrics --------------------------------------------------------------------------------


def load_expected(recipe: Recipe) -> ExpectedFile:
    """Load and validate ``recipe``'s expected-metrics file.

    Checks, each reported as ``file:line: field 'metrics[i].x'``: schema; recipe name; benchmarks named
    by the recipe's eval section (or ``training`` / in-training sets); variants exist; ``published`` needs a
    published checkpoint; unsupported benchmarks say ``evaluated: false``; every stored tolerance equals
    its formula (so the file cannot drift from recipes/README.md).
    """
    path = recipe.expected_path
    raw = read_yaml(path)
    ef: ExpectedFile = build(ExpectedFile, raw if raw is not None else {}, path)
    owners = [recipe.name] + ([recipe.copied_from] if recipe.copied_from else [])  # a copy may keep its original's
    if ef.recipe not in owners:
        hint = ("" if _is_shipped(recipe.path) else
                f"; a copy keeps its original's expected file while its own 'recipe' field still names the original "
                f"(here {recipe.file.recipe!r}), else it needs one of its own ({recipe.name}.expected.yaml with "
                f"recipe: {recipe.name})")
        raise UserError(f"{where(ef, 'recipe')}: field 'recipe': must be {' or '.join(repr(o) for o in owners)} "
                        f"(got {ef.recipe!r}){hint}")
    if not ef.metrics:
        raise UserError(f"{where(ef, 'metrics')}: field 'metrics': at least one expected metric")
    ev = recipe.file.eval
    seen: dict[str, int] = {}
    for i, m in enumerate(ef.metrics):
        def bad(key: str, why: str, m=m, i=i) -> UserError:
            return UserError(f"{where(m, key)}: field 'metrics[{i}].{key}': {why}")

        if m.key in seen:
            raise bad("benchmark", f"duplicate entry {m.key} (first is metrics[{seen[m.key]}])")
        seen[m.key] = i
        if m.benchmark != TRAINING_FIGURES and m.benchmark not in ev.benchmarks:
            raise bad("benchmark", f"{m.benchmark!r} is not in the recipe's eval.benchmarks {ev.benchmarks}")
        if m.variant is not None and m.variant not in recipe.file.variants:
            raise bad("variant", f"unknown variant {m.variant!r} (recipe has: {', '.join(recipe.file.variants) or 'none'})")
        if m.model == "published" and recipe.file.published_model is None:
            raise bad("model", "'published' needs a published_model in the recipe (use 'trained')")
        if m.benchmark in UNSUPPORTED_BENCHMARKS and m.evaluated:
            raise bad("evaluated", f"{m.benchmark} is {UNSUPPORTED_BENCHMARKS[m.benchmark]}: set evaluated: false")
        if not m.evaluated and not m.evaluated_note:
            raise bad("evaluated_note", "evaluated: false needs a note saying why")
        for k, v in m.eval_overrides.items():
            if k not in EVAL_OVERRIDE_KEYS or not isinstance(v, EVAL_OVERRIDE_KEYS[k]) or isinstance(v, bool):
                raise bad("eval_overrides", f"{k}={v!r}: allowed keys {sorted(EVAL_OVERRIDE_KEYS)} with their eval types")
        check_tolerance(m, ef.z, bad)
    return ef


def headline(recipe: Recipe, expected: ExpectedFile | None = None) -> list[ExpectedMetric]:
    """The entries marked ``headline: true`` (what ``areal ls`` shows)."""
    expected = expected or recipe.expected or load_expected(recipe)
    return [m for m in expected.metrics if m.headline]
