"""Hugging Face Hub references: what a pinned reference looks like, and whether the Hub can be reached.

A foundation shared by recipes (which pin models and data), ``areal download``, benchmark loading and task
records; it imports nothing of the kit. A reference is pinned when its revision is a 40-hex commit
(:data:`SHA1`); a file's checksum is 64 lowercase hex digits (:data:`SHA256`).
"""

from __future__ import annotations

import os
import re

#: A 40-hex commit SHA: the only revision a locked recipe or ``areal download`` accepts as pinned.
SHA1 = re.compile(r"^[0-9a-f]{40}$")
#: A file checksum: 64 lowercase hex digits.
SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: A Hub repo id ``owner/name``.
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` is set (``1``, ``true``, ``yes``, ``on``)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether a TCP connection to the Hugging Face endpoint (``HF_ENDPOINT``, default huggingface.co:443)
    opens within ``timeout_s``. Used to fail in one line at once instead of after huggingface_hub's
    retries (about 25 s of backoff) when the machine has no network."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def hub_local_only() -> bool:
    """True when downloads must come from the local cache: ``HF_HUB_OFFLINE`` is set or the hub is unreachable."""
    return offline() or not hub_reachable()
