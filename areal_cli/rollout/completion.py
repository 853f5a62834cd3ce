"""A finished sample of the rollout client, and how the chunks of an interrupted sample add up to it.

A sample interrupted by a pause or a weight update comes back in chunks (one per submission); each chunk's tokens,
behaviour logprobs and per-token policy versions are appended to the sample's (:func:`accumulate`). The versions
come from the server's ``meta_info.weight_versions`` spans (the weights that actually produced each token),
falling back to ``meta_info.weight_version``; ``"default"`` -> 0. AReaL instead stamped each chunk with the
client's version when the chunk returned (its §2.7 label race).

Stale prefix KV (in-place updates): SGLang labels a token with the weights that computed its logits, but the KV it
attends to may be older -- a request queued before an in-place weight update is prefilled after it, yet may reuse
prefix-cache entries the old weights computed (or have half its prompt prefilled before the update), and SGLang
labels its whole output with the new version. The kit sends each request with its policy version as the cache
namespace (``extra_key``, :func:`~areal_cli.rollout.protocol.cache_key`), so every cached KV a request can reuse was
computed by weights at least that old, and :func:`accumulate` with ``kv_floor`` relabels a chunk whose first token
is newer than the version it was sent under with that older version: no token is labelled with a version whose
weights did not compute all the KV it attended to. Tokens after an in-place update inside one sample keep SGLang's
labels; the trainer marks them (``areal_cli.trainer.steps.kv_versions``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from areal_cli.rollout.protocol.errors import ProtocolError
from areal_cli.rollout.protocol.generate_response import GenerateResponse, version_to_int, versions_from_spans


@dataclass
class Completion:
    """One finished sample.

    Attributes:
        prompt_ids: the prompt as given.
        output_ids: generated ids (a matched stop/EOS token is the last one), across all resubmissions.
        output_logprobs: behaviour logprob of each output token (as reported by the server that sampled it).
        output_versions: policy version that produced each output token.
        finish_reason: "stop" | "length" ("abort" only when the client was closed mid-request).
        n_interruptions: how many times the request was aborted and resubmitted.
        server_url: the server that produced the last chunk.
        matched_stop: (added) the matched stop id/string when finish_reason is "stop".
        rid: (added) the request id used on the wire.
    """

    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    finish_reason: str
    n_interruptions: int
    server_url: str
    matched_stop: int | str | None = None
    rid: str = ""


@dataclass
class PartialSample:
    """An aborted sample of a group being resumed: its tokens so far and interruption count."""

    rid: str
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    vers: list[int] = field(default_factory=list)
    n_int: int = 0


def accumulate(resp: GenerateResponse, ids: list[int], lps: list[float], vers: list[int],
               kv_floor: int | None = None) -> None:
    """Append the output ids, logprobs and per-token policy versions of one ``/generate`` chunk to a sample's.

    Args:
        kv_floor: the policy version the chunk was sent under (its prefix-cache namespace) when the servers keep
            requests across weight updates (in-place pauses): if the chunk's first token is labelled newer, every
            token of the chunk is labelled ``kv_floor`` instead (module docstring). None: labels as served.
    Raises:
        ProtocolError: the chunk has not one logprob per output id, or its version spans do not tile its output.
    """
    n = len(resp.output_ids)
    if len(resp.output_logprobs) != n:
        raise ProtocolError(f"response has {n} output ids but {len(resp.output_logprobs)} logprobs")
    labels = versions_from_spans(resp.weight_version_spans, n, resp.weight_version)
    ids.extend(resp.output_ids)
    lps.extend(resp.output_logprobs)
    as_int = {v: version_to_int(v) for v in set(labels)}  # a few distinct labels, one per token
    if kv_floor is not None and labels and as_int[labels[0]] > kv_floor:
        vers.extend([int(kv_floor)] * n)
        return
    vers.extend(as_int[v] for v in labels)
