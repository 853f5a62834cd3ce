"""Helpers shared by the test modules (imported as ``from helpers.x import y``; ``tests/`` is on pytest's
``pythonpath``). Fixtures built on them live in ``tests/conftest.py``.

Modules:
- ``tiny_models``: the tiny Qwen3 model pair (weights and a perturbed copy) the rollout tests serve.
- ``perturbed_models``: tiny model folders with every weight perturbed, for the trainer and conversion tests.
- ``hf_reference``: Hugging Face recomputes (logits, logprobs) that our engine and server are compared to.
- ``servers``: spawning an embedded rollout server and waiting until it is decoding.
- ``scripted``: rollout clients that answer from a script, and the episode clients the workflow tests drive.
- ``warm_model``: the tiny recipe's model after a short warm start, and the overrides of a deterministic run.
- ``torchrun_parity``: 2-process torchrun runs of tests/dist/parallel_parity.py and their comparison.
- ``one_line``: the assertions that a user-facing error is one line with no traceback.
- ``consoles``: a rich Console that writes into memory.
"""
