"""Hugging Face as the reference: full-sequence recomputes of logits and token logprobs that the rollout
engine and the embedded server must match (float32, same weights)."""

from __future__ import annotations

import torch


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    """Logits [len(ids), vocab] (float32) of the HF ``model`` on the one sequence ``ids``."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()

def hf_logprobs(model, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    """HF full-sequence recompute: log_softmax(logits / T)[token] (T = 1 for greedy)."""
    lp = torch.log_softmax(hf_logits(model, prompt + output) / (temperature if temperature > 0 else 1.0), -1)
    P = len(prompt)
    return [float(lp[P - 1 + i, t]) for i, t in enumerate(output)]
