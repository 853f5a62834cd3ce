"""In-loop evaluation of ``areal eval`` benchmarks during ``areal train`` (recipe key ``loop.eval_benchmarks``).

The same pieces as ``areal eval``: benchmark declarations and loaders (:func:`areal_cli.eval.preflight.
load_selected`), protocols (prompt strings and stop strings), per-sample seeds, and the math and code
graders in their worker pools (:class:`areal_cli.eval.grading.Graders`). Differences, all recorded: the
sampling is the run's held-out evaluation's (``loop.eval_n_samples`` at ``loop.eval_temperature``, ``rollout.max_new_tokens``
of training; no separate greedy pass), ``loop.eval_max_problems`` keeps the first N problems of each benchmark,
and the generation goes through the run's rollout client.

Every sample must come from one policy version -- the one the servers hold when the evaluation starts: the
loop awaits any weight load first and publishes nothing until the evaluation ends; a token of another version
is an error, never a silently mixed number.

Results per benchmark: ``pass@1`` (mean correctness over problems and samples), ``n_problems``,
``n_samples``, ``n_truncated`` (completions cut by ``rollout.max_new_tokens``: finish reason "length"),
``n_no_answer`` (completions without an extracted answer or code), ``grader_failures`` (error / timeout: counted
as wrong and reported). They go to metrics.jsonl under ``eval_benchmarks`` (counts beside pass@1) and to the
trackers as ``eval_benchmarks/<benchmark>/<metric>``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from areal_cli.foundations.errors import UserError


@dataclasses.dataclass
class BenchmarkEval:
    """The benchmarks, rendered prompts and grader pools of a run's in-loop evaluation.

    Build with :meth:`prepare` (loads and checks everything before training starts); call :meth:`run`.
    """

    protocol: Any
    prompts: dict[str, list]
    params: Any
    graders: Any
    seed: int

    @classmethod
    def prepare(cls, cfg: Any, tokenizer: Any, model_dir: Path, stop_ids: list[int], vocab_size: int,
                *, tiny_model: bool) -> "BenchmarkEval | None":
        """None when ``cfg.loop.eval_benchmarks`` is empty.

        ``cfg.loop.eval_benchmarks`` entries may be custom tasks (:mod:`areal_cli.eval.custom_task`): a task YAML or
        records file (made absolute against the recipe's folder when the recipe is read), or ``NAME`` with
        ``loop.eval_data_dir/NAME.yaml``; a task's ``samples:`` does not apply (``loop.eval_n_samples`` does).

        Raises:
            UserError: unknown benchmark or task, bad task records or grader, missing data (``loop.eval_data_dir``),
                a protocol that does not fit the benchmarks or the tokenizer, a prompt that does not fit the model.
        """
        if not cfg.loop.eval_benchmarks:
            return None
        import json

        from areal_cli.eval.generate import render_prompts
        from areal_cli.eval.grading import Graders, graders_kinds, prompt_kind
        from areal_cli.eval.preflight import load_selected, selected_specs
        from areal_cli.eval.protocols import check_tokenizer, prompt_token_ids, render_prompt
        from areal_cli.eval.settings import check_protocol_fits, choose_protocol, resolve_protocol
        from areal_cli.rollout.protocol import SamplingParams

        try:
            problems, reports = load_selected(list(cfg.loop.eval_benchmarks), cfg.loop.eval_data_dir or None)
        except UserError as e:
            raise UserError(f"field 'loop.eval_benchmarks': {e}") from None
        if cfg.loop.eval_max_problems:
            problems = {k: v[: cfg.loop.eval_max_problems] for k, v in problems.items()}
        specs = selected_specs(reports)  # the declared benchmarks and the custom tasks among the names
        name = choose_protocol(cfg.loop.eval_protocol or None, specs, list(problems), tiny_model)
        _, proto = resolve_protocol(name, n_samples=cfg.loop.eval_n_samples, temperature=cfg.loop.eval_temperature,
                                    max_new_tokens=cfg.rollout.max_new_tokens, greedy_pass=False)
        check_protocol_fits(proto, problems, specs)
        check_tokenizer(proto, tokenizer)
        model_cfg = json.loads((Path(model_dir) / "config.json").read_text())
        prompts = render_prompts(problems, lambda p: render_prompt(proto, p.problem, tokenizer, prompt_kind(p)),
                                 lambda text: prompt_token_ids(proto, tokenizer, text),
                                 max_new_tokens=proto.max_new_tokens,
                                 max_positions=model_cfg.get("max_position_embeddings"), vocab_size=vocab_size,
                                 model_path=Path(model_dir))
        params = SamplingParams(max_new_tokens=proto.max_new_tokens, temperature=float(proto.temperature),
                                top_p=float(proto.top_p), top_k=proto.top_k, stop_token_ids=stop_ids or None)
        graders = Graders()
        graders.start(graders_kinds(problems))
        return cls(proto, prompts, params, graders, int(cfg.seed))

    @property
    def names(self) -> list[str]:
        """The benchmarks evaluated, in order."""
        return list(self.prompts)

    async def run(self, client: Any, tokenizer: Any, version: int) -> dict[str, dict[str, Any]]:
        """Generate and grade every (problem, sample) through ``client``; all tokens must be of ``version``.

        Returns:
            ``{benchmark: {"pass@1", "n_problems", "n_samples", "n_truncated", "n_no_answer", "grader_failures",
            "version"}}`` (counts over every completion of the benchmark).
        Raises:
            RuntimeError: a sample holds tokens of another policy version.
        """
        from areal_cli.eval.generate import cut_at_stop, sample_seed

        async def one(prompt: Any, i: int) -> tuple[str, bool, str, set, bool, bool | None]:
            p = prompt.problem
            params = dataclasses.replace(self.params, seed=sample_seed(self.seed, p.dataset, p.id, i))
            comp = await client.generate(prompt.ids, params, rid=f"bench-{p.dataset}-{p.id}-{i}-v{version}")
            text, _ = cut_at_stop(tokenizer.decode(comp.output_ids, skip_special_tokens=True), self.protocol.stop)
            verdict = await self.graders.grade(p, text, prompt.think_open, prompt=prompt.text, prompt_ids=prompt.ids,
                                               completion_ids=list(comp.output_ids))
            return (p.dataset, bool(verdict["correct"]), verdict["grader_status"], set(comp.output_versions),
                    getattr(comp, "finish_reason", None) == "length",
                    None if getattr(p, "kind", "math") == "reward" else verdict.get("extracted") is None)  # reward: no answer

        jobs = [one(pr, i) for prompts in self.prompts.values() for pr in prompts
                for i in range(self.protocol.n_samples)]
        results = await asyncio.gather(*jobs)
        versions = set().union(*(r[3] for r in results)) if results else set()
        if versions - {version}:
            raise RuntimeError(f"in-loop benchmark evaluation mixed policy versions {sorted(versions)} "
                               f"(expected {version})")
        out: dict[str, dict[str, Any]] = {}
        for name, prompts in self.prompts.items():
            mine = [r for r in results if r[0] == name]
            out[name] = {"pass@1": sum(r[1] for r in mine) / max(len(mine), 1), "n_problems": len(prompts),
                         "n_samples": self.protocol.n_samples, "n_truncated": sum(r[4] for r in mine),
                         "n_no_answer": None if any(r[5] is None for r in mine) else sum(r[5] for r in mine),
                         "grader_failures": sum(r[2] != "ok" for r in mine), "version": version}
        return out

    def record(self) -> dict[str, Any]:
        """The protocol in force and the problem counts (for summary.json)."""
        return {"protocol": self.protocol.to_dict(), "benchmarks": {k: len(v) for k, v in self.prompts.items()}}

    def close(self) -> None:
        """Stop the grader pools."""
        self.graders.close()
