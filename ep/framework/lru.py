"""A small least-recently-used cache bounded in entries and in bytes, for values kept across
sessions (onnxruntime's optimized graphs, a context binary's decoded records).

Safe to use from several threads (a lock around lookups and inserts; two threads may compute the
same value at once, and either is kept). A forked child must call
:meth:`BoundedLru.reset_after_fork` (a thread of the parent may have held the lock, never
released in the child, in the middle of a change): it starts empty.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

MISSING = object()
"""What :meth:`BoundedLru.lookup` returns for a key it does not hold."""


class BoundedLru(Generic[K, V]):
    """At most ``entries`` values and ``max_bytes`` of them as ``size(key, value)`` counts; a
    value whose size alone exceeds ``max_bytes / 4`` is not kept. ``hits`` and ``misses`` count
    the lookups since the last :meth:`clear`."""

    def __init__(self, entries: int, max_bytes: int, size: Callable[[K, V], int]) -> None:
        self.entries = entries
        self.max_bytes = max_bytes
        self._size = size
        self.reset_after_fork()

    def lookup(self, k: K) -> V | object:
        """The value kept for ``k`` (then the most recently used), or :data:`MISSING`."""
        with self._lock:
            found = self._items.get(k, MISSING)
            if found is MISSING:
                self.misses += 1
            else:
                self._items.move_to_end(k)
                self.hits += 1
            return found

    def put(self, k: K, value: V, merge: Callable[[V, V], V] | None = None) -> None:
        """Keep ``value`` for ``k``, dropping the least recently used beyond the bounds (a key
        already kept keeps its value, or takes ``merge(kept, value)``; its size must not
        change)."""
        size = self._size(k, value)
        if size > self.max_bytes // 4:
            return
        with self._lock:
            if k in self._items:
                if merge is not None:
                    self._items[k] = merge(self._items[k], value)
                self._items.move_to_end(k)
                return
            self._items[k] = value
            self._bytes += size
            while len(self._items) > self.entries or self._bytes > self.max_bytes:
                old, dropped = self._items.popitem(last=False)
                self._bytes -= self._size(old, dropped)

    def clear(self) -> None:
        """Forget every value (and the hit counts)."""
        with self._lock:
            self._clear()

    def reset_after_fork(self) -> None:
        """A new lock and no values (also how a cache starts)."""
        self._lock = threading.Lock()
        self._clear()

    def _clear(self) -> None:
        self._items: OrderedDict[K, V] = OrderedDict()
        self._bytes = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
