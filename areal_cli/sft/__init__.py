"""Supervised fine-tuning: one SFT stage on the Megatron-core trainer (:mod:`.stage`, also the warm start of RL
recipes) and the ``kind: sft`` recipe job that runs it (:mod:`.job`).
"""
