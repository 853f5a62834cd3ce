"""What one engine step costs: the sufficient statistics of a least-squares cost model, kept by the engine.

Each :meth:`InferenceEngine.step` records its wall seconds ``y`` and four features ``x``:

* ``1`` (per-step overhead: Python scheduling, reading the weights, sampling set-up),
* ``decode_seqs``: sequences in the decode batch,
* ``decode_ctx_tokens``: the key slots the decode step's attention read. The embedded engine gathers the KV cache
  into right-padded blocks: one per group of similar context lengths (:mod:`areal_cli.rollout.decode_groups`), each
  ``n_g x L_g`` (its size x its longest context), so the feature is ``sum_g n_g x L_g`` (``decode_attention:
  grouped``; engines before the groups padded the whole batch to its longest context, ``B * L_max``:
  ``padded``, which is what a snapshot without ``decode_attention`` means),
* ``prefill_tokens``: padded tokens of the step's prefill forwards (batch x longest prompt + prefix, per group).
  Since session 33 the engine computes the requests of one prefill batch that have the same sequence (a group's
  samples, admitted together) once, so the rows counted are the distinct sequences (``prefill_sharing: batch``;
  a snapshot without the field: every request prefilled its own prompt, ``none``).

Since session 34 a step's decode runs in the same forward as its (last) prefill, so a step with both pays one
forward's fixed costs, not two (``step_forwards: mixed``; a snapshot without the field: ``separate``).

Only the sums ``X^T X``, ``X^T y``, ``y^T y`` and the count are kept (21 numbers, constant memory, additive: the
difference of two snapshots is the statistics of the steps between them), so a run's cost model is fitted from
every step it took without logging them. ``areal bench simulate --calibrate-from`` fits the cluster model's
decode constants ``a + b*n + c*n*L_max`` and prefill ``p`` from them (:mod:`areal_cli.bench.sim.calibrate`);
``GET /server_info`` reports them as ``internal_states[0].step_costs``.
"""

from __future__ import annotations

FEATURES = ("step", "decode_seqs", "decode_ctx_tokens", "prefill_tokens")


class StepCostStats:
    """Running sums for the linear model ``seconds = x . theta`` over engine steps (see the module docstring)."""

    def __init__(self, decode_attention: str = "grouped", prefill_sharing: str = "batch",
                 step_forwards: str = "mixed") -> None:
        self.decode_attention = decode_attention
        self.prefill_sharing = prefill_sharing
        self.step_forwards = step_forwards
        k = len(FEATURES)
        self.n = 0
        self.xtx = [[0.0] * k for _ in range(k)]
        self.xty = [0.0] * k
        self.yy = 0.0

    def record(self, decode_seqs: int, decode_ctx_tokens: int, prefill_tokens: int, seconds: float) -> None:
        """Add one step: ``decode_seqs`` sequences decoded, ``decode_ctx_tokens`` key slots its attention read,
        ``prefill_tokens`` padded prefill tokens, ``seconds`` of wall time."""
        x = (1.0, float(decode_seqs), float(decode_ctx_tokens), float(prefill_tokens))
        y = float(seconds)
        self.n += 1
        for i, xi in enumerate(x):
            self.xty[i] += xi * y
            row = self.xtx[i]
            for j, xj in enumerate(x):
                row[j] += xi * xj
        self.yy += y * y

    def to_dict(self) -> dict:
        """JSON form: ``{"features": [...], "n": steps, "xtx": k x k, "xty": k, "yy": float,
        "decode_attention": "grouped" | "padded", "prefill_sharing": "batch" | "none",
        "step_forwards": "mixed" | "separate"}``."""
        return {"features": list(FEATURES), "n": self.n, "xtx": [list(r) for r in self.xtx],
                "xty": list(self.xty), "yy": self.yy, "decode_attention": self.decode_attention,
                "prefill_sharing": self.prefill_sharing, "step_forwards": self.step_forwards}
