"""Continuous-batching inference engine for Qwen3 / Qwen2 / Llama causal LMs (CPU first), with a capped KV cache.

This is the engine inside the embedded server (:mod:`areal_cli.rollout.server`): SGLang does not run on
these CPU machines (DESIGN.md §1), so we run our own small decoder forward, written for inference.

Model (same maths as Hugging Face ``Qwen3ForCausalLM`` / ``Qwen2ForCausalLM`` / ``LlamaForCausalLM``,
``transformers/models/{qwen3,qwen2,llama}/modeling_*.py``; the switches are :mod:`areal_cli.models.families`):
    x = embed[ids]
    per layer:  h = RMSNorm(x);  q, k, v = h Wq (+ bq), h Wk (+ bk), h Wv (+ bv) (per head, head_dim; biases:
                Qwen2); q = RMSNorm_q(q), k = RMSNorm_k(k) (over head_dim; Qwen3 only);
                q, k = RoPE(q, k, position) (inv_freq: default or Llama-3 scaling);
                o = softmax(q k^T / sqrt(head_dim) + causal mask) v   (GQA: kv head = query head // groups);
                x = x + o Wo;  h = RMSNorm(x);  x = x + W_down(silu(W_gate h) * W_up h)
    logits = RMSNorm(x) W_lm_head^T   (W_lm_head = embed with tied embeddings)
    RMSNorm(x) = w * x / sqrt(mean(x^2) + eps).  RoPE: rotate-half layout.

KV cache: a token-budget pool ``k, v: [layers, max_total_tokens + 1, kv_heads, head_dim]`` (slot 0 is a
scratch slot that padding writes to). A request is admitted only when ``len(prompt) + max_new_tokens`` free
slots exist; it reserves them up front, so a running request never runs out of KV (no preemption needed) and
the pool never grows: memory is capped at ``max_total_tokens`` tokens of KV. Requests that do not fit wait
in a FIFO queue; a request that can never fit is rejected (:class:`EngineError`).

Scheduling (one :meth:`InferenceEngine.step`): admit waiting requests into free slots (up to
``max_running_requests``) and prefill them (right-padded batch, positions 0..L-1 per request, so no
left-padding position bug), sample their first token; then one decode step for every request that was
already running. Finished requests leave the batch at once and free their KV slots.

Sampling: temperature 0 = greedy argmax; else softmax(logits / T) restricted by top_k / top_p, drawn with a
per-request ``torch.Generator`` (seeded by the request's ``seed`` or, when None, from the engine seed in
submission order), so a request's samples do not depend on what else is in the batch.
Reported logprob of an output token = log_softmax(logits / T)[token] for T > 0, log_softmax(logits)[token]
for T == 0 (before top_k/top_p truncation; after the min_new_tokens mask), as SGLang reports them.
Every output token records the weight version that produced it.
"""

from __future__ import annotations

import json
import random
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from areal_cli.errors import UserError
from areal_cli.rollout.protocol import SamplingParams


class EngineError(ValueError):
    """A request the engine cannot serve (bad ids, too long, can never fit in the KV cache, duplicate id).

    The message is one line; the server returns it as a 400 ``{"error": {"message": ...}}``.
    """


# ----------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """Architecture numbers of a Qwen3 / Qwen2 / Llama model directory (from ``config.json``;
    :mod:`areal_cli.models.families`).

    ``eos_token_ids`` merges ``config.json`` and ``generation_config.json`` eos ids (as SGLang does).
    ``rope`` is the rotary configuration (type, theta and scaling keys) as sorted items.
    """

    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    tie_word_embeddings: bool
    qk_norm: bool
    qkv_bias: bool
    rope: tuple = ()

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> "ModelSpec":
        """Read ``config.json`` (+ ``generation_config.json``) of a Hugging Face model directory.

        Raises:
            UserError: missing/unreadable config, or a family or feature the engine does not run (one line
                naming the field and what is supported).
        """
        from areal_cli.models.families import UnsupportedModel, family_of, head_dim_of, rope_parameters

        d = Path(model_dir)
        cfg_path = d / "config.json"
        if not cfg_path.is_file():
            raise UserError(f"{d}: not a model directory (no config.json)")
        try:
            cfg = json.loads(cfg_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"{cfg_path}: cannot read config: {e}") from None
        if not isinstance(cfg, dict):
            raise UserError(f"{cfg_path}: not a config object")
        try:
            fam = family_of(cfg, str(cfg_path))
        except UnsupportedModel as e:
            raise UserError(str(e)) from None
        eos: list[int] = []
        for src in (cfg.get("eos_token_id"),):
            eos += [src] if isinstance(src, int) else list(src or [])
        gen_path = d / "generation_config.json"
        if gen_path.is_file():
            try:
                g = json.loads(gen_path.read_text()).get("eos_token_id")
                eos += [g] if isinstance(g, int) else list(g or [])
            except (OSError, json.JSONDecodeError, AttributeError):
                pass
        heads = int(cfg["num_attention_heads"])
        rope = rope_parameters(cfg)
        return cls(
            family=fam.name,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim_of(cfg),
            intermediate_size=int(cfg["intermediate_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope["rope_theta"]),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
            eos_token_ids=tuple(sorted(set(int(e) for e in eos))),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qk_norm=fam.qk_norm,
            qkv_bias=fam.qkv_bias,
            rope=tuple(sorted((k, v) for k, v in rope.items() if isinstance(v, (int, float, str)))),
        )

    def config(self) -> dict:
        """A minimal HF-style config dict of this spec (for :mod:`areal_cli.models.families` functions)."""
        return {"model_type": self.family, "hidden_size": self.hidden_size, "num_hidden_layers": self.num_layers,
                "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads,
                "head_dim": self.head_dim, "intermediate_size": self.intermediate_size,
                "vocab_size": self.vocab_size, "tie_word_embeddings": self.tie_word_embeddings,
                "rope_parameters": dict(self.rope)}


#: Former name (the engine ran Qwen3 only).
Qwen3Spec = ModelSpec


def load_safetensors_state(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of ``model.safetensors`` or of the shards listed in ``model.safetensors.index.json``.

    Raises:
        UserError: no safetensors weights in the directory.
    """
    from safetensors import safe_open

    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if (d / "model.safetensors").is_file():
        files = [d / "model.safetensors"]
    elif index.is_file():
        files = [d / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    else:
        raise UserError(f"{d}: no model.safetensors (or index) found")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():
                state[k] = sf.get_tensor(k)
    return state


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # HF Qwen3RMSNorm: x * rsqrt(mean(x^2) + eps), then weight * (.)
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class CausalLM:
    """Weights + inference forward of a Qwen3 / Qwen2 / Llama causal LM (no autograd, float32 by default).

    Args:
        model_dir: Hugging Face model directory (``config.json`` + safetensors).
        dtype: parameter/compute dtype (float32 for exact agreement with training logprobs).
        device: where the weights live and the forward runs (default CPU). Inputs may be CPU tensors; the
            logits :meth:`logits` returns are float32 on the CPU, where sampling happens.
    Raises:
        UserError: unreadable/unsupported model directory or missing/mis-shaped weights.
    """

    def __init__(self, model_dir: str | Path, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu"):
        from areal_cli.models.families import rope_inv_freq

        self.spec = ModelSpec.from_model_dir(model_dir)
        self.dtype = dtype
        self.device = torch.device(device)
        self.model_dir = str(model_dir)
        s = self.spec
        self.layers: list[dict[str, torch.Tensor]] = []
        self._load(load_safetensors_state(model_dir), model_dir, init=True)
        inv_freq = rope_inv_freq(s.config())
        pos = torch.arange(s.max_position_embeddings, dtype=torch.float)
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(device=self.device, dtype=dtype)  # [max_pos, head_dim]
        self.sin = emb.sin().to(device=self.device, dtype=dtype)

    # -- weights --------------------------------------------------------------------------------------------

    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        from areal_cli.models.families import weight_shapes

        return weight_shapes(self.spec.config())

    def _load(self, state: dict[str, torch.Tensor], model_dir: str | Path, init: bool) -> None:
        shapes = self._expected_shapes()
        for name, shape in shapes.items():
            if name not in state:
                raise UserError(f"{model_dir}: weight {name!r} missing")
            if tuple(state[name].shape) != shape:
                raise UserError(f"{model_dir}: weight {name!r} has shape {tuple(state[name].shape)}, "
                                f"expected {shape} (same architecture required)")
        t = {k: state[k].to(device=self.device, dtype=self.dtype).contiguous() for k in shapes}
        layers = []
        for i in range(self.spec.num_layers):
            p = f"model.layers.{i}."
            layer = {
                "ln1": t[p + "input_layernorm.weight"], "ln2": t[p + "post_attention_layernorm.weight"],
                "q": t[p + "self_attn.q_proj.weight"], "k": t[p + "self_attn.k_proj.weight"],
                "v": t[p + "self_attn.v_proj.weight"], "o": t[p + "self_attn.o_proj.weight"],
                "qn": t.get(p + "self_attn.q_norm.weight"), "kn": t.get(p + "self_attn.k_norm.weight"),
                "gate": t[p + "mlp.gate_proj.weight"], "up": t[p + "mlp.up_proj.weight"],
                "down": t[p + "mlp.down_proj.weight"],
            }
            for b in ("q", "k", "v", "o"):
                layer[b + "_b"] = t.get(p + f"self_attn.{b}_proj.bias")
            layers.append(layer)
        self._named = t  # HF name -> the tensor the forward uses (same objects as in ``layers``)
        self.embed = t["model.embed_tokens.weight"]
        self.norm = t["model.norm.weight"]
        self.lm_head = self.embed if self.spec.tie_word_embeddings else t["lm_head.weight"]
        self.layers = layers
        self.model_dir = str(model_dir)

    def load_weights(self, model_dir: str | Path) -> None:
        """Replace all weights with those of ``model_dir`` (same architecture).

        Raises:
            UserError: unreadable directory, different architecture (config numbers or weight shapes).
        """
        spec = ModelSpec.from_model_dir(model_dir)
        mine = {k: v for k, v in self.spec.__dict__.items() if k != "eos_token_ids"}
        theirs = {k: v for k, v in spec.__dict__.items() if k != "eos_token_ids"}
        if mine != theirs:
            diff = sorted(k for k in mine if mine[k] != theirs[k])
            raise UserError(f"{model_dir}: architecture differs from the loaded model in {', '.join(diff)}")
        self._load(load_safetensors_state(model_dir), model_dir, init=False)

    def update_tensors(self, named: dict[str, torch.Tensor], source: str = "update") -> list[str]:
        """Overwrite some weights in place with HF-named tensors (a subset is fine: weight-sync buckets).

        Every name and shape is checked before anything changes, so a refused call leaves all weights as
        they were. Values are cast to the model dtype exactly as a disk load casts them
        (``tensor.to(dtype)``), so loading the same weights this way or from disk gives identical numbers.
        ``lm_head.weight`` of a model with tied embeddings is skipped when it equals the embedding shape
        (SGLang's Qwen3 ``load_weights`` skips it too).

        Args:
            named: ``{hf_name: tensor}`` with the shapes of :meth:`_expected_shapes`.
            source: where the tensors came from (error messages only).
        Returns:
            the names that were loaded.
        Raises:
            UserError: an unknown name or a wrong shape (nothing is changed).
        """
        shapes = self._expected_shapes()
        todo: list[tuple[str, torch.Tensor]] = []
        for name, tensor in named.items():
            if name == "lm_head.weight" and self.spec.tie_word_embeddings and name not in shapes:
                if tuple(tensor.shape) != shapes["model.embed_tokens.weight"]:
                    raise UserError(f"{source}: weight 'lm_head.weight' has shape {tuple(tensor.shape)}, "
                                    f"expected {shapes['model.embed_tokens.weight']}")
                continue
            if name not in shapes:
                raise UserError(f"{source}: weight {name!r} is not a parameter of this {self.spec.family} model")
            if tuple(tensor.shape) != shapes[name]:
                raise UserError(f"{source}: weight {name!r} has shape {tuple(tensor.shape)}, "
                                f"expected {shapes[name]} (same architecture required)")
            todo.append((name, tensor))
        with torch.no_grad():
            for name, tensor in todo:
                self._named[name].copy_(tensor.to(self.dtype))
        return [n for n, _ in todo]

    # -- forward --------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, pos: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                write_idx: torch.Tensor, read_idx: torch.Tensor) -> torch.Tensor:
        """Run the layers for a right-padded batch, writing new K/V into the pool and attending over it.

        Args:
            ids: LongTensor [B, S] token ids (pad entries: any valid id).
            pos: LongTensor [B, S] position of each token (0-based, < max_position_embeddings).
            k_pool, v_pool: [layers, slots, kv_heads, head_dim] KV pool (modified in place).
            write_idx: LongTensor [B, S] pool slot where each token's K/V is written (pads -> scratch 0).
            read_idx: LongTensor [B, Lk] pool slot of key position j of each sequence (j = position);
                key j is visible to a query at position p iff j <= p (causal); pads beyond a sequence's
                length must point at an initialised slot (e.g. 0) and are masked by causality.
        Returns:
            FloatTensor [B, S, hidden] final-normed hidden states (apply :meth:`logits` to the rows needed).
        """
        s = self.spec
        dev = self.device
        ids, pos, write_idx, read_idx = ids.to(dev), pos.to(dev), write_idx.to(dev), read_idx.to(dev)
        B, S = ids.shape
        Lk = read_idx.shape[1]
        nh, nkv, D = s.num_heads, s.num_kv_heads, s.head_dim
        x = self.embed[ids]  # [B, S, H]
        cos = self.cos[pos].unsqueeze(2)  # [B, S, 1, D]
        sin = self.sin[pos].unsqueeze(2)
        mask = (torch.arange(Lk, device=dev)[None, None, :] <= pos[:, :, None]).unsqueeze(1)  # [B, 1, S, Lk]
        w_flat = write_idx.reshape(-1)
        r_flat = read_idx.reshape(-1)
        eps = s.rms_norm_eps
        for li, w in enumerate(self.layers):
            h = _rms_norm(x, w["ln1"], eps)
            q = F.linear(h, w["q"], w["q_b"]).view(B, S, nh, D)
            k = F.linear(h, w["k"], w["k_b"]).view(B, S, nkv, D)
            v = F.linear(h, w["v"], w["v_b"]).view(B, S, nkv, D)
            if w["qn"] is not None:  # Qwen3's per-head q/k norms (families.Family.qk_norm)
                q = _rms_norm(q, w["qn"], eps)
                k = _rms_norm(k, w["kn"], eps)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kp, vp = k_pool[li], v_pool[li]
            kp.index_copy_(0, w_flat, k.reshape(B * S, nkv, D))
            vp.index_copy_(0, w_flat, v.reshape(B * S, nkv, D))
            K = kp.index_select(0, r_flat).view(B, Lk, nkv, D).transpose(1, 2)  # [B, nkv, Lk, D]
            V = vp.index_select(0, r_flat).view(B, Lk, nkv, D).transpose(1, 2)
            # GQA: query head h uses kv head h // (nh // nkv) (HF repeat_kv), without copying K/V
            o = F.scaled_dot_product_attention(q.transpose(1, 2), K, V, attn_mask=mask, scale=D ** -0.5,
                                               enable_gqa=nkv != nh)  # [B, nh, S, D]
            o = o.transpose(1, 2).reshape(B, S, nh * D)
            x = x + F.linear(o, w["o"], w["o_b"])
            h = _rms_norm(x, w["ln2"], eps)
            x = x + F.linear(F.silu(F.linear(h, w["gate"])) * F.linear(h, w["up"]), w["down"])
        return _rms_norm(x, self.norm, eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [..., H]`` -> logits ``[..., vocab]`` (float32, on the CPU)."""
        return F.linear(hidden, self.lm_head).float().cpu()

    @torch.inference_mode()
    def full_logits(self, input_ids: list[int]) -> torch.Tensor:
        """Logits of every position of one sequence, no cache reuse: FloatTensor [L, vocab].

        Used by tests (vs Hugging Face) and for prompt logprobs; a private temporary KV pool is used.
        """
        L = len(input_ids)
        s = self.spec
        kp = torch.zeros(s.num_layers, L + 1, s.num_kv_heads, s.head_dim, dtype=self.dtype, device=self.device)
        vp = torch.zeros_like(kp)
        idx = torch.arange(1, L + 1)[None, :]
        hid = self.forward(torch.tensor([input_ids]), torch.arange(L)[None, :], kp, vp, idx, idx)
        return self.logits(hid[0])


#: Former name (the engine ran Qwen3 only).
Qwen3Model = CausalLM


# ----------------------------------------------------------------------------------------------------------
# Engine
# ----------------------------------------------------------------------------------------------------------


@dataclass
class EngineResult:
    """A finished (or aborted) request.

    Attributes:
        rid: request id.
        prompt_ids: the prompt as submitted.
        output_ids: generated ids; a matched stop/EOS token is the last one.
        output_logprobs: per output token, natural log (see module docstring for the definition).
        output_versions: weight-version label of each output token (the weights that produced it).
        finish_reason: "stop" | "length" | "abort".
        matched_stop: the matched stop/EOS id for "stop", else None.
        max_new_tokens: the request's budget (SGLang reports it as ``finish_reason.length``).
        weight_version: engine weight version when the request finished.
        input_logprobs: ``(logprob | None, id)`` per prompt position from ``logprob_start_len``
            (position 0 has None), or None when not requested. Computed with T = 1 (raw logits).
        num_retractions: times the request was retracted (KV dropped and recomputed).
        e2e_latency: seconds from submission to finish.
        abort_message: reason for "abort" ("Aborted" by default), else None.
    """

    rid: str
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[str]
    finish_reason: str
    matched_stop: int | None
    max_new_tokens: int
    weight_version: str
    input_logprobs: list[tuple[float | None, int]] | None = None
    num_retractions: int = 0
    e2e_latency: float = 0.0
    abort_message: str | None = None


@dataclass(eq=False)  # identity semantics: requests are compared/removed by object, never field-wise
class _Req:
    rid: str
    prompt: list[int]
    params: SamplingParams
    logprob_start_len: int
    seed: int
    t_arrival: float
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[str] = field(default_factory=list)
    input_logprobs: list[tuple[float | None, int]] | None = None
    slots: torch.Tensor | None = None  # LongTensor [reserved] KV pool slots, position j -> slots[j]
    slot_list: list[int] | None = None
    kv_len: int = 0  # positions whose K/V is in the pool
    generator: torch.Generator | None = None
    num_retractions: int = 0
    stop_ids: frozenset[int] = frozenset()

    @property
    def need(self) -> int:
        return len(self.prompt) + self.params.max_new_tokens


class InferenceEngine:
    """Continuous-batching engine with a capped, slot-reserving KV cache (see module docstring).

    Not thread-safe: one thread drives it (the server's engine thread).

    Args:
        model_path: Hugging Face model directory (Qwen3 / Qwen2 / Llama, safetensors).
        max_running_requests: most requests in the running batch.
        max_total_tokens: KV-cache capacity in tokens (the memory cap: 2 * layers * kv_heads * head_dim *
            dtype bytes per token); a request reserves ``len(prompt) + max_new_tokens`` tokens.
        context_length: longest prompt + max_new_tokens; default ``max_position_embeddings``.
        seed: seeds the per-request sampling generators of requests without their own seed.
        weight_version: initial weight-version label.
        max_prefill_tokens: cap on padded tokens (batch x length) of one prefill forward.
        dtype: compute dtype.
        device: the weights' and the KV pool's device (default CPU; sampling stays on the CPU).
    Raises:
        UserError: bad model directory. ValueError: non-positive sizes, context beyond the model's positions.
    """

    def __init__(self, model_path: str | Path, *, max_running_requests: int = 64,
                 max_total_tokens: int = 65536, context_length: int | None = None, seed: int = 0,
                 weight_version: str = "0", max_prefill_tokens: int = 8192,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        if max_running_requests < 1 or max_total_tokens < 1 or max_prefill_tokens < 1:
            raise ValueError("max_running_requests, max_total_tokens and max_prefill_tokens must be >= 1")
        self.model = CausalLM(model_path, dtype=dtype, device=device)
        s = self.model.spec
        self.context_length = int(context_length or s.max_position_embeddings)
        if self.context_length > s.max_position_embeddings:
            raise ValueError(f"context_length {self.context_length} exceeds the model's "
                             f"max_position_embeddings {s.max_position_embeddings}")
        self.max_running_requests = int(max_running_requests)
        self.max_total_tokens = int(max_total_tokens)
        self.max_prefill_tokens = int(max_prefill_tokens)
        self.weight_version = str(weight_version)
        self.model_path = str(model_path)
        # KV pool; slot 0 = scratch for padding writes (zero-initialised so masked reads stay finite).
        self.k_pool = torch.zeros(s.num_layers, self.max_total_tokens + 1, s.num_kv_heads, s.head_dim,
                                  dtype=dtype, device=self.model.device)
        self.v_pool = torch.zeros_like(self.k_pool)
        self._free: list[int] = list(range(self.max_total_tokens, 0, -1))
        self._seed_rng = random.Random(seed)
        self.waiting: deque[_Req] = deque()
        self.running: list[_Req] = []
        self._ready: list[EngineResult] = []  # finished outside a step (max_new_tokens == 0)
        self._rids: set[str] = set()
        self.stats = {"steps": 0, "prefill_tokens": 0, "decode_tokens": 0, "max_running": 0}

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
        r = _Req(rid=rid, prompt=list(input_ids), params=params, logprob_start_len=int(logprob_start_len),
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
        """Admit + prefill waiting requests that fit, then one decode step for the running batch.

        Returns:
            the requests that finished in this step (stop / length).
        """
        finished, self._ready = self._ready, []
        with torch.inference_mode():
            new = self._admit()
            before = [r for r in self.running if r not in new] if new else list(self.running)
            if new:
                finished += self._prefill(new)
            if before:
                finished += self._decode(before)
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

    def _admit(self) -> list[_Req]:
        new = []
        while self.waiting and len(self.running) < self.max_running_requests:
            r = self.waiting[0]
            if r.need > len(self._free):
                break  # FIFO: the head waits for memory; later (smaller) requests do not overtake it
            self.waiting.popleft()
            r.slot_list = self._free[-r.need:]
            del self._free[-r.need:]
            r.slots = torch.tensor(r.slot_list, dtype=torch.long)
            r.kv_len = 0
            self.running.append(r)
            new.append(r)
        self.stats["max_running"] = max(self.stats["max_running"], len(self.running))
        return new

    def _release(self, r: _Req) -> None:
        if r.slot_list is not None:
            self._free.extend(r.slot_list)
        r.slot_list, r.slots, r.kv_len = None, None, 0

    def _finish(self, r: _Req, reason: str, matched: int | None, message: str | None = None) -> EngineResult:
        self._rids.discard(r.rid)
        return EngineResult(
            rid=r.rid, prompt_ids=r.prompt, output_ids=list(r.output_ids),
            output_logprobs=list(r.output_logprobs), output_versions=list(r.output_versions),
            finish_reason=reason, matched_stop=matched, max_new_tokens=r.params.max_new_tokens,
            weight_version=self.weight_version, input_logprobs=r.input_logprobs,
            num_retractions=r.num_retractions, e2e_latency=time.monotonic() - r.t_arrival,
            abort_message=(message or "Aborted") if reason == "abort" else None,
        )

    def _prompt_logprobs_standalone(self, r: _Req) -> None:
        logits = self.model.full_logits(r.prompt)
        r.input_logprobs = self._prompt_logprobs_from(r, logits)

    @staticmethod
    def _prompt_logprobs_from(r: _Req, logits: torch.Tensor) -> list[tuple[float | None, int]]:
        # logits: [P, V] for prompt positions; logprob of prompt[t] comes from logits[t - 1].
        start = max(0, min(r.logprob_start_len, len(r.prompt) - 1))
        lp = torch.log_softmax(logits.float(), dim=-1)
        out: list[tuple[float | None, int]] = []
        for t in range(start, len(r.prompt)):
            out.append((None if t == 0 else float(lp[t - 1, r.prompt[t]]), r.prompt[t]))
        return out

    def _prefill(self, reqs: list[_Req]) -> list[EngineResult]:
        finished: list[EngineResult] = []
        group: list[_Req] = []
        longest = 0
        for r in reqs:
            L = len(r.prompt) + len(r.output_ids)
            if group and (len(group) + 1) * max(L, longest) > self.max_prefill_tokens:
                finished += self._prefill_group(group)
                group, longest = [], 0
            group.append(r)
            longest = max(longest, L)
        if group:
            finished += self._prefill_group(group)
        return finished

    def _prefill_group(self, reqs: list[_Req]) -> list[EngineResult]:
        seqs = [r.prompt + r.output_ids for r in reqs]
        lens = [len(s) for s in seqs]
        B, S = len(reqs), max(lens)
        ids = torch.zeros(B, S, dtype=torch.long)
        widx = torch.zeros(B, S, dtype=torch.long)
        for i, (r, seq) in enumerate(zip(reqs, seqs)):
            ids[i, :lens[i]] = torch.tensor(seq)
            widx[i, :lens[i]] = r.slots[:lens[i]]
        pos = torch.arange(S).expand(B, S)
        hid = self.model.forward(ids, pos, self.k_pool, self.v_pool, widx, widx)
        last = hid[torch.arange(B), torch.tensor(lens) - 1]  # [B, H]
        logits = self.model.logits(last)
        for i, r in enumerate(reqs):
            r.kv_len = lens[i]
            if r.logprob_start_len >= 0 and r.input_logprobs is None:
                P = len(r.prompt)
                r.input_logprobs = self._prompt_logprobs_from(r, self.model.logits(hid[i, :P]))
        self.stats["prefill_tokens"] += sum(lens)
        return self._sample_and_append(reqs, logits)

    def _decode(self, reqs: list[_Req]) -> list[EngineResult]:
        B = len(reqs)
        Lk = max(r.kv_len for r in reqs) + 1
        ids = torch.tensor([[r.output_ids[-1]] for r in reqs], dtype=torch.long)
        pos = torch.tensor([[r.kv_len] for r in reqs], dtype=torch.long)
        ridx = torch.zeros(B, Lk, dtype=torch.long)
        for i, r in enumerate(reqs):
            ridx[i, :r.kv_len + 1] = r.slots[:r.kv_len + 1]
        widx = ridx[torch.arange(B), pos[:, 0]].unsqueeze(1)
        hid = self.model.forward(ids, pos, self.k_pool, self.v_pool, widx, ridx)
        for r in reqs:
            r.kv_len += 1
        self.stats["decode_tokens"] += B
        return self._sample_and_append(reqs, self.model.logits(hid[:, 0]))

    def _sample_and_append(self, reqs: list[_Req], logits: torch.Tensor) -> list[EngineResult]:
        tokens, logprobs = self._sample(reqs, logits)
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

    def _sample(self, reqs: list[_Req], logits: torch.Tensor) -> tuple[list[int], list[float]]:
        """logits [B, V] float32 -> (token ids, reported logprobs)."""
        B, V = logits.shape
        for i, r in enumerate(reqs):
            if len(r.output_ids) < r.params.min_new_tokens and r.stop_ids:
                ban = [t for t in r.stop_ids if 0 <= t < V]
                logits[i, ban] = float("-inf")
        temps = torch.tensor([r.params.temperature if r.params.temperature > 0 else 1.0 for r in reqs],
                             dtype=logits.dtype)
        logp = torch.log_softmax(logits / temps[:, None], dim=-1)  # [B, V]
        tokens = logits.argmax(dim=-1)  # greedy rows keep this
        sample_rows = [i for i, r in enumerate(reqs) if r.params.temperature > 0]
        if sample_rows:
            rows = torch.tensor(sample_rows)
            probs = logp[rows].exp()
            need_filter = any(reqs[i].params.top_k > 0 or reqs[i].params.top_p < 1.0 for i in sample_rows)
            if need_filter:
                probs = self._top_k_top_p(probs, [reqs[i].params for i in sample_rows])
            for j, i in enumerate(sample_rows):
                r = reqs[i]
                if r.generator is None:
                    r.generator = torch.Generator().manual_seed(r.seed)
                q = torch.empty(V, dtype=probs.dtype).exponential_(generator=r.generator).clamp_(min=1e-20)
                tokens[i] = int(torch.argmax(probs[j] / q))  # exponential race: P(i) = p_i / sum p
        lps = logp.gather(1, tokens[:, None])[:, 0]
        return [int(t) for t in tokens], [float(x) for x in lps]

    @staticmethod
    def _top_k_top_p(probs: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """Zero out tokens outside top_k / the top_p nucleus (the token crossing top_p is kept)."""
        n, V = probs.shape
        sp, si = probs.sort(dim=-1, descending=True)
        ks = torch.tensor([p.top_k if p.top_k > 0 else V for p in params])
        ps = torch.tensor([p.top_p for p in params], dtype=probs.dtype)
        rank = torch.arange(V)[None, :]
        cum = sp.cumsum(dim=-1)
        drop = (rank >= ks[:, None]) | ((cum - sp) > ps[:, None])
        drop[:, 0] = False
        sp = sp.masked_fill(drop, 0.0)
        return torch.zeros_like(probs).scatter_(1, si, sp)
