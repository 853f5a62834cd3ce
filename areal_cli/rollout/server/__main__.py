"""The embedded server's child process: ``python -m areal_cli.rollout.server --model-path DIR --port N``.

Loads the model into an :class:`~areal_cli.rollout.engine.InferenceEngine`, starts the engine thread
(:mod:`areal_cli.rollout.server.worker`) and serves the HTTP app (:mod:`areal_cli.rollout.server.app`) with
uvicorn on the main thread's event loop until SIGTERM/SIGINT, or until ``--parent-pid`` is gone.
"""

import argparse
import logging
import os
import sys
import threading
import time
from pathlib import Path

from areal_cli.rollout.server.app import build_app
from areal_cli.rollout.server.worker import ServerState

log = logging.getLogger("areal.rollout.server")


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m areal_cli.rollout.server",
                                description="Embedded inference server (SGLang native protocol).")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--max-total-tokens", type=int, default=65536, help="KV-cache cap in tokens")
    p.add_argument("--max-prefill-tokens", type=int, default=8192)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-tokenizer-init", action="store_true",
                   help="as SGLang's: requests with min_new_tokens > 0 are refused (SGLang needs the tokenizer's EOS "
                        "id for them)")
    p.add_argument("--enable-deterministic-inference", action="store_true",
                   help="honour each request's sampling_seed (SGLang's flag; without it, as in SGLang, the field is "
                        "accepted and ignored)")
    p.add_argument("--weight-version", default="0")
    p.add_argument("--num-threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--step-delay-s", type=float, default=0.0,
                   help="sleep after each engine step (testing: makes generation interruptible)")
    p.add_argument("--weight-sync-timeout-s", type=float, default=300.0,
                   help="weight-update group: join and receive timeout (seconds)")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process is gone")
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def _watch_parent(pid: int) -> None:
    def run():
        while True:
            time.sleep(0.5)
            if os.getppid() != pid:
                log.warning("parent %d is gone: exiting", pid)
                os._exit(0)

    threading.Thread(target=run, name="parent-watchdog", daemon=True).start()


def _precheck_model_dir(d: Path) -> str | None:
    """A one-line problem with model directory ``d`` (no config.json / no safetensors), or None."""
    if not (d / "config.json").is_file():
        return f"{d}: not a model directory (no config.json)"
    if not ((d / "model.safetensors").is_file() or (d / "model.safetensors.index.json").is_file()):
        return f"{d}: no model.safetensors (or index) found"
    return None


def main(argv: list[str] | None = None) -> None:
    """Run one embedded server until SIGTERM/SIGINT (the child process of :class:`EmbeddedServer`)."""
    args = _parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.parent_pid:
        _watch_parent(args.parent_pid)
    problem = _precheck_model_dir(Path(args.model_path))
    if problem:  # fail fast, before the slow imports
        log.error("%s", problem)
        sys.exit(2)
    import torch

    torch.set_num_threads(max(1, args.num_threads))
    import uvicorn

    from areal_cli.foundations.errors import UserError
    from areal_cli.rollout.engine import InferenceEngine

    t0 = time.time()
    try:
        engine = InferenceEngine(args.model_path, max_running_requests=args.max_running_requests,
                                 max_total_tokens=args.max_total_tokens, context_length=args.context_length,
                                 seed=args.seed, weight_version=args.weight_version,
                                 max_prefill_tokens=args.max_prefill_tokens)
    except (UserError, ValueError) as e:  # bad model directory or sizes: one line, no traceback
        log.error("%s", e)
        sys.exit(2)
    except Exception as e:  # noqa: BLE001 - e.g. unreadable weights, out of memory: one line, no traceback
        first = (str(e).strip().splitlines() or [""])[0]
        log.error("cannot start the engine on %s: %s: %s", args.model_path, type(e).__name__, first)
        sys.exit(2)
    tokenizer = None
    tok_path = Path(args.model_path) / "tokenizer.json"
    if tok_path.is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tok_path))
    s = engine.spec
    log.info("loaded %s in %.2fs: %d layers, hidden %d, vocab %d, KV cap %d tokens (%.1f MiB), version %s",
             args.model_path, time.time() - t0, s.num_layers, s.hidden_size, s.vocab_size,
             engine.max_total_tokens, engine.k_pool.numel() * 2 * engine.k_pool.element_size() / 2**20,
             engine.weight_version)
    state = ServerState(engine, tokenizer, args)
    app = build_app(state)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=2, lifespan="on",
                            timeout_keep_alive=75)
    server = uvicorn.Server(config)
    server.run()


if __name__ == "__main__":
    main()
