"""``areal launch node --plan PLAN [--node-rank N] [--hosts h1,h2,...]``: what one node of a launch runs.

On node ``k`` (``--node-rank``, else ``$SLURM_NODEID``; host names from ``--hosts`` or the plan):

1. Status ``run_dir/launch/status/node{k}.json`` = running (with the pids of its children once started).
2. The inference servers placed on ``k`` (:func:`areal_cli.rollout.fleet.launch_fleet`: embedded or SGLang,
   listening on host ``k``, ``CUDA_VISIBLE_DEVICES`` = the server's GPUs; logs
   ``run_dir/nodes/node{k}/logs/server{j}.log``, j = local index).
3. If trainer ranks are placed on ``k``: ``torchrun --nnodes T --node-rank t --nproc-per-node n
   --master-addr <host of the first training node> --master-port P --max-restarts 0 <trainer args>`` with
   ``CUDA_VISIBLE_DEVICES`` = the ranks' GPUs, ``AREAL_CONTROLLER_ADDR`` = host 0 : controller port,
   ``AREAL_CONTROLLER_AUTHKEY_FILE`` = ``launch/authkey``, ``AREAL_TRAINER_LOG_DIR`` = ``run_dir/logs``
   (rank logs ``trainer-rank{r}.log``); torchrun's own log ``run_dir/logs/node{k}-torchrun.log``.
4. Once its servers answer ``/model_info`` (waited for in a thread while step 6 already watches):
   ``run_dir/discovery/servers/{k}-{i}.url`` (i = global server index, one URL per file, written atomically).
5. Node 0 (controller node): waits for every server's discovery file, then starts the controller command
   with ``AREAL_LLM_SERVER_ADDRS`` = the URLs (server order), ``AREAL_CONTROLLER_LISTEN`` = host 0 :
   controller port and ``AREAL_CONTROLLER_AUTHKEY_FILE``; log ``run_dir/logs/controller.log``.
6. Watches (every 0.25 s): a server exiting, torchrun exiting non-zero, the controller exiting, another
   node's status = failed, node 0's status = done. The controller's exit ends the run: node 0 writes done
   (exit code 0) or failed; every node then stops its children (SIGTERM to each process group, SIGKILL after
   a grace period) and exits: 0 after done, 1 after a failure with one line ``error: node K: ...`` naming the
   node that failed and why. SIGTERM / Ctrl-C (Slurm cancelling the step) stop the children the same way.

Stale files: the sbatch script removes ``discovery/`` and ``launch/status/`` before ``srun``; when nodes are
started by hand, use a fresh run directory (or remove them).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from areal_cli.foundations.atomic import write_atomic_many, write_json_atomic
from areal_cli.foundations.errors import UserError
from areal_cli.launch.plan import LaunchPlan, expand, read_plan

POLL_S = 0.25
GRACE_S = 10.0  # torchrun / controller: SIGTERM, then SIGKILL after this long
DONE_GRACE_S = 15.0  # after done: time for the trainer ranks to exit on their own (controller gone)


class NodeFailed(UserError):
    """This node or another one failed (``other``): one line, exit code 1 (not bad input)."""

    exit_code = 1

    def __init__(self, message: str, other: bool = False):
        super().__init__(message)
        self.other = other


def _die_with_parent() -> None:  # preexec_fn: SIGTERM to the child when this node process dies
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_process_group(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM ``proc``'s process group (it leads one), wait up to ``grace_s``, SIGKILL what is left."""
    if proc.poll() is None or _group_alive(proc.pid):
        _killpg(proc.pid, signal.SIGTERM)
        end = time.monotonic() + grace_s
        while time.monotonic() < end and (proc.poll() is None or _group_alive(proc.pid)):
            time.sleep(0.05)
        _killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def last_line(path: Path) -> str:
    """The last non-empty line of a log (for one-line errors), '' if none."""
    try:
        lines = [x.strip() for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def one_line(e: BaseException) -> str:
    """First line of an error; a trailing "last lines:" log tail is folded to its last line."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    if not lines:
        return type(e).__name__
    first = lines[0]
    if first.endswith("last lines:"):
        first = first[:-len("; last lines:")] if first.endswith("; last lines:") else first[:-len("last lines:")]
        if len(lines) > 1:
            first += f"; last log line: {lines[-1][:300]}"
    return first


def resolve_node_rank(node_rank: int | None, nodes: int) -> int:
    """``node_rank``, else ``$SLURM_NODEID``, else 0 on a one-node plan.

    Raises:
        UserError: unknown or out of range.
    """
    if node_rank is None:
        env = os.environ.get("SLURM_NODEID")
        if env is not None:
            if not env.strip().isdigit():
                raise UserError(f"SLURM_NODEID={env!r}: not a node index")
            node_rank = int(env)
        elif nodes == 1:
            node_rank = 0
        else:
            raise UserError(f"launch node: node rank unknown (pass --node-rank N or run under srun, which sets "
                            f"SLURM_NODEID); the plan has {nodes} nodes")
    if not 0 <= node_rank < nodes:
        raise UserError(f"launch node: node rank {node_rank} out of range for {nodes} node(s)")
    return node_rank


def resolve_hosts(hosts: list[str] | None, plan: LaunchPlan) -> list[str]:
    """``hosts`` (``--hosts``), else the plan's, else ``127.0.0.1`` for a one-node plan.

    Raises:
        UserError: unknown, or not one host per node.
    """
    n = plan.placement.nodes
    hosts = hosts if hosts else plan.hosts
    if not hosts:
        if n == 1:
            return ["127.0.0.1"]
        raise UserError(f"launch node: host names unknown for {n} nodes (pass --hosts h1,h2,...; the sbatch "
                        f"script passes `scontrol show hostnames $SLURM_JOB_NODELIST`)")
    if len(hosts) != n or not all(h.strip() for h in hosts):
        raise UserError(f"launch node: {len(hosts)} host name(s) {','.join(hosts)!r} for {n} node(s)")
    return [h.strip() for h in hosts]


def torchrun_command(plan: LaunchPlan, node: int, hosts: list[str], python: str = sys.executable) -> list[str] | None:
    """torchrun argv for the trainer ranks on ``node``, None when it holds none (see the module docstring)."""
    p = plan.placement
    ranks = p.ranks_on(node)
    if not ranks:
        return None
    tn = p.training_nodes
    return [python, "-m", "torch.distributed.run", "--nnodes", str(len(tn)), "--node-rank", str(tn.index(node)),
            "--nproc-per-node", str(len(ranks)), "--master-addr", hosts[tn[0]], "--master-port",
            str(plan.ports["master"]), "--max-restarts", "0", *expand(plan.trainer["args"], python)]


def discovery_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "discovery" / "servers"


def read_discovery(run_dir: str | Path, placement) -> list[str] | None:
    """Server URLs in server order once every server's file exists, else None."""
    d = discovery_dir(run_dir)
    urls = []
    for i, (node, _) in enumerate(placement.servers):
        f = d / f"{node}-{i}.url"
        try:
            text = f.read_text().strip()
        except FileNotFoundError:
            return None
        if not text:
            return None
        urls.append(text)
    return urls


class _Node:
    """State of one node's run: children, status file, the checks of the watch loop."""

    def __init__(self, plan: LaunchPlan, node: int, hosts: list[str], python: str, echo):
        self.plan, self.node, self.hosts, self.python, self.echo = plan, node, hosts, python, echo
        self.run = Path(plan.run_dir)
        self.status_dir = self.run / "launch" / "status"
        self.logs = self.run / "logs"
        self.fleet = None
        self.torchrun: subprocess.Popen | None = None
        self.controller: subprocess.Popen | None = None
        self.torchrun_rc: int | None = None
        self.open_logs: list = []
        self.published = False
        self.publish_error: BaseException | None = None

    # ------------------------------------------------------------------ status
    def status(self, state: str, message: str = "", code: int | None = None) -> None:
        pids = [p.pid for p in ([*(self.fleet.procs if self.fleet else [])] + [self.torchrun, self.controller])
                if p is not None]
        write_json_atomic(self.status_dir / f"node{self.node}.json",
                          {"node": self.node, "host": self.hosts[self.node], "state": state, "message": message,
                           "exit_code": code, "pid": os.getpid(), "children": pids, "time": time.time()})

    def others(self) -> list[dict]:
        out = []
        for f in sorted(self.status_dir.glob("node*.json")):
            if f.name == f"node{self.node}.json":
                continue
            try:
                out.append(json.loads(f.read_text()))
            except (OSError, json.JSONDecodeError):
                continue  # being replaced: read next time
        return out

    def check_others(self) -> bool:
        """True when node 0 reported done; raises NodeFailed when another node failed."""
        done = False
        for st in self.others():
            if st.get("state") == "failed":
                n, why = st.get("node"), str(st.get("message"))
                why = why[len(f"node {n}: "):] if why.startswith(f"node {n}: ") else why
                raise NodeFailed(f"node {n} ({st.get('host')}) failed: {why}; stopped node {self.node}", other=True)
            if st.get("state") == "done" and st.get("node") == self.plan.placement.controller_node:
                done = True
        return done

    # ------------------------------------------------------------------ children
    def _popen(self, cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
        log.parent.mkdir(parents=True, exist_ok=True)
        fh = open(log, "ab")
        self.open_logs.append(fh)
        fh.write(f"# areal launch node {self.node}: {' '.join(cmd)}\n".encode())
        fh.flush()
        return subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_die_with_parent)

    def start_servers(self) -> None:
        from areal_cli.rollout.fleet import FleetSpec, launch_fleet
        from areal_cli.rollout.sglang_launcher import SGLangServerArgs

        p, srv = self.plan.placement, self.plan.server
        here = p.servers_on(self.node)
        if not here:
            return
        for i in here:  # a stale file of ours from an earlier launch must not be read as this one's
            (discovery_dir(self.run) / f"{self.node}-{i}.url").unlink(missing_ok=True)
        engine = srv["engine"]
        sglang = SGLangServerArgs(srv["model_path"], **srv.get("sglang", {})) if engine == "sglang" else None
        spec = FleetSpec(engine=engine, n_servers=len(here), model_path=srv["model_path"], host=self.hosts[self.node],
                         gpu_ids=None if p.cpu else [list(p.servers[i][1]) for i in here],
                         embedded_extra_args=list(srv.get("embedded_extra_args", [])), sglang=sglang,
                         run_dir=self.run / "nodes" / f"node{self.node}",
                         startup_timeout_s=float(srv.get("startup_timeout_s", 600.0)), python=self.python,
                         seed=here[0])
        self.echo(f"starting {len(here)} {engine} server(s): {', '.join(str(i) for i in here)}")
        self.fleet = launch_fleet(spec, wait=False)

    def start_trainer(self) -> None:
        cmd = torchrun_command(self.plan, self.node, self.hosts, self.python)
        if cmd is None:
            return
        p = self.plan.placement
        env = {**os.environ, **self.plan.trainer.get("env", {}),
               "AREAL_CONTROLLER_ADDR": f"{self.hosts[p.controller_node]}:{self.plan.ports['controller']}",
               "AREAL_CONTROLLER_AUTHKEY_FILE": str(self.plan.authkey_path),
               "AREAL_TRAINER_LOG_DIR": str(self.logs),
               "OMP_NUM_THREADS": str(self.plan.trainer.get("threads", 1))}
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "AREAL_LLM_SERVER_ADDRS"):
            env.pop(k, None)
        if not p.cpu:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(p.trainer_ranks[r][1]) for r in p.ranks_on(self.node))
        self.echo(f"starting trainer ranks {p.ranks_on(self.node)[0]}-{p.ranks_on(self.node)[-1]}: {' '.join(cmd)}")
        self.torchrun = self._popen(cmd, env, self.logs / f"node{self.node}-torchrun.log")

    def start_publishing(self) -> None:
        """Wait for this node's servers in a thread (SGLang takes minutes; the watch loop keeps checking the
        other nodes meanwhile), then write their discovery files."""
        self.published = self.fleet is None
        self.publish_error: BaseException | None = None
        if self.fleet is None:
            return

        def wait() -> None:
            try:
                self.fleet.wait_ready()  # UserError with the log tail (servers stopped) if one fails to start
                here = self.plan.placement.servers_on(self.node)
                write_atomic_many({discovery_dir(self.run) / f"{self.node}-{i}.url": url + "\n"
                                   for i, url in zip(here, self.fleet.urls)})
                self.echo(f"servers ready: {', '.join(self.fleet.urls)}")
                self.published = True
            except BaseException as e:  # noqa: BLE001 - re-raised by check_children in the main thread
                self.publish_error = e

        threading.Thread(target=wait, name="publish-servers", daemon=True).start()

    def start_controller(self, urls: list[str]) -> None:
        p = self.plan.placement
        addr = f"{self.hosts[p.controller_node]}:{self.plan.ports['controller']}"
        env = {**os.environ, **self.plan.controller.get("env", {}),
               "AREAL_CONTROLLER_LISTEN": addr, "AREAL_CONTROLLER_AUTHKEY_FILE": str(self.plan.authkey_path)}
        env.pop("AREAL_LLM_SERVER_ADDRS", None)
        if urls:
            env["AREAL_LLM_SERVER_ADDRS"] = ",".join(u.split("://", 1)[-1] for u in urls)
        cmd = expand(self.plan.controller["command"], self.python)
        self.echo(f"starting the controller: {' '.join(cmd)}")
        self.controller = self._popen(cmd, env, self.logs / "controller.log")

    # ------------------------------------------------------------------ checks
    def check_children(self) -> None:
        """Raise NodeFailed when a server died or torchrun exited non-zero; re-raise a start-up failure of
        the servers (UserError: exit 2, message with the log tail)."""
        if self.publish_error is not None:
            raise self.publish_error
        if self.fleet is not None and self.published:
            for i, proc in zip(self.plan.placement.servers_on(self.node), self.fleet.procs):
                if proc.poll() is not None:
                    log = self.fleet.log_paths[self.plan.placement.servers_on(self.node).index(i)]
                    raise NodeFailed(f"node {self.node}: server {i} exited with code {proc.returncode} (log {log}: "
                                     f"{last_line(log)})")
        if self.torchrun is not None and self.torchrun_rc is None and self.torchrun.poll() is not None:
            self.torchrun_rc = self.torchrun.returncode
            log = self.logs / f"node{self.node}-torchrun.log"
            if self.torchrun_rc != 0:
                raise NodeFailed(f"node {self.node}: trainer torchrun exited with code {self.torchrun_rc} "
                                 f"(logs {log}, {self.logs}/trainer-rank*.log)")
            self.echo("trainer ranks finished (exit 0)")

    def stop(self, grace_s: float = GRACE_S) -> None:
        if self.controller is not None:
            stop_process_group(self.controller, grace_s)
        if self.torchrun is not None:
            stop_process_group(self.torchrun, grace_s)
        if self.fleet is not None:
            self.fleet.stop()
        for fh in self.open_logs:
            fh.close()
        self.open_logs = []


def run_node(plan_path: str | Path, *, node_rank: int | None = None, hosts: list[str] | None = None,
             python: str = sys.executable, echo=None) -> int:
    """Run node ``node_rank`` of the launch plan (see the module docstring). Returns 0 when the run is done.

    Raises:
        UserError: bad plan / node rank / hosts (exit 2, nothing started). NodeFailed: this node or another
            failed, or the controller exited non-zero (exit 1, this node's children stopped).
    """
    plan = read_plan(plan_path)
    k = resolve_node_rank(node_rank, plan.placement.nodes)
    hosts = resolve_hosts(hosts, plan)
    echo = echo or (lambda msg: print(f"node {k}: {msg}", flush=True))
    st = _Node(plan, k, hosts, python, echo)

    def on_term(signum, frame):
        raise NodeFailed(f"node {k}: stopped by signal {signal.Signals(signum).name}")

    old = signal.signal(signal.SIGTERM, on_term)
    st.status("starting")
    try:
        st.start_servers()
        st.start_trainer()
        st.status("running")
        st.start_publishing()
        is_controller = k == plan.placement.controller_node
        urls = None
        while True:
            done = st.check_others()
            try:
                st.check_children()
            except NodeFailed:
                time.sleep(2 * POLL_S)  # a peer's failure often kills our ranks too: report the first cause
                st.check_others()
                raise
            if done:
                echo("the controller finished; stopping")
                if st.torchrun is not None:  # the ranks exit once the controller is gone; give them the time
                    end = time.monotonic() + DONE_GRACE_S
                    while st.torchrun.poll() is None and time.monotonic() < end:
                        time.sleep(POLL_S)
                st.stop()
                st.status("stopped", "after done", 0)
                return 0
            if is_controller:
                if st.controller is None:
                    urls = read_discovery(plan.run_dir, plan.placement)
                    if urls is not None:
                        st.start_controller(urls)
                        st.status("running")
                elif st.controller.poll() is not None:
                    rc = st.controller.returncode
                    if rc != 0:
                        log = st.logs / "controller.log"
                        raise NodeFailed(f"node {k}: controller exited with code {rc} (log {log}: {last_line(log)})")
                    echo("the controller finished (exit 0)")
                    st.status("done", "controller exited 0", 0)
                    if st.torchrun is not None:
                        end = time.monotonic() + DONE_GRACE_S
                        while st.torchrun.poll() is None and time.monotonic() < end:
                            time.sleep(POLL_S)
                    st.stop()
                    return 0
            time.sleep(POLL_S)
    except BaseException as e:
        other = isinstance(e, NodeFailed) and e.other
        msg = f"node {k}: interrupted" if isinstance(e, KeyboardInterrupt) else one_line(e)
        st.status("stopped" if other else "failed", msg, getattr(e, "exit_code", 1))  # first: others stop now
        st.stop(grace_s=3.0)
        raise
    finally:
        signal.signal(signal.SIGTERM, old)
