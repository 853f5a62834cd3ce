"""SGLang's own environment (areal_cli.rollout.sglang_env, `areal engine`): pinned requirements, shims that fail
loudly when called, finding the Python that runs SGLang, one-line errors naming the set-up command; and the command
line a CPU machine starts SGLang with. The environment itself is built and used for real by .ci/real_sglang
(tests/real_sglang)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from areal_cli.foundations.errors import UserError
from areal_cli.rollout import sglang_env
from areal_cli.rollout.sglang_launcher import build_sglang_command, cpu_mode, sglang_args_from_config

from helpers.one_line import one_line_error

FILES = sglang_env.FILES


def test_every_package_of_the_environment_is_pinned_exactly():
    lines = [ln.strip() for ln in (FILES / "requirements.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert all(ln.count("==") == 1 and " " not in ln for ln in lines), [ln for ln in lines if "==" not in ln]
    pins = dict(ln.split("==") for ln in lines)
    assert pins["sglang"] == sglang_env.SGLANG_VERSION == "0.5.23"
    assert pins["torch"] == "2.13.0"  # the CPU build on this machine's disk, the kit's own
    assert pins["transformers"] == "5.19.0" and pins["kernels"] == "0.14.1" and "triton" in pins
    assert len(pins) == len(lines)  # no package twice


def _run(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with the shims' folder first on sys.path (as in SGLang's environment)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(FILES) + os.pathsep + os.environ.get("PYTHONPATH", "")})


@pytest.mark.multiproc
def test_the_sgl_kernel_stand_in_imports_and_raises_naming_itself_when_called():
    out = _run("import sgl_kernel\n"
               "from sgl_kernel import copy_all_layer_kv_cache_cpu as f\n"
               "try:\n    f(1, 2)\nexcept NotImplementedError as e:\n    print('raised:', e)\n"
               "try:\n    import sgl_kernel.kvcacheio\nexcept ImportError:\n    print('no submodule')\n")
    assert out.returncode == 0, out.stderr
    assert "raised: sgl_kernel.copy_all_layer_kv_cache_cpu was called" in out.stdout
    assert "no submodule" in out.stdout  # SGLang falls back when a kernel module is missing


@pytest.mark.multiproc
def test_the_torchvision_op_schemas_are_defined_and_have_no_kernel():
    out = _run("import areal_torchvision_ops as m, torch\nm.install()\nm._register()\n"
               "print(torch.ops.torchvision.nms.default._schema)\n"
               "try:\n    torch.ops.torchvision.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)\n"
               "except (NotImplementedError, RuntimeError) as e:\n    print('no kernel')\n")
    assert out.returncode == 0, out.stderr
    assert "torchvision::nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor" in out.stdout
    assert "no kernel" in out.stdout
    pth = (FILES / "areal_torchvision_ops.pth").read_text()
    assert pth.startswith("import areal_torchvision_ops") and "torch" not in pth.replace("torchvision", "")


def test_the_python_that_runs_sglang_is_found_or_named_in_one_line(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))
    monkeypatch.setenv("AREAL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(sglang_env.ENV_PYTHON, raising=False)
    with pytest.raises(UserError) as e:
        sglang_env.resolve_sglang_python("")
    assert "no SGLang found" in str(e.value) and "`areal engine setup sglang`" in str(e.value)
    # a finished environment at the default place is found
    env = sglang_env.default_env_dir()
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)
    assert sglang_env.built_env(env) is None
    with pytest.raises(UserError):
        sglang_env.resolve_sglang_python("")  # no marker yet: an unfinished build is not used
    (env / sglang_env.MARKER).write_text('{"digest": "x"}')
    assert sglang_env.resolve_sglang_python("") == str(env / "bin" / "python")
    # a named environment folder or interpreter, or the variable
    assert sglang_env.resolve_sglang_python(str(env)) == str(env / "bin" / "python")
    monkeypatch.setenv(sglang_env.ENV_PYTHON, sys.executable)
    assert sglang_env.resolve_sglang_python("") == sys.executable
    with pytest.raises(UserError, match="rollout.sglang_python: .*nowhere/python does not exist; build"):
        sglang_env.resolve_sglang_python(str(tmp_path / "nowhere" / "python"))


@pytest.mark.multiproc
def test_engine_commands_refuse_bad_input_in_one_line(tmp_path, monkeypatch):
    from areal_cli.commands.main import main

    res = CliRunner().invoke(main, ["engine", "check", "sglang", "--python", str(tmp_path / "no" / "python")])
    one_line_error(res, "does not exist", "areal engine setup sglang")
    res = CliRunner().invoke(main, ["engine", "check", "sglang", "--python", sys.executable])
    one_line_error(res, "`import sglang` fails", "No module named sglang", "areal engine setup sglang")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    res = CliRunner().invoke(main, ["engine", "setup", "sglang", "--env", str(tmp_path / "full")])
    one_line_error(res, "exists and is not an environment `areal engine setup sglang` built")
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"  # nothing touched
    (tmp_path / "full" / "pyvenv.cfg").write_text("home = /usr/bin\n")  # someone's own venv: not replaced either
    res = CliRunner().invoke(main, ["engine", "setup", "sglang", "--env", str(tmp_path / "full")])
    one_line_error(res, "is not an environment `areal engine setup sglang` built")
    assert (tmp_path / "full" / "notes.txt").exists()
    old = tmp_path / "python3.9"
    old.write_text("#!/bin/sh\necho 3.9\n")
    old.chmod(0o755)
    with pytest.raises(UserError, match="Python 3.9; SGLang 0.5.23 needs 3.10-3.12"):
        sglang_env.build_env(tmp_path / "env", python=str(old), log=lambda m: None)
    assert not (tmp_path / "env").exists()
    res = CliRunner().invoke(main, ["engine", "setup", "vllm"])
    assert res.exit_code == 2 and "vllm" in res.output


def test_a_cpu_machine_starts_sglang_in_its_cpu_mode():
    a = sglang_args_from_config("/m", max_total_tokens=65536, max_prompt_tokens=100, max_new_tokens=28)
    cmd = build_sglang_command(cpu_mode(a, dtype_given=False), python="/env/bin/python")
    assert cmd[:3] == ["/env/bin/python", "-m", "sglang.launch_server"]
    s = " ".join(cmd)
    for flag in ("--device cpu", "--attention-backend torch_native", "--dtype float32", "--sleep-on-idle",
                 "--max-total-tokens 65536", "--context-length 128", "--skip-tokenizer-init"):
        assert flag in s, flag
    assert "--disable-overlap-schedule" not in s
    chosen = build_sglang_command(cpu_mode(sglang_args_from_config("/m", dtype="bfloat16", skip_tokenizer_init=False,
                                                                   disable_overlap_schedule=True), dtype_given=True))
    s = " ".join(chosen)
    assert "--dtype bfloat16" in s and "--skip-tokenizer-init" not in s and "--disable-overlap-schedule" in s


def test_launch_servers_passes_the_environment_the_cpu_flags_and_the_run_modes(tmp_path, monkeypatch):
    """`rollout.engine=sglang` on a machine without CUDA: SGLang's Python, SGLANG_USE_CPU_ENGINE=1, CPU mode;
    in-place updates turn SGLang's overlap scheduler off, min_new_tokens keeps SGLang's tokenizer."""
    import areal_cli.train_loop.processes as processes
    from areal_cli.config import TrainConfig, apply_overrides

    seen = []
    monkeypatch.setattr(processes, "launch_fleet", lambda spec, wait=True: seen.append(spec))
    monkeypatch.setattr(processes.torch.cuda, "device_count", lambda: 0)
    model = tmp_path / "m"
    cfg = apply_overrides(TrainConfig(), ["rollout.engine=sglang", f"rollout.sglang_python={sys.executable}",
                                          "rollout.pause_mode=in_place", "rollout.min_new_tokens=1"])
    processes.launch_servers(cfg, model, 3, tmp_path / "out", log=lambda _: None)
    spec = seen[-1]
    assert spec.python == sys.executable and spec.env == {"SGLANG_USE_CPU_ENGINE": "1"}
    a = spec.sglang
    assert (a.device, a.attention_backend, a.dtype, a.sleep_on_idle) == ("cpu", "torch_native", "float32", True)
    assert a.disable_overlap_schedule is True and a.skip_tokenizer_init is False and a.weight_version == "3"
    cfg = apply_overrides(TrainConfig(), ["rollout.engine=sglang", f"rollout.sglang_python={sys.executable}",
                                          "rollout.sglang_dtype=bfloat16"])
    processes.launch_servers(cfg, model, 0, tmp_path / "out", log=lambda _: None)
    a = seen[-1].sglang
    assert a.dtype == "bfloat16" and a.disable_overlap_schedule is False and a.skip_tokenizer_init is True


@pytest.mark.multiproc
def test_unwritable_places_unrunnable_pythons_and_foreign_pythons_are_one_line(tmp_path):
    from areal_cli.commands.main import main

    (tmp_path / "afile").write_text("x")
    res = CliRunner().invoke(main, ["engine", "setup", "sglang", "--env", str(tmp_path / "afile" / "env")])
    one_line_error(res, "cannot write there", "give another --env")
    res = CliRunner().invoke(main, ["engine", "setup", "sglang", "--env", "/proc/areal-env"])
    one_line_error(res, "/proc/areal-env")
    notexec = tmp_path / "python"
    notexec.write_text("#!/bin/sh\n")
    res = CliRunner().invoke(main, ["engine", "check", "sglang", "--python", str(notexec)])
    one_line_error(res, "cannot be run (permission denied)", "chmod +x")
    res = CliRunner().invoke(main, ["engine", "check", "sglang", "--python", sys.executable])
    one_line_error(res, "it is not an SGLang environment: build one with `areal engine setup sglang`")


@pytest.mark.multiproc
def test_a_forced_rebuild_cut_short_leaves_an_unfinished_environment_never_a_finished_looking_one(tmp_path):
    """The finished marker goes first: a rebuild that fails (or is interrupted) leaves a folder the next setup
    rebuilds, never one that claims to be finished; an empty folder given as --env stays (emptied)."""
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / sglang_env.MARKER).write_text('{"digest": "old"}')
    (env / "junk").write_text("x")
    fake = tmp_path / "py"  # answers the version check, fails to make a venv
    fake.write_text('#!/bin/sh\ncase "$*" in *version_info*) echo 3.11;; *) echo "venv: no space left" >&2; '
                    'exit 1;; esac\n')
    fake.chmod(0o755)
    lines: list[str] = []
    with pytest.raises(UserError, match="failed while creating the virtual environment .*no space left"):
        sglang_env.build_env(env, python=str(fake), force=True, log=lines.append)
    assert lines[0] == f"removing {env} to build it again (--force)"
    assert sglang_env.built_env(env) is None and not any(env.iterdir())  # emptied, never "finished"
    assert (tmp_path / "env.build.log").exists()  # the failed build's log is kept
    empty = tmp_path / "mine"
    empty.mkdir()
    with pytest.raises(UserError):
        sglang_env.build_env(empty, python=str(fake), log=lambda m: None)
    assert empty.is_dir() and not any(empty.iterdir())


@pytest.mark.multiproc
def test_a_relative_sglang_python_is_kept_absolute_and_a_failed_start_keeps_its_log(tmp_path, monkeypatch):
    """The run's config.json names SGLang's Python absolutely (a resume from another folder finds it), and a server
    that fails to start leaves its log where the one-line error says, though the half-made run folder is gone."""
    from areal_cli.commands.main import main
    from areal_cli.config import TrainConfig, apply_overrides
    from areal_cli.train_loop.run import preflight

    fake = Path(__file__).resolve().parent / "fake_sglang"
    monkeypatch.setenv("PYTHONPATH", str(fake) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.chdir(tmp_path)
    rel = os.path.relpath(sys.executable, tmp_path)  # this venv's Python, named relative to here
    cfg = apply_overrides(TrainConfig(), ["rollout.engine=sglang", f"rollout.sglang_python={rel}",
                                          f"model.path={_tiny(tmp_path)}"])
    preflight(cfg)
    assert cfg.rollout.sglang_python == os.path.abspath(tmp_path / rel) == os.path.abspath(sys.executable)
    res = CliRunner().invoke(main, ["train", "--out", str(tmp_path / "run"), "--no-live", "-o", "rollout.engine=sglang",
                                    "-o", f"rollout.sglang_python={rel}", "-o", f"model.path={_tiny(tmp_path)}",
                                    "-o", "sft.max_steps=0", "-o", "rollout.sglang_extra_args=--bogus-flag"])
    line = next(x for x in res.output.splitlines() if x.startswith("error: "))  # then the log's last lines
    assert res.exit_code == 2 and line.startswith("error: rollout server 0 (sglang") and "exited with code 2" in line
    assert not (tmp_path / "run").exists()
    log = Path(line.split("(log ")[1].split(")")[0])
    assert log.is_file() and "--bogus-flag" in log.read_text()


def _tiny(tmp_path: Path) -> Path:
    from areal_cli.models.tiny import build_tiny_model
    from areal_cli.recipes import load_train_config
    from areal_cli.tasks.task import Task

    d = tmp_path / "model"
    if not (d / "config.json").exists():
        cfg, _ = load_train_config("tiny-arith")
        build_tiny_model(d, seed=cfg.seed, corpus=Task(cfg).tokenizer_corpus(), vocab_size=cfg.model.vocab_size,
                         hidden_size=cfg.model.hidden_size, num_layers=cfg.model.num_layers,
                         chat_template=cfg.model.chat_template)
    return d
