"""Shared test settings: one torch thread per process (the machines are 2 shared cores)."""

from pathlib import Path

import pytest

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass

SHARED = Path(__file__).resolve().parents[2] / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only ../shared folder beside the repository (real data, SGLang fixtures)."""
    if not SHARED.is_dir():
        pytest.fail(f"{SHARED} not found: tests need ../shared beside the repository")
    return SHARED
