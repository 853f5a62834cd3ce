"""Evaluation (a job): ``areal eval`` and the in-loop benchmark evaluation. Benchmarks and their data
(:mod:`.benchmarks`, :mod:`.datasets`, :mod:`.code_datasets`), the published protocols (:mod:`.protocols`,
:mod:`.settings`), generation on an embedded or external server (:mod:`.generate`), grading (:mod:`.grading`:
the math grader and the sandboxed code grader), pass@k / maj@k (:mod:`.metrics`), the Codeforces rating
(:mod:`.codeforces`), resuming and regrading a run (:mod:`.resume`, :mod:`.regrade`) and its report
(:mod:`.report`, :mod:`.summary`)."""
