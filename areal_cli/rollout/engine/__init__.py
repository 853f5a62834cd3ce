"""Continuous-batching inference engine for Qwen3 / Qwen2 / Llama causal LMs (CPU first), with a capped KV cache.

This is the engine inside the embedded server (:mod:`areal_cli.rollout.server`): SGLang does not run on
these CPU machines (DESIGN.md §1), so we run our own small decoder forward, written for inference.

Modules:

- :mod:`~areal_cli.rollout.engine.model`: :class:`ModelSpec` and :class:`CausalLM`, the forward (same maths as
  Hugging Face's; the equations are in its docstring).
- :mod:`~areal_cli.rollout.engine.scheduler`: :class:`InferenceEngine`, admission into the KV pool, prefill and
  decode steps, aborts and retractions.
- :mod:`~areal_cli.rollout.engine.requests`: a request inside the engine, :class:`EngineResult`, :class:`EngineError`.
- :mod:`~areal_cli.rollout.engine.sampling`: temperature / top-k / top-p sampling with counter-based per-request noise and
  the reported logprob.
- :mod:`~areal_cli.rollout.engine.step_costs`: :class:`StepCostStats`, what each step cost against its shape
  (least-squares sums for the cluster simulator's calibration).
"""

from areal_cli.rollout.engine.model import CausalLM, ModelSpec, load_safetensors_state
from areal_cli.rollout.engine.requests import EngineError, EngineResult
from areal_cli.rollout.engine.scheduler import InferenceEngine

__all__ = ["CausalLM", "EngineError", "EngineResult", "InferenceEngine", "ModelSpec", "load_safetensors_state"]
