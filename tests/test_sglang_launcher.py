"""Claims about areal_cli.rollout.sglang_launcher: the command line uses flags a real SGLang 0.5.23 server
has (checked against its recorded /server_info keys), carries every setting, refuses bad values with a line
naming the field, and the recipe helper derives context length and per-server seeds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from areal_cli.foundations.errors import UserError
from areal_cli.rollout.sglang_launcher import (
    SGLangServerArgs, build_sglang_command, for_server, sglang_args_from_config,
)
from helpers.one_line import assert_one_line

FAKE = Path(__file__).resolve().parent / "fake_sglang"


def _load_fake():
    """The test stand-in's launch_server module, loaded by path (no ``sglang`` enters sys.modules)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fake_sglang_launch_server",
                                                  FAKE / "sglang" / "launch_server.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


fake_launch_server = _load_fake()


def _flags(cmd: list[str]) -> dict[str, str | None]:
    """``--flag value`` / ``--switch`` pairs after ``-m sglang.launch_server``."""
    out: dict[str, str | None] = {}
    rest = cmd[3:]
    i = 0
    while i < len(rest):
        assert rest[i].startswith("--"), rest[i]
        if i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            out[rest[i]] = rest[i + 1]
            i += 2
        else:
            out[rest[i]] = None
            i += 1
    return out


FULL = SGLangServerArgs(model_path="/m/qwen", host="10.0.0.5", port=30001, tp_size=2, dp_size=1, pp_size=2,
                        mem_fraction_static=0.8, max_total_tokens=131072, max_running_requests=128,
                        context_length=32768, dtype="bfloat16", random_seed=7, skip_tokenizer_init=True,
                        attention_backend="fa3", device="cuda", weight_version="3", log_level="warning")


def test_command_carries_every_setting_under_sglang_flag_names():
    cmd = build_sglang_command(FULL, python="/usr/bin/python3")
    assert cmd[:3] == ["/usr/bin/python3", "-m", "sglang.launch_server"]
    assert _flags(cmd) == {
        "--model-path": "/m/qwen", "--host": "10.0.0.5", "--port": "30001", "--tp-size": "2", "--dp-size": "1",
        "--pp-size": "2", "--mem-fraction-static": "0.8", "--max-total-tokens": "131072",
        "--max-running-requests": "128", "--context-length": "32768", "--dtype": "bfloat16",
        "--random-seed": "7", "--skip-tokenizer-init": None, "--attention-backend": "fa3", "--device": "cuda",
        "--weight-version": "3", "--log-level": "warning",
    }


def test_unset_options_are_left_to_sglang_and_extra_args_come_last():
    cmd = build_sglang_command(SGLangServerArgs("/m", skip_tokenizer_init=False,
                                                extra_args=("--skip-server-warmup",)), python="py")
    flags = _flags(cmd)
    for absent in ("--pp-size", "--mem-fraction-static", "--max-total-tokens", "--context-length",
                   "--random-seed", "--skip-tokenizer-init", "--attention-backend", "--weight-version"):
        assert absent not in flags
    assert cmd[-1] == "--skip-server-warmup" and flags["--dtype"] == "auto"


def test_every_flag_is_a_server_arg_of_the_recorded_sglang_server(shared_dir):
    # /server_info of a real SGLang 0.5.23 lists its ServerArgs fields; field x_y is the flag --x-y.
    rec = json.loads((shared_dir / "fixtures" / "sglang" / "server_info_keys.json").read_text())
    keys = set(rec["response"]["top_level_keys"])
    flags = [f for f in _flags(build_sglang_command(FULL)) if f.startswith("--")]
    missing = [f for f in flags if f[2:].replace("-", "_") not in keys]
    assert len(flags) == 17 and missing == []


@pytest.mark.multiproc
def test_the_test_stand_in_accepts_exactly_these_flags_and_refuses_unknown_ones():
    a = fake_launch_server.parse(build_sglang_command(FULL)[3:])
    assert (a.model_path, a.port, a.tp_size, a.pp_size, a.random_seed, a.skip_tokenizer_init) == \
        ("/m/qwen", 30001, 2, 2, 7, True)
    r = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--model-path", "/m", "--no-such-flag"],
                       capture_output=True, text=True, env={"PYTHONPATH": str(FAKE)}, timeout=60)
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr


@pytest.mark.parametrize("field,value,msg", [
    ("port", 0, "sglang.port: must be an integer in [1, 65535], got 0"),
    ("port", 70000, "sglang.port: must be an integer in [1, 65535]"),
    ("tp_size", 0, "sglang.tp_size: must be an integer >= 1, got 0"),
    ("dp_size", 1.5, "sglang.dp_size: must be an integer >= 1"),
    ("pp_size", True, "sglang.pp_size: must be an integer >= 1"),
    ("mem_fraction_static", 1.2, "sglang.mem_fraction_static: must be a number in (0, 1], got 1.2"),
    ("mem_fraction_static", 0.0, "sglang.mem_fraction_static"),
    ("max_total_tokens", 0, "sglang.max_total_tokens: must be an integer >= 1"),
    ("context_length", -3, "sglang.context_length"),
    ("dtype", "fp8", "sglang.dtype: must be one of auto, half, float16, bfloat16, float, float32, got 'fp8'"),
    ("random_seed", -1, "sglang.random_seed"),
    ("host", "", "sglang.host: must be a non-empty string without spaces"),
    ("model_path", " ", "sglang.model_path: must be a non-empty path"),
    ("attention_backend", "fa 3", "sglang.attention_backend"),
    ("log_level", "loud", "sglang.log_level: must be one of debug, info"),
    ("extra_args", "--x", "sglang.extra_args: must be a list of strings"),
])
def test_bad_values_raise_one_line_naming_the_field(field, value, msg):
    from dataclasses import replace

    with pytest.raises(UserError) as ei:
        build_sglang_command(replace(FULL, **{field: value}))
    assert_one_line(str(ei.value), msg)


def test_recipe_helper_sets_context_length_and_per_server_seed():
    a = sglang_args_from_config("/m", server_index=3, port=31000, tp_size=2, pp_size=1,
                                mem_fraction_static=0.85, max_prompt_tokens=1024, max_new_tokens=31744,
                                dtype="bfloat16", seed=100, weight_version="4")
    assert (a.context_length, a.random_seed, a.tp_size, a.port, a.n_gpus) == (32768, 103, 2, 31000, 2)
    assert a.skip_tokenizer_init and a.weight_version == "4"
    with pytest.raises(UserError, match="sglang.context_length: needs both"):
        sglang_args_from_config("/m", max_new_tokens=10)
    with pytest.raises(UserError, match="sglang.server_index"):
        sglang_args_from_config("/m", server_index=-1)
    b = for_server(a, model_path="/other", host="127.0.0.1", port=40000, server_index=1)
    assert (b.model_path, b.port, b.random_seed, b.context_length) == ("/other", 40000, 104, 32768)
