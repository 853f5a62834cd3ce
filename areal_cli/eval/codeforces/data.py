"""Reading the Codeforces data files (``evaluation/codeforces/README.md``): historical ratings, problem ids
and the contest cache, decoded one contest at a time; malformed data is a UserError naming file and field."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

from areal_cli.foundations.errors import UserError, where
from areal_cli.eval.codeforces.contests import PROBLEM_ID_RE, ContestProblem, ContestStandings, StandingsRow

CONTEST_CACHE_FILE = "all_contest_data.json"
SORTED_RATINGS_FILE = "sorted_rating.json"


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read: {e}") from None


def _load_json(path: Path) -> Any:
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None


def load_sorted_ratings(path: str | Path) -> list[float]:
    """Historical Codeforces ratings, ascending, from ``sorted_rating.json``.

    Accepted forms: AReaL's ``{"<rating>": <number of users>, ...}`` (``read_ratings`` expands it) or
    CodeElo's ``[<rating>, ...]``.

    Raises:
        UserError: unreadable file, another JSON type, a non-numeric rating, a negative or
            non-integer count, or no ratings at all.
    """
    path = Path(path)
    data = _load_json(path)
    out: list[float] = []
    if isinstance(data, dict):
        for key, count in data.items():
            try:
                rating = float(key)
            except ValueError:
                raise UserError(f"{where(path, field=key)}: rating key is not a number") from None
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise UserError(f"{where(path, field=key)}: count must be a non-negative integer, got {count!r}")
            out.extend([rating] * count)
    elif isinstance(data, list):
        for i, v in enumerate(data):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise UserError(f"{where(path, field=f'[{i}]')}: rating must be a number, got {v!r}")
            out.append(float(v))
    else:
        raise UserError(f"{path}: expected an object {{rating: count}} or a list of ratings, got {type(data).__name__}")
    if not out:
        raise UserError(f"{path}: no ratings")
    return sorted(out)


def load_problem_ids(path: str | Path) -> list[str]:
    """``metadata_cf.json``: a JSON list of problem ids (``"2000A"``), entry i belonging to the benchmark
    problem with the i-th smallest ``idx`` (AReaL sorts samples by ``idx`` and zips them with this list).

    Raises:
        UserError: not a list, or an entry that is not a Codeforces problem id.
    """
    path = Path(path)
    data = _load_json(path)
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a list of problem ids like \"2000A\", got {type(data).__name__}")
    for i, pid in enumerate(data):
        if not isinstance(pid, str) or PROBLEM_ID_RE.fullmatch(pid) is None:
            raise UserError(f"{where(path, field=f'[{i}]')}: not a Codeforces problem id like \"2000A\": {pid!r}")
    return data


_WS = re.compile(r"[ \t\n\r]*")


def _iter_object_items(text: str, path: Path) -> Iterator[tuple[str, Any]]:
    """Decode a top-level JSON object one value at a time (peak memory: one value, not the whole file)."""
    dec = json.JSONDecoder()

    def fail(pos: int, msg: str) -> UserError:
        line = text.count("\n", 0, pos) + 1
        return UserError(f"{path}:{line}: invalid JSON: {msg}")

    i = _WS.match(text, 0).end()
    if text[i : i + 1] != "{":
        raise UserError(f"{path}: expected a JSON object {{\"<contest id>\": {{...}}, ...}} at the top level")
    i = _WS.match(text, i + 1).end()
    if text[i : i + 1] == "}":
        return
    while True:
        try:
            key, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise fail(e.pos, e.msg) from None
        if not isinstance(key, str):
            raise fail(i, "expected a string key")
        i = _WS.match(text, i).end()
        if text[i : i + 1] != ":":
            raise fail(i, "expected ':'")
        i = _WS.match(text, i + 1).end()
        try:
            value, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise fail(e.pos, e.msg) from None
        yield key, value
        i = _WS.match(text, i).end()
        c = text[i : i + 1]
        if c == "}":
            return
        if c != ",":
            raise fail(i, "expected ',' or '}'")
        i = _WS.match(text, i + 1).end()


class _Fields:
    """Typed access into one contest entry; errors name the file and the dotted field path."""

    def __init__(self, path: Path, prefix: str) -> None:
        self.path, self.prefix = path, prefix

    def error(self, fld: str, what: str) -> UserError:
        return UserError(f"{where(self.path, field=f'{self.prefix}.{fld}')}: {what}")

    def get(self, obj: Any, key: str, fld: str, types: type | tuple[type, ...]) -> Any:
        if not isinstance(obj, dict):
            raise self.error(fld.rsplit(".", 1)[0], "expected an object")
        if key not in obj:
            raise self.error(fld, "missing")
        v = obj[key]
        if isinstance(v, bool) or not isinstance(v, types):
            names = "/".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
            raise self.error(fld, f"expected {names}, got {v!r}"[:200])
        return v


def parse_contest_entry(contest_key: str, entry: Any, path: Path) -> ContestStandings | str:
    """One value of ``all_contest_data.json`` -> :class:`ContestStandings`, or the reason the contest is
    unusable (API status not "OK"; standings and rating changes not one to one after keeping the
    handles both list, as AReaL does).

    ``entry`` is ``{"standings": <contest.standings API response>, "rating_changes":
    <contest.ratingChanges API response>}``; fields read: ``standings.status``,
    ``standings.result.problems[].{contestId, index, points?}``,
    ``standings.result.rows[].{party.members[0].handle, points, penalty}``,
    ``standings.result.contest.name`` (optional), ``rating_changes.status``,
    ``rating_changes.result[].{handle, oldRating}``.

    Raises:
        UserError: a malformed key or a missing or mistyped field (file and field named).
    """
    if not contest_key.isdigit():
        raise UserError(f"{where(path, field=contest_key)}: contest id key is not a number")
    cid = int(contest_key)
    f = _Fields(path, contest_key)
    if not isinstance(entry, dict):
        raise UserError(f"{where(path, field=contest_key)}: expected an object with standings and rating_changes")
    standings = f.get(entry, "standings", "standings", dict)
    changes = f.get(entry, "rating_changes", "rating_changes", dict)
    for name, resp in (("standings", standings), ("rating_changes", changes)):
        status = resp.get("status")
        if status != "OK":
            comment = resp.get("comment")
            return f"{name} status {status!r}" + (f" ({comment})" if comment else "")
    result = f.get(standings, "result", "standings.result", dict)
    problems: list[ContestProblem] = []
    for j, p in enumerate(f.get(result, "problems", "standings.result.problems", list)):
        fld = f"standings.result.problems[{j}]"
        p_cid = f.get(p, "contestId", f"{fld}.contestId", int)
        index = f.get(p, "index", f"{fld}.index", str)
        points = f.get(p, "points", f"{fld}.points", (int, float)) if "points" in p else None
        problems.append(ContestProblem(p_cid, index, None if points is None else float(points)))
    raw_rows: list[tuple[str, float, int]] = []
    for j, row in enumerate(f.get(result, "rows", "standings.result.rows", list)):
        fld = f"standings.result.rows[{j}]"
        party = f.get(row, "party", f"{fld}.party", dict)
        members = f.get(party, "members", f"{fld}.party.members", list)
        if not members:
            raise f.error(f"{fld}.party.members", "empty")
        handle = f.get(members[0], "handle", f"{fld}.party.members[0].handle", str)
        points = f.get(row, "points", f"{fld}.points", (int, float))
        penalty = f.get(row, "penalty", f"{fld}.penalty", int)
        raw_rows.append((handle, float(points), penalty))
    old: list[tuple[str, int]] = []
    for j, ch in enumerate(f.get(changes, "result", "rating_changes.result", list)):
        fld = f"rating_changes.result[{j}]"
        old.append((f.get(ch, "handle", f"{fld}.handle", str), f.get(ch, "oldRating", f"{fld}.oldRating", int)))
    common = {h for h, _, _ in raw_rows} & {h for h, _ in old}
    kept_rows = [r for r in raw_rows if r[0] in common]
    kept_old = [o for o in old if o[0] in common]
    if len(kept_rows) != len(kept_old):
        return (
            f"{len(kept_rows)} standings rows but {len(kept_old)} rating changes after keeping common handles "
            "(repeated handles)"
        )
    old_by_handle = dict(kept_old)
    name = result.get("contest", {}).get("name", "") if isinstance(result.get("contest"), dict) else ""
    return ContestStandings(
        contest_id=cid,
        problems=tuple(problems),
        rows=tuple(StandingsRow(h, pts, pen, old_by_handle[h]) for h, pts, pen in kept_rows),
        name=str(name),
    )


def load_contest_cache(
    path: str | Path, contest_ids: Iterable[int] | None = None
) -> dict[int, ContestStandings | str]:
    """``all_contest_data.json`` -> ``{contest id: ContestStandings or unusable reason}``.

    The file is ``{"<contest id>": {"standings": ..., "rating_changes": ...}, ...}`` (Codeforces API
    responses; :func:`parse_contest_entry`). With ``contest_ids``, other contests are decoded but not
    kept. Values are decoded one at a time, so memory holds the file's text plus one contest.

    Raises:
        UserError: unreadable or invalid JSON, or a malformed entry (file, line or field named).
    """
    path = Path(path)
    wanted = None if contest_ids is None else {int(c) for c in contest_ids}
    out: dict[int, ContestStandings | str] = {}
    for key, entry in _iter_object_items(_read_text(path), path):
        if wanted is not None and key.isdigit() and int(key) not in wanted:
            continue
        parsed = parse_contest_entry(key, entry, path)
        out[int(key)] = parsed
    return out
