"""Benchmarks: ``areal bench simulate`` (a discrete-event model of an RL cluster) and measured runs."""
