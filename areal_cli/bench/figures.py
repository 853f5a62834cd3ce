"""Writing a benchmark's matplotlib figure as a PNG atomically (temporary file in the same folder, then rename)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def save_png(fig, path: Path) -> None:
    """Write ``fig`` to ``path`` (PNG, 110 dpi, tight bounding box, mode 0644), creating the folder.

    A reader never sees a half-written file: the figure goes to a temporary file next to ``path`` first.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
