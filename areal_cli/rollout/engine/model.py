"""The decoder forward of a Qwen3 / Qwen2 / Llama causal LM, written for inference (weights, no autograd).

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
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from areal_cli.foundations.errors import UserError


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


@dataclass(frozen=True)
class AttentionPart:
    """One attention call of :meth:`CausalLM.forward_packed`: ``rows`` sequences with ``q_len`` new tokens each.

    Attributes:
        read_idx: LongTensor [rows, lk]: pool slot of key position j of each row (j = position); key j is visible to
            a new token at position p iff j <= p (causal), so entries beyond a row's last position must point at an
            initialised slot (e.g. scratch 0) and are masked.
        q_len: new tokens per row (1 for a decode step, the padded length for a prefill); the positions are the
            forward's own ``pos`` of the part's ``rows * q_len`` tokens.
    """

    read_idx: torch.Tensor
    q_len: int


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
                write_idx: torch.Tensor, read_idx: torch.Tensor,
                groups: list[tuple[int, int, int]] | None = None) -> torch.Tensor:
        """Run the layers for a right-padded batch, writing new K/V into the pool and attending over it.

        Args:
            ids: LongTensor [B, S] token ids (pad entries: any valid id).
            pos: LongTensor [B, S] position of each token (0-based, < max_position_embeddings).
            k_pool, v_pool: [layers, slots, kv_heads, head_dim] KV pool (modified in place).
            write_idx: LongTensor [B, S] pool slot where each token's K/V is written (pads -> scratch 0).
            read_idx: LongTensor [B, Lk] pool slot of key position j of each sequence (j = position);
                key j is visible to a query at position p iff j <= p (causal); pads beyond a sequence's
                length must point at an initialised slot (e.g. 0) and are masked by causality.
            groups: optional ``[(start, end, lk), ...]``: contiguous row ranges covering the batch in order
                (:func:`areal_cli.rollout.decode_groups.decode_groups`), each attending over its first ``lk``
                key positions (``lk`` > every position in its rows, <= Lk) in a call of its own instead of over
                all ``Lk``: the same values, as the keys left out are masked for every query of the group.
                None: one call for the batch.
        Returns:
            FloatTensor [B, S, hidden] final-normed hidden states (apply :meth:`logits` to the rows needed).
        """
        B, S = ids.shape
        Lk = read_idx.shape[1]
        spans = groups if groups is not None and len(groups) > 1 else [(0, B, Lk)]
        parts = [AttentionPart(read_idx[a:b, :lk], S) for a, b, lk in spans]
        hid = self.forward_packed(ids.reshape(-1), pos.reshape(-1), write_idx.reshape(-1), parts, k_pool, v_pool)
        return hid.view(B, S, -1)

    @torch.inference_mode()
    def forward_packed(self, ids: torch.Tensor, pos: torch.Tensor, write_idx: torch.Tensor,
                       parts: list[AttentionPart], k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
        """Run the layers over the tokens of several batches at once (a mixed prefill + decode step: SGLang's
        mixed chunked prefill), each batch attending in a call of its own.

        The per-token layers (norms, projections, MLP) run once over all T tokens; attention runs per part.

        Args:
            ids, pos, write_idx: LongTensor [T]: the tokens, their positions (RoPE and the causal mask) and the pool
                slots their K/V is written to (pads -> scratch slot 0), part after part; a part of ``rows`` rows and
                ``q_len`` tokens per row holds ``rows * q_len`` consecutive tokens, row-major.
            parts: :class:`AttentionPart` list covering the T tokens in order.
            k_pool, v_pool: [layers, slots, kv_heads, head_dim] KV pool (modified in place).
        Returns:
            FloatTensor [T, hidden] final-normed hidden states.
        Raises:
            ValueError: the parts do not cover the T tokens.
        """
        s = self.spec
        dev = self.device
        ids, pos, write_idx = ids.to(dev), pos.to(dev), write_idx.to(dev)
        T = ids.shape[0]
        covered = sum(p.read_idx.shape[0] * p.q_len for p in parts)
        if covered != T:
            raise ValueError(f"attention parts cover {covered} tokens, the batch has {T}")
        nh, nkv, D = s.num_heads, s.num_kv_heads, s.head_dim
        x = self.embed[ids]  # [T, H]
        cos = self.cos[pos].unsqueeze(1)  # [T, 1, D]
        sin = self.sin[pos].unsqueeze(1)
        # per part: (first token, rows, tokens per row, keys read, flat slots, mask [rows, 1, S, lk])
        plan = []
        t0 = 0
        for p in parts:
            r_idx = p.read_idx.to(dev)
            (n, lk), S = r_idx.shape, p.q_len
            part_pos = pos[t0:t0 + n * S].view(n, S)
            mask = (torch.arange(lk, device=dev)[None, None, :] <= part_pos[:, :, None]).unsqueeze(1)
            plan.append((t0, n, S, lk, r_idx.reshape(-1), mask))
            t0 += n * S
        eps = s.rms_norm_eps
        for li, w in enumerate(self.layers):
            h = _rms_norm(x, w["ln1"], eps)
            q = F.linear(h, w["q"], w["q_b"]).view(T, nh, D)
            k = F.linear(h, w["k"], w["k_b"]).view(T, nkv, D)
            v = F.linear(h, w["v"], w["v_b"]).view(T, nkv, D)
            if w["qn"] is not None:  # Qwen3's per-head q/k norms (families.Family.qk_norm)
                q = _rms_norm(q, w["qn"], eps)
                k = _rms_norm(k, w["kn"], eps)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kp, vp = k_pool[li], v_pool[li]
            kp.index_copy_(0, write_idx, k)
            vp.index_copy_(0, write_idx, v)
            outs = []
            for a, n, S, lk, r_idx, m in plan:
                K = kp.index_select(0, r_idx).view(n, lk, nkv, D).transpose(1, 2)  # [n, nkv, lk, D]
                V = vp.index_select(0, r_idx).view(n, lk, nkv, D).transpose(1, 2)
                qp = q[a:a + n * S].view(n, S, nh, D).transpose(1, 2)  # [n, nh, S, D]
                # GQA: query head h uses kv head h // (nh // nkv) (HF repeat_kv), without copying K/V
                o = F.scaled_dot_product_attention(qp, K, V, attn_mask=m, scale=D ** -0.5, enable_gqa=nkv != nh)
                outs.append(o.transpose(1, 2).reshape(n * S, nh * D))
            o = outs[0] if len(outs) == 1 else torch.cat(outs)
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

