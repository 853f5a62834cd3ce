"""Rewards (an engine): the worker pool every reward call runs in, with a hard timeout and every outcome counted
(:mod:`.pool`), the math grader (:mod:`.math_grader`: math-verify with the published extraction rules) and the
code grader (:mod:`.code_grader`: test cases run in the sandbox)."""
