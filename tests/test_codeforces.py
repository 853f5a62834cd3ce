"""Claims: the Codeforces rating estimate follows AReaL's cf_elo_caculator.py (CodeElo): the score rule
(first success at 0-based attempt i among the first pass_n: points - 50*i, or +1 and 10*i penalty), the
rank (ties count ahead), the binary search for the rating whose Elo expected seed equals the rank, the
mean over contests and the bisect percentile, checked on synthetic contests with closed-form answers.

Closed form used throughout: with m participants all rated R, seed(r) = 1 + m / (1 + 10^((r - R)/400)),
so seed(r) = rank at r* = R + 400*log10(m/(rank - 1) - 1) and the estimate is floor(r*) (capped at R+99).
For m = 8, R = 1500: rank 4 -> 1588.7, rank 5 -> 1500 exactly, rank 6 -> 1411.3, rank 7 -> 1309.2.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest

from areal_cli.foundations.errors import UserError
from areal_cli.eval.codeforces import (
    ContestProblem,
    ContestResult,
    ContestStandings,
    RatingEstimate,
    StandingsRow,
    contest_results,
    contest_score,
    estimate_rating,
    expected_seed,
    load_contest_cache,
    load_problem_ids,
    load_sorted_ratings,
    percentile,
    problem_id_from,
    rank_in_standings,
    rate_contest,
    rating_for_rank,
    rating_from_verdicts,
    split_problem_id,
)

DATA = Path(__file__).resolve().parent / "data" / "codeforces"


def closed_form(m: int, rank: int, r: float = 1500) -> float:
    return r + 400 * math.log10(m / (rank - 1) - 1)


def standings(contest_id, problems, rows, ratings=None):
    """rows: [(points, penalty)] in standings order; every participant rated 1500 unless ``ratings``."""
    ratings = ratings or [1500] * len(rows)
    return ContestStandings(
        contest_id,
        tuple(problems),
        tuple(StandingsRow(f"u{i}", float(p), pen, r) for i, ((p, pen), r) in enumerate(zip(rows, ratings))),
    )


CF_PROBLEMS = [ContestProblem(1, "A", 500.0), ContestProblem(1, "B", 1000.0), ContestProblem(1, "C", 1500.0)]
CF_ROWS = [(3000, 0), (2500, 0), (2000, 0), (1500, 0), (1000, 0), (800, 0), (500, 0), (0, 0)]
ICPC_PROBLEMS = [ContestProblem(2, "A"), ContestProblem(2, "B"), ContestProblem(2, "C")]


# ------------------------------------------------------------------------------------------- score
def test_points_score_loses_50_per_earlier_failed_attempt_counting_only_first_pass_n():
    res = ContestResult.from_attempts(
        1, {"A": [True], "B": [False, False, True], "C": [False, False, False, True]}, pass_n=3
    )
    assert res.first_success == {"A": 0, "B": 2, "C": None}
    assert contest_score(res, CF_PROBLEMS) == (500 + 1000 - 100, 0)
    res_all = ContestResult.from_attempts(1, {"C": [False, False, False, True]})  # pass_n None: all count
    assert contest_score(res_all, CF_PROBLEMS) == (1500 - 150, 0)


def test_points_score_never_goes_below_zero_per_problem():
    res = ContestResult.from_attempts(1, {"A": [False] * 12 + [True], "B": [True]})
    assert contest_score(res, CF_PROBLEMS) == (0 + 1000, 0)  # max(0, 500 - 600)


def test_icpc_score_counts_solved_and_10_minutes_per_earlier_failure():
    res = ContestResult.from_attempts(2, {"A": [True], "B": [False, True], "C": [False, False, False]})
    assert contest_score(res, ICPC_PROBLEMS) == (2, 10)


def test_problems_not_in_the_contest_are_ignored():
    res = ContestResult.from_attempts(1, {"Z": [True], "A": [True]})
    assert contest_score(res, CF_PROBLEMS) == (500, 0)


def test_pass_n_must_be_positive():
    with pytest.raises(ValueError):
        ContestResult.from_attempts(1, {"A": [True]}, pass_n=0)


# -------------------------------------------------------------------------------------------- rank
def test_rank_counts_participants_ahead_or_tied():
    rows = standings(1, CF_PROBLEMS, CF_ROWS).rows
    assert rank_in_standings(rows, 1000, 0) == 5  # ties with the 1000-point row: it counts ahead
    assert rank_in_standings(rows, 1001, 0) == 4
    assert rank_in_standings(rows, 3500, 0) == 0
    assert rank_in_standings(rows, 0, 0) == 8  # beats nobody


def test_rank_breaks_equal_points_by_penalty():
    rows = standings(2, ICPC_PROBLEMS, [(3, 100), (2, 30), (2, 50), (2, 80), (1, 0)]).rows
    assert rank_in_standings(rows, 2, 50) == 3  # tie with (2, 50) counts ahead, beats (2, 80)
    assert rank_in_standings(rows, 2, 40) == 2
    assert rank_in_standings(rows, 2, 10) == 1


# ------------------------------------------------------------------------------------------ rating
def test_expected_seed_is_one_plus_expected_number_of_winners():
    assert expected_seed(1500, [1500, 1500, 1500, 1500]) == 3.0  # each wins with probability 1/2
    assert expected_seed(1500, [1900]) == pytest.approx(1 + 1 / (1 + 10**-1))


@pytest.mark.parametrize("rank", [4, 5, 6, 7, 8])
def test_rating_is_floor_of_closed_form_for_equal_ratings(rank):
    got = rating_for_rank(rank, [1500] * 8)
    assert got == math.floor(closed_form(8, rank))
    assert {4: 1588, 5: 1500, 6: 1411, 7: 1309, 8: 1161}[rank] == got


def test_three_participants_at_1500_and_last_place_gives_1379():
    # 3 / (1 + 10^x) = 2 -> r = 1500 - 400*log10(2) = 1379.59
    assert rating_for_rank(3, [1500, 1500, 1500]) == 1379


def test_rating_is_capped_at_max_old_rating_plus_99():
    for rank in (0, 1, 2):  # closed form for rank 2 is 1500 + 400*log10(7) > 1599
        assert rating_for_rank(rank, [1500] * 8) == 1599
    assert rating_for_rank(4, [1500] * 7 + [2500]) <= 2599


def test_rating_is_zero_when_no_positive_rating_matches_the_rank():
    assert rating_for_rank(10, [3000, 3000, 3000]) == 0


def test_binary_search_equals_exhaustive_search():
    rng = random.Random(0)
    old = [rng.randint(800, 2600) for _ in range(25)]
    for rank in range(0, 27):
        brute = max((r for r in range(1, max(old) + 100) if expected_seed(r, old) >= rank), default=0)
        assert rating_for_rank(rank, old) == brute


def test_tie_with_a_participant_rates_like_being_behind_them():
    st = standings(1, CF_PROBLEMS, CF_ROWS)
    tie = rate_contest(ContestResult.from_attempts(1, {"B": [True]}), st, [1500.0])  # 1000 = row 5's points
    assert (tie.score, tie.rank, tie.rating) == (1000, 5, 1500)
    ahead = rate_contest(ContestResult.from_attempts(1, {"A": [False, True], "B": [True]}), st, [1500.0])  # 1450
    assert (ahead.score, ahead.rank, ahead.rating) == (1450, 4, 1588)


def test_solving_more_or_sooner_never_lowers_the_rating():
    rng = random.Random(1)
    problems = [ContestProblem(7, idx, pts) for idx, pts in zip("ABCDE", (500.0, 750.0, 1000.0, 1750.0, 2500.0))]
    rows = sorted(((rng.randrange(0, 6500, 10), 0) for _ in range(60)), reverse=True)
    st = standings(7, problems, rows, [rng.randint(900, 2900) for _ in rows])
    prev = -1
    attempts: dict[str, list[bool]] = {}
    for idx in "ABCDE":  # add one solved problem at a time, first at attempt 3, then at attempt 0
        attempts[idx] = [False, False, False, True]
        late = rate_contest(ContestResult.from_attempts(7, attempts), st, [1500.0]).rating
        attempts[idx] = [True]
        early = rate_contest(ContestResult.from_attempts(7, attempts), st, [1500.0]).rating
        assert prev <= late <= early
        prev = early
    assert prev > rate_contest(ContestResult.from_attempts(7, {}), st, [1500.0]).rating


# -------------------------------------------------------------------------------------- percentile
def test_percentile_is_share_of_ratings_strictly_below():
    hist = [1000.0, 1500.0, 1500.0, 2000.0]
    assert percentile(999, hist) == 0.0
    assert percentile(1000, hist) == 0.0  # equal is not below
    assert percentile(1000.5, hist) == 25.0
    assert percentile(1500, hist) == 25.0
    assert percentile(1501, hist) == 75.0
    assert percentile(2000, hist) == 75.0
    assert percentile(2001, hist) == 100.0
    with pytest.raises(ValueError):
        percentile(1500, [])


# ------------------------------------------------------------------------------- over contests
def test_estimate_is_mean_over_rated_contests_and_percentile_of_the_mean():
    cf = standings(1, CF_PROBLEMS, CF_ROWS)  # rank 5 -> 1500
    icpc = standings(2, ICPC_PROBLEMS, [(3, 0), (2, 0), (2, 0), (1, 0), (1, 0), (1, 0), (0, 0), (0, 0)])
    small = standings(3, CF_PROBLEMS, CF_ROWS[:3])
    results = [
        ContestResult.from_attempts(1, {"B": [True]}),
        ContestResult.from_attempts(2, {"A": [False, True]}),  # 1 solved, penalty 10: rank 6 -> 1411
        ContestResult.from_attempts(3, {"A": [True]}),
        ContestResult.from_attempts(4, {"A": [True]}),
        ContestResult.from_attempts(5, {"A": [True]}),
    ]
    hist = [1000.0, 1400.0, 1450.0, 1455.5, 1460.0, 1600.0]
    contests = {1: cf, 2: icpc, 3: small, 5: "rating_changes status 'FAILED'"}
    est = estimate_rating(results, contests, hist, min_participants=8)
    assert [(c.contest_id, c.rank, c.rating) for c in est.contests] == [(1, 5, 1500), (2, 6, 1411)]
    assert est.rating == (1500 + 1411) / 2 == 1455.5
    assert est.percentile == 50.0  # 1000, 1400, 1450 are below 1455.5
    assert est.skipped == {
        3: "3 rated participants, fewer than 8",
        4: "not in the contest data",
        5: "rating_changes status 'FAILED'",
    }
    assert est.summary() == "1456 / 50.0%"
    assert json.loads(json.dumps(est.to_dict()))["contests"][1]["rating"] == 1411


def test_contests_need_more_than_200_rated_participants_by_default():
    res = ContestResult.from_attempts(1, {"A": [True]})
    rows_201 = [(1000, 0)] * 201
    assert len(estimate_rating([res], {1: standings(1, CF_PROBLEMS, rows_201)}, [1.0]).contests) == 1
    with pytest.raises(UserError, match="none of 1 contests could be rated: 1: 200 rated participants"):
        estimate_rating([res], {1: standings(1, CF_PROBLEMS, rows_201[:200])}, [1.0])


def test_summary_prints_rating_and_percentile_like_areal():
    assert RatingEstimate(rating=2043.6, percentile=98.17, contests=()).summary() == "2044 / 98.2%"


def test_problem_ids_group_by_contest_in_order_of_first_appearance():
    assert split_problem_id("2000A") == (2000, "A")
    assert split_problem_id("1910B1") == (1910, "B1")
    for bad in ("A2000", "2000", "2000a"):
        with pytest.raises(ValueError):
            split_problem_id(bad)
    res = contest_results(["2001B", "2000A", "2001A"], [[False, True], [True], [False]], pass_n=1)
    assert [(r.contest_id, dict(r.first_success)) for r in res] == [(2001, {"B": None, "A": None}), (2000, {"A": 0})]
    with pytest.raises(ValueError):
        contest_results(["2000A", "2000A"], [[True], [True]])


# ------------------------------------------------------------------------------------------ files
def test_fixture_files_give_the_hand_computed_estimate():
    """tests/data/codeforces: contest 2000 (points) keeps 8 of 9 standings rows (handle 'unrated_x' has
    no rating change; 'absent_y', rated 3500, is not in the standings, so the cap stays 1599); 2001 is
    ICPC rules; 2002's rating changes failed."""
    cache = load_contest_cache(DATA / "all_contest_data.json")
    assert cache[2002] == "rating_changes status 'FAILED' (contestId: Rating changes are unavailable for this contest)"
    cf = cache[2000]
    assert isinstance(cf, ContestStandings) and len(cf.rows) == 8 and "unrated_x" not in {r.handle for r in cf.rows}
    assert cf.old_ratings == [1500] * 8 and cf.problems[1] == ContestProblem(2000, "B", 1000.0)
    assert cache[2001].problems[0].points is None
    ids = load_problem_ids(DATA / "metadata_cf.json")
    hist = load_sorted_ratings(DATA / "sorted_rating.json")
    assert hist == [1000.0] * 2 + [1500.0] * 5 + [1600.0] * 2 + [2000.0]
    verdicts = [
        [False, True],  # 2000A: 500 - 50
        [True],  # 2000B: 1000 -> 1450: ahead of the 1000-point row only -> rank 4
        [False] * 8,  # 2000C
        [True],  # 2001A
        [False] * 5 + [True],  # 2001B at attempt 5: 2 solved, penalty 50, ties (2, 50) -> rank 4
        [False],  # 2001C
        [True],  # 2002A: contest unusable
    ]
    est = estimate_rating(contest_results(ids, verdicts, pass_n=8), cache, hist, min_participants=8)
    assert [(c.contest_id, c.score, c.penalty, c.rank, c.rating) for c in est.contests] == [
        (2000, 1450, 0, 4, 1588),
        (2001, 2, 50, 4, 1588),
    ]
    assert (est.rating, est.percentile) == (1588, 70.0)
    assert set(est.skipped) == {2002}
    # Only the first 4 attempts count: 2001B unsolved -> 1 solved, penalty 0, ties (1, 0) -> rank 6 -> 1411
    est4 = estimate_rating(contest_results(ids, verdicts, pass_n=4), cache, hist, min_participants=8)
    assert [c.rating for c in est4.contests] == [1588, 1411]
    assert (est4.rating, est4.percentile) == (1499.5, 20.0)


def test_contest_cache_keeps_only_requested_contests():
    assert set(load_contest_cache(DATA / "all_contest_data.json", contest_ids=[2001])) == {2001}


def write(tmp_path: Path, name: str, obj) -> Path:
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def fixture_data() -> dict:
    return json.loads((DATA / "all_contest_data.json").read_text())


def test_missing_field_names_file_and_field(tmp_path):
    data = fixture_data()
    del data["2000"]["rating_changes"]["result"][1]["oldRating"]
    p = write(tmp_path, "all_contest_data.json", data)
    field = r"field '2000.rating_changes.result\[1\].oldRating'"
    with pytest.raises(UserError, match=rf"all_contest_data.json: {field}: missing"):
        load_contest_cache(p)


def test_mistyped_field_names_file_and_field(tmp_path):
    data = fixture_data()
    data["2001"]["standings"]["result"]["rows"][2]["points"] = "two"
    p = write(tmp_path, "all_contest_data.json", data)
    with pytest.raises(UserError, match=r"field '2001.standings.result.rows\[2\].points': expected int/float"):
        load_contest_cache(p)


def test_invalid_json_and_missing_file_are_user_errors(tmp_path):
    p = write(tmp_path, "all_contest_data.json", '{"2000":\n [1, 2,, 3]}')
    with pytest.raises(UserError, match=r"all_contest_data.json:2: invalid JSON"):
        load_contest_cache(p)
    with pytest.raises(UserError, match="expected a JSON object"):
        load_contest_cache(write(tmp_path, "list.json", "[1]"))
    with pytest.raises(UserError, match="file not found"):
        load_contest_cache(tmp_path / "nope.json")
    with pytest.raises(UserError, match="contest id key is not a number"):
        load_contest_cache(write(tmp_path, "key.json", {"abc": {}}))


def test_repeated_handles_make_a_contest_unusable_like_areal(tmp_path):
    data = fixture_data()
    rc = data["2000"]["rating_changes"]["result"]
    rc.append(dict(rc[0]))
    cache = load_contest_cache(write(tmp_path, "all_contest_data.json", data))
    assert "9 rating changes" in cache[2000]


def test_sorted_ratings_accept_counts_or_a_list_and_reject_bad_entries(tmp_path):
    assert load_sorted_ratings(write(tmp_path, "a.json", {"2000": 1, "900.5": 2, "1200": 0})) == [900.5, 900.5, 2000.0]
    assert load_sorted_ratings(write(tmp_path, "b.json", [1800, 1200.0])) == [1200.0, 1800.0]
    for bad, msg in (
        ({"x": 1}, "field 'x': rating key is not a number"),
        ({"1500": -1}, "field '1500': count must be a non-negative integer"),
        ([1500, "a"], r"field '\[1\]': rating must be a number"),
        ({}, "no ratings"),
        ("3", "expected an object"),
    ):
        with pytest.raises(UserError, match=msg):
            load_sorted_ratings(write(tmp_path, "bad.json", bad))


def test_problem_ids_file_rejects_malformed_ids(tmp_path):
    with pytest.raises(UserError, match=r"metadata_cf.json: field '\[1\]': not a Codeforces problem id"):
        load_problem_ids(write(tmp_path, "metadata_cf.json", ["2000A", "B2000"]))
    with pytest.raises(UserError, match="expected a list"):
        load_problem_ids(write(tmp_path, "m.json", {"0": "2000A"}))


def test_fixture_directory_is_self_contained(tmp_path):
    # the three files are all the estimator needs; copied elsewhere they still load
    for f in DATA.iterdir():
        shutil.copy(f, tmp_path / f.name)
    assert len(load_contest_cache(tmp_path / "all_contest_data.json")) == 3


def test_rating_from_verdicts_reads_the_data_directory_and_ids_from_metadata():
    verdicts = {
        "p0": [False, True],
        "p1": [True],
        "2001A": [True],
        "2001B": [False] * 5 + [True],
        "2002A": [True],
    }
    metas = {"p0": {"contest_id": "2000", "index": "A"}, "p1": {"contest_id": 2000, "index": "B"}, "2001A": {}}
    out = rating_from_verdicts(verdicts, metas, DATA, min_participants=8)
    assert (out["rating"], out["percentile"], out["summary"]) == (1588, 70.0, "1588 / 70.0%")
    assert out["pass_n"] == 8 and out["n_contests"] == 2 and out["n_skipped"] == 1
    assert json.loads(json.dumps(out)) == out
    assert rating_from_verdicts(verdicts, metas, DATA, pass_n=4, min_participants=8)["rating"] == 1499.5
    with pytest.raises(UserError, match="problem 'x'"):
        rating_from_verdicts({"x": [True]}, {"x": {"contest_id": None}}, DATA)
    with pytest.raises(UserError, match="file not found"):
        rating_from_verdicts({"2000A": [True]}, {}, DATA / "missing")
    assert problem_id_from("ignored", {"contest_id": "1910", "index": "B1"}) == "1910B1"
