"""Continuous batching over a capped, slot-reserving KV cache: which requests run, prefill and decode steps.

KV cache: a token-budget pool ``k, v: [layers, max_total_tokens + 1, kv_heads, head_dim]`` (slot 0 is a
scratch slot that padding writes to). A request is admitted only when ``len(prompt) + max_new_tokens`` free
slots exist; it reserves them up front, so a running request never runs out of KV (no preemption needed) and
the pool never grows: memory is capped at ``max_total_tokens`` tokens of KV. Requests that do not fit wait
in a FIFO queue; a request that can never fit is rejected (:class:`EngineError`).

Scheduling (one :meth:`InferenceEngine.step`): admit waiting requests into free slots (up to
``max_running_requests``) and prefill them (right-padded batch, positions 0..L-1 per request, so no
left-padding position bug; requests with the same sequence, a group's samples, computed once), sample their first
token; and one decode step for every request that was already running, in the same forward as the (last) prefill
(SGLang's mixed chunked prefill: the per-token layers run once over both, attention per batch), so a step is one
forward unless ``max_prefill_tokens`` splits its prefill. Finished requests leave the batch at once and free their KV slots.

Sampling is :mod:`areal_cli.rollout.engine.sampling`; the forward is :mod:`areal_cli.rollout.engine.model`.
Every output token records the weight version that produced it.
"""

from __future__ import annotations

import os
import random
import time
from collections import deque
from pathlib import Path

import torch

from areal_cli.rollout.decode_groups import MAX_GROUPS, MIN_SAVING, decode_groups, padded_slots
from areal_cli.rollout.engine.model import AttentionPart, CausalLM, ModelSpec
from areal_cli.rollout.engine.requests import EngineError, EngineResult, Request
from areal_cli.rollout.engine.sampling import sample
from areal_cli.rollout.engine.step_costs import StepCostStats
from areal_cli.rollout.protocol import SamplingParams


class InferenceEngine:
    """Continuous-batching engine with a capped, slot-reserving KV cache (see module docstring).

    Not thread-safe: one thread drives it (the server's engine thread).

    Args:
        model_path: Hugging Face model directory (Qwen3 / Qwen2 / Llama, safetensors).
        max_running_requests: most requests in the running batch (at most ``max_total_tokens``: each holds a slot).
        max_total_tokens: KV-cache capacity in tokens (the memory cap: 2 * layers * kv_heads * head_dim *
            dtype bytes per token); a request reserves ``len(prompt) + max_new_tokens`` tokens.
        context_length: longest prompt + max_new_tokens; default ``max_position_embeddings``.
        seed: draws the sampling seeds of requests without their own seed (in submission order).
        weight_version: initial weight-version label.
        max_prefill_tokens: cap on the padded prefill tokens (distinct sequences x longest length) of one forward;
            the running requests' decode tokens (one each) that join the step's last prefill forward come on top.
        dtype: compute dtype.
        device: the weights' and the KV pool's device (default CPU; sampling stays on the CPU).
        decode_group_min_saving, decode_max_groups: how a decode step splits its attention over groups of
            similar context lengths (:func:`~areal_cli.rollout.decode_groups.decode_groups`); max_groups 1: one
            call padded to the longest context.
    Raises:
        UserError: bad model directory. ValueError: non-positive sizes, context beyond the model's positions, a KV
            cache (CPU) larger than the machine's memory.
    """

    def __init__(self, model_path: str | Path, *, max_running_requests: int = 64,
                 max_total_tokens: int = 65536, context_length: int | None = None, seed: int = 0,
                 weight_version: str = "0", max_prefill_tokens: int = 8192,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 decode_group_min_saving: int = MIN_SAVING, decode_max_groups: int = MAX_GROUPS):
        if max_running_requests < 1 or max_total_tokens < 1 or max_prefill_tokens < 1 or decode_max_groups < 1:
            raise ValueError("max_running_requests, max_total_tokens, max_prefill_tokens and decode_max_groups "
                             "must be >= 1")
        self.decode_group_min_saving = int(decode_group_min_saving)
        self.decode_max_groups = int(decode_max_groups)
        if context_length is not None and context_length < 1:
            raise ValueError(f"context_length must be >= 1 (or None: the model's), got {context_length}")
        self.model = CausalLM(model_path, dtype=dtype, device=device)
        s = self.model.spec
        self.context_length = int(context_length or s.max_position_embeddings)
        if self.context_length > s.max_position_embeddings:
            raise ValueError(f"context_length {self.context_length} exceeds the model's "
                             f"max_position_embeddings {s.max_position_embeddings}")
        self.max_total_tokens = int(max_total_tokens)
        # a running request holds at least one KV slot: more rows than slots could never be used
        self.max_running_requests = min(int(max_running_requests), self.max_total_tokens)
        pool_bytes = 2 * s.num_layers * (self.max_total_tokens + 1) * s.num_kv_heads * s.head_dim * dtype.itemsize
        if self.model.device.type == "cpu" and hasattr(os, "sysconf"):
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            if pool_bytes > ram:
                raise ValueError(f"max_total_tokens {self.max_total_tokens}: its KV cache needs "
                                 f"{pool_bytes / 2**30:.1f} GiB, more than this machine's {ram / 2**30:.1f} GiB")
        self.max_prefill_tokens = int(max_prefill_tokens)
        self.weight_version = str(weight_version)
        self.model_path = str(model_path)
        # KV pool; slot 0 = scratch for padding writes (zero-initialised so masked reads stay finite).
        self.k_pool = torch.zeros(s.num_layers, self.max_total_tokens + 1, s.num_kv_heads, s.head_dim,
                                  dtype=dtype, device=self.model.device)
        self.v_pool = torch.zeros_like(self.k_pool)
        self._free: list[int] = list(range(self.max_total_tokens, 0, -1))
        # slot table: row i = the KV slots of the request holding row i (position j -> slot), 0 beyond; a decode step
        # reads its [B, Lk] indices by one index_select. Width: the largest reservation so far (grows by doubling)
        self._table = torch.zeros(self.max_running_requests, 0, dtype=torch.long)
        self._rows: list[int] = list(range(self.max_running_requests - 1, -1, -1))
        self._seed_rng = random.Random(seed)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._ready: list[EngineResult] = []  # finished outside a step (max_new_tokens == 0)
        self._rids: set[str] = set()
        self.stats = {"steps": 0, "prefill_tokens": 0, "decode_tokens": 0, "max_running": 0}
        # seconds per step against its shape (least-squares sums); one group = the whole batch padded
        self.step_costs = StepCostStats("grouped" if self.decode_max_groups > 1 else "padded")
        self._step_shape = [0, 0, 0]  # decode sequences, key slots its attention read, padded prefill tokens

    # -- properties -----------------------------------------------------------------------------------------

    @property
    def spec(self) -> ModelSpec:
        """Architecture of the loaded model."""
        return self.model.spec

    @property
    def vocab_size(self) -> int:
        """Number of token ids (valid ids are ``[0, vocab_size)``)."""
        return self.model.spec.vocab_size

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end generation unless ``ignore_eos`` (config.json + generation_config.json)."""
        return self.model.spec.eos_token_ids

    @property
    def free_tokens(self) -> int:
        """Unreserved KV slots."""
        return len(self._free)

    def has_work(self) -> bool:
        """True while any request is running, waiting or finished-but-not-returned."""
        return bool(self.running or self.waiting or self._ready)

    # -- requests -------------------------------------------------------------------------------------------

    def validate(self, input_ids: list[int], params: SamplingParams) -> None:
        """Check that a request can ever be served.

        Raises:
            EngineError: empty prompt, ids outside ``[0, vocab_size)``, prompt + max_new_tokens over the
                context length, or over the whole KV capacity (it would wait forever).
        """
        try:
            params.validate()
        except ValueError as e:
            raise EngineError(str(e)) from e
        if not input_ids:
            raise EngineError("input_ids cannot be empty.")
        V = self.vocab_size
        for j, t in enumerate(input_ids):
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < V:
                raise EngineError(f"input_ids[{j}] = {t!r} is out of the vocabulary range [0, {V}).")
        total = len(input_ids) + params.max_new_tokens
        if total > self.context_length:
            raise EngineError(f"Requested token count exceeds the model's maximum context length of "
                              f"{self.context_length} tokens: {len(input_ids)} prompt + "
                              f"{params.max_new_tokens} max_new_tokens = {total}.")
        if total > self.max_total_tokens:
            raise EngineError(f"Request needs {total} KV-cache tokens ({len(input_ids)} prompt + "
                              f"{params.max_new_tokens} max_new_tokens) but max_total_tokens is "
                              f"{self.max_total_tokens}: it can never be scheduled.")

    def add_request(self, rid: str, input_ids: list[int], params: SamplingParams, *,
                    logprob_start_len: int = -1) -> None:
        """Queue a request (FIFO). It joins the running batch at a later :meth:`step`.

        Args:
            rid: unique among unfinished requests.
            input_ids: prompt token ids.
            params: sampling parameters (``seed`` None -> drawn from the engine seed, in submission order).
            logprob_start_len: >= 0 to also compute prompt logprobs from that position.
        Raises:
            EngineError: see :meth:`validate`; duplicate rid.
        """
        self.validate(input_ids, params)
        if rid in self._rids:
            raise EngineError(f"Duplicate request id {rid!r}: a request with this id is still running.")
        seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(63)
        stop = set(params.stop_token_ids or [])
        if not params.ignore_eos:
            stop |= set(self.eos_token_ids)
        r = Request(rid=rid, prompt=list(input_ids), params=params, logprob_start_len=int(logprob_start_len),
                 seed=int(seed), t_arrival=time.monotonic(), stop_ids=frozenset(stop))
        self._rids.add(rid)
        if params.max_new_tokens == 0:
            if r.logprob_start_len >= 0:
                self._prompt_logprobs_standalone(r)
            self._ready.append(self._finish(r, "length", None))
            return
        self.waiting.append(r)

    def abort(self, rid: str, message: str = "Aborted") -> EngineResult | None:
        """Abort one running or waiting request; returns its partial result (None if unknown)."""
        for r in list(self.running):
            if r.rid == rid:
                self.running.remove(r)
                self._release(r)
                return self._finish(r, "abort", None, message)
        for r in list(self.waiting):
            if r.rid == rid:
                self.waiting.remove(r)
                return self._finish(r, "abort", None, message)
        return None

    def abort_all(self, message: str = "Aborted") -> list[EngineResult]:
        """Abort every running and waiting request; returns their partial results (tokens + logprobs)."""
        out = []
        for r in self.running:
            self._release(r)
            out.append(self._finish(r, "abort", None, message))
        for r in self.waiting:
            out.append(self._finish(r, "abort", None, message))
        self.running, self.waiting = [], deque()
        return out

    def retract_all(self) -> int:
        """Move running requests back to the head of the queue, dropping their KV (recomputed on
        re-admission from prompt + generated tokens, with the weights current then). Returns the count."""
        n = len(self.running)
        for r in reversed(self.running):
            self._release(r)
            r.num_retractions += 1
            self.waiting.appendleft(r)
        self.running = []
        return n

    def load_weights(self, model_dir: str | Path, weight_version: str | None = None) -> None:
        """Swap in the weights of ``model_dir`` (same architecture); optionally set the version label.

        Running requests keep their KV (computed with the old weights); callers abort or retract first when
        that matters (the server does, per SGLang semantics).

        Raises:
            UserError: unreadable directory or different architecture (the old weights stay loaded).
        """
        self.model.load_weights(model_dir)
        self.model_path = str(model_dir)
        if weight_version is not None:
            self.weight_version = str(weight_version)

    def load_tensors(self, named: dict[str, torch.Tensor], weight_version: str | None = None,
                     source: str = "update") -> list[str]:
        """Load HF-named tensors in place (all or a subset; see :meth:`CausalLM.update_tensors`) and
        optionally set the version label. Same caveat on running requests as :meth:`load_weights`.

        Raises:
            UserError: unknown name or wrong shape (nothing changes, the version label stays).
        """
        loaded = self.model.update_tensors(named, source=source)
        if weight_version is not None:
            self.weight_version = str(weight_version)
        return loaded

    # -- stepping -------------------------------------------------------------------------------------------

    def step(self) -> list[EngineResult]:
        """Admit + prefill waiting requests that fit, and one decode step for the requests already running, in one
        forward (the last prefill forward when the prefill needs several: SGLang's mixed chunked prefill).

        Returns:
            the requests that finished in this step (stop / length).
        """
        finished, self._ready = self._ready, []
        t0 = time.perf_counter()
        self._step_shape = [0, 0, 0]
        with torch.inference_mode():
            new = self._admit()
            before = [r for r in self.running if r not in new] if new else list(self.running)
            if new:  # the decode batch rides in the last prefill forward (one forward for the step)
                finished += self._prefill(new, before)
            elif before:
                finished += self._decode(before)
        if new or before:
            self.step_costs.record(*self._step_shape, time.perf_counter() - t0)
        self.stats["steps"] += 1
        return finished

    def run_until_done(self, max_steps: int | None = None) -> list[EngineResult]:
        """Step until no request is left; returns all results in finishing order."""
        out: list[EngineResult] = []
        n = 0
        while self.has_work():
            out += self.step()
            n += 1
            if max_steps is not None and n >= max_steps:
                break
        return out

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
                 ) -> list[EngineResult]:
        """Offline helper: run ``prompts`` to completion; results in prompt order.

        Raises:
            EngineError: an invalid prompt (nothing is queued then).
        """
        plist = params if isinstance(params, list) else [params] * len(prompts)
        for p, sp in zip(prompts, plist):
            self.validate(p, sp)
        rids = [f"gen-{id(self)}-{i}-{time.monotonic_ns()}" for i in range(len(prompts))]
        for rid, p, sp in zip(rids, prompts, plist):
            self.add_request(rid, p, sp)
        by_rid = {r.rid: r for r in self.run_until_done()}
        return [by_rid[r] for r in rids]

    # -- internals ------------------------------------------------------------------------------------------

    def _admit(self) -> list[Request]:
        new = []
        while self.waiting and len(self.running) < self.max_running_requests:
            r = self.waiting[0]
            if r.need > len(self._free):
                break  # FIFO: the head waits for memory; later (smaller) requests do not overtake it
            self.waiting.popleft()
            r.slot_list = self._free[-r.need:]
            del self._free[-r.need:]
            r.slots = torch.tensor(r.slot_list, dtype=torch.long)
            if r.need > self._table.shape[1]:
                with torch.inference_mode(False):  # a normal tensor: _release writes it outside inference mode too
                    self._table = torch.cat([self._table, torch.zeros(self.max_running_requests, max(
                        r.need - self._table.shape[1], self._table.shape[1]), dtype=torch.long)], dim=1)
            r.row = self._rows.pop()
            self._table[r.row, :r.need] = r.slots
            r.kv_len = 0
            self.running.append(r)
            new.append(r)
        self.stats["max_running"] = max(self.stats["max_running"], len(self.running))
        return new

    def _release(self, r: Request) -> None:
        if r.slot_list is not None:
            self._free.extend(r.slot_list)
            self._table[r.row, :r.need] = 0
            self._rows.append(r.row)
        r.slot_list, r.slots, r.kv_len, r.row = None, None, 0, -1

    def _finish(self, r: Request, reason: str, matched: int | None, message: str | None = None) -> EngineResult:
        self._rids.discard(r.rid)
        return EngineResult(
            rid=r.rid, prompt_ids=r.prompt, output_ids=list(r.output_ids),
            output_logprobs=list(r.output_logprobs), output_versions=list(r.output_versions),
            finish_reason=reason, matched_stop=matched, max_new_tokens=r.params.max_new_tokens,
            weight_version=self.weight_version, input_logprobs=r.input_logprobs,
            num_retractions=r.num_retractions, e2e_latency=time.monotonic() - r.t_arrival,
            abort_message=(message or "Aborted") if reason == "abort" else None,
        )

    def _prompt_logprobs_standalone(self, r: Request) -> None:
        logits = self.model.full_logits(r.prompt)
        r.input_logprobs = self._prompt_logprobs_from(r, logits)

    @staticmethod
    def _prompt_logprobs_from(r: Request, logits: torch.Tensor) -> list[tuple[float | None, int]]:
        # logits: [P, V] for prompt positions; logprob of prompt[t] comes from logits[t - 1].
        start = max(0, min(r.logprob_start_len, len(r.prompt) - 1))
        lp = torch.log_softmax(logits.float(), dim=-1)
        out: list[tuple[float | None, int]] = []
        for t in range(start, len(r.prompt)):
            out.append((None if t == 0 else float(lp[t - 1, r.prompt[t]]), r.prompt[t]))
        return out

    def _prefill(self, reqs: list[Request], decode: list[Request] | None = None) -> list[EngineResult]:
        """Prefill ``reqs`` in forwards of at most ``max_prefill_tokens`` padded tokens, counting each distinct
        sequence once (:meth:`_prefill_group` computes a group's samples once, so they never split a forward);
        ``decode`` (the requests already running) takes its decode step in the last of these forwards."""
        finished: list[EngineResult] = []
        group: list[Request] = []
        seqs: list[tuple[int, ...]] = []
        seen: set[tuple[int, ...]] = set()
        longest = 0
        for r in reqs:
            seq = tuple(r.prompt + r.output_ids)
            if seq not in seen:
                if group and (len(seen) + 1) * max(len(seq), longest) > self.max_prefill_tokens:
                    finished += self._prefill_group(group, seqs)
                    group, seqs, seen, longest = [], [], set(), 0
                seen.add(seq)
                longest = max(longest, len(seq))
            group.append(r)
            seqs.append(seq)
        if group:
            finished += self._prefill_group(group, seqs, decode)
        return finished

    def _prefill_group(self, reqs: list[Request], seqs: list[tuple[int, ...]],
                       decode: list[Request] | None = None) -> list[EngineResult]:
        """Prefill ``reqs`` (``seqs``: each one's prompt + output ids) in one right-padded forward and sample their
        first tokens. Requests with the same sequence (a GRPO group's samples arrive together with one prompt) are
        computed once: the forward runs each distinct sequence, its K/V is copied to the other requests' slots and its
        logits are sampled by each of them with its own seed (SGLang shares such a prefix through its radix cache).
        ``decode``: running requests whose decode step joins the same forward (its tokens after the prefill's)."""
        lens = [len(s) for s in seqs]
        first: dict[tuple[int, ...], int] = {}
        src = [first.setdefault(seq, i) for i, seq in enumerate(seqs)]  # request -> the one computed
        uniq = sorted(first.values())
        row = {i: j for j, i in enumerate(uniq)}  # computed request -> its row of the forward
        B, U, S = len(reqs), len(uniq), max(lens)
        ids = torch.zeros(U, S, dtype=torch.long)
        widx = torch.zeros(U, S, dtype=torch.long)
        for j, i in enumerate(uniq):
            ids[j, :lens[i]] = torch.tensor(seqs[i])
            widx[j, :lens[i]] = reqs[i].slots[:lens[i]]
        pos = torch.arange(S).expand(U, S)
        parts = [AttentionPart(widx, S)]
        flat = [ids.reshape(-1)], [pos.reshape(-1)], [widx.reshape(-1)]
        if decode:
            d_ids, d_pos, d_widx, d_parts, back = self._decode_inputs(decode)
            for acc, x in zip(flat, (d_ids, d_pos, d_widx)):
                acc.append(x)
            parts += d_parts
        hid_all = self.model.forward_packed(*(torch.cat(x) for x in flat), parts, self.k_pool, self.v_pool)
        hid = hid_all[:U * S].view(U, S, -1)
        last = hid[torch.arange(U), torch.tensor([lens[i] for i in uniq]) - 1]  # [U, H]
        logits = self.model.logits(last)
        if U < B:
            dup = [i for i in range(B) if src[i] != i]
            dst = torch.cat([reqs[i].slots[:lens[i]] for i in dup])
            from_ = torch.cat([reqs[src[i]].slots[:lens[i]] for i in dup])
            self.k_pool[:, dst] = self.k_pool[:, from_]
            self.v_pool[:, dst] = self.v_pool[:, from_]
            logits = logits[torch.tensor([row[src[i]] for i in range(B)])]  # a copy: the sampler masks rows in place
        for i, r in enumerate(reqs):
            r.kv_len = lens[i]
            if r.logprob_start_len >= 0 and r.input_logprobs is None:
                P = len(r.prompt)
                r.input_logprobs = self._prompt_logprobs_from(r, self.model.logits(hid[row[src[i]], :P]))
        self.stats["prefill_tokens"] += sum(lens[i] for i in uniq)
        self._step_shape[2] += U * S
        if decode:
            logits = torch.cat([logits, self._decoded(decode, hid_all[U * S:], back)])
            reqs = reqs + decode
        return self._sample_and_append(reqs, logits)

    def _decode(self, reqs: list[Request]) -> list[EngineResult]:
        """One decode step for ``reqs`` (a forward of their last tokens), sampled in the order of ``reqs``."""
        ids, pos, widx, parts, back = self._decode_inputs(reqs)
        hid = self.model.forward_packed(ids, pos, widx, parts, self.k_pool, self.v_pool)
        return self._sample_and_append(reqs, self._decoded(reqs, hid, back))

    def _decode_inputs(self, reqs: list[Request]
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[AttentionPart], list[int]]:
        """The tokens of one decode step for ``reqs``: the batch runs sorted by context length, its attention split
        into groups of similar lengths (:func:`decode_groups`). Adds the step's decode shape (sequences, key slots
        read) to the step's cost record.

        Returns:
            ``(ids, pos, write_idx, parts, back)``: LongTensors [B] of the sorted rows' last tokens, their positions
            and KV slots; their :class:`AttentionPart` list; ``back[i]`` = the sorted row of ``reqs[i]``.
        """
        B = len(reqs)
        order = sorted(range(B), key=lambda i: reqs[i].kv_len)
        srt = [reqs[i] for i in order]
        lens = [r.kv_len + 1 for r in srt]  # key positions each attends to (its context and the new token)
        Lk = lens[-1]
        groups = decode_groups(lens, self.decode_group_min_saving, self.decode_max_groups)
        ids = torch.tensor([r.output_ids[-1] for r in srt], dtype=torch.long)
        pos = torch.tensor([r.kv_len for r in srt], dtype=torch.long)
        # key j of row i -> its slot (j < lens[i]), else the scratch slot 0
        ridx = self._table[:, :Lk].index_select(0, torch.tensor([r.row for r in srt]))
        ridx.masked_fill_(torch.arange(Lk)[None, :] >= torch.tensor(lens)[:, None], 0)
        widx = ridx[torch.arange(B), pos]
        parts = [AttentionPart(ridx[a:b, :lens[b - 1]], 1) for a, b in groups]
        back = [0] * B
        for j, i in enumerate(order):
            back[i] = j
        self._step_shape[0] += B
        self._step_shape[1] += padded_slots(lens, groups)
        return ids, pos, widx, parts, back

    def _decoded(self, reqs: list[Request], hid: torch.Tensor, back: list[int]) -> torch.Tensor:
        """After the decode forward (``hid`` [B, H], sorted rows): advance ``reqs`` and return their logits [B, V]
        in the order of ``reqs``."""
        for r in reqs:
            r.kv_len += 1
        self.stats["decode_tokens"] += len(reqs)
        return self.model.logits(hid[back])

    def _sample_and_append(self, reqs: list[Request], logits: torch.Tensor) -> list[EngineResult]:
        tokens, logprobs = sample(reqs, logits)
        finished = []
        for r, t, lp in zip(reqs, tokens, logprobs):
            r.output_ids.append(t)
            r.output_logprobs.append(lp)
            r.output_versions.append(self.weight_version)
            # SGLang order: the length check comes first, then stop tokens / EOS.
            if len(r.output_ids) >= r.params.max_new_tokens:
                reason, matched = "length", None
            elif t in r.stop_ids:
                reason, matched = "stop", t
            else:
                continue
            self.running.remove(r)
            self._release(r)
            finished.append(self._finish(r, reason, matched))
        return finished
