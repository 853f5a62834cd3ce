"""A run's task: its records, prompt rendering, reward function and rollout workflow, resolved from the
config (the preset of ``task`` fills what the recipe leaves empty; :mod:`areal_cli.tasks.registry`).

Order of use: :class:`Task` reads and checks the records (before any model exists, so that bad data fails
in one line before anything starts), :meth:`Task.tokenizer_corpus` feeds the embedded tiny model's tokenizer,
:meth:`Task.bind` attaches the model's tokenizer, then :meth:`Task.train_stream` / :meth:`Task.heldout` /
:meth:`Task.sft_examples` give :class:`~areal_cli.api.types.Item` objects.

Data order: file and Hub records train in epochs, each a fresh seeded shuffle (``task.shuffle_dataset``); a
function source streams what it yields (``fn("train", seed)``, called again when exhausted). Held out:
``task.eval_dataset``, else ``fn("heldout", seed)`` for function sources, else ``task.heldout_fraction`` of the records
by a hash of their id (:func:`areal_cli.api.records.heldout_by_hash`). Prompts longer than
``task.max_prompt_len`` tokens are dropped and counted (:attr:`Task.dropped_too_long`), as AReaL drops them.
"""

from __future__ import annotations

import itertools
import random
from typing import Any, Iterator

from areal_cli.api.loading import add_code_dir, load_object
from areal_cli.api.records import Record, Source, heldout_by_hash, iter_records, parse_source
from areal_cli.api.reward import check_fields, resolve_reward
from areal_cli.api.types import Item
from areal_cli.api.workflow import make_workflow
from areal_cli.foundations.errors import UserError
from areal_cli.tasks.prompts import PromptRenderer
from areal_cli.tasks.registry import get_preset

#: Records read for the embedded tokenizer's corpus (generic tasks).
CORPUS_RECORDS = 2000
#: Training records rendered when the tokenizer is bound (template mismatches and limits fail at start).
BIND_CHECK_RECORDS = 512


class Task:
    """The task of a run (see the module docstring).

    Args:
        cfg: the run's :class:`~areal_cli.config.TrainConfig`.
        load_workflow: instantiate the workflow now (False in processes that never run episodes).
    Raises:
        UserError: unknown task, missing dataset or reward, unloadable user code, bad records (``file:line:
            field 'x'``), a reward that cannot take the records' fields, no training record.
    """

    def __init__(self, cfg: Any, *, load_workflow: bool = True) -> None:
        preset = get_preset(cfg.task.preset)
        if cfg.task.preset == "tiny-arith" and cfg.task.dataset:
            raise UserError("field 'task.preset': tiny-arith generates its own problems; a recipe with a dataset names its "
                            "task: custom (or math-rl / code-rl for those record formats)")
        self.cfg = cfg
        self.name = cfg.task.preset
        self.kind = preset.kind
        self.seed = int(cfg.seed)
        self.dataset = cfg.task.dataset or preset.dataset
        self.reward_spec = cfg.task.reward or preset.reward
        self.workflow_spec = cfg.task.workflow or preset.workflow
        self.workflow_args = dict(cfg.task.workflow_args)
        self.prompt_field = cfg.task.prompt_field or preset.prompt_field
        self.prompt_template = cfg.task.prompt_template or preset.prompt_template
        self.id_field = cfg.task.id_field or preset.id_field
        self.required = tuple(dict.fromkeys(tuple(preset.required_fields) + tuple(cfg.task.required_fields)))
        self.sft_target_field = cfg.sft.target_field or preset.sft_target_field
        self._sft_target_fn = "" if cfg.sft.target_field else preset.sft_target
        self.code_dir = cfg.task.code_dir
        self._corpus_fn = preset.corpus
        self.dropped_too_long = 0
        if not self.dataset:
            raise UserError(f"field 'task.dataset': task '{self.name}' needs a dataset (a data file, hf:OWNER/NAME or "
                            f"module:function)")
        if not self.reward_spec:
            raise UserError(f"field 'task.reward': task '{self.name}' needs a reward function "
                            f"(reward(prompt, completion, prompt_ids, completion_ids, **fields) -> float)")
        add_code_dir(self.code_dir)
        self._check = load_object(preset.record_check, "record check") if preset.record_check else None
        resolve_reward(self.reward_spec)
        self.workflow = make_workflow(self.workflow_spec, self.workflow_args) if load_workflow else None
        self._renderer: PromptRenderer | None = None
        self._load_records()

    # ------------------------------------------------------------------------------------ records
    def _iter(self, src: Source, what: str, split: str = "train") -> Iterator[Record]:
        for r in iter_records(src, what=what, split=split, seed=self.seed, required=self.required,
                              id_field=self.id_field):
            value = r.fields.get(self.prompt_field)
            if value is None:
                raise UserError(f"{r.where}: field '{self.prompt_field}': missing (the prompt field)")
            if not (isinstance(value, str) and value.strip()) and not isinstance(value, list):
                raise UserError(f"{r.where}: field '{self.prompt_field}': expected a non-empty string or a messages "
                                f"list, got {type(value).__name__} {value!r:.40}")
            if self._check is not None:
                try:
                    self._check(r.fields)
                except ValueError as e:
                    raise UserError(f"{r.where}: {e}") from None
            yield r

    def _load_records(self) -> None:
        cfg = self.cfg
        self.source = parse_source(self.dataset, what="field 'task.dataset'", revision=cfg.task.dataset_revision,
                                   split=cfg.task.dataset_split)
        self.train_records: list[Record] | None = None
        self.heldout_records: list[Record] | None = None
        if self.source.kind != "function":
            records = list(self._iter(self.source, "field 'task.dataset'"))
            if not records:
                raise UserError(f"field 'task.dataset': {self.dataset} holds no record")
            self.train_records = records
        if cfg.task.eval_dataset:
            src = parse_source(cfg.task.eval_dataset, what="field 'task.eval_dataset'", revision=cfg.task.dataset_revision,
                               split="test")
            self.heldout_records = list(self._iter(src, "field 'task.eval_dataset'", "heldout"))
        elif self.train_records is not None:
            self.train_records, self.heldout_records = heldout_by_hash(self.train_records, cfg.task.heldout_fraction)
        if self.train_records is not None and not self.train_records:
            raise UserError(f"field 'task.dataset': no training record left after holding out {cfg.task.heldout_fraction:g} "
                            f"of {self.dataset}")
        first = self.train_records[0] if self.train_records else next(self._iter(self.source, "field 'task.dataset'"),
                                                                        None)
        if first is None:
            raise UserError(f"field 'task.dataset': {self.dataset} yields no record")
        check_fields(self.reward_spec, first.fields, first.where)

    def tokenizer_corpus(self) -> list[str]:
        """Texts for the embedded tiny model's tokenizer: the preset's corpus, else every string (and list of
        strings) field of the first training records."""
        if self._corpus_fn:
            return list(load_object(self._corpus_fn, "corpus")())
        recs = self.train_records if self.train_records is not None else \
            list(itertools.islice(self._iter(self.source, "field 'task.dataset'"), CORPUS_RECORDS))
        out: list[str] = []
        for r in itertools.chain(recs[:CORPUS_RECORDS], (self.heldout_records or [])[:CORPUS_RECORDS]):
            for v in r.fields.values():
                if isinstance(v, str):
                    out.append(v)
                elif isinstance(v, list):
                    out.extend(x for x in v if isinstance(x, str))
        return out

    # --------------------------------------------------------------------------------------- items
    def bind(self, tokenizer: Any) -> "Task":
        """Attach the model's tokenizer (prompts are rendered with it); checks the prompt template.

        Raises:
            UserError: see :meth:`areal_cli.tasks.prompts.PromptRenderer.check`.
        """
        self.tokenizer = tokenizer
        self._renderer = PromptRenderer(tokenizer, self.prompt_field, self.prompt_template, self.kind)
        self._renderer.check()
        if self.train_records is not None:  # render a sample now: a bad record or limit fails before the run
            sample = self.train_records[:BIND_CHECK_RECORDS]
            lengths = [len(self._renderer.render(r.fields, r.where)[1]) for r in sample]
            limit = self.cfg.task.max_prompt_len
            if limit and min(lengths) > limit:
                raise UserError(f"field 'task.max_prompt_len': every prompt of {self.dataset} checked ({len(sample)}) is "
                                f"longer than {limit} tokens (the shortest has {min(lengths)})")
        return self

    def item(self, record: Record) -> Item | None:
        """The :class:`Item` of ``record``, or None (counted) when its prompt exceeds ``task.max_prompt_len``.

        Raises:
            UserError: the record's prompt cannot be rendered (``file:line: field 'prompt': ...``).
        """
        if self._renderer is None:
            raise RuntimeError("Task.bind(tokenizer) first")
        text, ids = self._renderer.render(record.fields, record.where)
        limit = self.cfg.task.max_prompt_len
        if limit and len(ids) > limit:
            self.dropped_too_long += 1
            return None
        return Item(record.id, ids, text, dict(record.fields), record.where)

    def _epochs(self) -> Iterator[Record]:
        """Training records forever: seeded shuffled epochs (files, Hub) or the function's stream."""
        epoch = 0
        while True:
            if self.train_records is not None:
                order = list(self.train_records)
                if self.cfg.task.shuffle_dataset:
                    random.Random(f"areal-epoch:{self.seed}:{epoch}").shuffle(order)
                rows: Iterator[Record] = iter(order)
            else:
                rows = self._iter(self.source, "field 'task.dataset'")
            yield from rows
            epoch += 1

    def train_stream(self) -> Iterator[Item]:
        """Endless training items (module docstring); overlong prompts skipped and counted.

        Raises:
            UserError: a whole pass over the data gave no item (every prompt too long).
        """
        n_train = len(self.train_records) if self.train_records is not None else None
        misses = 0
        for rec in self._epochs():
            item = self.item(rec)
            if item is None:
                misses += 1
                if (n_train is not None and misses >= n_train) or misses >= 100_000:
                    raise UserError(f"field 'task.max_prompt_len': every prompt of {self.dataset} is longer than "
                                    f"{self.cfg.task.max_prompt_len} tokens")
                continue
            misses = 0
            yield item

    def heldout(self, n: int) -> list[Item]:
        """The first ``n`` held-out items (fixed; overlong prompts skipped and counted). May be fewer than ``n``.

        Raises:
            UserError: the function source has no held-out split and no ``task.eval_dataset`` is set.
        """
        if self.heldout_records is not None:
            rows: Iterator[Record] = iter(self.heldout_records)
        else:
            try:
                rows = self._iter(self.source, "field 'task.dataset'", "heldout")
                first = next(rows, None)
            except UserError as e:
                raise UserError(f"{e} (set 'task.eval_dataset' for the held-out records)") from None
            rows = itertools.chain([first] if first is not None else [], rows)
        out: list[Item] = []
        for rec in rows:
            if len(out) >= n:
                break
            item = self.item(rec)
            if item is not None:
                out.append(item)
        return out

    def sft_examples(self, n: int) -> list[tuple[Item, str]]:
        """``n`` distinct training items with their target completion for the warm start: the
        ``sft.target_field`` text (or the preset's target function of the rendered prompt and the record),
        from the function's ``"sft"`` split or the training records in a seeded order.

        Raises:
            UserError: no target, a record without one.
        """
        if not self.sft_target_field and not self._sft_target_fn:
            raise UserError(f"field 'sft.target_field': task '{self.name}' names no target field, so it has no "
                            f"warm start (set sft.max_steps: 0, or name the field holding the target completion)")
        target_fn = load_object(self._sft_target_fn, "sft target") if self._sft_target_fn else None
        if self.train_records is not None:
            order = list(self.train_records)
            random.Random(f"areal-sft:{self.seed}").shuffle(order)
            rows: Iterator[Record] = iter(order)
        else:
            rows = self._iter(self.source, "field 'task.dataset'", "sft")
        out: list[tuple[Item, str]] = []
        seen: set[str] = set()
        for rec in rows:
            if len(out) >= n:
                break
            if rec.id in seen:
                continue
            seen.add(rec.id)
            item = self.item(rec)
            if item is None:
                continue
            if target_fn is not None:
                try:
                    target = target_fn(item.prompt, rec.fields)
                except (KeyError, IndexError, TypeError) as e:
                    raise UserError(f"{rec.where}: the warm start needs a target for this record: "
                                    f"{type(e).__name__}: {e}") from None
            else:
                target = rec.fields.get(self.sft_target_field)
            field_name = self.sft_target_field or "solutions"
            if target is None and target_fn is None and field_name not in rec.fields:
                raise UserError(f"{rec.where}: field '{field_name}': missing; the warm start's target is read from "
                                f"it (sft.target_field; this record has {', '.join(map(repr, rec.fields)) or 'no field'}"
                                f"; -o sft.target_field=NAME, or -o sft.max_steps=0 for no warm start)")
            if not isinstance(target, str):
                raise UserError(f"{rec.where}: field '{field_name}': the warm start's target (sft.target_field) must "
                                f"be a string, got {type(target).__name__}")
            out.append((item, target))
        return out
