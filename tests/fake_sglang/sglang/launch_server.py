"""``python -m sglang.launch_server ...`` for tests: parse SGLang's flags, exec the embedded server.

Accepts the flags :func:`areal_cli.rollout.sglang_launcher.build_sglang_command` emits, under SGLang's names
and aliases (``python/sglang/srt/server_args.py``); an unknown flag or a bad value exits 2 with argparse's
message, as SGLang does. Settings the embedded server has no use for (tp/dp/pp sizes, memory fraction, dtype,
attention backend, device) are accepted and written to the log. Then the process replaces itself
(``os.execv``, same pid) with ``python -m areal_cli.rollout.server`` so the pid the launcher holds is the
server's.

Test-only knob: env ``FAKE_SGLANG_STEP_DELAY_S`` -> the embedded server's ``--step-delay-s`` (slow generation
that a pause can interrupt).
"""

import argparse
import os
import sys


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sglang.launch_server")
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", type=int, default=1)
    p.add_argument("--pp-size", "--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--max-total-tokens", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--dtype", default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--skip-tokenizer-init", action="store_true")
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--schedule-policy", default="fcfs")
    p.add_argument("--device", default=None)
    p.add_argument("--weight-version", default="default")
    p.add_argument("--log-level", default="info")
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--sleep-on-idle", action="store_true")
    p.add_argument("--disable-overlap-schedule", action="store_true")
    p.add_argument("--enable-deterministic-inference", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> None:
    a = parse(argv)
    print(f"fake sglang: tp={a.tp_size} dp={a.dp_size} pp={a.pp_size} mem_fraction_static="
          f"{a.mem_fraction_static} dtype={a.dtype} attention_backend={a.attention_backend} device={a.device} "
          f"schedule_policy={a.schedule_policy} context_length={a.context_length} "
          f"skip_tokenizer_init={a.skip_tokenizer_init} sleep_on_idle={a.sleep_on_idle}: not used by the embedded "
          f"server", flush=True)
    cmd = [sys.executable, "-m", "areal_cli.rollout.server", "--model-path", a.model_path, "--host", a.host,
           "--port", str(a.port), "--weight-version", a.weight_version, "--log-level", a.log_level,
           "--seed", str(a.random_seed or 0)]
    if a.max_total_tokens is not None:
        cmd += ["--max-total-tokens", str(a.max_total_tokens)]
    if a.max_running_requests is not None:
        cmd += ["--max-running-requests", str(a.max_running_requests)]
    if a.skip_tokenizer_init:
        cmd.append("--skip-tokenizer-init")
    if a.enable_deterministic_inference:
        cmd.append("--enable-deterministic-inference")
    if a.context_length is not None:
        cmd += ["--context-length", str(a.context_length)]
    if os.environ.get("FAKE_SGLANG_STEP_DELAY_S"):
        cmd += ["--step-delay-s", os.environ["FAKE_SGLANG_STEP_DELAY_S"]]
    sys.stdout.flush()
    os.execv(sys.executable, cmd)


if __name__ == "__main__":
    main()
