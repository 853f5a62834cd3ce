"""Per-operation costs of the cluster model (seconds), given or derived from the hardware and the model size.

A decode step of a server with ``n`` running requests whose contexts sum to ``S`` tokens takes ``a + b*n + c*S``
seconds; a prefill ``p`` seconds per token; training ``train_fixed_s`` plus per-token and per-squared-length GPU
seconds; a weight update ``save`` (trainer) and ``load`` (each server).

Costs can be given directly (``decode_step_fixed_s`` ...) or derived (:func:`derive_costs`) from the model size,
the GPU's FLOP/s and memory bandwidth and a few efficiency constants, so a scenario for other hardware or another
model size changes only the physical numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_cli.bench.sim.scenario import Scenario


@dataclass(frozen=True)
class Costs:
    """Per-operation costs in seconds (see the module docstring for the formulas)."""

    decode_a: float  # s per decode step
    decode_b: float  # s per decode step per running sequence
    decode_c: float  # s per decode step per context token of the running sequences
    prefill_per_token: float  # s per prefilled token
    train_gpu_s_per_token: float  # GPU-s per trained token (fwd + bwd)
    train_gpu_s_per_token_sq: float  # GPU-s per squared sequence length (causal attention, fwd + bwd)
    train_fixed_s: float
    sync_save_s: float
    sync_load_s: float

    def decode_tokens_per_s(self, batch: int, ctx: float) -> float:
        """Tokens/s of one server decoding ``batch`` sequences of mean context ``ctx`` tokens."""
        return batch / (self.decode_a + self.decode_b * batch + self.decode_c * batch * ctx)


def derive_costs(sc: Scenario) -> Costs:
    """Costs from the physical numbers (explicit cost fields of the scenario win).

    Roofline-style formulas, fp16 weights (2 bytes/parameter), ``N`` = parameters:
      a = decode_overhead_s + 2N / (HBM * bw_eff) ; b = 2N / (FLOPs * flops_eff) ;
      c = kv_bytes_per_token / (HBM * bw_eff) ; p = 2N / (FLOPs * prefill_eff) ;
      train per token = 6N / (FLOPs * MFU) ; train per len^2 = 6 * layers * hidden / (FLOPs * MFU) ;
      save = 2N / io ; load = sync_overhead_s + 2N / io.
    Per server the FLOPs and bandwidth are ``gen_tp`` GPUs' worth.
    """
    n = sc.model_params_b * 1e9
    flops = sc.gpu_tflops * 1e12
    hbm = sc.gpu_hbm_tb_s * 1e12 * sc.gen_tp
    wbytes = 2.0 * n
    io = sc.weight_io_gb_s * 1e9

    def pick(explicit: float | None, derived: float) -> float:
        return float(explicit) if explicit is not None else derived

    return Costs(
        decode_a=pick(sc.decode_step_fixed_s, sc.decode_overhead_s + wbytes / (hbm * sc.decode_bw_efficiency)),
        decode_b=pick(sc.decode_step_per_seq_s, 2 * n / (flops * sc.gen_tp * sc.decode_flops_efficiency)),
        decode_c=pick(sc.decode_step_per_ctx_token_s, sc.model_kv_bytes_per_token / (hbm * sc.decode_bw_efficiency)),
        prefill_per_token=pick(sc.prefill_s_per_token, 2 * n / (flops * sc.gen_tp * sc.prefill_flops_efficiency)),
        train_gpu_s_per_token=pick(sc.train_gpu_s_per_token, 6 * n / (flops * sc.train_mfu)),
        train_gpu_s_per_token_sq=pick(sc.train_gpu_s_per_token_sq,
                                      6 * sc.model_layers * sc.model_hidden / (flops * sc.train_mfu)),
        train_fixed_s=sc.train_fixed_s,
        sync_save_s=pick(sc.sync_save_s, wbytes / io),
        sync_load_s=pick(sc.sync_load_s, sc.sync_overhead_s + wbytes / io),
    )

