"""Tasks: what is trained and how it is scored, built on the public API (:mod:`areal_cli.api`): the task of a
run from its config (:mod:`.task`), the built-in presets (:mod:`.registry`: tiny-arith, tiny-longtail, math-rl,
code-rl, multi-turn) and prompt rendering (:mod:`.prompts`)."""
