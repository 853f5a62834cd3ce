"""Which server gets a request: round robin over the servers in the rotation, a request id sticking to its server.

A request id (``rid``) sticks to the server it first went to (an LRU of 4096 ids), so the resubmissions of one
sample go back to the same server; a server out of the rotation (down) is skipped, and its sticky ids move to
the next live one. Used by :class:`~areal_cli.rollout.server_pool.ServerPool`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Container


class StickyRouting:
    """Round robin over ``urls`` with sticky request ids.

    Args:
        urls: server base URLs (the list is kept, not copied).
        max_ids: how many request ids are remembered; the least recently used are forgotten.
    """

    def __init__(self, urls: list[str], max_ids: int = 4096):
        self.urls = urls
        self._rr = 0
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._sticky_max = int(max_ids)

    def choose(self, rid: str | None, down: Container[str]) -> str:
        """Server URL for ``rid``: the sticky one if known and not in ``down``, else the next live one in
        round-robin order (the first server when none is live), which ``rid`` then sticks to."""
        if rid is not None and rid in self._sticky and self._sticky[rid] not in down:
            self._sticky.move_to_end(rid)
            return self._sticky[rid]
        live = [u for u in self.urls if u not in down] or self.urls
        url = live[self._rr % len(live)]
        self._rr += 1
        if rid is not None:
            self._sticky[rid] = url
            while len(self._sticky) > self._sticky_max:
                self._sticky.popitem(last=False)
        return url

    def stick(self, rid: str, url: str) -> None:
        """Send ``rid`` to ``url`` from now on (the samples of a group follow the group's server)."""
        self._sticky[rid] = url
