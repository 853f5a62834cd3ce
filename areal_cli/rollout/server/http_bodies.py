"""Reading a request's JSON body and answering an error: what every route of the embedded server shares."""

import json
from typing import Any

from areal_cli.rollout.protocol.errors import ProtocolError, error_body


def error_response(status: int, message: str):
    """A JSON response with SGLang's error body ``{"error": {"message": message}}`` and HTTP ``status``."""
    from fastapi.responses import JSONResponse

    return JSONResponse(error_body(message), status_code=status)


async def read_json(request, *, empty_ok: bool = False) -> Any:
    """The decoded JSON body of a FastAPI ``request`` (``empty_ok``: an empty body reads as None).

    Raises:
        ProtocolError: an empty body (unless ``empty_ok``) or invalid JSON (the message the route answers with 400).
    """
    raw = await request.body()
    if not raw and empty_ok:
        return None
    if not raw:
        raise ProtocolError("The request body is empty (expected a JSON object).")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise ProtocolError(f"JSON decode error: {e}") from e
