"""Benchmarks: ``areal bench simulate`` (a discrete-event model of an RL cluster) and measured runs.

Packages and modules:
    sim/:          the cluster model of ``areal bench simulate`` (scenario, costs, modes, event loop, sweeps, fitting).
    throughput/:   ``areal bench throughput``: sync vs async measured side by side on this machine.
    staleness/:    ``areal bench staleness``: the eta x loss-variant ablation on this machine.
    algorithms/:   ``areal bench algorithms``: the ``ppo.algorithm`` presets side by side on this machine.
    runs:          what the measured benchmarks share around their recipe runs (machine, console, overrides).
    figures:       writing a figure as a PNG atomically.
    *_cmd:         the click commands (importing one imports only click and the standard library).
"""
