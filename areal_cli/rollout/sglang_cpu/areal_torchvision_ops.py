"""Registers the two ``torchvision`` operator schemas that torchvision's CUDA-linked wheel fails to register on
a CPU-only torch, before torchvision is first imported (installed by areal into SGLang's CPU environment).

torchvision 0.28.0's ``_C.so`` links ``libc10_cuda.so`` and does not load beside torch's CPU build; its
``_meta_registrations`` then fails with ``operator torchvision::nms does not exist``. Defining the schemas of
``torchvision::nms`` and ``torchvision::qnms`` is enough for the import to succeed. No kernel is registered: a
call raises torch's "no kernel registered" error naming the operator. SGLang (text models) never calls them.

Loaded by ``areal_torchvision_ops.pth`` through a meta-path finder, so torch is not imported at every interpreter
start, only when something imports torchvision.
"""

import importlib.abc
import sys

_SCHEMA = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
_done = False


def _register() -> None:
    global _done
    if _done:
        return
    _done = True
    import torch

    lib = torch.library.Library("torchvision", "DEF")  # noqa: F841 (kept alive below)
    for op in ("nms", "qnms"):
        lib.define(op + _SCHEMA)
    sys.modules[__name__]._lib = lib


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" and not _done:
            _register()
        return None


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
