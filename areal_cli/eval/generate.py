"""Generation for ``areal eval``: the model directory, one job per (pass, problem, sample), one request each.

A *job* is one sample to generate: the problem, its prompt token ids, the pass it belongs to
(``"sample"``: the protocol's n sampled completions; ``"greedy"``: AReaL's separate greedy run, temperature
0, n = 1, top_p 1) and its sample index. Each request carries its own seed, derived from the run seed and
the sample's identity (:func:`sample_seed`), so a sample does not depend on request order, concurrency,
other datasets, or on being generated in a resumed run.

Generation goes through any object with ``async generate(prompt_ids, params, rid) -> Completion`` and
``async aclose()``: :class:`areal_cli.rollout.client.RolloutClient` against the embedded server or an
already running SGLang-protocol server (``--server-url``).

Stop strings (protocol ``stop``, e.g. AReaL's ``"\\n\\n\\n"`` for "pure" prompts): the wire format
(:class:`areal_cli.rollout.protocol.SamplingParams`) has stop token ids only, so stop strings are applied
to the decoded text (cut at the first occurrence); the output ids are kept whole.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol as TypingProtocol, Sequence

from areal_cli.foundations.errors import UserError
from areal_cli.eval.benchmarks import Problem

TINY_MODEL_SEED = 0
PASSES = ("sample", "greedy")


# ---------------------------------------------------------------------------------------------- model
def default_cache_dir() -> Path:
    """``$AREAL_CACHE_DIR`` or ``~/.cache/areal``."""
    env = os.environ.get("AREAL_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "areal"


def ensure_tiny_model(cache_dir: Path | None = None, seed: int = TINY_MODEL_SEED) -> Path:
    """The tiny default model (``areal_cli.models.tiny.build_tiny_model``), built once into
    ``cache_dir/models/tiny-seed{seed}`` (built in a temp dir, then renamed: never half-written)."""
    from areal_cli.models.tiny import build_tiny_model

    root = (cache_dir or default_cache_dir()) / "models"
    final = root / f"tiny-seed{seed}"
    if (final / "config.json").is_file() and (final / "model.safetensors").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tiny-seed{seed}.", dir=root))
    try:
        build_tiny_model(tmp, seed=seed)
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / "model.safetensors").is_file():  # a concurrent build won the race otherwise
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def read_model_config(model_dir: Path) -> dict[str, Any]:
    """``model_dir/config.json`` as a dict (needs an integer ``vocab_size``).

    Raises:
        UserError: missing directory or file, malformed JSON, no integer vocab_size.
    """
    cfg_path = model_dir / "config.json"
    if not model_dir.is_dir():
        what = "not a directory" if model_dir.exists() else "no such file or directory"
        raise UserError(f"{model_dir}: {what}: expected a model directory or a .gguf file (a published model: "
                        f"`areal download MODEL_REPO_ID --local-dir DIR`)")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{cfg_path}: not found (a Hugging Face model directory needs config.json)") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{cfg_path}: malformed JSON: {exc}") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("vocab_size"), int):
        raise UserError(f"{cfg_path}: field 'vocab_size' missing or not an integer")
    return cfg


def check_embedded_family(model_dir: Path, cfg: dict[str, Any]) -> None:
    """The embedded server runs the families of :mod:`areal_cli.models.families` only: an other one is one line
    here, before the server would refuse it at start-up (an external SGLang server may serve more).

    Raises:
        UserError: ``config.json: field 'model_type': ... (supported: ...)``.
    """
    from areal_cli.models.families import UnsupportedModel, family_of

    try:
        family_of(cfg, str(model_dir / "config.json"))
    except UnsupportedModel as e:
        raise UserError(str(e)) from None


def eos_ids(model_dir: Path, cfg: dict[str, Any], tokenizer: Any) -> list[int]:
    """Stop token ids: eos ids of config.json, generation_config.json and the tokenizer (deduplicated)."""
    ids: list[int] = []

    def add(v: Any) -> None:
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, int) and not isinstance(x, bool) and x not in ids:
                ids.append(x)

    add(cfg.get("eos_token_id"))
    gen = model_dir / "generation_config.json"
    if gen.is_file():
        try:
            add(json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id"))
        except (json.JSONDecodeError, AttributeError):
            pass
    add(getattr(tokenizer, "eos_token_id", None))
    return ids


def model_vocab(model: str | Path) -> set[str]:
    """The token strings of ``model`` (a model directory or a ``.gguf`` file), read without converting or loading
    weights, so that a protocol the model cannot read is refused (or a default replaced) before anything costly.

    Raises:
        UserError: a path that does not exist, not a model directory, an unreadable GGUF file or tokenizer.
    """
    from areal_cli.models.gguf import is_gguf, tokens
    from areal_cli.models.packaged import locate_model

    p = locate_model(model)  # a packaged model's name: its file
    if is_gguf(p):
        return tokens(p)
    read_model_config(p)  # a missing path or a folder without config.json: one line
    return set(load_tokenizer(p).get_vocab())


def load_tokenizer(model_dir: Path) -> Any:
    """``AutoTokenizer.from_pretrained(model_dir)``.

    Raises:
        UserError: the tokenizer cannot be loaded (one line with the loader's reason).
    """
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as exc:  # noqa: BLE001 - any loader failure is a bad model dir
        from areal_cli.reward.pool import one_line

        raise UserError(f"{model_dir}: cannot load tokenizer: {one_line(exc)}") from None


# ---------------------------------------------------------------------------------------------- jobs
def sample_seed(seed: int, dataset: str, problem_id: str, sample_index: int) -> int:
    """Per-request sampling seed (SGLang ``sampling_seed``), a 31-bit integer from SHA-256 of
    ``"{seed}:{dataset}:{problem_id}:{sample_index}"``: each sample's randomness depends only on its own
    identity, not on request order, concurrency or which other datasets are evaluated."""
    digest = hashlib.sha256(f"{seed}:{dataset}:{problem_id}:{sample_index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclass(frozen=True)
class Prompt:
    """One problem's rendered prompt.

    Attributes:
        problem: the benchmark problem.
        text: the prompt string (protocol template or chat template applied).
        ids: its token ids (``add_special_tokens=False``: the template holds them).
        think_open: the prompt ends inside an open ``<think>`` (R1 / Qwen3-think templates): the completion
            continues the thinking, so graders see ``"<think>" + completion``.
    """

    problem: Problem
    text: str
    ids: list[int]
    think_open: bool


@dataclass(frozen=True)
class Job:
    """One sample to generate. ``key`` = (pass, dataset, problem id, sample index) identifies it in
    ``samples.jsonl`` and in the resume file."""

    prompt: Prompt
    pass_name: str
    sample_index: int

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (self.pass_name, self.prompt.problem.dataset, self.prompt.problem.id, self.sample_index)


def render_prompts(
    problems_by_ds: dict[str, list[Problem]],
    render: Callable[[Problem], str],
    tokenize: Callable[[str], list[int]],
    *,
    max_new_tokens: int,
    max_positions: int | None,
    vocab_size: int,
    model_path: Path,
) -> dict[str, list[Prompt]]:
    """Render and tokenize every problem's prompt; check it fits the model.

    Args:
        render: problem -> prompt string (the protocol's template or the chat template).
        tokenize: prompt string -> token ids (with or without special tokens, as the protocol says).
        max_positions: the model's ``max_position_embeddings`` (None: no check).

    Raises:
        UserError: ``file:line`` of a prompt whose tokens + ``max_new_tokens`` exceed ``max_positions``;
            a tokenizer that produces ids outside the vocabulary.
    """
    out: dict[str, list[Prompt]] = {}
    for ds, problems in problems_by_ds.items():
        prompts = []
        for p in problems:
            text = render(p)
            ids = tokenize(text)
            if isinstance(max_positions, int) and len(ids) + max_new_tokens > max_positions:
                raise UserError(
                    f"{p.path}:{p.line}: prompt ({len(ids)} tokens) + max_new_tokens "
                    f"({max_new_tokens}) exceeds the model's max_position_embeddings ({max_positions})"
                )
            if any(not 0 <= i < vocab_size for i in ids):
                raise UserError(f"{model_path}: tokenizer produces ids outside the model vocabulary ({vocab_size})")
            prompts.append(Prompt(p, text, ids, text.rstrip().endswith("<think>")))
        out[ds] = prompts
    return out


def make_jobs(prompts_by_ds: dict[str, list[Prompt]], n: int, greedy_pass: bool) -> list[Job]:
    """All jobs of a run, in order: per dataset, the greedy pass (if any) then n samples per problem."""
    jobs: list[Job] = []
    for prompts in prompts_by_ds.values():
        if greedy_pass:
            jobs.extend(Job(p, "greedy", 0) for p in prompts)
        jobs.extend(Job(p, "sample", i) for p in prompts for i in range(n))
    return jobs


# ---------------------------------------------------------------------------------------------- requests
class Generator(TypingProtocol):
    """What the runner needs from a generation backend (``RolloutClient`` satisfies it)."""

    async def generate(self, prompt_ids: list[int], params: Any, rid: str | None = None) -> Any: ...

    async def aclose(self) -> None: ...


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, str | None]:
    """``text`` up to the earliest occurrence of any stop string, and that string (None if none occurs)."""
    best: tuple[int, str] | None = None
    for s in stop:
        i = text.find(s) if s else -1
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return (text, None) if best is None else (text[: best[0]], best[1])


async def generate_sample(generator: Generator, job: Job, params: Any, seed: int, tokenizer: Any,
                          stop: Sequence[str]) -> dict[str, Any]:
    """Generate one job's completion.

    Args:
        params: :class:`~areal_cli.rollout.protocol.SamplingParams` of the job's pass (its ``seed`` is
            replaced by :func:`sample_seed`).

    Returns:
        the sample record before grading: pass, dataset, problem_id, sample_index, prompt (the rendered prompt
        text the model continued), output_ids (list[int]), text (decoded, special tokens skipped, cut at the
        first stop string), finish_reason, stop_string (the stop string that cut the text, or None), gold.
    """
    p = job.prompt.problem
    sample_params = dataclasses.replace(params, seed=sample_seed(seed, p.dataset, p.id, job.sample_index))
    rid = f"eval-{job.pass_name}-{p.dataset}-{p.id}-{job.sample_index}"
    comp = await generator.generate(job.prompt.ids, sample_params, rid=rid)
    text, stop_string = cut_at_stop(tokenizer.decode(comp.output_ids, skip_special_tokens=True), stop)
    return {
        "pass": job.pass_name,
        "dataset": p.dataset,
        "problem_id": p.id,
        "sample_index": job.sample_index,
        "prompt": job.prompt.text,
        "output_ids": [int(t) for t in comp.output_ids],
        "text": text,
        "finish_reason": comp.finish_reason,
        "stop_string": stop_string,
        "gold": p.answer,
    }
