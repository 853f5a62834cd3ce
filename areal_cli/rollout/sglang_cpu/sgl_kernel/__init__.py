"""A stand-in for ``sgl_kernel`` (SGLang's compiled kernels), installed by areal into SGLang's CPU environment.

SGLang 0.5.23 imports ``sgl_kernel`` at module import time, but on a CPU without AMX it calls none of its
functions (``cpu_has_amx_support()`` gates every CPU kernel). Every attribute is a function that raises
``NotImplementedError`` naming itself, so a call that does happen fails loudly instead of computing garbage.
Submodules (``sgl_kernel.kvcacheio``, ``sgl_kernel.scalar_type``, ...) are not faked: importing one raises
``ImportError``, which SGLang treats as "kernel not available" and falls back.
"""

__version__ = "0.0.0+areal-cpu-shim"
__path__: list = []  # a package with no submodules: `import sgl_kernel.x` raises ImportError


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def _missing(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} was called, but this environment has areal's CPU stand-in for sgl_kernel "
            f"(SGLang's compiled kernels are not installed); areal's SGLang CPU mode assumed no kernel is called "
            f"on a CPU without AMX")

    _missing.__name__ = name
    _missing.__qualname__ = name
    return _missing
