"""Command lines for real SGLang rollout servers (``python -m sglang.launch_server ...``), pure.

:class:`SGLangServerArgs` holds the settings of one server; :func:`build_sglang_command` turns them into the
argv list (validated: a bad value raises ``UserError("sglang.<field>: ...")``, one line); and
:func:`sglang_args_from_config` derives one server's settings from the recipe's generation settings.
Launching, readiness and stopping live in :mod:`areal_cli.rollout.fleet`.

Flag names were checked against SGLang's ``python/sglang/srt/server_args.py`` (sgl-project/sglang; fields of
``ServerArgs``, each field ``x_y`` is the flag ``--x-y``): ``--model-path``, ``--host``, ``--port``,
``--tp-size`` (alias ``--tensor-parallel-size``), ``--dp-size`` (``--data-parallel-size``), ``--pp-size``
(``--pipeline-parallel-size``), ``--mem-fraction-static`` (fraction of GPU memory for weights + KV pool),
``--max-total-tokens`` (KV pool size in tokens), ``--max-running-requests``, ``--context-length``,
``--dtype`` (choices auto, half, float16, bfloat16, float, float32), ``--random-seed``,
``--skip-tokenizer-init`` (a switch: token ids in, token ids out; ``text`` is not decoded),
``--attention-backend``, ``--device``, ``--weight-version`` (initial label, default "default"),
``--log-level``, ``--sleep-on-idle`` (an idle scheduler sleeps instead of polling: on CPU an idle server otherwise
burns most of a core), ``--disable-overlap-schedule`` (see :class:`SGLangServerArgs`). Anything else goes through ``extra_args`` verbatim.

SGLang's CPU mode (:func:`cpu_mode`): ``--device cpu --attention-backend torch_native --dtype float32
--sleep-on-idle`` and ``SGLANG_USE_CPU_ENGINE=1`` in the server's environment (``shared/reference/sglang_cpu.md`` of
the workspace).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace

from areal_cli.foundations.errors import UserError

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


@dataclass(frozen=True)
class SGLangServerArgs:
    """Settings of one SGLang server process (None = leave SGLang's default).

    Attributes:
        model_path: HF model directory (or hub id) the server loads at start.
        host, port: HTTP address the server listens on.
        tp_size, dp_size, pp_size: tensor / data / pipeline parallel size inside this server (GPUs used =
            tp * dp * pp, counted from the first visible device).
        mem_fraction_static: fraction (0, 1] of GPU memory for weights + KV cache.
        max_total_tokens: KV-cache cap in tokens (SGLang derives it from the memory fraction if None).
        max_running_requests: concurrent requests cap.
        context_length: longest prompt + generation, tokens (None: the model config's).
        dtype: one of :data:`DTYPES`.
        random_seed: sampling seed of this server (>= 0).
        skip_tokenizer_init: token ids in, token ids out (True: the trainer owns the tokenizer).
        attention_backend: e.g. "flashinfer", "fa3", "triton", "torch_native" (None: SGLang chooses).
        device: "cuda" (default when None), "cpu", ...
        weight_version: initial ``weight_version`` label (e.g. "3" when resuming; None: "default").
        log_level: one of :data:`LOG_LEVELS`.
        sleep_on_idle: ``--sleep-on-idle``.
        disable_overlap_schedule: ``--disable-overlap-schedule``. SGLang's overlap scheduler launches the next
            forward before it has processed the last one's tokens; a pause in place then lands with one forward in
            flight, and its tokens, computed by the old weights, come back labelled with the new version after the
            update (measured on SGLang 0.5.23: the first token after the span boundary matched the old weights;
            with the overlap off the boundary is exact). The kit turns it off for in-place updates.
        extra_args: further flags, appended verbatim.
    """

    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    tp_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    mem_fraction_static: float | None = None
    max_total_tokens: int | None = None
    max_running_requests: int | None = None
    context_length: int | None = None
    dtype: str = "auto"
    random_seed: int | None = None
    skip_tokenizer_init: bool = True
    attention_backend: str | None = None
    device: str | None = None
    weight_version: str | None = None
    log_level: str = "info"
    sleep_on_idle: bool = False
    disable_overlap_schedule: bool = False
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    @property
    def n_gpus(self) -> int:
        """GPUs one such server uses: tp * dp * pp."""
        return self.tp_size * self.dp_size * self.pp_size


def _bad(name: str, what: str, value) -> UserError:
    return UserError(f"sglang.{name}: {what}, got {value!r}")


def _int(name: str, v, lo: int, hi: int | None = None) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise _bad(name, f"must be an integer {rng}", v)


def _word(name: str, v) -> None:
    if not isinstance(v, str) or not v or any(c.isspace() for c in v):
        raise _bad(name, "must be a non-empty string without spaces", v)


def validate_sglang_args(a: SGLangServerArgs) -> None:
    """Check every field of ``a``.

    Raises:
        UserError: ``"sglang.<field>: <what is wrong>, got <value>"`` for the first bad field.
    """
    if not isinstance(a.model_path, str) or not a.model_path.strip():
        raise _bad("model_path", "must be a non-empty path", a.model_path)
    _word("host", a.host)
    _int("port", a.port, 1, 65535)
    for name in ("tp_size", "dp_size", "pp_size"):
        _int(name, getattr(a, name), 1)
    m = a.mem_fraction_static
    if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not 0.0 < m <= 1.0):
        raise _bad("mem_fraction_static", "must be a number in (0, 1]", m)
    for name in ("max_total_tokens", "max_running_requests", "context_length"):
        if getattr(a, name) is not None:
            _int(name, getattr(a, name), 1)
    if a.dtype not in DTYPES:
        raise _bad("dtype", f"must be one of {', '.join(DTYPES)}", a.dtype)
    if a.random_seed is not None:
        _int("random_seed", a.random_seed, 0, 2**31 - 1)
    for name in ("skip_tokenizer_init", "sleep_on_idle", "disable_overlap_schedule"):
        if not isinstance(getattr(a, name), bool):
            raise _bad(name, "must be true or false", getattr(a, name))
    for name in ("attention_backend", "device", "weight_version"):
        if getattr(a, name) is not None:
            _word(name, getattr(a, name))
    if a.log_level not in LOG_LEVELS:
        raise _bad("log_level", f"must be one of {', '.join(LOG_LEVELS)}", a.log_level)
    if isinstance(a.extra_args, str) or not all(isinstance(x, str) for x in a.extra_args):
        raise _bad("extra_args", "must be a list of strings", a.extra_args)


def build_sglang_command(args: SGLangServerArgs, python: str = sys.executable) -> list[str]:
    """The argv that starts one SGLang server: ``[python, "-m", "sglang.launch_server", ...]``.

    Pure: no file or network access. Optional settings left at None are not passed (SGLang's defaults).

    Raises:
        UserError: a field is invalid (see :func:`validate_sglang_args`).
    """
    validate_sglang_args(args)
    a = args
    cmd = [python, "-m", "sglang.launch_server", "--model-path", a.model_path, "--host", a.host,
           "--port", str(a.port), "--tp-size", str(a.tp_size), "--dp-size", str(a.dp_size)]
    if a.pp_size != 1:
        cmd += ["--pp-size", str(a.pp_size)]
    if a.mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", repr(float(a.mem_fraction_static))]
    for flag, v in (("--max-total-tokens", a.max_total_tokens),
                    ("--max-running-requests", a.max_running_requests),
                    ("--context-length", a.context_length)):
        if v is not None:
            cmd += [flag, str(v)]
    cmd += ["--dtype", a.dtype]
    if a.random_seed is not None:
        cmd += ["--random-seed", str(a.random_seed)]
    if a.skip_tokenizer_init:
        cmd.append("--skip-tokenizer-init")
    for flag, v in (("--attention-backend", a.attention_backend), ("--device", a.device),
                    ("--weight-version", a.weight_version)):
        if v is not None:
            cmd += [flag, v]
    cmd += ["--log-level", a.log_level]
    if a.sleep_on_idle:
        cmd.append("--sleep-on-idle")
    if a.disable_overlap_schedule:
        cmd.append("--disable-overlap-schedule")
    cmd += list(a.extra_args)
    return cmd


def sglang_args_from_config(model_path: str, *, server_index: int = 0, host: str = "127.0.0.1",
                            port: int = 30000, tp_size: int = 1, pp_size: int = 1, dp_size: int = 1,
                            mem_fraction_static: float | None = None, max_total_tokens: int | None = None,
                            max_running_requests: int | None = None, max_prompt_tokens: int | None = None,
                            max_new_tokens: int | None = None, dtype: str = "bfloat16", seed: int = 0,
                            weight_version: str | None = None, attention_backend: str | None = None,
                            device: str | None = None, log_level: str = "info", sleep_on_idle: bool = False,
                            skip_tokenizer_init: bool = True, disable_overlap_schedule: bool = False,
                            extra_args: list[str] | tuple[str, ...] = ()) -> SGLangServerArgs:
    """One server's :class:`SGLangServerArgs` from the recipe's generation settings.

    Args:
        server_index: 0-based index of this server in the fleet; its seed is ``seed + server_index`` (so
            servers do not sample the same streams).
        tp_size, pp_size, dp_size: the allocation's generation parallelism per server (``sglang.dDmMpP``:
            one server per tp*pp GPUs, so dp_size stays 1 here unless one server should run DP itself).
        max_prompt_tokens, max_new_tokens: context length = their sum when both are given.
        skip_tokenizer_init: token ids in and out, no tokenizer loaded (SGLang 0.5.23 then refuses requests with
            ``min_new_tokens > 0``: it needs the tokenizer's EOS id; a run with ``rollout.min_new_tokens`` passes
            False).
        disable_overlap_schedule: see :class:`SGLangServerArgs` (in-place weight updates).
        Others: as in :class:`SGLangServerArgs`.
    Raises:
        UserError: a bad value (``sglang.<field>: ...``); a negative server_index or max_* value.
    """
    _int("server_index", server_index, 0)
    context_length = None
    if max_prompt_tokens is not None or max_new_tokens is not None:
        if max_prompt_tokens is None or max_new_tokens is None:
            raise UserError("sglang.context_length: needs both max_prompt_tokens and max_new_tokens")
        _int("max_prompt_tokens", max_prompt_tokens, 1)
        _int("max_new_tokens", max_new_tokens, 1)
        context_length = max_prompt_tokens + max_new_tokens
    _int("random_seed", seed, 0)
    a = SGLangServerArgs(model_path=str(model_path), host=host, port=port, tp_size=tp_size, dp_size=dp_size,
                         pp_size=pp_size, mem_fraction_static=mem_fraction_static,
                         max_total_tokens=max_total_tokens, max_running_requests=max_running_requests,
                         context_length=context_length, dtype=dtype, random_seed=seed + server_index,
                         skip_tokenizer_init=skip_tokenizer_init, attention_backend=attention_backend, device=device,
                         weight_version=weight_version, log_level=log_level, sleep_on_idle=sleep_on_idle,
                         disable_overlap_schedule=disable_overlap_schedule,
                         extra_args=tuple(extra_args))
    validate_sglang_args(a)
    return a


#: SGLang's CPU mode: the flags and the environment variable its CPU engine needs (measured with SGLang 0.5.23).
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}


def cpu_mode(args: SGLangServerArgs, *, dtype_given: bool) -> SGLangServerArgs:
    """``args`` for SGLang's CPU mode: ``device="cpu"``, ``attention_backend="torch_native"`` (the only attention
    backend SGLang runs on a CPU without AMX), ``sleep_on_idle``, and ``dtype="float32"`` unless the dtype was
    chosen (``dtype_given``). The server also needs :data:`CPU_ENV` in its environment."""
    return replace(args, device=args.device or "cpu", attention_backend=args.attention_backend or "torch_native",
                   sleep_on_idle=True, dtype=args.dtype if dtype_given else "float32")


def for_server(template: SGLangServerArgs, *, model_path: str, host: str, port: int, server_index: int
               ) -> SGLangServerArgs:
    """``template`` with this server's model path, address and seed (``template.random_seed or 0`` +
    ``server_index``)."""
    seed = (template.random_seed or 0) + server_index
    return replace(template, model_path=str(model_path), host=host, port=port, random_seed=seed)
