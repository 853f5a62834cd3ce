"""Helpers shared by the test modules (imported as ``from helpers.x import y``; ``tests/`` is on pytest's
``pythonpath``). Fixtures built on them live in ``tests/conftest.py``.

Modules:
- ``tiny_models``: the tiny Qwen3 model pair (weights and a perturbed copy) the rollout tests serve.
- ``hf_reference``: Hugging Face recomputes (logits, logprobs) that our engine and server are compared to.
- ``servers``: spawning an embedded rollout server and waiting until it is decoding.
- ``scripted``: rollout clients that answer from a script, and the episode clients the workflow tests drive.
- ``warm_model``: the tiny recipe's model after a short warm start (rewards neither all 0 nor all 1).
- ``one_line``: the assertion that a user-facing error is one line with no traceback.
"""
