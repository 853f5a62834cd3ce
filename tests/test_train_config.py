"""TrainConfig in sections: dotted keys, Literal types, a docstring per setting, the flat names of earlier
releases (accepted with one note), and the same config from every form a recipe or ``-o`` may take."""

from __future__ import annotations

import json
import subprocess
import sys
import typing

import pytest

from areal_cli.config import FLAT_NAMES, KEYS, SECTIONS, TrainConfig, apply_overrides, field_docs, get_value, keys
from areal_cli.foundations.errors import UserError
from areal_cli.recipes import load_recipe, load_train_config
from helpers.one_line import assert_one_line

NESTED = """\
recipe: mine
seed: 3
task: tiny-arith
model: {hidden_size: 64}
sft:
  max_steps: 7
  lr: 0.002
rollout:
  group_size: 2
  engine: embedded
ppo: {lr: 1.0e-4, n_minibatches: 2}
parallel: {torch_threads: 1}
loop: {max_steps: 5}
"""
DOTTED = """\
recipe: mine
seed: 3
task.preset: tiny-arith
model.hidden_size: 64
sft.max_steps: 7
sft.lr: 0.002
rollout.group_size: 2
rollout.engine: embedded
ppo.lr: 1.0e-4
ppo.n_minibatches: 2
parallel.torch_threads: 1
loop.max_steps: 5
"""
FLAT = """\
recipe: mine
seed: 3
task: tiny-arith
model_hidden_size: 64
sft_max_steps: 7
sft_lr: 0.002
group_size: 2
rollout_engine: embedded
lr: 1.0e-4
ppo_n_minibatches: 2
torch_threads: 1
max_steps: 5
"""


def test_every_setting_has_a_docstring_a_type_and_a_section():
    docs = field_docs()
    assert set(docs) == set(KEYS), sorted(set(KEYS) - set(docs))
    assert all(len(d) > 10 for d in docs.values())
    assert all(cls.__doc__ and len(cls.__doc__) > 20 for cls in SECTIONS.values())
    assert {k.partition(".")[0] for k in KEYS if "." in k} == {"model", "task", "sft", "rollout", "ppo", "critic",
                                                               "parallel", "loop"}
    literal = {k for k, key in KEYS.items() if typing.get_origin(key.type) is typing.Literal}
    assert {"rollout.engine", "rollout.stale_groups", "rollout.weight_update_mode", "ppo.adv_norm",
            "ppo.behav_imp_weight_mode", "ppo.prox_logp_method", "ppo.lr_scheduler", "model.chat_template",
            "task.sandbox_isolation", "rollout.sglang_dtype"} <= literal
    for k in literal:  # every default is one of its values
        assert get_value(TrainConfig(), k) in typing.get_args(KEYS[k].type)


def test_sections_nested_dotted_and_flat_files_give_one_config(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(keys, "_noted", set())
    cfgs = {}
    for name, text in (("nested", NESTED), ("dotted", DOTTED), ("flat", FLAT)):
        p = tmp_path / name / "mine.yaml"
        p.parent.mkdir()
        p.write_text(text)
        cfgs[name] = load_train_config(str(p))[0]
        err = capsys.readouterr().err
        if name == "flat":  # one line naming the new keys
            assert_one_line(err.strip(), "flat setting names are deprecated")
            assert "group_size -> rollout.group_size" in err and "model_hidden_size -> model.hidden_size" in err
        else:
            assert err == ""
    a, b, c = (cfgs[n].to_dict() for n in ("nested", "dotted", "flat"))
    for d in (a, b, c):
        d["task"]["code_dir"] = ""  # each file's own folder
    assert a == b == c
    cfg = cfgs["nested"]
    assert (cfg.seed, cfg.model.hidden_size, cfg.sft.max_steps, cfg.rollout.group_size, cfg.ppo.n_minibatches,
            cfg.loop.max_steps, cfg.ppo.lr) == (3, 64, 7, 2, 2, 5, 1e-4)
    assert cfg.rollout.batch_size == TrainConfig().rollout.batch_size  # untouched keys of a section keep defaults


@pytest.mark.parametrize("flat", sorted(k for k in FLAT_NAMES if k not in KEYS and k != "task"))
def test_every_flat_name_of_earlier_releases_sets_its_sectioned_key(flat, capsys):
    dotted = FLAT_NAMES[flat]
    value = get_value(TrainConfig(), dotted)
    text = json.dumps(value) if not isinstance(value, str) else (value or '""')
    assert apply_overrides(TrainConfig(), [f"{flat}={text}"]) == apply_overrides(TrainConfig(), [f"{dotted}={text}"])
    capsys.readouterr()


def test_overrides_copy_validate_and_the_last_one_wins(capsys, monkeypatch):
    monkeypatch.setattr(keys, "_noted", set())  # the note is said once per process
    base = TrainConfig()
    cfg = apply_overrides(base, ["rollout.group_size=3", "group_size=5", "task=math-rl"])
    assert (cfg.rollout.group_size, cfg.task.preset) == (5, "math-rl")
    assert base.rollout.group_size == 8 and base.task.preset == "tiny-arith"  # the sections were copied
    assert capsys.readouterr().err.count("\n") == 1  # the one note for group_size
    for item, needle in (("rollout.engine=vllm", "field 'rollout.engine': must be one of embedded, sglang, external"),
                         ("rollout_engine=vllm", "field 'rollout.engine': must be one of"),
                         ("rollout.group_sise=3", "unknown key (did you mean rollout.group_size"),
                         ("rollout=3", "field 'rollout': a section, not a setting"),
                         ("ppo.n_minibatches=3", "field 'ppo.n_minibatches': must divide rollout.batch_size=16")):
        with pytest.raises(UserError) as e:
            apply_overrides(base, [item])
        assert_one_line(str(e.value), needle)
        assert str(e.value).startswith(f"-o {item}") or "overrides" in str(e.value)
    assert capsys.readouterr().err == ""  # an error alone: no note beside it


def test_literal_values_are_checked_even_when_set_from_python():
    with pytest.raises(UserError, match="field 'ppo.adv_norm': must be one of group, global"):
        TrainConfig().with_values({"ppo.adv_norm": "batch"}).validate()
    with pytest.raises(KeyError):
        TrainConfig().with_values({"group_size": 3})  # Python callers use the dotted keys


def test_flat_attribute_names_say_where_the_setting_went():
    with pytest.raises(AttributeError, match=r"TrainConfig.group_size is now TrainConfig.rollout.group_size"):
        TrainConfig().group_size  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        TrainConfig().nope  # noqa: B018


def test_config_json_round_trip_and_a_flat_one_of_an_earlier_release(capsys, monkeypatch):
    monkeypatch.setattr(keys, "_noted", set())
    cfg = apply_overrides(TrainConfig(), ["rollout.group_size=3", "loop.loggers=tensorboard", "task.workflow_args={a: 1}"])
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    old = {k.rpartition(".")[2] if k in ("recipe", "seed") else next(f for f, d in FLAT_NAMES.items() if d == k): v
           for k, v in cfg.flat_dict().items() if k in ("recipe", "seed") or k in FLAT_NAMES.values()}
    assert "pause_mode" not in old  # settings newer than the flat names have none (and take their defaults)
    assert "group_size" in old and "sft_lr" in old and "trainer_data_parallel" in old
    assert TrainConfig.from_dict(old, "run/config.json") == cfg
    assert "run/config.json: flat setting names are deprecated" in capsys.readouterr().err
    with pytest.raises(UserError, match="run/config.json: field 'bogus': unknown key"):
        TrainConfig.from_dict({"bogus": 1}, "run/config.json")


def test_a_variant_overrides_single_keys_of_a_section(tmp_path):
    text = (load_recipe("tiny-arith").path.read_text()
            + "variants:\n  sync:\n    description: synchronous\n    train:\n      rollout: {max_head_offpolicyness: 0}\n")
    p = tmp_path / "tiny-arith.yaml"
    p.write_text(text)
    (tmp_path / "tiny-arith.expected.yaml").write_text(
        load_recipe("tiny-arith").path.with_name("tiny-arith.expected.yaml").read_text())
    r = load_recipe(p)
    base, sync = r.variant(None), r.variant("sync")
    assert sync.rollout.max_head_offpolicyness == 0 and base.rollout.max_head_offpolicyness == 4
    assert sync.rollout.batch_size == base.rollout.batch_size == 32  # the rest of the section is the base's


def test_list_settings_shows_every_key_with_the_recipes_value(tmp_path):
    r = subprocess.run([sys.executable, "-m", "areal_cli", "train", "tiny-arith", "--list-settings",
                        "-o", "rollout.group_size=3"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    shown = {line.split(" = ")[0].strip() for line in lines if " = " in line and line.startswith("  ") and
             not line.startswith("      ")}
    assert shown == set(KEYS)
    assert "  rollout.group_size = 3  (int; was group_size)" in lines
    assert any(line.startswith("  rollout.engine = 'embedded'  (embedded | sglang | external") for line in lines)
    assert not (tmp_path / "runs").exists()  # nothing trained, nothing written


def test_one_workflow_argument_is_overridden_and_the_others_kept():
    cfg, _ = load_train_config("tiny-arith-multiturn")
    out = apply_overrides(cfg, ["task.workflow_args.max_turns=3", "task.workflow_args.feedback=Try again."])
    assert out.task.workflow_args == {**cfg.task.workflow_args, "max_turns": 3, "feedback": "Try again."}
    assert cfg.task.workflow_args["max_turns"] == 2  # the recipe's config is not changed
    assert apply_overrides(cfg, ["task.workflow_args.feedback=null"]).task.workflow_args == {
        k: v for k, v in cfg.task.workflow_args.items() if k != "feedback"}  # null removes the argument


def test_a_workflow_args_mapping_merges_into_the_recipes_like_the_dotted_form():
    cfg, _ = load_train_config("tiny-arith-multiturn")
    recipe = dict(cfg.task.workflow_args)
    mapping = apply_overrides(cfg, ["task.workflow_args={max_turns: 3, feedback: null}"]).task.workflow_args
    dotted = apply_overrides(cfg, ["task.workflow_args.max_turns=3", "task.workflow_args.feedback=null"]).task.workflow_args
    assert mapping == dotted == {"max_turns": 3, "turn_discount": recipe["turn_discount"],
                                 "reward_mode": recipe["reward_mode"]}  # RFC 7396: kept, replaced, removed
    assert cfg.task.workflow_args == recipe  # the recipe's config is not changed
    # nested mappings merge too (RFC 7396), in both forms; removing an absent argument changes nothing
    nested = TrainConfig().with_values({"task.workflow_args": {"agent": "m:A", "agent_args": {"max_turns": 2, "x": 1}}})
    for items in (["task.workflow_args={agent_args: {max_turns: 4, x: null}}"],
                  ["task.workflow_args.agent_args.max_turns=4", "task.workflow_args.agent_args.x=null"],
                  ["task.workflow_args.agent_args={max_turns: 4, x: null}", "task.workflow_args.nope=null"]):
        assert apply_overrides(nested, items).task.workflow_args == {"agent": "m:A", "agent_args": {"max_turns": 4}}
    assert apply_overrides(cfg, ["task.workflow_args=null"]).task.workflow_args == {}  # null: every argument removed
    assert apply_overrides(cfg, ["task.workflow_args="]).task.workflow_args == {}
    assert apply_overrides(cfg, ["task.workflow_args={}"]).task.workflow_args == recipe  # an empty patch
    for item, got in (("task.workflow_args=3", "got 3"), ("task.workflow_args=[max_turns]", "got ['max_turns']"),
                      ("task.workflow_args={max_turns: 3", "got '{max_turns: 3'")):  # not YAML: a text
        with pytest.raises(UserError) as e:
            apply_overrides(cfg, [item])
        assert str(e.value).startswith(f"-o {item}: field 'task.workflow_args': expected a mapping"), str(e.value)
        assert got in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match=r"-o task.workflow_args..x=1: field 'task.workflow_args..x': empty argument"):
        apply_overrides(cfg, ["task.workflow_args..x=1"])


def test_override_errors_name_the_item_and_text_settings_keep_their_text():
    for item, needle in (("rollout.group_size=0", "-o rollout.group_size=0: field 'rollout.group_size': must be > 0"),
                         ("sft.eval_every=0", "-o sft.eval_every=0: field 'sft.eval_every': must be > 0"),
                         ("model.hidden_size=0", "field 'model.hidden_size': must be > 0"),
                         ("ppo.adam_beta1=1", "field 'ppo.adam_beta1': must be in [0, 1)"),
                         ("ppo.weight_decay=-1", "field 'ppo.weight_decay': must be >= 0"),
                         ("rollout=5", "field 'rollout': a section, not a setting (write rollout.KEY"),
                         ("rolout.group_size=5", "unknown section 'rolout' (did you mean rollout?)")):
        with pytest.raises(UserError) as e:
            apply_overrides(TrainConfig(), [item])
        assert_one_line(str(e.value), needle)
    cfg = apply_overrides(TrainConfig(), ["task.prompt_field=true", "task.id_field=7", "model.path=x", "model.path="])
    assert (cfg.task.prompt_field, cfg.task.id_field, cfg.model.path) == ("true", "7", None)


def test_sections_in_files_suggest_keys_and_may_be_empty(tmp_path):
    p = tmp_path / "r.yaml"
    for text, needle in (("rollout:\n  group_sise: 4\n", "r.yaml:2: field 'rollout.group_sise': unknown key (did you "
                                                          "mean rollout.group_size?)"),
                         ("rolout:\n  group_size: 4\n", "r.yaml:1: field 'rolout': unknown section (did you mean "
                                                        "rollout?)")):
        p.write_text(text)
        with pytest.raises(UserError) as e:
            load_train_config(str(p))
        assert_one_line(str(e.value), needle)
    p.write_text("rollout:\n  # everything commented out\nloop: {max_steps: 2}\n")
    cfg, _ = load_train_config(str(p))
    assert cfg.rollout == TrainConfig().rollout and cfg.loop.max_steps == 2


def test_the_cli_says_only_the_error_when_flat_settings_are_followed_by_a_bad_override(tmp_path):
    p = tmp_path / "flat.yaml"
    p.write_text("group_size: 2\nmax_steps: 1\n")
    r = subprocess.run([sys.executable, "-m", "areal_cli", "train", str(p), "--out", str(tmp_path / "o"),
                        "-o", "rollout.batch_size=0"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: -o rollout.batch_size=0: field 'rollout.batch_size': must be > 0 (got 0)"], r.stderr
    r = subprocess.run([sys.executable, "-m", "areal_cli", "train", str(p), "--list-settings"], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stderr.count("flat setting names are deprecated") == 1, r.stderr
    r = subprocess.run([sys.executable, "-m", "areal_cli", "train", "--resume", str(tmp_path), "--list-settings"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "--list-settings" in r.stderr and not (tmp_path / "o").exists()


def test_a_benchmark_refuses_overrides_of_what_it_sets_per_run_and_reads_sections():
    from areal_cli.bench.runs import override_items, refuse_per_run_overrides

    for item in ("seed=3", "max_steps=5", "rollout.max_head_offpolicyness=2"):
        with pytest.raises(UserError, match="for every run; change the scenario"):
            refuse_per_run_overrides([item])
    refuse_per_run_overrides(["ppo.lr=1e-4", "group_size=2"])
    # the staleness grid runs any update mode; the throughput benchmark's modes set it per run
    from areal_cli.bench.runs import PER_RUN_THROUGHPUT

    refuse_per_run_overrides(["rollout.pause_mode=in_place", "rollout.interruptible=false"])
    for item in ("rollout.pause_mode=in_place", "interruptible=false"):
        with pytest.raises(UserError, match=r"set by the mode of the run \(compare_.*\) for every run"):
            refuse_per_run_overrides([item], PER_RUN_THROUGHPUT)
    assert override_items({"rollout": {"group_size": 2, "temperature": 0.5}, "ppo.lr": 1e-4}) == [
        "rollout.group_size=2", "rollout.temperature=0.5", "ppo.lr=0.0001"]


def test_an_unknown_task_preset_names_its_line(tmp_path):
    p = tmp_path / "r.yaml"
    for text, line in (("seed: 2\ntask: nosuch\n", 2), ("seed: 2\ntask:\n  dataset: x.jsonl\n  preset: nosuch\n", 4)):
        p.write_text(text)
        with pytest.raises(UserError) as e:
            load_train_config(str(p))
        assert_one_line(str(e.value), f"{p}:{line}: field 'task.preset': unknown task 'nosuch' (known: tiny-arith")


@pytest.mark.parametrize("other, field", [("loop.target_accuracy=0.5", "loop.target_accuracy"),
                                          ("loop.checkpoint_every=2", "loop.checkpoint_every"),
                                          ("loop.eval_benchmarks=[aime24]", "loop.eval_benchmarks")])
def test_deferred_evaluations_refuse_what_needs_the_accuracy_during_the_loop(other, field):
    base = apply_overrides(TrainConfig(), ["loop.target_accuracy=0", "parallel.rollout_process=false"])
    apply_overrides(base, ["loop.eval_deferred=true"])  # alone: fine
    with pytest.raises(UserError) as e:
        apply_overrides(base, ["loop.eval_deferred=true", other])
    assert_one_line(str(e.value), f"field '{field}': must be off with loop.eval_deferred")


@pytest.mark.parametrize("item, expected", [
    ("ppo.learning_rate=1e-5", "TRL's learning_rate is ppo.lr here"),
    ("learning_rate=1e-5", "TRL's learning_rate is ppo.lr here"),
    ("num_generations=4", "TRL's num_generations is rollout.group_size here"),
    ("actor_rollout_ref.rollout.n=4", "verl's actor_rollout_ref.rollout.n is rollout.group_size here"),
    ("data.max_response_length=64", "verl's max_response_length is rollout.max_new_tokens here"),
    ("gconfig.n_samples=4", "AReaL's gconfig.n_samples is rollout.group_size here"),
])
def test_a_peers_key_is_answered_with_the_kits_name(item, expected):
    with pytest.raises(UserError) as e:
        apply_overrides(TrainConfig(), [item])
    assert str(e.value) == f"-o {item}: field '{item.split('=')[0]}': unknown key ({expected})"
    from areal_cli.config.peer_names import PEER_NAMES

    assert all(kit in KEYS for kit, _ in PEER_NAMES.values())  # every answer is a real setting


def test_a_peers_key_in_a_file_section_names_its_line(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("ppo:\n  lr: 1e-5\n  max_grad_norm: 1.0\n")
    with pytest.raises(UserError, match=r"r\.yaml:3: field 'ppo\.max_grad_norm': unknown key \(TRL's max_grad_norm is "
                                        r"ppo\.grad_clip here\)"):
        load_train_config(str(f))


def test_list_settings_take_comma_lists_on_the_command_line():
    cfg = apply_overrides(TrainConfig(), ["task.required_fields=question, answer", "loop.eval_benchmarks=aime24"])
    assert cfg.task.required_fields == ["question", "answer"] and cfg.loop.eval_benchmarks == ["aime24"]
    assert apply_overrides(TrainConfig(), ["task.required_fields=[q, a]"]).task.required_fields == ["q", "a"]
    assert apply_overrides(TrainConfig(), ["task.required_fields="]).task.required_fields == []


def test_a_model_path_that_does_not_exist_says_so_and_names_areal_download(tmp_path):
    from areal_cli.train_loop.run import preflight

    cfg = apply_overrides(TrainConfig(), [f"model.path={tmp_path / 'no' / 'such'}"])
    with pytest.raises(UserError) as e:
        preflight(cfg)
    assert str(e.value) == (f"model.path '{tmp_path / 'no' / 'such'}': no such file or directory (a published model: "
                            f"`areal download MODEL_REPO_ID --local-dir DIR`, then -o model.path=DIR)")
