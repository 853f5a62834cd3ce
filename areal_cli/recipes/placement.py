"""AReaL allocation strings -> where every inference server, trainer rank and the controller run.

**Allocation string** (AReaL v0.2/v0.3 ``allocation_mode``): ``[BACKEND.]GEN+TRAIN`` or ``TRAIN``.

- ``BACKEND``: ``sglang`` | ``vllm`` | ``embedded`` (this kit's CPU server). With a backend the first part is
  the inference (generation) part and the second the training part; without one the single part is training
  only (SFT: ``d32p1m4`` = 128 training GPUs).
- each part: degrees ``d`` (data), ``m`` (tensor; ``t`` is an alias), ``p`` (pipeline), in any order, each
  at most once, each >= 1, missing ones = 1. Inference ``dD mM pP``: D servers, each using M*P GPUs
  (SGLang ``--tp-size M --pp-size P``). Training ``dD mM pP``: D*M*P Megatron ranks.

Examples: ``sglang.d80m2p1+d4m2p4`` (80 TP2 servers = 160 GPUs + DP4 x TP2 x PP4 = 32 training GPUs),
``sglang.d64p1m1+d32p2m1``, ``d32p1m4``, ``embedded.d2+d1`` (2 CPU servers + 1 trainer process).

**Placement** (:func:`place`) on ``nodes`` x ``gpus_per_node``, in this order:

1. Inference servers, server 0 first: each takes the next ``tp*pp`` GPUs of the current node; a server that
   does not fit in what is left of the node starts on the next node (a server never spans nodes).
2. Trainer ranks in Megatron's rank order: ``megatron.core.parallel_state.initialize_model_parallel``'s
   default ``order="tp-cp-ep-dp-pp"`` (tensor fastest; context and expert parallel are 1 here), so global rank
   ``r = tp_rank + TP * (dp_rank + DP * pp_rank)``. Ranks go in tensor-parallel groups of TP consecutive
   ranks, each group on one node (TP must divide ``gpus_per_node``: its all-reduces stay on NVLink), starting
   where the servers stopped. Ranks on a node are therefore a contiguous range and nodes come in rank order,
   which is how ``torchrun --node-rank k --nproc-per-node n`` numbers them.
3. The controller (``areal train``: rollout controller, reward pool) on node 0.

**CPU placement** (``gpus_per_node == 0``): servers and trainer ranks are processes, not GPUs, with no
capacity limit: on one node every process runs on that host; on several nodes servers are spread evenly in
contiguous blocks (server ``i`` on node ``i * nodes // n_servers``) and so are the trainer's TP groups; GPU
ids are empty and trainer ranks have no local GPU (``None``).

Errors: :class:`~areal_cli.foundations.errors.UserError`, one line naming the allocation string (and the bad part):
``allocation 'sglang.d0m2+d1': part 'd0m2': d must be >= 1``; impossible layouts (more GPUs than
``nodes * gpus_per_node``, a server larger than a node, TP not dividing ``gpus_per_node``, a layout that does
not fit once servers and TP groups may not span nodes).

Imports the standard library only (rich in :meth:`Placement.table`, lazily).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from areal_cli.foundations.errors import UserError

BACKENDS = ("sglang", "vllm", "embedded")
#: Megatron-core's default rank order (initialize_model_parallel(order=...)); tp varies fastest.
MEGATRON_ORDER = "tp-cp-ep-dp-pp"
_LETTERS = {"d": "dp", "m": "tp", "t": "tp", "p": "pp"}


@dataclass(frozen=True)
class Parallel:
    """Parallel degrees of one part: data ``dp``, tensor ``tp``, pipeline ``pp`` (each >= 1)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1

    @property
    def world(self) -> int:
        """Processes (GPUs) of the part: dp * tp * pp."""
        return self.dp * self.tp * self.pp

    def text(self) -> str:
        """Canonical form ``d4m2p4``."""
        return f"d{self.dp}m{self.tp}p{self.pp}"

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(tp_rank, dp_rank, pp_rank)`` of global ``rank`` in Megatron order :data:`MEGATRON_ORDER`."""
        return rank % self.tp, (rank // self.tp) % self.dp, rank // (self.tp * self.dp)


@dataclass(frozen=True)
class Allocation:
    """A parsed allocation string (see the module docstring).

    Attributes:
        text: the string as given.
        backend: ``"sglang" | "vllm" | "embedded"``, None for a training-only string.
        gen: inference part (``gen.dp`` servers of ``gen.tp * gen.pp`` GPUs each), None without a backend.
        train: training part.
    """

    text: str
    backend: str | None
    gen: Parallel | None
    train: Parallel

    @property
    def n_servers(self) -> int:
        return self.gen.dp if self.gen else 0

    @property
    def server_gpus(self) -> int:
        """GPUs of one inference server (tp * pp), 0 without an inference part."""
        return self.gen.tp * self.gen.pp if self.gen else 0

    @property
    def inference_gpus(self) -> int:
        return self.gen.world if self.gen else 0

    @property
    def training_gpus(self) -> int:
        return self.train.world

    @property
    def total(self) -> int:
        return self.inference_gpus + self.training_gpus

    def describe(self) -> str:
        """``160 inference (sglang: d80 x m2 x p1) + 32 training (d4 x m2 x p4)``."""
        def degrees(p: Parallel) -> str:
            return f"d{p.dp} x m{p.tp} x p{p.pp}"

        text = f"{self.training_gpus} training ({degrees(self.train)})"
        if self.gen is not None:
            text = f"{self.inference_gpus} inference ({self.backend}: {degrees(self.gen)}) + " + text
        return text


def _part(s: str, part: str) -> Parallel:
    if not part:
        raise UserError(f"allocation '{s}': empty part (expected degrees like d4m2p1)")
    tokens = re.findall(r"([a-z])(\d+)", part)
    if "".join(f"{k}{v}" for k, v in tokens) != part:
        raise UserError(f"allocation '{s}': part '{part}': expected letters d, m (or t), p each followed by a "
                        f"number, e.g. d4m2p1")
    seen: dict[str, str] = {}
    degrees: dict[str, int] = {}
    for letter, num in tokens:
        if letter not in _LETTERS:
            raise UserError(f"allocation '{s}': part '{part}': unknown degree '{letter}' (d data, m or t tensor, "
                            f"p pipeline)")
        key = _LETTERS[letter]
        if key in seen:
            raise UserError(f"allocation '{s}': part '{part}': {key} given twice ({seen[key]} and {letter})")
        seen[key] = letter
        if int(num) < 1:
            raise UserError(f"allocation '{s}': part '{part}': {letter} must be >= 1")
        degrees[key] = int(num)
    return Parallel(**degrees)


def parse_allocation(s: str) -> Allocation:
    """Parse an AReaL allocation string (grammar in the module docstring).

    Raises:
        UserError: ``allocation 'S': ...`` naming the bad part: unknown backend or letter, a degree < 1 or
            given twice, a backend without a training part, two parts without a backend.
    """
    if not isinstance(s, str) or not s.strip():
        raise UserError(f"allocation {s!r}: empty (expected e.g. sglang.d4m2p1+d2m2p1 or d8m1p1)")
    s = s.strip()
    backend, body = None, s
    head, dot, rest = s.partition(".")
    if dot:
        if head not in BACKENDS:
            raise UserError(f"allocation '{s}': unknown backend '{head}' (known: {', '.join(BACKENDS)})")
        backend, body = head, rest
    parts = [_part(s, part) for part in body.split("+")]  # each part checked first (the bad one named)
    if backend is not None:
        if len(parts) != 2:
            raise UserError(f"allocation '{s}': a '{backend}.' backend needs an inference part and a training "
                            f"part, GEN+TRAIN (e.g. {backend}.d2m1p1+d1m1p1)")
        return Allocation(s, backend, parts[0], parts[1])
    if len(parts) != 1:
        raise UserError(f"allocation '{s}': {len(parts)} parts need a backend prefix for the inference part "
                        f"({', '.join(b + '.' for b in BACKENDS)})")
    return Allocation(s, None, None, parts[0])


def config_allocation(cfg: Any) -> str:
    """What ``areal train`` runs for a TrainConfig ``cfg``: ``rollout.n_servers`` embedded servers and its trainer
    degrees, ``embedded.d{n_servers}m1p1+d{dp}m{tp}p{pp}`` (place with ``gpus_per_node = 0``: processes)."""
    return (f"embedded.d{cfg.rollout.n_servers}m1p1+d{cfg.parallel.data}m{cfg.parallel.tensor}"
            f"p{cfg.parallel.pipeline}")


# --- placement -------------------------------------------------------------------------------------------


@dataclass
class NodeSummary:
    """What runs on one node: server indices, trainer ranks, GPUs used / free (free is None on CPU)."""

    node: int
    servers: list[int]
    ranks: list[int]
    controller: bool
    gpus_used: int
    gpus_free: int | None


@dataclass
class Placement:
    """Where everything of an :class:`Allocation` runs (build with :func:`place`).

    Attributes:
        servers: ``servers[i] = (node, gpu_ids)``: inference server i, the local GPU ids it sees.
        trainer_ranks: ``trainer_ranks[r] = (node, local_gpu)``: global trainer rank r (Megatron order),
            ``local_gpu`` None on CPU.
        controller_node: node of the controller (always 0).
    """

    allocation: Allocation
    nodes: int
    gpus_per_node: int
    servers: list[tuple[int, tuple[int, ...]]]
    trainer_ranks: list[tuple[int, int | None]]
    controller_node: int = 0
    _summary: list[NodeSummary] | None = field(default=None, repr=False, compare=False)

    @property
    def cpu(self) -> bool:
        return self.gpus_per_node == 0

    @property
    def training_nodes(self) -> list[int]:
        """Nodes holding trainer ranks, in rank order (torchrun's ``--node-rank`` is the index here)."""
        out: list[int] = []
        for node, _ in self.trainer_ranks:
            if not out or out[-1] != node:
                out.append(node)
        return out

    def servers_on(self, node: int) -> list[int]:
        return [i for i, (n, _) in enumerate(self.servers) if n == node]

    def ranks_on(self, node: int) -> list[int]:
        return [r for r, (n, _) in enumerate(self.trainer_ranks) if n == node]

    def summary(self) -> list[NodeSummary]:
        """One :class:`NodeSummary` per node, node 0 first."""
        if self._summary is None:
            out = []
            for n in range(self.nodes):
                srv, rk = self.servers_on(n), self.ranks_on(n)
                used = sum(len(self.servers[i][1]) for i in srv) + (0 if self.cpu else len(rk))
                out.append(NodeSummary(n, srv, rk, n == self.controller_node, used,
                                       None if self.cpu else self.gpus_per_node - used))
            self._summary = out
        return self._summary

    def _node_text(self, s: NodeSummary) -> tuple[str, str, str, str]:
        """(servers, server GPUs, trainer ranks, trainer GPUs / pp stages) of one node, as text."""
        srv = _span(s.servers) if s.servers else "-"
        sg = " | ".join(_span(list(self.servers[i][1])) for i in s.servers) if s.servers and not self.cpu else "-"
        rk = _span(s.ranks) if s.ranks else "-"
        if s.ranks:
            stages = sorted({self.allocation.train.coords(r)[2] for r in s.ranks})
            rg = ("" if self.cpu else f"GPUs {_span([self.trainer_ranks[r][1] for r in s.ranks])}, ") + \
                f"pp stage{'s' if len(stages) > 1 else ''} {_span(stages)}"
        else:
            rg = "-"
        return srv, sg, rk, rg

    def _groups(self) -> list[tuple[list[int], tuple[str, str, str, str]]]:
        """Consecutive nodes with the same layout (same GPU ids and counts), merged: (nodes, texts of first)."""
        groups: list[tuple[list[int], tuple[str, str, str, str], tuple]] = []
        for s in self.summary():
            key = (s.controller, tuple(self.servers[i][1] for i in s.servers), len(s.servers),
                   tuple(self.trainer_ranks[r][1] for r in s.ranks), len(s.ranks))
            if groups and groups[-1][2] == key and not s.controller:
                groups[-1][0].append(s.node)
            else:
                groups.append(([s.node], self._node_text(s), key))
        out = []
        for nodes, texts, _ in groups:
            if len(nodes) > 1:
                summ = [self.summary()[n] for n in nodes]
                srv = _span([i for x in summ for i in x.servers]) if summ[0].servers else "-"
                rk = _span([r for x in summ for r in x.ranks]) if summ[0].ranks else "-"
                stages = sorted({self.allocation.train.coords(r)[2] for x in summ for r in x.ranks})
                rg = texts[3] if not stages else \
                    texts[3].rsplit("pp stage", 1)[0] + f"pp stage{'s' if len(stages) > 1 else ''} {_span(stages)}"
                texts = (srv, texts[1], rk, rg)
            out.append((nodes, texts))
        return out

    def describe(self) -> list[str]:
        """Human-readable lines: totals, the inference and training layout, then nodes (runs of identical
        nodes merged, e.g. ``nodes 1-39: servers 2-79 (2 per node, GPUs 0-3 | 4-7)``)."""
        a = self.allocation
        if self.cpu:
            used = f"{len(self.trainer_ranks) + len(self.servers)} processes placed (CPU: no GPUs)"
        else:
            used = f"{a.total} of {self.nodes * self.gpus_per_node} GPUs placed"
        lines = [f"allocation {a.text} on {self.nodes} node{'s' if self.nodes > 1 else ''} x "
                 f"{self.gpus_per_node} GPUs: {used}"]
        if a.gen is not None:
            per = f"{a.server_gpus} GPU{'s' if a.server_gpus > 1 else ''} each" if not self.cpu else "1 process each"
            lines.append(f"inference: {a.n_servers} {a.backend} server{'s' if a.n_servers > 1 else ''} (tp {a.gen.tp}, "
                         f"pp {a.gen.pp}; {per}) on node{_plural_nodes(sorted({n for n, _ in self.servers}))}")
        t = a.train
        tn = self.training_nodes
        lines.append(f"training: {t.world} Megatron rank{'s' if t.world > 1 else ''} (dp {t.dp} x tp {t.tp} x pp {t.pp}; "
                     f"order {MEGATRON_ORDER}: rank = tp + {t.tp}*(dp + {t.dp}*pp)) on node{_plural_nodes(tn)}; "
                     f"torchrun --nnodes {len(tn)}")
        lines.append(f"controller: node {self.controller_node}")
        for nodes, (srv, sg, rk, rg) in self._groups():
            label = f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {nodes[0]}-{nodes[-1]}"
            bits = []
            if nodes[0] == self.controller_node:
                bits.append("controller")
            first = self.summary()[nodes[0]]
            if first.servers:
                each = f"{len(first.servers)} per node, " if len(nodes) > 1 else ""
                bits.append(f"servers {srv} ({each}GPUs {sg})" if not self.cpu else f"servers {srv}")
            if first.ranks:
                each = f"{len(first.ranks)} per node, " if len(nodes) > 1 else ""
                bits.append(f"trainer ranks {rk} ({each}{rg})")
            if first.gpus_free:
                bits.append(f"{first.gpus_free} GPU{'s' if first.gpus_free > 1 else ''} idle")
            lines.append(f"{label}: {'; '.join(bits) or 'idle'}")
        return lines

    def table(self) -> Any:
        """A rich Table: one row per run of identical nodes (node, controller, servers, their GPUs, trainer
        ranks, their GPUs and pipeline stages, idle GPUs)."""
        from rich.table import Table

        t = Table(title=f"placement of {self.allocation.text} on {self.nodes} x {self.gpus_per_node} "
                        f"{'GPUs' if not self.cpu else '(CPU processes)'}", title_justify="left")
        for col in ("nodes", "controller", "servers", "server GPUs", "trainer ranks", "trainer GPUs / pp",
                    "idle GPUs"):
            t.add_column(col, overflow="fold")
        for nodes, (srv, sg, rk, rg) in self._groups():
            first = self.summary()[nodes[0]]
            t.add_row(_span(nodes), "yes" if first.controller else "", srv, sg, rk, rg,
                      "-" if first.gpus_free is None else str(first.gpus_free))
        return t

    def to_dict(self) -> dict:
        """JSON form (``plan.json``); :func:`placement_from_dict` reads it back."""
        return {"allocation": self.allocation.text, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "controller_node": self.controller_node,
                "servers": [{"node": n, "gpus": list(g)} for n, g in self.servers],
                "trainer_ranks": [{"node": n, "gpu": g} for n, g in self.trainer_ranks]}


def placement_from_dict(d: dict) -> Placement:
    """Inverse of :meth:`Placement.to_dict` (re-places and checks it matches; a hand-edited plan is refused).

    Raises:
        UserError: the stored layout differs from what :func:`place` computes for its allocation.
    """
    p = place(parse_allocation(d["allocation"]), nodes=int(d["nodes"]), gpus_per_node=int(d["gpus_per_node"]))
    if p.to_dict() != d:
        raise UserError(f"placement of '{d['allocation']}': the stored layout differs from the computed one "
                        f"(plan edited by hand?)")
    return p


def _span(xs: list[int]) -> str:
    """``[0,1,2,5]`` -> ``0-2,5``."""
    xs = list(xs)
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)


def _plural_nodes(nodes: list[int]) -> str:
    return f" {nodes[0]}" if len(nodes) == 1 else f"s {_span(nodes)}"


def _pack(sizes: list[int], gpus_per_node: int, nodes: int | None) -> list[tuple[int, tuple[int, ...]]] | None:
    """Place blocks of ``sizes`` GPUs in order, each within one node, from node 0 GPU 0 on; a block that does
    not fit in the rest of the current node starts on the next. None when ``nodes`` is exceeded."""
    node, used, out = 0, 0, []
    for size in sizes:
        if used + size > gpus_per_node:
            node, used = node + 1, 0
        if nodes is not None and node >= nodes:
            return None
        out.append((node, tuple(range(used, used + size))))
        used += size
    return out


def place(alloc: Allocation, *, nodes: int, gpus_per_node: int) -> Placement:
    """Place ``alloc`` on ``nodes`` x ``gpus_per_node`` (rules in the module docstring).

    Args:
        nodes: >= 1.
        gpus_per_node: >= 0; 0 = CPU placement (processes, no capacity limit).
    Raises:
        UserError: one line naming the allocation: bad node/GPU counts, more GPUs than the nodes hold, a
            server larger than a node, training TP not dividing ``gpus_per_node``, a layout that does not fit
            once no server or TP group may span nodes.
    """
    a = alloc
    if not isinstance(nodes, int) or nodes < 1:
        raise UserError(f"placement of '{a.text}': nodes must be >= 1, got {nodes!r}")
    if not isinstance(gpus_per_node, int) or gpus_per_node < 0:
        raise UserError(f"placement of '{a.text}': gpus per node must be >= 0, got {gpus_per_node!r}")
    tp = a.train.tp
    n_groups = a.train.world // tp
    if gpus_per_node == 0:
        servers = [((i * nodes) // a.n_servers, ()) for i in range(a.n_servers)]
        ranks = [((g * nodes) // n_groups, None) for g in range(n_groups) for _ in range(tp)]
        return Placement(a, nodes, 0, servers, ranks)
    have = nodes * gpus_per_node
    if a.total > have:
        raise UserError(f"allocation '{a.text}' needs {a.total} GPUs ({a.describe()}); {nodes} node"
                        f"{'s' if nodes > 1 else ''} x {gpus_per_node} GPUs = {have}")
    if a.server_gpus > gpus_per_node:
        raise UserError(f"allocation '{a.text}': one {a.backend} server uses tp*pp = {a.server_gpus} GPUs, more than "
                        f"a node's {gpus_per_node} (a server never spans nodes)")
    if gpus_per_node % tp:
        raise UserError(f"allocation '{a.text}': training tensor parallel {tp} must divide the {gpus_per_node} GPUs "
                        f"per node (a tensor-parallel group never crosses a node)")
    sizes = [a.server_gpus] * a.n_servers + [tp] * n_groups
    packed = _pack(sizes, gpus_per_node, nodes)
    if packed is None:
        need = _pack(sizes, gpus_per_node, None)[-1][0] + 1
        raise UserError(f"allocation '{a.text}' does not fit on {nodes} x {gpus_per_node} GPUs: servers "
                        f"({a.server_gpus} GPUs each) and tensor-parallel groups ({tp} GPUs) never span a node, "
                        f"which takes {need} nodes")
    servers = packed[:a.n_servers]
    ranks = [(node, g) for node, gpus in packed[a.n_servers:] for g in gpus]
    return Placement(a, nodes, gpus_per_node, servers, ranks)
