"""The results pages of the site, generated from ``benchmarks/results/`` at build time.

A *results folder* is a folder of ``benchmarks/results/`` (``simulate/``'s subfolders each count as one): its
page shows its ``NOTES.md`` (the measurement log, written by hand), then for every ``results.json`` in it the
table the benchmark itself prints (``areal_cli.bench``'s own renderers where there is one), and its plots. A
loose ``NAME.json`` (the component benchmarks) is shown on one page with ``NAME.md`` beside it as its notes.
The overview tables read the same files, and the recipes' expected numbers come from ``recipes/*.expected.yaml``.
Nothing here holds a number.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
log = logging.getLogger("mkdocs.hooks.results")

#: Overview sections and the results folders they hold (first match wins), in the order of the nav.
GROUPS = (
    ("Async vs sync: tiny-arith", lambda r: r.startswith("throughput-tiny-arith")),
    ("Async vs sync: tiny-longtail", lambda r: r.startswith("throughput-tiny-longtail")),
    ("Staleness ablation", lambda r: r.startswith("staleness-")),
    ("Cluster simulator", lambda r: r.startswith("simulate/")),
    ("Engines, real models, multi-turn, tried ideas", lambda r: True),
)
_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})$")


# ---------------------------------------------------------------------------------------------- discovery
def folders() -> list[str]:
    """Results folders relative to benchmarks/results, newest first within each group."""
    out = []
    for p in sorted(RESULTS.iterdir()):
        if not p.is_dir():
            continue
        if p.name == "simulate":
            out += [f"simulate/{q.name}" for q in sorted(p.iterdir()) if q.is_dir()]
        else:
            out.append(p.name)
    for rel in out:
        if not _DATE.search(rel):
            log.warning(f"benchmarks/results/{rel}: a results folder's name ends with the date it was measured "
                        f"(<benchmark>-<task>-<what>-YYYY-MM-DD; benchmarks/README.md, 'Results folders')")
    return sorted(out, key=lambda r: (_DATE.search(r).group(1) if _DATE.search(r) else "", r), reverse=True)


def group_of(rel: str) -> str:
    return next(name for name, match in GROUPS if match(rel))


def loose_files() -> list[Path]:
    """The component benchmarks: NAME.json files, and NAME.md notes of a benchmark that writes no file."""
    stems = {p.stem for p in RESULTS.glob("*.json")} | {p.stem for p in RESULTS.glob("*.md")}
    return [RESULTS / f"{s}.json" for s in sorted(stems)]


def page_uri(rel: str) -> str:
    return f"results/{rel}/index.md"


def nav(nav_config: list) -> list:
    """The configured nav with its ``Results`` entry grown into the overview, a section per group and the
    component benchmarks."""
    groups: dict[str, list] = {name: [] for name, _ in GROUPS}
    for rel in folders():
        groups[group_of(rel)].append({rel.split("/")[-1]: page_uri(rel)})
    entry = [{"Overview": "results/index.md"}, {"Expected numbers of the recipes": "results/recipes.md"},
             *({name: pages} for name, pages in groups.items() if pages),
             {"Component benchmarks": "results/components.md"}]
    out = []
    for item in nav_config:
        if isinstance(item, dict) and "Results" in item:
            out.append({"Results": entry})
        else:
            out.append(item)
    return out


# ---------------------------------------------------------------------------------------------- helpers
def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"docs: {path.relative_to(ROOT)}: not readable JSON ({e})") from None


def kind(d: dict) -> str:
    if "grid" in d and "scenario" in d:
        return "staleness"
    if "modes" in d and "ratios" in d and "scenario" in d:
        return "throughput"
    if isinstance(d.get("scenario"), dict) and d["scenario"].get("kind") == "simulate":
        return "simulate"
    if "models" in d and "sglang" in d:
        return "engine-vs-sglang"
    if "means" in d and "workflow_args" in d:
        return "multi-turn"
    if "mean_final" in d and "runs" in d:
        return "real-model-rl"
    return "generic"


def cell(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def md_table(head: list[str], rows: list[list], nowrap: bool = False) -> list[str]:
    table = (["| " + " | ".join(cell(h) for h in head) + " |", "|" + "---|" * len(head)]
             + ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows])
    return ['<div class="nowrap-table" markdown>', "", *table, "", "</div>"] if nowrap else table


#: Results pages use the whole width (no table of contents on the right).
FRONT = "---\nhide:\n  - toc\n---\n\n"


def rich_to_markdown(table) -> list[str]:
    """A rich Table (as a benchmark prints it) as Markdown: its title, the table, its caption."""
    from rich.text import Text

    def plain(x) -> str:
        return x.plain if isinstance(x, Text) else Text.from_markup(str(x)).plain

    cols = table.columns
    rows = [[plain(c) for c in cells] for cells in zip(*(col.cells for col in cols))]
    out = [f"**{plain(table.title)}**", ""] if table.title else []
    out += md_table([plain(c.header) for c in cols], rows)
    if table.caption:
        out += ["", f"*{plain(table.caption)}*"]
    return out


def f2(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


# -------------------------------------------------------------------------------------- one results.json
def render(d: dict) -> list[str]:
    k = kind(d)
    if k == "throughput":
        from areal_cli.bench.throughput.table import headline_line, results_table

        out = rich_to_markdown(results_table(d))
        line = headline_line(d)
        return out + (["", f"`{line}`"] if line else [])
    if k == "staleness":
        from areal_cli.bench.staleness.report import table_markdown

        md = table_markdown(d).split("\n")
        return md[2:]  # without its own "# title" line
    if k == "simulate":
        return render_simulate(d)
    if k == "engine-vs-sglang":
        return render_engines(d)
    if k == "multi-turn":
        return render_multi_turn(d)
    if k == "real-model-rl":
        return render_real_rl(d)
    return render_generic(d)


def render_simulate(d: dict) -> list[str]:
    rows = [[m, v.get("eta"), "yes" if v.get("interruptible") else "no", f2(v.get("step_s"), "{:.3g}"),
             f2(v.get("effective_tokens_per_s"), "{:,.0f}"), f2(v.get("staleness_mean")),
             f2(v.get("speedup_vs_sync"))] for m, v in d["modes"].items()]
    out = md_table(["mode", "eta", "interruptible", "s per step", "effective tok/s", "staleness (mean)",
                    "over sync"], rows)
    pc = d.get("published_check")
    if pc:
        out += ["", f"Published: {pc['published_sync_hours']} h sync / {pc['published_async_hours']} h async = "
                f"{pc['published_ratio']:.2f}x; predicted {pc['predicted_sync_hours']:.1f} / "
                f"{pc['predicted_async_hours']:.1f} h = **{pc['predicted_ratio']:.2f}x** "
                f"({pc['ratio_rel_error']:+.1%}). Source: {pc.get('source', '-')}."]
    mc = d.get("measured_check")
    if mc:
        rows = [[m, f2(v["measured"]), f2(v["predicted"]), f"{v['rel_error']:+.1%}"]
                for m, v in mc.items() if isinstance(v, dict)]
        out += ["", "Against the measured runs (steady state):", ""]
        out += md_table(["ratio", "measured", "predicted", "error"], rows)
        if mc.get("source"):
            out += ["", f"Measured: `{mc['source']}`"]
    return out


def render_engines(d: dict) -> list[str]:
    rows = []
    for model, m in d["models"].items():
        for eng, e in m["engines"].items():
            rows.append([model, eng, f2(e["tok_s_1"]["median"], "{:.1f}"), f2(e["tok_s_32"]["median"], "{:,.0f}"),
                         f2(e.get("fraction_of_bound_32"), "{:.0%}"), f2(e["disk_update_s"]["median"], "{:.3f} s"),
                         f2(e["dist_update_s"]["median"], "{:.3f} s"), f2(e.get("ready_s"), "{:.0f} s")])
    out = md_table(["model", "engine", "tok/s, 1 request", "tok/s, 32 concurrent", "of compute bound",
                    "update from disk", "update over gloo", "ready after"], rows)
    mc = d.get("machine", {})
    cpu = mc.get("cpu_use", {})
    out += ["", f"Medians of {d['settings']['repeats']} repeats, {d['settings']['new_tokens']} greedy tokens per "
            f"request; SGLang {d['sglang']['version']}; float32 matmul peak {mc.get('fp32_matmul_peak_gflops')} "
            f"GFLOP/s; other processes {cpu.get('other_cores', '-')} core"
            + (" (BUSY MACHINE)" if mc.get("busy_machine") else "") + "."]
    return out


def render_multi_turn(d: dict) -> list[str]:
    rows = [[r, f"{m['warm_start.first_try']:.3f} → {m['final.first_try']:.3f}",
             f"{m['warm_start.within_max_turns']:.3f} → {m['final.within_max_turns']:.3f}",
             f"{m['wall_s']:.0f} s", m["n_seeds"]] for r, m in d["means"].items()]
    out = md_table(["recipe", "first try: warm start → final", "within max_turns: warm start → final",
                    "wall time (mean)", "seeds"], rows)
    per = [[name, f"{r['final']['first_try']:.3f}", f"{r['final']['within_max_turns']:.3f}",
            f"{r['warm_start_s']:.0f} + {r['rl_s']:.0f} s", r["samples_generated"], r["tokens_generated"]]
           for name, r in d["runs"].items()]
    return out + ["", f"{d['steps']} RL steps per run; workflow_args `{json.dumps(d['workflow_args'])}`.", ""] + \
        md_table(["run", "final first try", "final within max_turns", "warm start + RL", "samples", "tokens"], per)


def render_real_rl(d: dict) -> list[str]:
    rows = [[seed, f"{r['start']:.3f}", f"{r['final']:.3f}", f"{r['best']:.3f}", r["steps"],
             f"{r['rl_seconds']:.0f} s"] for seed, r in d["runs"].items()]
    return md_table(["seed", "start", "final", "best", "steps", "RL time"], rows) + [
        "", f"{d.get('model')}; {d.get('heldout_prompts')} held-out prompts. Mean {d['mean_start']:.3f} → "
        f"{d['mean_final']:.3f} (gain **{d['gain']:+.3f}**); binomial SE of one evaluation "
        f"{d['binomial_se_one_eval']:.3f}, seed spread of the final accuracy {d['seed_spread_final']:.3f}."]


def _flatten(d, prefix="", depth=0):
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and depth < 2:
            yield from _flatten(v, key + ".", depth + 1)
        elif isinstance(v, (int, float, str, bool)) or v is None:
            yield key, v
        elif isinstance(v, list) and len(v) <= 8 and all(isinstance(x, (int, float, str)) for x in v):
            yield key, ", ".join(f"{x:.4g}" if isinstance(x, float) else str(x) for x in v)


def render_generic(d: dict) -> list[str]:
    rows = []
    for k, v in _flatten(d):
        if isinstance(v, float):
            v = f"{v:.4g}"
        v = str(v)
        rows.append([f"`{k}`", v if len(v) < 160 else v[:157] + "..."])
    return md_table(["field", "value"], rows[:80]) + (["", f"({len(rows) - 80} more fields in the file)"]
                                                      if len(rows) > 80 else [])


# ---------------------------------------------------------------------------------------------- pages
def folder_page(rel: str) -> tuple[str, list[tuple[str, Path]]]:
    """The page of one results folder and the images it shows (page-relative path, file)."""
    base = RESULTS / rel
    images: list[tuple[str, Path]] = []
    out = [FRONT + f"# {rel.split('/')[-1]}", ""]
    date = _DATE.search(rel)
    out += [f"`benchmarks/results/{rel}/` · measured {date.group(1) if date else '?'} · "
            f"{group_of(rel)} · [all results](" + "../" * (rel.count("/") + 1) + "index.md)", ""]
    notes = base / "NOTES.md"
    if notes.is_file():
        text = notes.read_text(encoding="utf-8")
        out += [re.sub(r"^# .*\n", "", text, count=1).strip(), ""]
        images += [(m, base / m) for m in re.findall(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", text)
                   if (base / m).is_file()]
    else:
        log.warning(f"benchmarks/results/{rel}: no NOTES.md (what was measured, how, and what it shows)")
    files = sorted(base.rglob("results.json"), key=lambda p: (len(p.parts), str(p)))
    for res in files:
        sub = res.parent.relative_to(base).as_posix()
        d = _load(res)
        title = "Recorded results" if sub == "." else f"`{sub}/`"
        out += [f"## {title}", ""]
        meta = []
        if d.get("command"):
            meta.append(f"command: `{d['command']}`")
        if d.get("created"):
            meta.append(f"created {d['created'][:16].replace('T', ' ')}")
        load = (d.get("machine") or {}).get("start", {}).get("load_average") if isinstance(d.get("machine"), dict) \
            else None
        if load:
            meta.append(f"load at start {load}")
        if meta:
            out += ["; ".join(meta), ""]
        out += render(d) + [""]
        pngs = sorted(res.parent.glob("*.png"))
        for png in pngs:
            rel_png = png.relative_to(base).as_posix()
            if rel_png not in dict(images):
                images.append((rel_png, png))
                out += [f"![{png.stem}]({rel_png})", ""]
    other = sorted(p.relative_to(base).as_posix() for p in base.rglob("*")
                   if p.is_file() and p.name not in ("NOTES.md",))
    out += ["## Files", "", ", ".join(f"`{p}`" for p in other), ""]
    return "\n".join(out), images


def components_page() -> str:
    out = ["# Component benchmarks", "",
           "One file each in `benchmarks/results/` (written by the scripts in `benchmarks/`; what each measures: "
           "[Benchmarks](../guides/benchmarks.md)). Tables generated from the JSON files; the notes beside each "
           "(`NAME.md`) are the measurement logs.", ""]
    for f in loose_files():
        out += [f"## `{f.name if f.is_file() else f.stem}`", ""]
        notes = f.with_suffix(".md")
        if notes.is_file():
            text = re.sub(r"^# .*\n", "", notes.read_text(encoding="utf-8"), count=1).strip()
            out += [re.sub(r"^(#+) ", r"#\1 ", text, flags=re.M), ""]  # its headings one level down
        else:
            log.warning(f"benchmarks/results/{f.name}: no {notes.name} beside it (its measurement notes)")
        if f.is_file():
            out += render_generic(_load(f)) + [""]
    return "\n".join(out)


def recipes_page() -> str:
    out = ["# Expected numbers of the locked recipes", "",
           "Generated from `recipes/*.expected.yaml`: what `areal reproduce NAME` compares a run with (how the "
           "tolerances are derived: [recipes/README.md](../repo/recipes.md)). Headline metrics in bold.", ""]
    rows = []
    for f in sorted((ROOT / "recipes").glob("*.expected.yaml")):
        doc = yaml.safe_load(f.read_text())
        for m in doc.get("metrics", []):
            tol = m.get("tolerance") or {}
            name = f"**{m.get('metric')}**" if m.get("headline") else m.get("metric")
            rows.append([f"`{doc.get('recipe')}`", m.get("benchmark"), name, m.get("value"), m.get("unit"),
                         m.get("model"), m.get("check"), tol.get("retrain", "-"),
                         " ".join(str(m.get("source", "")).split())[:140]])
    return "\n".join(out + md_table(["recipe", "benchmark", "metric", "value", "unit", "model", "check",
                                     "tolerance (retrain)", "source"], rows)) + "\n"


def overview_page() -> str:
    out = [FRONT + "# Results", "",
           "Everything measured in this repository, generated at build time from the `results.json` files under "
           "`benchmarks/results/` (one folder per measurement, named `<benchmark>-<task>-<what>-<date>`, with "
           "its `NOTES.md`). Each row links to the folder's page: its notes, the full table the benchmark "
           "printed, and its plots. How to run and read each benchmark: [Benchmarks](../guides/benchmarks.md). "
           "Numbers are from a 2-core CPU machine unless a page says otherwise.", ""]
    # throughput
    for title, prefix in (("Async vs sync throughput: tiny-arith", "throughput-tiny-arith"),
                          ("Async vs sync throughput: tiny-longtail (long-tailed answers)",
                           "throughput-tiny-longtail")):
        rows = []
        for rel in folders():
            if not rel.startswith(prefix):
                continue
            for res in sorted((RESULTS / rel).rglob("results.json")):
                d = _load(res)
                if kind(d) != "throughput":
                    continue
                sub = res.parent.relative_to(RESULTS / rel).as_posix()
                rows.append(_throughput_row(rel, sub, d))
        out += [f"## {title}", "",
                "Effective training throughput of each asynchronous mode over sync over whole RL loops: the mean "
                "of the seed pairs' ratios, as the bench reports it († where results.json holds no pairs: the "
                "ratio of the modes' mean tokens/s); `aborting` = interruptible updates, AReaL's default. The "
                "overlap ceiling (G + T + P) / max(G, T + P) from the sync runs' phases (long-tailed answers: with "
                "the straggler seconds S per sync step, (G + T + P) / max(G - S, T + P)); the steady-state "
                "fraction of that ceiling of the best mode; held-out accuracy after the last step.", ""]
        out += md_table(["results", "date", "steps × seeds", "η", "ceiling", "aborting", "non-interr.",
                         "in place", "steady: best, of ceiling", "accuracy sync / async"], rows, nowrap=True) + [""]
    # staleness
    out += ["## Staleness ablation", "", "Final held-out accuracy per η and loss variant.", ""]
    for rel in folders():
        if not rel.startswith("staleness-"):
            continue
        d = _load(RESULTS / rel / "results.json")
        cells = d["grid"]["cells"]
        etas = sorted({int(e) for by in cells.values() for e in by})
        rows = []
        for v, by in cells.items():
            row = [v]
            for e in etas:
                c = by.get(str(e))
                fa = c and c["final_accuracy"]
                row.append("-" if not fa else f"{fa['mean']:.3f} ± {fa['std']:.3f}" if fa["n"] > 1
                           else f"{fa['mean']:.3f}")
            rows.append(row)
        sc = d["scenario"]
        out += [f"[`{rel}`]({rel}/index.md): scenario `{sc['name']}`, {sc['steps']} RL steps, {sc.get('seeds')} seed(s) "
                f"per cell (± = standard deviation over seeds)", ""]
        out += md_table(["variant"] + [f"η {e}" for e in etas], rows, nowrap=True) + [""]
    # simulator
    rows = []
    for rel in folders():
        if not rel.startswith("simulate/"):
            continue
        for res in sorted((RESULTS / rel).rglob("results.json")):
            d = _load(res)
            sub = res.parent.relative_to(RESULTS / rel).as_posix()
            pc, mc = d.get("published_check"), d.get("measured_check")
            check = (f"published {pc['published_ratio']:.2f}x, predicted {pc['predicted_ratio']:.2f}x" if pc else
                     "; ".join(f"{m.replace('_over_sync', '')} {v['measured']:.2f}x vs {v['predicted']:.2f}x "
                               f"({v['rel_error']:+.0%})" for m, v in mc.items() if isinstance(v, dict))
                     if mc else "-")
            rows.append([f"[{short(rel)}]({rel}/index.md)" + ("" if sub == "." else f" / {sub}"),
                         d["scenario"]["name"], f2(d.get("async_sync_ratio")), check])
    out += ["## Cluster simulator", "", "Predicted async/sync ratio of each simulated scenario, and the check "
            "against published or measured ratios.", ""]
    out += md_table(["results", "scenario", "predicted async / sync", "check"], rows) + [""]
    # the rest
    out += ["## Engines, real models, multi-turn", ""]
    for rel in folders():
        if group_of(rel) != GROUPS[-1][0]:
            continue
        for res in sorted((RESULTS / rel).rglob("results.json")):
            d = _load(res)
            if kind(d) in ("engine-vs-sglang", "multi-turn", "real-model-rl"):
                out += [f"### [`{rel}`]({rel}/index.md)", ""] + render(d) + [""]
    others = [rel for rel in folders() if group_of(rel) == GROUPS[-1][0]]
    out += ["Also: " + ", ".join(f"[`{rel}`]({rel}/index.md)" for rel in others) + "; "
            "[component benchmarks](components.md) (grader, sandbox, attention, decode, contention, weight sync); "
            "[expected numbers of the recipes](recipes.md).", ""]
    return "\n".join(out)


def short(rel: str, prefix: str = "") -> str:
    """A results folder's name without its group's prefix and its date (the date has a column of its own)."""
    name = rel.split("/")[-1]
    name = name[len(prefix):] if prefix and name.startswith(prefix) else name
    return _DATE.sub("", name).rstrip("-") or name


def _throughput_row(rel: str, sub: str, d: dict) -> list:
    modes = d["modes"]
    sync = modes["sync"]["effective_tokens_per_s"]["mean"]
    # the figure the bench itself reports: the mean of the seed pairs' ratios where results.json holds the pairs
    # (aborting: ratios.async_over_sync; in place: in_place.over_sync), else the ratio of the modes' means (marked †)
    paired = {"async": (d.get("ratios") or {}).get("async_over_sync"),
              "async_in_place": (d.get("in_place") or {}).get("over_sync")}

    def ratio(m: str) -> str:
        if m not in modes:
            return "-"
        if isinstance(paired.get(m), dict) and paired[m].get("mean") is not None:
            return f"{paired[m]['mean']:.2f}x"
        return f"{modes[m]['effective_tokens_per_s']['mean'] / sync:.2f}x†"

    ss = d.get("steady_state") or {}
    # long-tailed answers: the ceiling counts the straggler wait a synchronous step pays (steady_state holds it)
    stragglers = ss.get("ceiling_with_stragglers") is not None and "longtail" in d["scenario"].get("name", rel)
    oc = ss["ceiling_with_stragglers"] if stragglers else (d.get("overlap_ceiling") or {}).get("ceiling", {}).get("mean")
    suffix = "_with_stragglers" if stragglers else ""
    best = max(((ss.get(f"{m}_fraction_of_ceiling{suffix}"), lab) for m, lab in
                (("async", "aborting"), ("async_noninterruptible", "non-interr."), ("async_in_place", "in place"))
                if ss.get(f"{m}_fraction_of_ceiling{suffix}") is not None), default=None)
    steady = "-" if not best else f"{best[0]:.0%} {best[1]}" + (" (drift)" if ss.get("steady") is False else "")
    acc = " / ".join(f"{modes[m]['final_accuracy']['mean']:.2f}" for m in ("sync", "async") if m in modes)
    sc = d["scenario"]
    prefix = "throughput-tiny-arith-" if rel.startswith("throughput-tiny-arith") else "throughput-tiny-longtail-"
    link = f"[{short(rel, prefix)}]({rel}/index.md)" + ("" if sub == "." else f" / {sub}")
    return [link, d.get("created", "")[:10], f"{sc['steps']} × {sc['repeats']}", sc.get("eta_async"), "-" if oc is None else f"{oc:.2f}x",
            ratio("async"), ratio("async_noninterruptible"), ratio("async_in_place"), steady, acc]


def pages():
    """(uri, markdown, None) for the pages and (uri, None, file) for the images they show."""
    yield "results/index.md", overview_page(), None
    yield "results/components.md", components_page(), None
    yield "results/recipes.md", recipes_page(), None
    for rel in folders():
        text, images = folder_page(rel)
        yield page_uri(rel), text, None
        for png in sorted((RESULTS / rel).rglob("*.png")):
            yield f"results/{rel}/{png.relative_to(RESULTS / rel).as_posix()}", None, png
