"""Built-in rollout workflows: :mod:`areal_cli.workflows.rlvr` (single turn) and
:mod:`areal_cli.workflows.multi_turn` (answer, feedback, try again) over the token-exact conversation of
:mod:`areal_cli.workflows.conversation`; users write their own with the same API (:mod:`areal_cli.api`)."""
