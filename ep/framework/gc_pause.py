"""Pausing Python's cyclic garbage collector while a session is created.

Creating a session builds thousands of objects that live as long as the session (program
tables, tensor descriptions, simulator events). Each allocation counts towards the collector's
thresholds, so a creation regularly sets off collections, and about one in ten a *full* one,
which walks every object in the process: with torch and transformers imported that is
0.4-0.9 s, inside a load that otherwise takes a few milliseconds. None of it finds garbage the
creation made: its objects are alive until the session is dropped.

:data:`creation` pauses the collector for the span of a creation and restores it after, also
when the creation raises. It nests and is safe across threads: one process-wide counter under
a lock; the first to enter turns the collector off only if it was on, the last to leave turns it
back on only if the first found it on. Nothing is collected, frozen or tuned behind the caller's
back: once enabled again, the collector's next regular pass sees the new objects as it would
have, outside the creation.
"""

from __future__ import annotations

import gc
import threading
from contextlib import ContextDecorator
from types import TracebackType


class PausedCollector(ContextDecorator):
    """Context manager (and decorator) that keeps the cyclic collector off while inside."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._was_enabled = False

    def __enter__(self) -> PausedCollector:
        with self._lock:
            if self._depth == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._depth += 1
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._was_enabled:
                gc.enable()

    @property
    def depth(self) -> int:
        """How many creations are inside (0: the collector is as the process left it)."""
        return self._depth


creation = PausedCollector()
"""The process-wide pause used by :class:`~ep.framework.session.InferenceSession`."""
