"""Foundations (bottom layer): small modules every other layer may use, which import nothing else of the kit.

errors (the one-line :class:`~.errors.UserError` and friends), atomic (all-or-nothing file writes), jsonl
(append-only logs), hub (model/dataset references), ports (free ports), log_tail (the end of a child's log),
typed_yaml (YAML with file:line locations), resources (where shipped recipes and data cards live), plots,
timeline (phase timings), manifest (what a run records about its environment).
"""
