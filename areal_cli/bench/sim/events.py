"""The event loop of the cluster model: synchronous vs one-step-overlap vs fully asynchronous throughput.

What is simulated (one event loop, ``heapq``; pure Python + numpy):

* ``G`` generation servers (``gen_gpus // gen_tp``), each with continuous batching. All running requests of a
  server advance one token per decode step; a step with ``n`` running requests whose contexts (prompt +
  generated) sum to ``S`` tokens takes ``t = a + b*n + c*S`` seconds (``a``: per-step overhead + reading the
  weights; ``b``: per-sequence compute; ``c``: reading the KV cache). Between two events ``n`` is constant and
  ``S`` grows by ``n`` per step, so the time for ``k`` steps is ``k*(a+b*n+c*S) + c*n*k*(k-1)/2`` and the loop
  jumps from event to event (a request finishing, a prefill, a weight update) without stepping tokens; token
  counts are treated as continuous between events. Admitting requests costs a prefill of ``p`` seconds per
  prompt (or re-computed prefix) token, during which the server does not decode. At most
  ``max_running_per_server`` requests run at once (a stand-in for the KV-cache limit); the rest queue (FIFO).
  With ``decode_attention: padded`` (the embedded CPU engine, which pads a decode batch to its longest context)
  ``S`` is ``n`` times the longest running context instead of the sum; it also grows by ``n`` per step, so the
  same closed form holds between events. ``decode_attention: grouped`` (the embedded engine now): the running
  contexts, sorted, are split as the engine splits them (:func:`areal_cli.rollout.decode_groups.decode_groups`)
  and ``S`` is the sum over groups of size x longest context (it too grows by ``n`` per step).
  ``prefix_cache: false``: every sample prefills its own prompt. (The embedded CPU engine shares a prompt's prefill
  only among the samples prefilled in one forward, ``prefill_sharing: batch`` in its step costs; a group's samples
  arrive in one request and are admitted and prefilled together, so the two differ only for a group split across
  steps by a full server, and for samples resumed after an aborting update, which the engine prefills each with its
  own prefix.)
  ``request_overhead_s`` per sample (HTTP, reward, the controller: work on the server's core outside the engine
  step), paid at its first admission (not again when it resumes after an interruption), blocks the server like a
  prefill and is counted with it. On the trainer's side, ``batch_handoff_s_per_token`` (receiving the batch
  from the rollout process) precedes every training step, and in the overlapping modes (eta > 0) training and
  saving take ``overlap_train_factor`` times as long (the trainer's core also serves its process's other
  threads then).
  Requests are dispatched round-robin over servers (AReaL's default ``round_robin`` schedule policy), one
  request per sample (``n=1``), as in AReaL.
* Response lengths: lognormal with median ``response_median_tokens`` and log-sd ``response_sigma`` (or an
  empirical list), truncated at ``max_new_tokens`` (truncated samples end at the cap: the long tail that makes a
  synchronous batch wait for its longest sample). ``response_prompt_corr`` is the share of the log-length
  variance common to the samples of one prompt (hard prompts give long answers for all their samples).
* Admission control: AReaL's staleness rule (:mod:`areal_cli.rollout.staleness`)
  ``capacity = min(max_concurrent - running, (eta + version + 1)*B - (accepted + running))`` in groups.
  A finished group is kept with probability ``accept_fraction`` (success-rate filter); a dropped group gives its
  slot back.
* ``T`` training GPUs: one step on ``B`` accepted groups (FIFO) takes
  ``train_fixed_s + (tokens*cost_tok + sum(len^2)*cost_attn) * (1 + 1/3 if decoupled) / T`` seconds
  (dense 6N FLOPs per token and causal attention ``6*layers*hidden*len^2`` per sequence at ``train_mfu``; the
  decoupled PPO objective adds a forward pass for the proximal log-probs, +1/3). Parallel efficiency is folded
  into ``train_mfu``; strong-scaling loss comes from ``train_fixed_s``.
* Weight update after each step: the trainer saves (``sync_save_s``, trainer blocked), then every server loads
  (``sync_load_s``, generation blocked). *Interruptible* (AReaL boba²): running requests are aborted, the weights
  load, and the aborted requests resume with their prefix re-prefilled with the new weights. *Non-interruptible*
  (SGLang ``update_weights_from_disk`` without interrupt: the weight-update lock waits for in-flight requests):
  the server stops admitting, drains its running requests, then loads. With ``chunk_tokens > 0`` requests run
  in chunks of that many new tokens (AReaL ``new_tokens_per_chunk``), so a drain waits at most one chunk.
  *In place* (mode ``async_inplace``, SGLang ``/pause_generation`` mode ``in_place``): running requests stop
  for the load and then decode on with their KV cache; nothing is aborted or re-prefilled.

Modes: :mod:`areal_cli.bench.sim.modes`; costs: :mod:`areal_cli.bench.sim.costs`; response lengths:
:mod:`areal_cli.bench.sim.lengths`; the steady-state figures of a run (the public entry,
:func:`~areal_cli.bench.sim.steady_state.simulate`): :mod:`areal_cli.bench.sim.steady_state`. Units: seconds,
tokens.

Source of the rule and the metric: AReaL v0.3 (boba²) ``gserver_manager.py::is_staled``,
``patch/sglang/v0.4.6.post4.patch``, ``benchmark/verl_v0_3_0_post1_76084d3``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from areal_cli.bench.sim.costs import Costs
from areal_cli.bench.sim.lengths import ResponseLengths
from areal_cli.bench.sim.modes import ModeSpec
from areal_cli.bench.sim.scenario import Scenario
from areal_cli.rollout.decode_groups import decode_groups, padded_slots
from areal_cli.rollout.staleness import StalenessManager

_SRV, _LOAD, _TRAIN_DONE, _PUBLISH, _TRAINER_FREE, _NOTIFY = range(6)
_READY, _DRAINING, _LOADING = range(3)


class _Req:
    __slots__ = ("group", "prompt", "length", "gen", "head", "kv_sid", "kv_version", "k_admit", "gen_admit", "stop")

    def __init__(self, group: "_Group", prompt: int, length: int):
        self.group, self.prompt, self.length = group, prompt, length
        self.gen = 0.0
        self.head = -1  # policy version at the first generated token
        self.kv_sid = -1
        self.kv_version = -1
        self.k_admit = 0.0
        self.gen_admit = 0.0
        self.stop = 0.0


class _Group:
    __slots__ = ("left", "tokens", "sq", "heads", "kv_sid", "kv_version")

    def __init__(self, n: int):
        self.left = n
        self.kv_sid = -1  # server and weight version whose radix cache holds the prompt's KV
        self.kv_version = -1
        self.tokens = 0
        self.sq = 0.0
        self.heads: list[int] = []


class _Server:
    """One generation server. ``k``: decode steps done (continuous), valid at time ``t``; when ``t`` is in
    the future the server is prefilling until ``t``."""

    __slots__ = ("sid", "t", "k", "n", "s", "heap", "queue", "version", "target", "state", "epoch",
                 "decode_s", "prefill_s", "load_s", "tokens", "interrupted")

    def __init__(self, sid: int):
        self.sid = sid
        self.t = 0.0
        self.k = 0.0
        self.n = 0
        self.s = 0.0
        self.heap: list = []
        self.queue: deque = deque()
        self.version = 0
        self.target = 0
        self.state = _READY
        self.epoch = 0
        self.decode_s = self.prefill_s = self.load_s = self.tokens = 0.0
        self.interrupted = 0


class ClusterSim:
    """The event loop of one simulated run (module docstring): :meth:`run` until the trainer publishes
    ``sc.sim_steps`` versions.

    Args:
        sc: the scenario (already scaled, :func:`~areal_cli.bench.sim.modes.scaled`).
        spec: the mode (:func:`~areal_cli.bench.sim.modes.mode_spec`).
        costs: per-operation costs in seconds (:class:`~areal_cli.bench.sim.costs.Costs`).
        seed: seeds the response lengths and the accept filter.
        empirical: response lengths to draw from (tokens), or None for the lognormal.
    After :meth:`run`: ``snap`` / ``snap_end`` (:meth:`snapshot` at the end of warm-up and of the run),
    ``step_tokens`` (tokens of each training step, in order) and ``servers`` (their count is what the
    throughputs are scaled from).
    """

    def __init__(self, sc: Scenario, spec: ModeSpec, costs: Costs, seed: int, empirical: np.ndarray | None):
        self.sc, self.spec, self.c = sc, spec, costs
        self.rng = np.random.default_rng(seed)
        self.lengths = ResponseLengths(sc, self.rng, empirical)
        self.A, self.B, self.C = costs.decode_a, costs.decode_b, costs.decode_c
        self.padded = sc.decode_attention == "padded"
        self.grouped = sc.decode_attention == "grouped"
        self.overlap = sc.overlap_train_factor if spec.eta > 0 else 1.0  # training beside generation
        self.servers = [_Server(i) for i in range(sc.n_servers)]
        self.events: list = []
        self.seq = 0
        self.rr = 0
        # controller (groups); ``version`` is the weight version the rollout manager knows of
        self.version = 0
        self.trainer_version = 0
        max_conc = sc.max_concurrent_groups or sc.batch_size
        if spec.batch_admission:  # the synchronous baselines always generate a whole batch at once
            max_conc = max(max_conc, sc.batch_size)
        self.stale = StalenessManager(sc.batch_size, spec.eta, max_conc)
        self.buffer: deque = deque()
        # trainer
        self.trainer_busy = False
        self.train_s = self.save_s = self.overhead_s = 0.0
        self.step_times: list[float] = []
        self.step_tokens: list[int] = []
        self.stale_hist: dict[int, int] = {}
        self.trained_tokens = 0
        self.snap: dict | None = None
        self.snap_end: dict | None = None
        self.gen_requests = 0

    # ---- helpers -----------------------------------------------------------------------------------
    def push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        """Schedule an event of ``kind`` at time ``t`` (ties: in push order)."""
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, a, b))

    def advance(self, sv: _Server, now: float) -> None:
        """Bring server ``sv`` to time ``now`` (decode steps done meanwhile)."""
        if now <= sv.t:
            return
        if sv.n and sv.state != _LOADING:  # a load stops decoding (in-place updates keep requests running)
            dt = now - sv.t
            a1 = self.A + self.B * sv.n + self.C * sv.s - 0.5 * self.C * sv.n
            beta = self.C * sv.n
            dk = dt / a1 if beta == 0 else 2 * dt / (a1 + math.sqrt(a1 * a1 + 2 * beta * dt))
            sv.k += dk
            sv.s += sv.n * dk
            sv.tokens += sv.n * dk
            sv.decode_s += dt
        sv.t = now

    def repad(self, sv: _Server) -> None:
        """``decode_attention: padded``: the context term is ``n`` x the longest running context; ``grouped``: the
        sum over the engine's length groups of their size x their longest context."""
        if self.grouped:
            ctx = sorted(rq.prompt + rq.gen_admit + sv.k - rq.k_admit + 1 for _, _, rq in sv.heap)
            sv.s = float(padded_slots(ctx, decode_groups(ctx))) - sv.n  # decode_groups counts the new token
        elif self.padded:
            sv.s = sv.n * max((rq.prompt + rq.gen_admit + sv.k - rq.k_admit for _, _, rq in sv.heap), default=0.0)

    def schedule(self, sv: _Server) -> None:
        """(Re)schedule the server's next request completion."""
        sv.epoch += 1
        if sv.n and sv.state != _LOADING:
            dk = max(0.0, sv.heap[0][0] - sv.k)
            a1 = self.A + self.B * sv.n + self.C * sv.s - 0.5 * self.C * sv.n
            self.push(sv.t + a1 * dk + 0.5 * self.C * sv.n * dk * dk, _SRV, sv.sid, sv.epoch)

    def try_admit(self, sv: _Server, now: float) -> None:
        """Move queued requests into the running batch (continuous batching), paying their prefill."""
        if sv.state != _READY or not sv.queue or sv.n >= self.sc.max_running_per_server:
            return
        self.advance(sv, now)
        chunk = self.spec.chunk_tokens
        prefill = 0.0
        admitted = 0
        while sv.queue and sv.n < self.sc.max_running_per_server:
            rq = sv.queue.popleft()
            admitted += rq.head < 0  # a sample's first admission (not its resumes or chunks)
            g = rq.group
            if not (self.sc.prefix_cache and g.kv_sid == sv.sid and g.kv_version == sv.version):  # prompt not cached
                prefill += rq.prompt
                g.kv_sid, g.kv_version = sv.sid, sv.version
            if rq.gen and not (rq.kv_sid == sv.sid and rq.kv_version == sv.version):
                prefill += rq.gen  # a resumed prefix whose KV was discarded
            if rq.head < 0:
                rq.head = sv.version
            rq.k_admit, rq.gen_admit = sv.k, rq.gen
            rq.stop = rq.length if not chunk else min(rq.length, (int(rq.gen + 1e-6) // chunk + 1) * chunk)
            self.seq += 1
            heapq.heappush(sv.heap, (sv.k + rq.stop - rq.gen, self.seq, rq))
            sv.n += 1
            sv.s += rq.prompt + rq.gen
        self.repad(sv)
        dt = prefill * self.c.prefill_per_token + admitted * self.sc.request_overhead_s
        if dt:
            sv.t = max(sv.t, now) + dt
            sv.prefill_s += dt
        self.schedule(sv)

    def begin_load(self, sv: _Server, now: float) -> None:
        """Server ``sv`` stops decoding and loads weights for ``sync_load_s`` seconds."""
        self.advance(sv, now)
        sv.state = _LOADING
        sv.epoch += 1
        start = max(now, sv.t)
        sv.load_s += self.c.sync_load_s
        self.push(start + self.c.sync_load_s, _LOAD, sv.sid, sv.target)

    # ---- controller --------------------------------------------------------------------------------
    def admit(self, now: float) -> None:
        """AReaL's staleness rule (:class:`StalenessManager`, the one the real controller uses): start as many
        groups as capacity allows; in whole-batch modes only when no group is running."""
        if self.spec.batch_admission and self.stale.running:
            return
        cap = self.stale.capacity()
        if cap <= 0:
            return
        servers, ns = self.servers, len(self.servers)
        prompt = self.sc.prompt_tokens
        for _ in range(cap):
            g = _Group(self.sc.group_size)
            self.stale.on_submit()
            sv = servers[self.rr]  # round-robin over servers; a prompt's samples share one server (AReaL qid)
            self.rr = (self.rr + 1) % ns
            for length in self.lengths.group():
                sv.queue.append(_Req(g, prompt, length))
            self.gen_requests += self.sc.group_size
            self.try_admit(sv, now)

    def group_done(self, g: _Group, now: float) -> None:
        """A group finished: kept with probability ``accept_fraction`` (then maybe trained on), else rejected."""
        if self.sc.accept_fraction >= 1 or self.rng.random() < self.sc.accept_fraction:
            self.stale.on_accept()
            self.buffer.append(g)
            self.try_train(now)
        else:
            self.stale.on_reject()

    # ---- events ------------------------------------------------------------------------------------
    def on_server(self, sv: _Server, now: float) -> None:
        """Server ``sv`` reached its next completion: finished requests (and ended chunks) leave its batch, a
        draining server then loads and a ready one admits more; finished groups go to the controller."""
        self.advance(sv, now)
        heap = sv.heap
        if heap and heap[0][0] > sv.k:  # snap to the exact completion step (float round-off)
            d = heap[0][0] - sv.k
            sv.k += d
            sv.s += sv.n * d
            sv.tokens += sv.n * d
        finished_groups = []
        while heap and heap[0][0] <= sv.k + 1e-6:
            _, _, rq = heapq.heappop(heap)
            sv.n -= 1
            sv.s -= rq.prompt + rq.stop
            rq.gen = rq.stop
            if rq.stop < rq.length:  # end of a chunk: back to the queue, prefix still cached here
                rq.kv_sid, rq.kv_version = sv.sid, sv.version
                sv.queue.append(rq)
                continue
            g = rq.group
            g.left -= 1
            seq_len = rq.prompt + rq.length
            g.tokens += seq_len
            g.sq += float(seq_len) * seq_len
            g.heads.append(rq.head)
            if g.left == 0:
                finished_groups.append(g)
        if sv.n == 0:
            sv.s = 0.0
        self.repad(sv)
        if sv.state == _DRAINING and sv.n == 0:
            self.begin_load(sv, now)
        else:
            self.try_admit(sv, now)  # no-op unless the server is ready
            self.schedule(sv)
        for g in finished_groups:
            self.group_done(g, now)
        if finished_groups:
            self.admit(now)

    def on_load(self, sv: _Server, version: int, now: float) -> None:
        """Server ``sv`` has loaded ``version``: load again if a newer one is waiting, else serve."""
        sv.version = version
        sv.t = max(sv.t, now)
        if sv.target > sv.version:
            self.begin_load(sv, now)
            return
        sv.state = _READY
        self.try_admit(sv, now)
        self.schedule(sv)

    def try_train(self, now: float) -> None:
        """Start a training step on the oldest ``batch_size`` accepted groups if the trainer is free."""
        b = self.sc.batch_size
        if self.trainer_busy or len(self.buffer) < b:
            return
        groups = [self.buffer.popleft() for _ in range(b)]
        tokens = sum(g.tokens for g in groups)
        sq = sum(g.sq for g in groups)
        hist = self.stale_hist
        for g in groups:
            for h in g.heads:
                lag = self.trainer_version - h
                hist[lag] = hist.get(lag, 0) + 1
        c, sc = self.c, self.sc
        factor = 4.0 / 3.0 if self.spec.recompute else 1.0
        dt = c.train_fixed_s + factor * (tokens * c.train_gpu_s_per_token + sq * c.train_gpu_s_per_token_sq) / sc.train_gpus
        dt = dt * self.overlap + tokens * sc.batch_handoff_s_per_token
        self.trainer_busy = True
        self.train_s += dt
        self.step_tokens.append(tokens)
        self.push(now + dt, _TRAIN_DONE)

    def on_publish(self, now: float) -> None:
        """The trainer has saved new weights."""
        self.trainer_version += 1
        v = self.trainer_version
        self.step_times.append(now)
        if v == self.sc.warmup_steps:
            self.snap = self.snapshot(now)
        if v == self.sc.sim_steps:
            self.snap_end = self.snapshot(now)
            return
        poll = self.sc.weight_poll_s
        if poll > 0:
            self.push(math.ceil(now / poll) * poll, _NOTIFY, v)
        else:
            self.on_notify(v, now)
        if self.sc.trainer_overhead_s > 0:
            self.overhead_s += self.sc.trainer_overhead_s
            self.push(now + self.sc.trainer_overhead_s, _TRAINER_FREE)
        else:
            self.trainer_busy = False
            self.try_train(now)

    def on_notify(self, v: int, now: float) -> None:
        """The rollout manager sees weight version ``v``: servers update, admission capacity grows."""
        if v <= self.version:
            return
        self.version = v
        self.stale.set_version(v)
        for sv in self.servers:
            sv.target = v
            if sv.state == _LOADING:
                continue  # loads the newest version when the current load finishes
            if self.spec.in_place:
                self.begin_load(sv, now)  # running requests wait on the server, KV kept
            elif self.spec.interruptible:
                self.interrupt(sv, now)
            elif sv.state == _READY:
                if sv.n == 0:
                    self.begin_load(sv, now)
                else:
                    sv.state = _DRAINING
        self.admit(now)

    def interrupt(self, sv: _Server, now: float) -> None:
        """Abort running requests (they resume after the load, prefix re-prefilled), then load."""
        self.advance(sv, now)
        if sv.n:
            running = sorted(sv.heap, key=lambda e: e[1])  # admission order
            for _, _, rq in running:
                rq.gen = min(rq.stop, rq.gen_admit + (sv.k - rq.k_admit))
                rq.kv_sid = -1
            sv.queue.extendleft(rq for _, _, rq in reversed(running))
            sv.interrupted += sv.n
            sv.heap = []
            sv.n = 0
            sv.s = 0.0
        self.begin_load(sv, now)

    def snapshot(self, now: float) -> dict:
        """Every server brought to ``now``, then the cumulative counters (seconds per kind of work, tokens,
        decode steps, interruptions, the staleness histogram, requests)."""
        for sv in self.servers:
            self.advance(sv, now)
        return {
            "t": now,
            "decode_s": sum(sv.decode_s for sv in self.servers),
            "prefill_s": sum(sv.prefill_s for sv in self.servers),
            "load_s": sum(sv.load_s for sv in self.servers),
            "tokens": sum(sv.tokens for sv in self.servers),
            "decode_steps": sum(sv.k for sv in self.servers),
            "interrupted": sum(sv.interrupted for sv in self.servers),
            "train_s": self.train_s, "save_s": self.save_s, "overhead_s": self.overhead_s,
            "stale_hist": dict(self.stale_hist),
            "requests": self.gen_requests,
        }

    def run(self) -> None:
        """Process events until the trainer has published ``sc.sim_steps`` versions.

        Raises:
            RuntimeError: no event is pending before that (a bug of the model, not bad input).
        """
        self.admit(0.0)
        ev = self.events
        servers = self.servers
        while self.snap_end is None:
            if not ev:
                raise RuntimeError("simulation stalled: no pending event")  # a model bug, not user input
            now, _, kind, a, b = heapq.heappop(ev)
            if kind == _SRV:
                sv = servers[a]
                if b == sv.epoch:
                    self.on_server(sv, now)
            elif kind == _LOAD:
                self.on_load(servers[a], b, now)
            elif kind == _TRAIN_DONE:
                save = self.c.sync_save_s * self.overlap
                self.save_s += save
                self.push(now + save, _PUBLISH)
            elif kind == _PUBLISH:
                self.on_publish(now)
            elif kind == _NOTIFY:
                self.on_notify(a, now)
            else:  # _TRAINER_FREE
                self.trainer_busy = False
                self.try_train(now)
