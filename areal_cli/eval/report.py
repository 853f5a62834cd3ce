"""Outputs of ``areal eval``: the terminal table, ``report.md``, and the atomic write of all result files.

Numbers are shown as AReaL prints them (``eval_and_aggregate.py``, PrettyTable): metric fractions x100
with 1 decimal; pass@1 also with its standard error (``53.3 ± 2.1``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from areal_cli.foundations.atomic import write_atomic_many

#: Per pass: completions without an answer and completions cut by the token budget (finish reason "length").
PASS_COUNTERS = (("n_no_answer", "no answer (sampled)"), ("n_truncated", "truncated (sampled)"),
                 ("greedy_n_no_answer", "no answer (greedy)"), ("greedy_n_truncated", "truncated (greedy)"))
#: Over both passes: grader failures (graded wrong) and failed equivalence checks of maj@k.
GRADER_COUNTERS = (("n_grader_errors", "grader errors"), ("n_grader_timeouts", "grader timeouts"),
                   ("n_equivalence_failures", "equivalence failures"))
COUNTERS = PASS_COUNTERS + GRADER_COUNTERS

#: Units of the values in results.json (report.md and the terminal show fractions x100).
METRIC_UNITS = {"pass@k, maj@k, greedy_acc, *_stderr": "fraction of problems in [0, 1]",
                "codeforces.rating": "Elo rating points", "codeforces.percentile": "percent (0-100)",
                "mean_output_tokens": "tokens", "elapsed_s": "seconds"}


def dataset_names(results: dict[str, Any]) -> list[str]:
    """The dataset keys of a results dict (everything except ``config``)."""
    return [k for k in results if k != "config"]


def pct(x: Any) -> str:
    """A fraction as percent with 1 decimal (``0.8333 -> "83.3"``); ``-`` when absent."""
    return f"{100 * x:.1f}" if isinstance(x, (int, float)) else "-"


def metric_keys(results: dict[str, Any]) -> list[str]:
    """greedy_acc, pass@k and maj@n keys present in any dataset, in a stable order."""
    keys: list[str] = []
    for ds in dataset_names(results):
        for k in results[ds]:
            if (k == "greedy_acc" or k.startswith("maj@") or (k.startswith("pass@") and not k.endswith("_stderr"))) \
                    and k not in keys:
                keys.append(k)
    order = {"greedy_acc": 0}
    return sorted(keys, key=lambda k: (order.get(k, 1 if k.startswith("pass@") else 2),
                                       int(k.split("@")[1]) if "@" in k else 0))


def pass_counters(results: dict[str, Any]) -> list[tuple[str, str]]:
    """The (key, label) of :data:`PASS_COUNTERS` a results dict reports: the sampled pass's always, the greedy
    pass's when a dataset has one (``greedy_acc``)."""
    greedy = any("greedy_acc" in results[ds] for ds in dataset_names(results))
    return [(k, label) for k, label in PASS_COUNTERS if greedy or not k.startswith("greedy_")]


def count_cell(m: dict[str, Any], key: str) -> str:
    """A count as an integer; ``-`` when the results do not know it (e.g. no finish reasons in a regraded file)."""
    v = m.get(key)
    return str(v) if isinstance(v, int) else "-"


def metric_cell(m: dict[str, Any], key: str) -> str:
    """One metric for display; pass@1 carries ``± stderr`` when known (key ``pass@1_stderr``, or
    ``stderr`` in a breakdown group)."""
    if key not in m:
        return "-"
    stderr = m.get("pass@1_stderr", m.get("stderr"))
    if key == "pass@1" and isinstance(stderr, (int, float)) and stderr == stderr:
        return f"{pct(m[key])} ± {pct(stderr)}"
    return pct(m[key])


def render_table(results: dict[str, Any], console: Any = None, out_dir: Path | None = None) -> None:
    """Print the per-dataset metrics as a rich table: one column per dataset, one row per metric
    (percent with 1 decimal, as AReaL prints them; counts as integers); with ``out_dir``, then the folder that
    holds results.json, report.md and samples.jsonl, on a line of its own and whole at any terminal width."""
    from rich.console import Console
    from rich.table import Table

    from areal_cli.train_loop.run_status import print_paths

    console = console or Console()
    datasets = dataset_names(results)
    if not datasets:
        if out_dir is not None:
            print_paths(console, [("outputs (results.json, report.md, samples.jsonl)", out_dir)])
        return
    protocol = (results.get("config") or {}).get("protocol") or {}
    title = "areal eval" + (f" (protocol {protocol['name']})" if protocol.get("name") else "")
    table = Table(title=title, caption="accuracy: % of problems; counts: completions; grader failures graded wrong")
    table.add_column("", no_wrap=True)
    for ds in datasets:
        table.add_column(ds, justify="right", no_wrap=True)

    def row(label: str, fmt: Any) -> None:
        table.add_row(label, *[fmt(results[ds]) for ds in datasets])

    row("problems", lambda m: str(m.get("n_problems", "-")))
    row("samples / problem", lambda m: str(m.get("n_samples", "-")))
    for k in metric_keys(results):
        row("greedy accuracy" if k == "greedy_acc" else k, lambda m, k=k: metric_cell(m, k))
    if any("mean_reward" in results[ds] for ds in datasets):  # custom tasks graded by their reward function
        row("mean reward", lambda m: f"{m['mean_reward']:.3f}" if isinstance(m.get("mean_reward"), (int, float))
            else "-")
    for key, label in pass_counters(results):
        row(label, lambda m, key=key: count_cell(m, key))
    for key, label in GRADER_COUNTERS[:2]:
        row(label, lambda m, key=key: str(m.get(key, 0)))
    console.print(table)
    for ds in datasets:
        line = codeforces_line(results[ds].get("codeforces"))
        if line:
            console.print(f"{ds}: {line}", markup=False, highlight=False, soft_wrap=True)
    if out_dir is not None:
        print_paths(console, [("outputs (results.json, report.md, samples.jsonl)", out_dir)])


def codeforces_line(cf: Any) -> str | None:
    """``rating: 1962 / 97.5% (3 contests)``, ``rating: needs --cf-data DIR``, or ``rating: not computed
    (why)``; None when there is no Codeforces entry."""
    if not isinstance(cf, dict):
        return None
    if isinstance(cf.get("rating"), str):
        return f"rating: {cf['rating']}"
    if cf.get("rating") is None:
        return f"rating: not computed ({cf.get('error', 'unknown reason')})"
    return f"rating: {cf.get('summary') or cf['rating']} (rating / percentile; contests rated: {cf.get('n_contests', '?')})"


def _kit_line(kit: Any) -> str | None:
    """``areal 0.1.0, commit abc123def456 (dirty)`` from ``config.kit``; None when absent."""
    if not isinstance(kit, dict):
        return None
    dirty = {True: " (dirty)", False: "", None: " (dirty: unknown)"}.get(kit.get("dirty"), "")
    return f"areal {kit.get('version', '?')}, commit {str(kit.get('commit', 'unknown'))[:12]}{dirty}"


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return lines


def render_markdown(results: dict[str, Any]) -> str:
    """``report.md``: protocol, model, datasets, a metrics table (rows = datasets, x100, 1 decimal, with the
    no-answer and truncated counts of each pass), breakdowns, Codeforces rating, grader counters, the code
    sandbox's isolation, the kit (version, commit, dirty), config hash, elapsed time."""
    cfg = results.get("config") or {}
    datasets = dataset_names(results)
    protocol = cfg.get("protocol") or {}
    lines = ["# areal eval report", ""]
    sampling = None
    if "temperature" in cfg:
        sampling = f"temperature {cfg['temperature']}, top_p {cfg.get('top_p')}, top_k {cfg.get('top_k')}"
    elapsed = cfg.get("elapsed_s")
    facts = [
        ("mode", cfg.get("mode", "generate")),
        ("protocol", protocol.get("name") if protocol else None),
        ("model", cfg.get("model")),
        ("datasets", ", ".join(datasets)),
        ("samples per problem", cfg.get("n")),
        ("sampling", sampling),
        ("max new tokens", cfg.get("max_new_tokens")),
        ("stop strings", json.dumps(cfg["stop"]) if cfg.get("stop") else None),
        ("greedy pass", cfg.get("greedy_pass")),
        ("seed", cfg.get("seed")),
        ("server", cfg.get("server_url")),
        ("generations file", cfg.get("generations")),
        ("samples reused from an interrupted run", cfg.get("resumed_samples") or None),
        ("code sandbox isolation", (cfg.get("sandbox") or {}).get("summary")),
        ("kit", _kit_line(cfg.get("kit"))),
        ("config hash", cfg.get("config_hash")),
        ("elapsed", f"{elapsed:.1f} s" if isinstance(elapsed, (int, float)) else None),
    ]
    lines += [f"- {k}: {v}" for k, v in facts if v is not None]
    if protocol.get("overrides"):
        preset = protocol.get("preset") or {}
        lines.append("- overridden protocol settings: " + ", ".join(
            f"{k}={protocol.get(k)} (preset {preset.get(k, '-')})" for k in protocol["overrides"]))
    data = cfg.get("data") or {}
    if data:
        lines += ["", "## Data", ""]
        rows = []
        for ds, rep_ in data.items():
            if not isinstance(rep_, dict):
                continue
            win = rep_.get("date_window") or {}
            window = f"{win.get('from') or '-'} .. {win.get('to') or '-'}" if win else "-"
            excluded = ", ".join(f"{k} {v}" for k, v in (rep_.get("excluded") or {}).items()) or "-"
            files = "; ".join(f"{f.get('path')} (sha256 {str(f.get('sha256'))[:12]})" for f in rep_.get("files") or [])
            source = rep_.get("repo_id") or rep_.get("source") or "-"
            if rep_.get("revision"):
                source += f"@{str(rep_['revision'])[:12]}"
            problems = rep_.get("n_problems", "-")
            if rep_.get("limit") is not None:
                problems = f"{problems} (evaluated: the first {rep_['limit']}, --limit {rep_['limit']})"
            rows.append([ds, source, files or "-", window, problems, excluded])
        lines += _md_table(["dataset", "source", "files", "date window", "problems", "excluded"], rows)
    if cfg.get("generations_sha256"):
        lines += ["", f"Generations file sha256: {cfg['generations_sha256']}"]
    lines += ["", "## Metrics (% of problems)", ""]
    keys = metric_keys(results)
    counts = pass_counters(results)
    header = ["dataset", "problems", "samples/problem", *keys, "mean output tokens", *[label for _, label in counts]]
    rows = []
    for ds in datasets:
        m = results[ds]
        tokens = m.get("mean_output_tokens")
        rows.append([ds, m.get("n_problems", "-"), m.get("n_samples", "-"), *[metric_cell(m, k) for k in keys],
                     f"{tokens:.1f}" if isinstance(tokens, (int, float)) else "-",
                     *[count_cell(m, k) for k, _ in counts]])
    lines += _md_table(header, rows)
    rewarded = [ds for ds in datasets if "mean_reward" in results[ds]]
    if rewarded:  # custom tasks graded by their reward function (areal_cli.eval.custom_task)
        lines += ["", "Mean reward (custom tasks' reward functions, sampled completions): " + ", ".join(
            f"{ds} {results[ds]['mean_reward']:.3f}" if isinstance(results[ds]["mean_reward"], (int, float))
            else f"{ds} -" for ds in rewarded)]
    for ds in datasets:
        for key, by_value in (results[ds].get("breakdown") or {}).items():
            lines += ["", f"## {ds}: by {key}", ""]
            sub_keys = sorted({k for v in by_value.values() for k in v if k.startswith("pass@")},
                              key=lambda k: (k.endswith("_stderr"), int(k.split("@")[1].split("_")[0])))
            sub_keys = [k for k in sub_keys if not k.endswith("_stderr")]
            lines += _md_table([key, "problems", *sub_keys],
                               [[val, v.get("n_problems", "-"), *[metric_cell(v, k) for k in sub_keys]]
                                for val, v in by_value.items()])
    for ds in datasets:
        cf = results[ds].get("codeforces")
        if isinstance(cf, dict):
            lines += ["", f"## {ds}: Codeforces", "", f"- {codeforces_line(cf)}"]
            lines += [f"- {k}: {v}" for k, v in cf.items()
                      if k not in ("rating", "summary", "error", "percentile") and not isinstance(v, (list, dict))]
            for c in cf.get("contests") or []:
                lines.append(f"- contest {c.get('contest_id')}: score {c.get('score')}, rank {c.get('rank')} of "
                             f"{c.get('n_participants')} rated participants, rating {c.get('rating')}")
    lines += ["", "## Grader", ""]
    lines += _md_table(["dataset", *[label for _, label in GRADER_COUNTERS]],
                       [[ds, *[results[ds].get(k, "-") for k, _ in GRADER_COUNTERS]] for ds in datasets])
    calls = cfg.get("grader_calls")
    if calls:
        lines += ["", "Grader pool calls: " + json.dumps(calls, sort_keys=True)]
    return "\n".join(lines) + "\n"


def write_outputs(out_dir: Path, results: dict[str, Any], samples: Sequence[dict[str, Any]]) -> None:
    """Write ``results.json``, ``report.md`` and ``samples.jsonl`` into ``out_dir``, all or none
    (:func:`areal_cli.foundations.atomic.write_atomic_many`: every file is complete or untouched)."""
    samples_text = "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples)
    results_text = json.dumps(results, indent=2, ensure_ascii=False) + "\n"
    write_atomic_many({
        out_dir / "samples.jsonl": samples_text,
        out_dir / "report.md": render_markdown(results),
        out_dir / "results.json": results_text,
    })


def json_safe(obj: Any) -> Any:
    """``obj`` with non-finite floats (NaN stderr of a one-problem group) replaced by None: JSON has no NaN."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
