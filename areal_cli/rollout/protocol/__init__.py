"""The one wire format between rollout clients and inference servers: SGLang's native HTTP protocol.

Everything here is pure (no I/O, no torch): dataclasses, payload builders and parsers, used by the client
(:mod:`areal_cli.rollout.client`), the embedded server (:mod:`areal_cli.rollout.server`), the trainer's weight
sender (:mod:`areal_cli.rollout.weight_sender`) and the tests.

Shapes follow the recordings of a real SGLang 0.5.23 server in ``shared/fixtures/sglang`` of the workspace (README
there; DESIGN.md §2) and, for the collective weight update that has no recording, SGLang's
``python/sglang/srt/managers/io_struct.py``. One module per family of messages:

- :mod:`~areal_cli.rollout.protocol.generate_request`: ``POST /generate`` bodies and :class:`SamplingParams`.
- :mod:`~areal_cli.rollout.protocol.generate_response`: ``/generate`` results, ``finish_reason`` and the
  per-token policy versions (``meta_info.weight_versions`` spans).
- :mod:`~areal_cli.rollout.protocol.control`: ``/pause_generation``, ``/continue_generation``,
  ``/abort_request``, ``/update_weight_version``.
- :mod:`~areal_cli.rollout.protocol.weight_update`: ``/update_weights_from_disk`` and the weight-update group
  (``/init_weights_update_group``, ``/begin_weight_update``, ``/update_weights_from_distributed``,
  ``/end_weight_update``, ``/destroy_weights_update_group``).
- :mod:`~areal_cli.rollout.protocol.errors`: :class:`ProtocolError`, :class:`ServerError` and SGLang's error
  bodies; :mod:`~areal_cli.rollout.protocol.fields`: the type checks the parsers share.

Each message is a dataclass with ``to_json()`` (what a client sends) and, where a server parses it,
``from_json()`` (raising :class:`ProtocolError` with the message the server answers); the ``build_*_payload``
and ``parse_*`` functions are those methods in function form. This package holds the wire format and nothing
else; every public name is importable from it (``from areal_cli.rollout.protocol import SamplingParams``).
"""

from areal_cli.rollout.protocol.control import (
    PAUSE_MODES, AbortRequest, ContinueGenerationRequest, PauseGenerationRequest, UpdateWeightVersionRequest,
    build_abort_payload, build_continue_payload, build_pause_payload,
)
from areal_cli.rollout.protocol.errors import (
    ProtocolError, ServerError, error_body, is_error_body, parse_error_message,
)
from areal_cli.rollout.protocol.generate_request import (
    SGLANG_SAMPLING_KEYS, BatchGenerateRequest, GenerateRequest, SamplingParams, build_batch_generate_payload,
    build_generate_payload, cache_key, parse_generate_request,
)
from areal_cli.rollout.protocol.generate_response import (
    ABORT_FINISH_REASON, GenerateResponse, build_generate_response, finish_reason_json, parse_generate_response,
    spans_from_versions, version_to_int, versions_from_spans,
)
from areal_cli.rollout.protocol.weight_update import (
    DEFAULT_GROUP_NAME, DTYPE_BYTES, NO_SESSION, NO_SESSION_TO_END, SESSION_OPEN, BeginWeightUpdateRequest,
    DestroyWeightsUpdateGroupRequest, InitWeightsUpdateGroupRequest, ParamSpec,
    UpdateWeightsFromDiskRequest, UpdateWeightsFromDistributedRequest, WeightUpdateReply,
    build_destroy_weights_update_group_payload, build_init_weights_update_group_payload,
    build_update_weights_from_disk_payload, build_update_weights_from_distributed_payload,
    parse_destroy_weights_update_group_request, parse_init_weights_update_group_request,
    parse_update_weights_from_distributed_request,
)

__all__ = [
    "ABORT_FINISH_REASON", "DEFAULT_GROUP_NAME", "DTYPE_BYTES", "NO_SESSION", "NO_SESSION_TO_END", "PAUSE_MODES",
    "SESSION_OPEN", "SGLANG_SAMPLING_KEYS", "AbortRequest", "BeginWeightUpdateRequest", "BatchGenerateRequest", "ContinueGenerationRequest", "DestroyWeightsUpdateGroupRequest",
    "GenerateRequest", "GenerateResponse", "InitWeightsUpdateGroupRequest", "ParamSpec", "PauseGenerationRequest",
    "ProtocolError", "SamplingParams", "ServerError", "UpdateWeightVersionRequest", "UpdateWeightsFromDiskRequest",
    "UpdateWeightsFromDistributedRequest", "WeightUpdateReply",
    "build_abort_payload", "build_batch_generate_payload", "build_continue_payload",
    "build_destroy_weights_update_group_payload", "build_generate_payload", "build_generate_response",
    "build_init_weights_update_group_payload", "build_pause_payload", "build_update_weights_from_disk_payload",
    "build_update_weights_from_distributed_payload", "cache_key", "error_body", "finish_reason_json", "is_error_body",
    "parse_destroy_weights_update_group_request", "parse_error_message", "parse_generate_request",
    "parse_generate_response", "parse_init_weights_update_group_request",
    "parse_update_weights_from_distributed_request", "spans_from_versions", "version_to_int", "versions_from_spans",
]
