"""MkDocs hook: the pages generated at build time from the code and the repository's files.

- ``reference/cli.md``: the click commands (mkdocs-click on the ``areal`` console script's group).
- ``reference/settings.md``: every ``TrainConfig`` key, from the sources ``areal train --list-settings`` reads
  (``areal_cli.config``: ``SECTIONS``, ``KEYS``, ``field_docs``, ``FLAT_NAMES``).
- ``reference/api.md``: every name ``areal_cli.api`` exports (mkdocstrings, from the docstrings).
- ``results/``: a page per results folder of ``benchmarks/results/`` (tables and plots from its results.json
  files, its NOTES.md), the overview, and the recipes' expected numbers (``results.py``).
- ``guides/benchmarks.md`` and ``repo/``: ``benchmarks/README.md`` and the other READMEs, as they are.

Checks (warnings, so ``mkdocs build --strict`` fails on them): a code span in a page that names a setting
(``rollout.group_size``) must name one that exists; such spans are linked to the settings reference.
"""

from __future__ import annotations

import logging
import re
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

from mkdocs.structure.files import File, Files

HOOKS = Path(__file__).resolve().parent
ROOT = HOOKS.parents[1]
sys.path.insert(0, str(HOOKS))

import results  # noqa: E402  (docs/hooks/results.py)
from griffe_rst import escape_html, rst_inline_to_markdown  # noqa: E402  (docs/hooks/griffe_rst.py)

log = logging.getLogger("mkdocs.hooks.generate")

#: Repository READMEs shown in the site as they are: page -> file.
MIRRORS = {
    "guides/benchmarks.md": "benchmarks/README.md",
    "repo/tests.md": "tests/README.md",
    "repo/recipes.md": "recipes/README.md",
    "repo/evaluation.md": "evaluation/README.md",
    "repo/codeforces.md": "evaluation/codeforces/README.md",
}

SECTION_NAMES = ("model", "task", "sft", "rollout", "ppo", "parallel", "loop")
#: `section.name` code spans that are not settings: file names (by extension) and these.
NOT_SETTINGS = frozenset({"model.generate"})
_NOT_A_KEY = re.compile(r"\.(py|pyi|yaml|yml|json|jsonl|md|png|txt|sh|toml|gguf|safetensors|log)$")
_KEY_SPAN = re.compile(r"(?<![`\w\[])`((?:%s)\.[A-Za-z_][A-Za-z0-9_]*)((?:[.=:][^`\n]*)?)`" % "|".join(SECTION_NAMES))


# ------------------------------------------------------------------------------------------------ the CLI
def _cli_target() -> tuple[str, str]:
    """Module and attribute of the ``areal`` console script (pyproject.toml's [project.scripts])."""
    eps = entry_points(group="console_scripts", name="areal")
    if not eps:
        raise SystemExit("docs: no 'areal' console script is installed: pip install -e '.[docs]' first")
    module, _, attr = next(iter(eps)).value.partition(":")
    return module, attr


def cli_page() -> str:
    module, attr = _cli_target()
    return textwrap.dedent(f"""\
        # CLI reference

        Generated at build time from the click commands of `areal` (`{module}:{attr}`): every command, its
        arguments, options and help text as `areal COMMAND --help` prints them.

        <div class="cli-tables" markdown>

        ::: mkdocs-click
            :module: {module}
            :command: {attr}
            :prog_name: areal
            :depth: 1
            :style: table
            :list_subcommands: true

        </div>
        """)


# ------------------------------------------------------------------------------------------- the settings
def _md_cell(text: str) -> str:
    """A table cell: a code span holding ``|`` becomes ``<code>`` with ``&#124;`` (Markdown shows ``\\|`` inside
    code spans literally), any other ``|`` is escaped."""
    import re

    text = escape_html(text).replace("\n", " ")
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(f"<code>{part[1:-1].replace('|', '&#124;')}</code>" if part.startswith("`") and "|" in part
                   else part.replace("|", "\\|") for part in parts)


def settings_page() -> str:
    from areal_cli.config import FLAT_NAMES, KEYS, SECTIONS, TrainConfig, field_docs, get_value
    from areal_cli.config.listing import _type_name, plain_text

    docs, defaults = field_docs(), TrainConfig()
    old = {v: k for k, v in FLAT_NAMES.items() if k not in KEYS and k != "task"}
    out = ["# Settings reference (`TrainConfig`)", "",
           "Every key of `areal train`, generated at build time from `areal_cli.config` (the sections' types and "
           "docstrings): the same source as `areal train --list-settings`, which prints them with a recipe's own "
           "values. The defaults below are `TrainConfig()`'s; a recipe sets its own (`areal train RECIPE "
           "--list-settings`). A recipe writes a key in its section (`rollout: {group_size: 8}`) or dotted "
           "(`rollout.group_size: 8`); the command line as `-o rollout.group_size=8`. How settings are read: "
           "[Settings and recipes as files](../guides/settings.md).", ""]

    def table(keys: list[str]) -> list[str]:
        rows = ['<div class="settings-table" markdown>', "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for key in keys:
            was = f" (was `{old[key]}`)" if key in old else ""
            rows.append(f"| `{key}`{{ #{key} }} | {_md_cell(_type_name(KEYS[key].type))} | "
                        f"`{_md_cell(repr(get_value(defaults, key)))}` | "
                        f"{_md_cell(plain_text(docs.get(key, '')))}{was} |")
        return rows + ["", "</div>"]

    out += ["## Top level", ""] + table([k for k in KEYS if "." not in k]) + [""]
    for sec, cls in SECTIONS.items():
        out += [f"## `{sec}`", "", escape_html(plain_text(cls.__doc__ or "")), ""]
        out += table([k for k in KEYS if k.startswith(sec + ".")]) + [""]
        if sec == "ppo":  # what each ppo.algorithm preset fills (areal_cli.config.algorithms)
            from areal_cli.config.algorithms import ALGORITHMS

            out += ["`ppo.algorithm` presets fill the keys a recipe and `-o` leave unset:", "",
                    "| preset | sets |", "|---|---|"]
            out += [f"| `{name}` | " + (", ".join(f"`{k}: {v}`" for k, v in vals.items()) or "nothing (today's "
                                        "defaults)") + " |" for name, vals in ALGORITHMS.items()] + [""]
    return "\n".join(out)


# ------------------------------------------------------------------------------------------------ the API
def api_page() -> str:
    import areal_cli.api as api

    out = ["# Python API (`areal_cli.api`)", "",
           "Generated at build time from the docstrings of every name `areal_cli.api` exports "
           "(`areal_cli.api.__all__`). A recipe names your dataset, reward and workflow by `module:attr` "
           "(`task.dataset`, `task.reward`, `task.workflow`); the [own-task guide](../guides/own-task.md) shows "
           "them in use.", ""]
    by_module: dict[str, list[str]] = {}
    for name in api.__all__:
        obj = getattr(api, name)
        by_module.setdefault(obj.__module__, []).append(name)
    for mod in ("areal_cli.api.records", "areal_cli.api.reward"):
        by_module.setdefault(mod, [])
    for mod in sorted(by_module, key=lambda m: (not m.startswith("areal_cli.api"), m)):
        out += [f"::: {mod}", "    options:", "      show_root_heading: true", "      show_root_full_path: true",
                "      heading_level: 2", "      members:"]
        names = by_module[mod] or _public_functions(mod)
        out += [f"        - {n}" for n in names] + [""]
    return "\n".join(out)


def _public_functions(module: str) -> list[str]:
    import importlib
    import inspect

    mod = importlib.import_module(module)
    return [n for n, v in vars(mod).items()
            if not n.startswith("_") and inspect.isfunction(v) and v.__module__ == module]


# --------------------------------------------------------------------------------------------- the layout
def _first_sentence(doc: str | None, limit: int = 240) -> str:
    text = " ".join((doc or "").split())
    m = re.match(r"(.+?\.)(\s|$)", text)
    text = m.group(1) if m else text
    if len(text) > limit:
        text = text[: limit].rsplit(" ", 1)[0] + " ..."
    return rst_inline_to_markdown(text) or "(no docstring)"


def layout_page() -> str:
    import ast
    import tomllib

    pkg = ROOT / "areal_cli"
    rows = []
    for entry in sorted(pkg.iterdir()):
        if entry.name.startswith(("_", ".")) and entry.name != "__main__.py":
            continue
        init = entry / "__init__.py" if entry.is_dir() else entry
        if not init.is_file() or init.suffix != ".py":
            continue
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        kind = "package" if entry.is_dir() else "module"
        subs = sorted([q.stem for q in entry.glob("*.py") if not q.name.startswith("_")]
                      + [q.name + "/" for q in entry.iterdir() if (q / "__init__.py").is_file()]) if entry.is_dir() else []
        rows.append(f"| `areal_cli.{entry.stem if kind == 'module' else entry.name}` | {kind} | "
                    f"{_md_cell(_first_sentence(doc))} | {', '.join(f'`{x}`' for x in subs) or '-'} |")
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text()).get("tool", {}).get("importlinter", {})
    out = ["# Package layout", "",
           "Generated at build time from `areal_cli/` (each package's or module's docstring, first sentence) and "
           "from the import contracts in `pyproject.toml` that `lint-imports` enforces.", "",
           "| name | kind | what it holds | modules |", "|---|---|---|---|", *rows, "",
           "## Import contracts", ""]
    for c in contracts.get("contracts", []):
        out.append(f"- **{c.get('name')}** ({c.get('type')})")
        if c.get("type") == "layers":
            out.append("    - layers, top to bottom: " + " → ".join(f"`{x}`" for x in c.get("layers", [])))
        else:
            out.append("    - " + ", ".join(f"`{x}`" for x in c.get("source_modules", [])) + " never import "
                       + ", ".join(f"`{x}`" for x in c.get("forbidden_modules", [])))
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------ README's "Two commands"
TWO_COMMANDS = "<!-- two-commands: the \"Two commands\" section of README.md, inserted at build time -->"


def two_commands() -> str:
    """README.md's "Two commands" section (its text and the two fenced commands CI and the tests check), as is."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^## Two commands\n(.*?)(?=^## )", text, flags=re.S | re.M)
    if not m:
        raise SystemExit("docs: README.md has no '## Two commands' section (getting-started.md shows it)")
    return m.group(1).strip()


# ------------------------------------------------------------------------------------------------- hooks
def _patch_mkdocs_click() -> None:
    """mkdocs-click 0.9 prints click >= 8.3's ``UNSET`` sentinel as a default (``Sentinel.UNSET``): show none."""
    from mkdocs_click import _docs

    if getattr(_docs._format_table_option_row, "_areal", False):
        return
    orig = _docs._format_table_option_row

    def row(option):
        default = option.default
        if "UNSET" in repr(default) or (getattr(option, "is_flag", False) and default is False):
            import copy

            option = copy.copy(option)
            option.default = None
            line = orig(option)
            return line[: line.rstrip(" |").rfind("|")] + "|  |" if not option.required else line
        return orig(option)

    row._areal = True
    _docs._format_table_option_row = row


def on_config(config):
    _patch_mkdocs_click()
    config.nav = results.nav(config.nav)
    return config


def on_files(files: Files, config) -> Files:
    def add(uri: str, content: str | None = None, src: Path | None = None) -> None:
        if files.get_file_from_path(uri) is not None:
            raise SystemExit(f"docs: {uri} is generated; remove docs/{uri}")
        files.append(File.generated(config, uri, content=content,
                                    abs_src_path=None if src is None else str(src)))

    add("reference/cli.md", cli_page())
    add("reference/settings.md", settings_page())
    add("reference/api.md", api_page())
    add("reference/layout.md", layout_page())
    for uri, rel in MIRRORS.items():
        add(uri, mirror(rel))
    for card in sorted((ROOT / "data_cards").glob("*.md")):
        add(f"repo/data_cards/{card.name}", mirror(f"data_cards/{card.name}"))
    for uri, content, src in results.pages():
        add(uri, content, src)
    return files


def mirror(rel: str) -> str:
    text = (ROOT / rel).read_text(encoding="utf-8")
    return (f'!!! note "This page is `{rel}` of the repository, shown as it is."\n\n' + text)


_LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+\.) ")


def blank_line_before_lists(markdown: str) -> str:
    """A list that follows a paragraph line directly (as the repository's READMEs write them, which GitHub renders as
    a list) gets the blank line Python-Markdown needs to see a list there."""
    out: list[str] = []
    in_fence = False
    for line in markdown.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        prev = out[-1] if out else ""
        if (not in_fence and _LIST_ITEM.match(line) and not line.startswith(" ") and prev.strip()
                and not _LIST_ITEM.match(prev) and not prev.startswith((" ", "|", ">", "#", "<"))):
            out.append("")
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Check every `section.key` code span against the settings and link it to the reference."""
    from areal_cli.config import KEYS

    markdown = blank_line_before_lists(markdown)
    uri = page.file.src_uri
    if TWO_COMMANDS in markdown:
        markdown = markdown.replace(TWO_COMMANDS, two_commands())
    if uri == "reference/settings.md":
        return markdown
    depth = uri.count("/")
    target = "../" * depth + "reference/settings.md"
    fence = re.compile(r"^(```|~~~)")
    out, in_fence = [], False
    for line in markdown.split("\n"):
        if fence.match(line.lstrip()):
            in_fence = not in_fence
        if in_fence:
            out.append(line)
            continue

        def link(m: re.Match) -> str:
            key, rest = m.group(1), m.group(2)
            if _NOT_A_KEY.search(key + rest) or key in NOT_SETTINGS:
                return m.group(0)
            if key not in KEYS:
                log.warning(f"{uri}: `{key}{rest}` names no setting of areal train (areal_cli.config; "
                            f"see reference/settings.md)")
                return m.group(0)
            return f"[{m.group(0)}]({target}#{key})"

        out.append(_KEY_SPAN.sub(link, line))
    return "\n".join(out)

