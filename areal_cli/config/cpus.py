"""Linux cpu lists (``"0"``, ``"0-3,6"``), the form of the ``parallel.*_cpus`` settings."""

from __future__ import annotations


def parse_cpu_list(spec: str) -> frozenset[int]:
    """Parse a Linux cpu list (``"0"``, ``"0-3,6"``; ``""`` = no pinning -> empty set).

    Raises:
        ValueError: not a comma list of non-negative ints / ``a-b`` ranges with a <= b.
    """
    cpus: set[int] = set()
    for part in (p.strip() for p in spec.split(",")) if spec.strip() else ():
        lo, sep, hi = part.partition("-")
        if not lo.strip().isdigit() or (sep and not hi.strip().isdigit()):
            raise ValueError(f"not a cpu list like '0' or '0-3,6': bad item '{part}'")
        a, b = int(lo), int(hi) if sep else int(lo)
        if a > b:
            raise ValueError(f"range '{part}' is decreasing")
        cpus.update(range(a, b + 1))
    return frozenset(cpus)
