"""Locked recipes: every shipped recipe and expected file validates, every published number of the reference
is in its expected file, bad files are reported with file:line, and compare() says pass / fail / skipped."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from areal_cli.foundations.errors import UserError
from areal_cli.recipes import (
    BENCHMARK_CARDS,
    CF_PERCENTILE_PER_ELO,
    Measured,
    PublishedTrainSpec,
    allocation_gpus,
    binomial_tolerance,
    codeforces_rating_tolerance,
    compare,
    eval_vocabulary,
    load_expected,
    load_recipe,
    load_train_config,
    recipe_names,
    train_config_from_recipe,
)
from helpers.one_line import assert_one_line

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
PUBLISHED = ["boba2-8b-code", "boba2-14b-code", "boba2-8b-code-open", "boba2-14b-code-open", "boba-rl-7b-math",
             "boba-sft-32b", "async-1.5b-math", "async-7b-math", "boba2-math-multiturn"]


def values(name: str) -> dict[str, float]:
    return {m.key: m.value for m in load_expected(load_recipe(name)).metrics}


# --- the shipped files ---------------------------------------------------------------------------------


CPU = ["tiny-arith", "mini-math", "mini-code", "tiny-arith-multiturn", "tiny-longtail"]


def test_the_catalogue_holds_the_eight_published_recipes_and_the_cpu_ones():
    assert set(recipe_names()) == set(PUBLISHED) | set(CPU)


@pytest.mark.parametrize("name", PUBLISHED + CPU)
def test_every_shipped_recipe_and_its_expected_file_validate(name):
    r = load_recipe(name)
    exp = load_expected(r)
    f = r.file
    assert r.expected_path.name == f"{name}.expected.yaml"
    assert (REPO / "data_cards" / f.data.card).is_file(), f.data.card
    for b in f.eval.benchmarks:
        assert (REPO / "data_cards" / BENCHMARK_CARDS[b]).is_file(), b
    for ref in (f.model, f.published_model, f.data):
        if ref is not None and ref.repo is not None:
            assert ref.revision is None and ref.revision_note or re.fullmatch(r"[0-9a-f]{40}", ref.revision)
    if f.trainer == "gpu":
        assert f.resources.allocation is None or allocation_gpus(f.resources.allocation) == f.resources.gpus
    assert any(m.headline for m in exp.metrics)


def test_recipes_name_only_protocols_and_benchmarks_areal_eval_knows():
    protocols, benchmarks = eval_vocabulary()
    for name in recipe_names():
        ev = load_recipe(name).file.eval
        assert ev.protocol in protocols and set(ev.benchmarks) <= set(benchmarks)


def test_gpqa_numbers_are_recorded_but_marked_not_evaluated():
    gpqa = [m for n in ("boba-rl-7b-math", "boba-sft-32b") for m in load_expected(load_recipe(n)).metrics
            if m.benchmark == "gpqa_diamond"]
    assert len(gpqa) == 4 and all(not m.evaluated and "not yet supported" in m.evaluated_note for m in gpqa)


def test_published_training_settings_are_the_areal_config_values():
    code8 = load_recipe("boba2-8b-code")
    t = code8.train
    assert isinstance(t, PublishedTrainSpec)
    assert (t.batch_size * t.group_size, t.max_head_offpolicyness, t.max_new_tokens, t.lr, t.adam_eps) == \
        (2048, 16, 27648, 2e-5, 1e-5)
    assert (t.success_rate_lb, t.success_rate_ub, t.behav_imp_weight_cap, t.reward_scaling) == (0.05, 0.95, 5.0, 5.0)
    assert code8.file.resources.allocation == "sglang.d80m2p1+d4m2p4" and code8.file.resources.gpus == 192
    assert load_recipe("boba2-14b-code").file.resources.gpus == 384
    sft = load_recipe("boba-sft-32b").file.sft
    assert (sft.epochs, sft.batch_size, sft.lr, sft.weight_decay, sft.dtype) == (200, 64, 1e-5, 0.1, "bf16")


def test_async_math_recipes_carry_their_synchronous_twin():
    r = load_recipe("async-1.5b-math")
    sync = r.variant("sync")
    assert (r.train.max_head_offpolicyness, r.train.use_decoupled_loss) == (4, True)
    assert (sync.max_head_offpolicyness, sync.recompute_logprob, sync.use_decoupled_loss) == (0, False, False)
    assert sync.batch_size == r.train.batch_size and sync.max_steps == 1000
    with pytest.raises(UserError, match="no variant 'fast'.*known: sync"):
        r.variant("fast")


def test_tiny_arith_locked_recipe_trains_with_what_areal_train_uses():
    locked = train_config_from_recipe("tiny-arith")
    flat, _ = load_train_config("tiny-arith")
    assert locked.to_dict() == flat.to_dict()


def test_a_gpu_recipe_is_an_sglang_run_and_the_sft_recipe_is_not_an_rl_run():
    cfg = train_config_from_recipe("boba2-8b-code")
    assert (cfg.rollout.engine, cfg.rollout.n_servers, cfg.task.preset) == ("sglang", 80, "code-rl")
    with pytest.raises(UserError, match="supervised fine-tuning"):
        train_config_from_recipe("boba-sft-32b")


# --- every published number of section (a) ---------------------------------------------------------------


def table_row(text: str, header: str, label: str) -> list[str]:
    """Cells (bold removed) of the row starting with ``label`` in the table whose header starts ``| header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header}"))
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip().replace("**", "") for c in line.strip().strip("|").split("|")]
        if cells[0] == label or cells[0].startswith(label + " ("):
            return cells
    raise AssertionError(f"row {label!r} not in table {header!r}")


CODE_ROWS = {  # recipe -> (table header, published model row, base model row)
    "boba2-8b-code": ("Model (8B)", "AReaL-boba²-8B", "Qwen3-8B"),
    "boba2-8b-code-open": ("Model (8B)", "AReaL-boba²-8B-Open", "Qwen3-8B"),
    "boba2-14b-code": ("Model (14B)", "AReaL-boba²-14B", "Qwen3-14B"),
    "boba2-14b-code-open": ("Model (14B)", "AReaL-boba²-14B-Open", "Qwen3-14B"),
}


@pytest.mark.parametrize("name", sorted(CODE_ROWS))
def test_every_table1_number_of_the_code_models_is_expected(shared_dir, name):
    text = (shared_dir / "reference" / "areal_v03_published.md").read_text(encoding="utf-8")
    header, row, base = CODE_ROWS[name]
    got = values(name)
    for label, suffix in ((row, ""), (base, "#base")):
        lcb, cf, cc = table_row(text, header, label)[1:4]
        rating, pct = (float(x.strip().rstrip("%")) for x in cf.split("/"))
        assert got[f"lcb_v5/pass@1{suffix}"] == float(lcb)
        assert got[f"codeforces/rating{suffix}"] == rating
        assert got[f"codeforces/percentile{suffix}"] == pct
        assert got[f"codecontests/pass@1{suffix}"] == float(cc)


@pytest.mark.parametrize("name,header,row,base", [
    ("boba-rl-7b-math", "Model (7B)", "AReaL-boba-RL-7B", "R1-Distill-Qwen-7B"),
    ("boba-sft-32b", "Model (32B)", "AReaL-boba-SFT-32B", "R1-Distill-Qwen-32B"),
])
def test_every_v02_table_number_is_expected(shared_dir, name, header, row, base):
    text = (shared_dir / "reference" / "areal_v03_published.md").read_text(encoding="utf-8")
    got = values(name)
    for label, suffix in ((row, ""), (base, "#base")):
        a24, a25, gpqa = (float(c) for c in table_row(text, header, label)[1:4])
        assert (got[f"aime24/pass@1{suffix}"], got[f"aime25/pass@1{suffix}"], got[f"gpqa_diamond/pass@1{suffix}"]) \
            == (a24, a25, gpqa)


@pytest.mark.parametrize("name,header,speedup", [("async-1.5b-math", "1.5B", 2.77), ("async-7b-math", "7B", 2.27)])
def test_every_table2_number_and_the_speedup_are_expected(shared_dir, name, header, speedup):
    text = (shared_dir / "reference" / "areal_v03_published.md").read_text(encoding="utf-8")
    got = values(name)
    head = f"{header} | AIME24 | #Nodes"
    assert got["aime24/pass@1#base"] == float(table_row(text, head, "base model")[1])
    sync, asyn = table_row(text, head, "Synchronous AReaL"), table_row(text, head, "Asynchronous AReaL")
    assert (got["aime24/pass@1@sync"], got["training/wall_clock_hours@sync"]) == (float(sync[1]), float(sync[4]))
    assert (got["aime24/pass@1"], got["training/wall_clock_hours"]) == (float(asyn[1]), float(asyn[4]))
    assert got["training/speedup_vs_sync"] == speedup == round(float(sync[4]) / float(asyn[4]), 2)
    if name == "async-1.5b-math":  # Table 3 holds the same runs' AIME25 (eta 0 naive; eta 4 decoupled)
        assert got["aime25/pass@1@sync"] == float(table_row(text, "η (max staleness)", "0")[3])
        assert got["aime25/pass@1"] == float(table_row(text, "η (max staleness)", "4")[4])


# --- bad files: one line, file:line, field path ---------------------------------------------------------


def copy_recipe(tmp_path: Path, name: str, edit) -> Path:
    """Copy ``name`` (and its expected file) into tmp_path, apply ``edit(text) -> text`` to the recipe."""
    src = load_recipe(name)
    shutil.copy(src.expected_path, tmp_path / src.expected_path.name)
    dst = tmp_path / f"{name}.yaml"
    dst.write_text(edit(src.path.read_text(encoding="utf-8")), encoding="utf-8")
    return dst


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


@pytest.mark.parametrize("name,old,new,field,why", [
    ("boba2-8b-code", "  eps_clip: 0.2", "  eps_clip: 0.2\n  eps_clip_higher: 0.28", "train.eps_clip_higher", "unknown key"),
    ("boba2-8b-code", "      sha256: null", "      sha256: null\n      sha512: null", "data.files[0].sha512", "unknown key"),
    ("boba2-8b-code", "  gpus: 192", "  gpus: many", "resources.gpus", "expected int, got 'many'"),
    ("boba2-8b-code", "  use_decoupled_loss: true", "  use_decoupled_loss: yes please", "train.use_decoupled_loss",
     "expected bool"),
    ("boba2-8b-code", "  lr: 2.0e-5", "  lr: fast", "train.lr", "expected float"),
    ("boba2-8b-code", "  dtype: fp16", "  dtype: fp8", "train.dtype", "must be one of 'fp16' | 'bf16' | 'fp32'"),
    ("boba2-8b-code", "  revision: b968826d9c46dd6066d109eabc6255188de91218", "  revision: main",
     "model.revision", "40-hex commit"),
    ("boba2-8b-code", "  allocation: sglang.d80m2p1+d4m2p4", "  allocation: sglang.d80m2p1+d4m2p2",
     "resources.allocation", "uses 176 GPUs but resources.gpus is 192"),
    ("boba2-8b-code", "  max_head_offpolicyness: 16", "  max_head_offpolicyness: 0", "train.max_head_offpolicyness",
     "async-ppo needs eta > 0"),
    ("boba2-8b-code", "  protocol: qwen3-think-pure", "  protocol: qwen9", "eval.protocol", "unknown protocol 'qwen9'"),
    ("tiny-arith", "  batch_size: 32", "  batch_size: abc", "rollout.batch_size", "expected int"),
    ("tiny-arith", "    eval_n_prompts: 128", "    eval_n_prompts: 128\n  batch_sise: 32", "train.batch_sise",
     "unknown key (did you mean rollout.batch_size"),
    ("tiny-arith", "  stop_accuracy: 0.3", "  stop_accuracy: 0.7", "sft.stop_accuracy", "0.5"),
    ("tiny-arith", "    lr: 0.0003", "    lr: 0.0003\n    sft_lr: 0.1", "train.ppo.sft_lr", "unknown key (did you mean sft.lr?)"),
    ("tiny-arith", "    eval_n_prompts: 128", "    eval_n_prompts: 128\n  sft_lr: 0.1", "train.sft.lr",
     "given twice ('sft.lr' at line"),
    ("boba-sft-32b", "  epochs: 200", "  epochs: 200\n  epochs: 100", "epochs", "duplicate key"),
])
def test_a_bad_key_or_value_is_reported_with_file_line_and_field(tmp_path, name, old, new, field, why):
    path = copy_recipe(tmp_path, name, lambda t: t.replace(old, new, 1))
    bad_line = line_of(path, new.splitlines()[-1].strip())
    with pytest.raises(UserError) as e:
        load_recipe(path)
    msg = str(e.value)
    assert_one_line(msg)
    assert msg.startswith(f"{path}:{bad_line}: field '{field}'"), msg
    assert why in msg


def test_a_missing_required_key_names_the_section(tmp_path):
    path = copy_recipe(tmp_path, "boba2-8b-code", lambda t: t.replace("  eps_clip: 0.2\n", "", 1))
    with pytest.raises(UserError, match=r":\d+: field 'train.eps_clip': required key missing"):
        load_recipe(path)


def test_an_unpinned_revision_needs_a_note(tmp_path):
    path = copy_recipe(tmp_path, "boba2-8b-code", lambda t: re.sub(r"(published_model:\n(?:.*\n){2})  revision_note:.*\n.*\n",
                                                                   r"\1", t, count=1))
    with pytest.raises(UserError, match="field 'published_model.revision': null revision needs a 'revision_note'"):
        load_recipe(path)


def test_an_expected_file_whose_tolerance_disagrees_with_the_formula_is_rejected(tmp_path):
    path = copy_recipe(tmp_path, "boba-rl-7b-math", lambda t: t)
    exp = tmp_path / "boba-rl-7b-math.expected.yaml"
    exp.write_text(exp.read_text().replace("tolerance: {eval_only: 6.65,", "tolerance: {eval_only: 2.0,", 1))
    with pytest.raises(UserError) as e:
        load_recipe(path)
    assert str(e.value).startswith(f"{exp}:{line_of(exp, 'eval_only: 2.0')}: field 'metrics[0].tolerance'")
    assert "disagrees with binomial-mean" in str(e.value)


def test_a_gpqa_number_claimed_as_evaluated_is_rejected(tmp_path):
    path = copy_recipe(tmp_path, "boba-sft-32b", lambda t: t)
    exp = tmp_path / "boba-sft-32b.expected.yaml"
    exp.write_text(exp.read_text().replace("evaluated: false", "evaluated: true", 1))
    with pytest.raises(UserError, match="field 'metrics\\[2\\].evaluated': gpqa_diamond is not yet supported"):
        load_recipe(path)


def test_an_unknown_recipe_lists_the_known_ones():
    with pytest.raises(UserError, match="unknown recipe 'boba3' \\(known: async-1.5b-math, .*tiny-arith, tiny-arith-multiturn, tiny-longtail\\)"):
        load_recipe("boba3")


# --- tolerances and compare -----------------------------------------------------------------------------


def test_binomial_tolerance_is_z_sqrt2_se_for_both_modes():
    t = binomial_tolerance(0.5, 50, 2, z=3)  # se_eval = sqrt(.25 / 100) = .05, se_retrain = sqrt(.25 / 50)
    assert t["eval_only"] == pytest.approx(3 * 2 ** 0.5 * 0.05)
    assert t["retrain"] == pytest.approx(3 * 2 ** 0.5 * (0.25 / 50) ** 0.5)


def test_codeforces_tolerances_follow_the_documented_assumptions():
    assert codeforces_rating_tolerance(57, z=3) == pytest.approx(3 * 2 ** 0.5 * 200 * 2 ** 0.5 / 57 ** 0.5)
    assert CF_PERCENTILE_PER_ELO == pytest.approx(1.5 / 165)


def test_compare_passes_within_tolerance_and_fails_outside():
    exp = load_expected(load_recipe("boba-rl-7b-math"))  # AIME24 61.9, eval_only tolerance 6.65 points
    rows = {c.key: c for c in compare(exp, {"aime24/pass@1": 56.0, "aime25/pass@1": Measured(40.0)})}
    assert rows["aime24/pass@1"].status == "pass" and rows["aime24/pass@1"].tolerance == pytest.approx(6.65)
    assert rows["aime25/pass@1"].status == "fail" and "> 6.84" in rows["aime25/pass@1"].reason
    assert rows["gpqa_diamond/pass@1"].status == "skipped" and "not yet supported" in rows["gpqa_diamond/pass@1"].reason
    assert set(rows) == {"aime24/pass@1", "aime25/pass@1", "gpqa_diamond/pass@1"}  # the published model's rows


def test_compare_retrain_mode_uses_the_wider_tolerance():
    exp = load_expected(load_recipe("boba-rl-7b-math"))
    (row,) = [c for c in compare(exp, {"aime24/pass@1": 40.0}, mode="retrain") if c.key == "aime24/pass@1"]
    assert row.status == "pass" and row.tolerance == pytest.approx(37.62, abs=0.01)


def test_compare_base_model_rows_and_unmeasured_rows():
    exp = load_expected(load_recipe("boba2-8b-code"))
    rows = {c.key: c for c in compare(exp, {"codeforces/rating#base": 1700.0}, subject="base")}
    assert rows["codeforces/rating#base"].status == "fail"  # 1879 published, 159 Elo tolerance
    assert rows["lcb_v5/pass@1#base"].status == "skipped" and rows["lcb_v5/pass@1#base"].reason == "not measured"


def test_compare_derives_the_tolerance_from_the_measured_problem_count_when_unknown():
    exp = load_expected(load_recipe("boba2-8b-code"))  # LCB v5: n_problems unknown, 8 samples
    rows = {c.key: c for c in compare(exp, {"lcb_v5/pass@1": Measured(60.0, n_problems=279),
                                           "codecontests/pass@1": 40.0})}
    assert rows["lcb_v5/pass@1"].tolerance == pytest.approx(binomial_tolerance(0.63, 279, 8)["eval_only"] * 100)
    assert rows["lcb_v5/pass@1"].status == "pass"
    assert rows["codecontests/pass@1"].status == "skipped" and "n_problems unknown" in rows["codecontests/pass@1"].reason


def test_compare_variants_report_rows_and_targets():
    exp = load_expected(load_recipe("async-1.5b-math"))
    sync = {c.key: c for c in compare(exp, {"aime24/pass@1@sync": 41.0, "training/wall_clock_hours@sync": 39.0},
                                      mode="retrain", variant="sync")}
    assert sync["aime24/pass@1@sync"].status == "pass"
    assert sync["training/wall_clock_hours@sync"].status == "skipped"
    assert "reported, not checked" in sync["training/wall_clock_hours@sync"].reason
    tiny = load_expected(load_recipe("tiny-arith"))
    ok = {c.key: c.status for c in compare(tiny, {"tiny-arith/max_accuracy": 0.91, "tiny-arith/final_accuracy": 0.91},
                                           mode="retrain")}
    low = {c.key: c.status for c in compare(tiny, {"tiny-arith/max_accuracy": 0.89, "tiny-arith/final_accuracy": 0.80},
                                            mode="retrain")}
    assert ok == {"tiny-arith/max_accuracy": "pass", "tiny-arith/final_accuracy": "pass"}
    assert low == {"tiny-arith/max_accuracy": "fail", "tiny-arith/final_accuracy": "fail"}  # 0.80 < 0.926 - 0.098
