"""Weight updates: from disk, and over a collective (a weight-update group the trainer broadcasts to).

From disk (recorded from SGLang 0.5.23, ``shared/fixtures/sglang`` of the workspace): ``/update_weights_from_disk
{model_path, weight_version?, abort_all_requests?}``; a refusal is ``{"success": false, "message": str}``.

Over a collective (:mod:`areal_cli.rollout.weight_sync`). No recording of these endpoints exists in
``shared/fixtures/sglang``; the field names and types are those of SGLang's
``python/sglang/srt/managers/io_struct.py``, sgl-project/sglang main:

- ``InitWeightsUpdateGroupReqInput``: ``master_address: str, master_port: int, rank_offset: int,
  world_size: int, group_name: str = "weight_update_group", backend: str = "nccl"``. AReaL sends
  ``master_port`` as a string (pydantic coerces it); we do too, and parse both.
- ``UpdateWeightsFromDistributedReqInput``: ``names: List[str], dtypes: List[str], shapes: List[List[int]],
  group_name = "weight_update_group", flush_cache = True, abort_all_requests = False,
  weight_version: Optional[str] = None, load_format: Optional[str] = None, torch_empty_cache = False``.
  ``dtypes`` are torch dtype names without the ``torch.`` prefix (``"bfloat16"``, ``"float32"``).
- ``DestroyWeightsUpdateGroupReqInput``: ``group_name = "weight_update_group"``.
- ``BeginWeightUpdateReqInput`` (``POST /begin_weight_update``): ``selector: "target" | "draft" | "all" = "all"``;
  ``EndWeightUpdateReqInput`` (``POST /end_weight_update``): no field. SGLang 0.5.23 refuses
  ``/update_weights_from_distributed`` outside such a session (HTTP 400 "update_weights_from_distributed must run
  between begin_weight_update() and end_weight_update()"), and a second begin while one is open ("a
  weight-update session is already open; call end_weight_update() first"). Checked against a real server (CPU).
- Replies (``*ReqOutput``): ``{"success": bool, "message": str}``, HTTP 200 or 400.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from areal_cli.rollout.protocol.errors import ProtocolError
from areal_cli.rollout.protocol.fields import bool_field, int_field, is_int, str_field

@dataclass
class UpdateWeightsFromDiskRequest:
    """``POST /update_weights_from_disk`` body (SGLang ``UpdateWeightFromDiskReqInput``).

    Attributes:
        model_path: Hugging Face model directory to load.
        weight_version: the version label after the load (sent only when not None).
        abort_all_requests: True aborts in-flight requests first; False (or None: not sent, SGLang's default)
            lets them finish while new ones wait.
        flush_cache: False keeps SGLang from flushing its prefix cache after the load (None: not sent, SGLang's
            default True). An in-place update must send False: SGLang asserts that the flush succeeds, and a
            flush fails while requests are running (in place, they are).
    """

    model_path: str
    weight_version: str | None = None
    abort_all_requests: bool | None = None
    flush_cache: bool | None = None

    def to_json(self) -> dict:
        """``{model_path, weight_version?, abort_all_requests?, flush_cache?}``."""
        out: dict[str, Any] = {"model_path": str(self.model_path)}
        if self.weight_version is not None:
            out["weight_version"] = str(self.weight_version)
        if self.abort_all_requests is not None:
            out["abort_all_requests"] = bool(self.abort_all_requests)
        if self.flush_cache is not None:
            out["flush_cache"] = bool(self.flush_cache)
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "UpdateWeightsFromDiskRequest":
        """Parse a decoded body (server side).

        Raises:
            ProtocolError: not an object, or no ``model_path`` string.
        """
        if not isinstance(obj, dict) or not isinstance(obj.get("model_path"), str):
            raise ProtocolError("model_path (a string) is required.")
        wv, abort, flush = obj.get("weight_version"), obj.get("abort_all_requests"), obj.get("flush_cache")
        return cls(obj["model_path"], None if wv is None else str(wv), None if abort is None else bool(abort),
                   None if flush is None else bool(flush))


def build_update_weights_from_disk_payload(model_path: str, weight_version: str | None = None,
                                           abort_all_requests: bool | None = None) -> dict:
    """``POST /update_weights_from_disk`` body: ``{model_path, weight_version?, abort_all_requests?}``."""
    return UpdateWeightsFromDiskRequest(model_path, None if weight_version is None else str(weight_version),
                                        abort_all_requests).to_json()


DEFAULT_GROUP_NAME = "weight_update_group"  # SGLang's default group_name

# torch dtype name (str(torch.dtype) without "torch.") -> bytes per element
DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}


@dataclass(frozen=True)
class ParamSpec:
    """One tensor of a weight update, as it travels in the payload.

    Attributes:
        name: Hugging Face parameter name (``model.layers.0.mlp.up_proj.weight``).
        shape: tensor shape.
        dtype: torch dtype name without ``torch.`` (``"bfloat16"``, ``"float32"``), a key of DTYPE_BYTES.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        """Size in bytes (numel * element size)."""
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class InitWeightsUpdateGroupRequest:
    """``POST /init_weights_update_group`` body (SGLang ``InitWeightsUpdateGroupReqInput``).

    Attributes:
        master_address, master_port: the rendezvous (a TCPStore hosted by the trainer's head rank, rank 0).
        rank_offset: rank of this server's first process in the group (in ``[1, world_size)``).
        world_size: the trainer head rank + every server process.
        group_name: SGLang's group name. backend: "nccl" | "gloo".
    """

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = DEFAULT_GROUP_NAME
    backend: str = "nccl"

    def to_json(self) -> dict:
        """The body; ``master_port`` is sent as a string, as AReaL does (SGLang's pydantic coerces it)."""
        return {"master_address": str(self.master_address), "master_port": str(int(self.master_port)),
                "rank_offset": int(self.rank_offset), "world_size": int(self.world_size),
                "group_name": str(self.group_name), "backend": str(self.backend)}

    @classmethod
    def from_json(cls, body: Any) -> "InitWeightsUpdateGroupRequest":
        """Parse and check a decoded body (server side); ``master_port`` as an int or a digit string.

        Raises:
            ProtocolError: missing/ill-typed field, port outside 1..65535, rank_offset outside [1, world_size).
        """
        if not isinstance(body, dict):
            raise ProtocolError("The request body must be a JSON object.")
        req = cls(
            master_address=str_field(body, "master_address"),
            master_port=int_field(body, "master_port", lo=1),
            rank_offset=int_field(body, "rank_offset", lo=0),
            world_size=int_field(body, "world_size", lo=2),
            group_name=str_field(body, "group_name", DEFAULT_GROUP_NAME),
            backend=str_field(body, "backend", "nccl"),
        )
        if req.master_port > 65535:
            raise ProtocolError(f"master_port must be in 1..65535, got {req.master_port}")
        if not 1 <= req.rank_offset < req.world_size:
            raise ProtocolError(f"rank_offset {req.rank_offset} must be in [1, world_size={req.world_size}) "
                                f"(rank 0 is the trainer)")
        return req


@dataclass(frozen=True)
class UpdateWeightsFromDistributedRequest:
    """``POST /update_weights_from_distributed`` body (SGLang ``UpdateWeightsFromDistributedReqInput``): one
    bucket of tensors, then broadcast from rank 0 in this order.

    Attributes:
        specs: name, shape and dtype of each tensor (``names``, ``shapes``, ``dtypes`` on the wire).
        group_name: the group the tensors come over.
        weight_version: the version label after this bucket loads (the last bucket of an update), else None.
        abort_all_requests: abort in-flight requests first (SGLang's default False: let them finish).
        flush_cache: SGLang flushes its prefix cache after the load (default True).
        extra: other fields of a parsed body (``load_format``, ``torch_empty_cache``, ...), sent back as is.
    """

    specs: list[ParamSpec]
    group_name: str = DEFAULT_GROUP_NAME
    weight_version: str | None = None
    abort_all_requests: bool = False
    flush_cache: bool = True
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """``{names, dtypes, shapes, group_name, flush_cache, abort_all_requests, weight_version?}``; ``dtypes``
        are torch dtype names without the ``torch.`` prefix."""
        out: dict[str, Any] = {
            "names": [s.name for s in self.specs],
            "dtypes": [s.dtype for s in self.specs],
            "shapes": [list(s.shape) for s in self.specs],
            "group_name": str(self.group_name),
            "flush_cache": bool(self.flush_cache),
            "abort_all_requests": bool(self.abort_all_requests),
        }
        if self.weight_version is not None:
            out["weight_version"] = str(self.weight_version)
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, body: Any) -> "UpdateWeightsFromDistributedRequest":
        """Parse and check a decoded body (server side).

        Raises:
            ProtocolError: names/dtypes/shapes missing, of different lengths, an unknown dtype, a negative
                dimension, a duplicate name; ill-typed optional fields.
        """
        if not isinstance(body, dict):
            raise ProtocolError("The request body must be a JSON object.")
        names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
        for key, v in (("names", names), ("dtypes", dtypes), ("shapes", shapes)):
            if not isinstance(v, list) or not v:
                raise ProtocolError(f"{key} must be a non-empty list, got {v!r}")
        if not len(names) == len(dtypes) == len(shapes):
            raise ProtocolError(f"names, dtypes and shapes must have the same length "
                                f"({len(names)}, {len(dtypes)}, {len(shapes)})")
        specs: list[ParamSpec] = []
        seen: set[str] = set()
        for i, (n, d, s) in enumerate(zip(names, dtypes, shapes)):
            if not isinstance(n, str) or not n:
                raise ProtocolError(f"names[{i}] must be a non-empty string, got {n!r}")
            if n in seen:
                raise ProtocolError(f"names[{i}] = {n!r} appears twice")
            seen.add(n)
            if not isinstance(d, str) or d.removeprefix("torch.") not in DTYPE_BYTES:
                raise ProtocolError(f"dtypes[{i}] = {d!r} is not a supported dtype "
                                    f"({', '.join(sorted(DTYPE_BYTES))})")
            if not isinstance(s, list) or not all(is_int(x) and x >= 0 for x in s):
                raise ProtocolError(f"shapes[{i}] = {s!r} must be a list of non-negative ints")
            specs.append(ParamSpec(n, tuple(s), d.removeprefix("torch.")))
        wv = body.get("weight_version")
        if wv is not None and not isinstance(wv, (str, int)) or isinstance(wv, bool):
            raise ProtocolError(f"weight_version must be a string, got {wv!r}")
        if body.get("load_format") not in (None, "", "auto"):
            raise ProtocolError(f"load_format {body.get('load_format')!r} is not supported by this server")
        known = {"names", "dtypes", "shapes", "group_name", "weight_version", "abort_all_requests",
                 "flush_cache", "load_format"}
        return cls(
            specs=specs,
            group_name=str_field(body, "group_name", DEFAULT_GROUP_NAME),
            weight_version=None if wv is None else str(wv),
            abort_all_requests=bool_field(body, "abort_all_requests", False),
            flush_cache=bool_field(body, "flush_cache", True),
            extra={k: v for k, v in body.items() if k not in known},
        )


#: SGLang 0.5.23's refusals around weight-update sessions, verbatim (servers answer them; the sender recognises them).
NO_SESSION = "{op} must run between begin_weight_update() and end_weight_update()"
SESSION_OPEN = "a weight-update session is already open; call end_weight_update() first"
NO_SESSION_TO_END = "no weight-update session is open; call begin_weight_update() first"
SELECTORS = ("target", "draft", "all")


@dataclass(frozen=True)
class BeginWeightUpdateRequest:
    """``POST /begin_weight_update`` body (SGLang ``BeginWeightUpdateReqInput``): open a weight-update session, in
    which ``/update_weights_from_distributed`` may load buckets; ``/end_weight_update`` closes it.

    Attributes:
        selector: the runners the session covers: "target", "draft" (speculative decoding) or "all".
    """

    selector: str = "all"

    def to_json(self) -> dict:
        """``{"selector": selector}``."""
        return {"selector": self.selector}

    @classmethod
    def from_json(cls, body: Any) -> "BeginWeightUpdateRequest":
        """Parse a decoded body (None or ``{}``: selector "all").

        Raises:
            ProtocolError: not an object, or an unknown selector.
        """
        body = {} if body is None else body
        if not isinstance(body, dict):
            raise ProtocolError("The request body must be a JSON object.")
        sel = body.get("selector", "all")
        if sel not in SELECTORS:
            raise ProtocolError(f"selector must be one of {', '.join(SELECTORS)}, got {sel!r}")
        return cls(sel)


@dataclass(frozen=True)
class DestroyWeightsUpdateGroupRequest:
    """``POST /destroy_weights_update_group`` body (SGLang ``DestroyWeightsUpdateGroupReqInput``)."""

    group_name: str = DEFAULT_GROUP_NAME

    def to_json(self) -> dict:
        """``{"group_name": group_name}``."""
        return {"group_name": str(self.group_name)}

    @classmethod
    def from_json(cls, body: Any) -> "DestroyWeightsUpdateGroupRequest":
        """Parse a decoded body (None or ``{}`` -> the default name).

        Raises:
            ProtocolError: not an object or a bad group_name.
        """
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise ProtocolError("The request body must be a JSON object.")
        return cls(str_field(body, "group_name", DEFAULT_GROUP_NAME))


@dataclass(frozen=True)
class WeightUpdateReply:
    """Reply to every weight-update request (SGLang's ``*ReqOutput``): ``{"success", "message"}``, HTTP 200 or
    400; ``/update_weights_from_disk`` adds ``num_paused_requests``.

    Attributes:
        success: the update (or group operation) was done.
        message: what the server says (SGLang's wording).
        num_paused_requests: sent only when not None.
    """

    success: bool
    message: str
    num_paused_requests: int | None = None

    def to_json(self) -> dict:
        """``{"success", "message", "num_paused_requests"?}``."""
        out: dict[str, Any] = {"success": bool(self.success), "message": str(self.message)}
        if self.num_paused_requests is not None:
            out["num_paused_requests"] = int(self.num_paused_requests)
        return out


def build_init_weights_update_group_payload(master_address: str, master_port: int | str, rank_offset: int,
                                            world_size: int, group_name: str = DEFAULT_GROUP_NAME,
                                            backend: str = "nccl") -> dict:
    """``POST /init_weights_update_group`` body (see :class:`InitWeightsUpdateGroupRequest`).

    ``master_port`` is sent as a string, as AReaL does.

    Raises:
        ValueError: rank_offset outside ``[1, world_size)``, port outside 1..65535, empty address/name.
    """
    port = int(master_port)
    if not 0 < port < 65536:
        raise ValueError(f"master_port must be in 1..65535, got {master_port!r}")
    if not 1 <= int(rank_offset) < int(world_size):
        raise ValueError(f"rank_offset {rank_offset} must be in [1, world_size={world_size})")
    if not master_address or not group_name:
        raise ValueError("master_address and group_name must be non-empty")
    return InitWeightsUpdateGroupRequest(str(master_address), port, int(rank_offset), int(world_size),
                                         str(group_name), str(backend)).to_json()


def build_update_weights_from_distributed_payload(specs: Sequence[ParamSpec],
                                                  group_name: str = DEFAULT_GROUP_NAME,
                                                  weight_version: str | int | None = None,
                                                  abort_all_requests: bool = True,
                                                  flush_cache: bool = True) -> dict:
    """``POST /update_weights_from_distributed`` body (see :class:`UpdateWeightsFromDistributedRequest`):
    ``{names, dtypes, shapes, group_name, flush_cache, abort_all_requests, weight_version?}``.

    Raises:
        ValueError: no specs.
    """
    if not specs:
        raise ValueError("a weight update needs at least one tensor")
    return UpdateWeightsFromDistributedRequest(
        list(specs), str(group_name), None if weight_version is None else str(weight_version),
        bool(abort_all_requests), bool(flush_cache)).to_json()


def build_destroy_weights_update_group_payload(group_name: str = DEFAULT_GROUP_NAME) -> dict:
    """``POST /destroy_weights_update_group`` body (SGLang ``DestroyWeightsUpdateGroupReqInput``)."""
    return DestroyWeightsUpdateGroupRequest(str(group_name)).to_json()


def parse_init_weights_update_group_request(body: Any) -> InitWeightsUpdateGroupRequest:
    """Parse and check an ``/init_weights_update_group`` body (server side); see
    :meth:`InitWeightsUpdateGroupRequest.from_json`."""
    return InitWeightsUpdateGroupRequest.from_json(body)


def parse_update_weights_from_distributed_request(body: Any) -> UpdateWeightsFromDistributedRequest:
    """Parse and check an ``/update_weights_from_distributed`` body (server side); see
    :meth:`UpdateWeightsFromDistributedRequest.from_json`."""
    return UpdateWeightsFromDistributedRequest.from_json(body)


def parse_destroy_weights_update_group_request(body: Any) -> str:
    """Group name of a ``/destroy_weights_update_group`` body (``{}`` -> the default name).

    Raises:
        ProtocolError: not an object or a bad group_name.
    """
    return DestroyWeightsUpdateGroupRequest.from_json(body).group_name
