"""Publishing a policy version: the trainer's weights saved in HF format (or broadcast, ``rollout.weight_update_mode: xccl``)
and loaded on every server, under the lock that keeps weight updates and server restarts apart.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path


from areal_cli.train_loop.processes import weight_sync_spec
from areal_cli.rollout.controller import RolloutController
from areal_cli.train_loop.context import RunContext


class VersionLoader:
    """Loads published versions on every server in the background, the newest winning: the trainer never waits
    for a load it does not need (AReaL boba's trainer does not wait for the servers either).

    :meth:`publish` hands over a saved version. If no load runs, one starts; if one runs, the version waits as
    the pending one, replacing an older pending version (which is then never loaded). When a load ends and a
    newer version is pending, it is loaded at once, before the controller hears of the older one, so the
    controller admits rollouts of the newest version only. Without this, the next step's publish waited for the
    previous load: with non-interruptible updates a load waits for every in-flight sample to finish (the long
    tail), which kept the trainer idle ~0.25 s per step on the long-tail benchmark.

    :meth:`wait` returns once every handed-over version is loaded (before an evaluation, a checkpoint, the end);
    :meth:`floor` is the oldest version a server may still need (serving or loading): weights below it may be
    deleted. A failed load raises at the next :meth:`publish` or :meth:`wait`.
    """

    def __init__(self, ctx: RunContext, controller: RolloutController):
        self.ctx, self.controller = ctx, controller
        self._task: asyncio.Task | None = None
        self._pending: tuple[Path, int] | None = None
        self._loading: int | None = None

    def publish(self, path: Path, version: int) -> None:
        """Load ``version`` (weights in ``path``) when the servers are free of older loads (class docstring).
        Raises: the error of a load that failed since the last call."""
        self._reap()
        self._pending = (path, version)
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def wait(self) -> None:
        """Until every published version is loaded. Raises: a load's error."""
        if self._task is not None:
            task, self._task = self._task, None
            await task

    async def cancel(self) -> None:
        """Stop a running load (an error or Ctrl-C ends the run)."""
        self._pending = None
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def floor(self, default: int) -> int:
        """The oldest version a server may need: the one being loaded or the one served, else ``default``."""
        served = self.ctx.served[1] if self.ctx.served is not None else default
        return min(x for x in (self._loading, served, default) if x is not None)

    def _reap(self) -> None:
        if self._task is not None and self._task.done():
            task, self._task = self._task, None
            task.result()

    async def _run(self) -> None:
        while self._pending is not None:
            path, version = self._pending
            self._pending = None
            self._loading = version
            try:
                await load_on_servers(self.ctx, path, version)
            finally:
                self._loading = None
            if self._pending is None:
                self.controller.notify_version(version)


async def load_on_servers(ctx: RunContext, path: Path, version: int) -> None:
    """Load the weights in ``path`` on every server as ``version``, under :func:`fleet_lock`; the run context then
    says the servers hold it (``ctx.version``, ``ctx.served``). Raises: what the client's load raises."""
    async with fleet_lock(ctx):
        await ctx.client.update_weights_from_disk(str(path.resolve()), version)
        ctx.version, ctx.served = version, (path, version)


def fleet_lock(ctx: RunContext):
    """The lock that keeps weight updates and server restarts apart (a no-op context without supervision)."""
    return ctx.fleet_lock if ctx.fleet_lock is not None else contextlib.nullcontext()


async def sync_distributed(ctx: RunContext, version: int) -> None:
    """``rollout.weight_update_mode: xccl``: every trainer rank gathers the HF weights, rank 0 broadcasts them to the
    servers in buckets (:func:`areal_cli.rollout.weight_sync.sync_weights_from_engine`), around a pause of the
    servers (interruptible) or a hold of new submissions (non-interruptible)."""
    from areal_cli.rollout.weight_sync import update_weights_distributed

    spec = weight_sync_spec(ctx.cfg, ctx.client)
    async with fleet_lock(ctx):
        await update_weights_distributed(
            ctx.client, lambda: ctx.train("areal_cli.rollout.weight_sync:sync_weights_from_engine", spec, version),
            version)


async def adopt_or_reset_external(client, weights: Path, version: int, log, *, in_place: bool = False) -> None:
    """Servers someone else started (``rollout.engine: external``) at the start of a run: each must serve the run's
    starting policy ``version`` (0, or a checkpoint's when resuming) with the weights in ``weights``. A server whose
    ``/model_info`` says that version is adopted as it is; any other is reset by loading ``weights`` as
    ``version``. One line says which for each server. With ``in_place`` (``rollout.pause_mode: in_place``), a real
    SGLang server running its overlap scheduler gets a warning line: its version spans put the token in flight at an
    update one position late (``areal_cli.rollout.sglang_launcher``; the kit starts its own without it).

    Raises:
        ServerError: a server that cannot be asked or refuses the load (e.g. it cannot read ``weights``): its
            message, the server and what to do.
    """
    from areal_cli.rollout.protocol import ServerError, version_to_int

    for url in client.urls:
        info = await client.model_info(url)
        label = info.get("weight_version", "default")
        try:
            held = version_to_int(label)
        except ValueError:
            held = None
        if held == version:
            log(f"external server {url}: serves weight version {label!r}, the run's version {version}: adopted")
            continue
        try:
            await client.load_weights_on(url, str(Path(weights).resolve()), version)
        except ServerError as e:
            raise ServerError(e.status, f"{url} serves weight version {label!r}, not the run's version {version}, "
                                        f"and refused to load the run's weights {weights} as version {version} "
                                        f"({e.message}); restart it on those weights with --weight-version "
                                        f"{version}", url) from None
        log(f"external server {url}: served weight version {label!r}; reset: loaded the run's weights "
            f"({weights}) as version {version}")
    if in_place:
        for url in client.urls:
            if (await client.server_info(url)).get("disable_overlap_schedule") is False:
                log(f"warning: external server {url} runs SGLang's overlap scheduler: with rollout.pause_mode "
                    f"in_place the token in flight at each weight update is labelled with the new version though "
                    f"the old weights computed it; start it with --disable-overlap-schedule")


async def publish(ctx: RunContext, version: int, tag: str) -> Path:
    """Write the trainer's weights in HF format and load them on every server as ``version``."""
    path = await ctx.train("engine.save_hf", ctx.out / "weights" / tag)
    await load_on_servers(ctx, path, version)
    return path
