"""Built-in rollout workflows (:mod:`areal_cli.workflows.rlvr`); users write their own with the same API
(:mod:`areal_cli.api`)."""
