"""Rollout (an engine): SGLang's native HTTP protocol (:mod:`.protocol`), the embedded engine and server that
speak it (:mod:`.engine`, :mod:`.server`), the client that generates, resumes interrupted samples and loads
weights (:mod:`.client`), the server fleet and its supervision (:mod:`.fleet`, :mod:`.watchdog`), real SGLang
servers (:mod:`.sglang_launcher`, :mod:`.sglang_env`), weight updates from disk or over a process group
(:mod:`.weight_sync`), the staleness bound (:mod:`.staleness`) and the rollout controller that runs workflows
(:mod:`.controller`, :mod:`.from_config`)."""
