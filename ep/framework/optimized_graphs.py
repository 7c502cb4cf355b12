"""onnxruntime's optimized graphs, kept across sessions of the same model in a process.

:func:`~.optimizer.optimize` shows onnxruntime the model without its weights and reads back the
graph its basic optimization makes: a CPU session created for nothing else, the largest single
step of a session's creation (MobileNet-V3-sized: 10-13 ms of 40-60). What onnxruntime makes of
those bytes depends only on them, the free-dimension overrides and onnxruntime itself, so
:data:`GRAPHS` keeps the result, onnxruntime's serialized output (or None where onnxruntime
could not load the model), keyed by the SHA-256 of the exact bytes it was shown and the
overrides. A session of a model already created in this process (tests, instances, sweeps)
parses the kept bytes instead; a model differing in any byte onnxruntime sees, a small constant
or a name, is another key. The weights were never part of it: each session puts its own back.

Bounded in entries and in bytes, safe to use from several threads (a lock around lookups and
inserts; two threads may optimize the same bytes at once, and either result is kept), and
emptied in a forked child, whose copy of the lock a parent's thread may have held.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping

Key = tuple[bytes, tuple[tuple[str, int], ...]]

MISSING = object()
"""What :meth:`OptimizedGraphs.get` returns for a key it does not hold (None is a kept
refusal)."""


def key(shown: bytes, free_dims: Mapping[str, int]) -> Key:
    """The key of onnxruntime's optimization of ``shown`` (the serialized model it is shown)
    with the free-dimension overrides ``free_dims``."""
    return hashlib.sha256(shown).digest(), tuple(sorted((str(d), int(v))
                                                        for d, v in free_dims.items()))


class OptimizedGraphs:
    """An LRU of onnxruntime's serialized optimized graphs (or None: it refused the model) by
    :func:`key`: at most ``entries`` of them and ``max_bytes`` of graphs; a graph larger than
    ``max_bytes / 4`` is not kept."""

    def __init__(self, entries: int = 32, max_bytes: int = 64 << 20) -> None:
        self.entries = entries
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self.reset_after_fork()

    def get(self, k: Key) -> bytes | None | object:
        """The graph kept for ``k`` (then most recently used), or :data:`MISSING`."""
        with self._lock:
            found = self._items.get(k, MISSING)
            if found is MISSING:
                self.misses += 1
            else:
                self._items.move_to_end(k)
                self.hits += 1
            return found

    def put(self, k: Key, graph: bytes | None) -> None:
        """Keep ``graph`` for ``k``, dropping the least recently used beyond the bounds."""
        size = len(graph or b"")
        if size > self.max_bytes // 4:
            return
        with self._lock:
            if k in self._items:
                self._items.move_to_end(k)
                return
            self._items[k] = graph
            self._bytes += size
            while len(self._items) > self.entries or self._bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self._bytes -= len(old or b"")

    def clear(self) -> None:
        """Forget every graph (and the hit counts)."""
        with self._lock:
            self._clear()

    def reset_after_fork(self) -> None:
        """A new lock and no graphs (a forked child: a parent's thread may have held the lock
        in the middle of a change)."""
        self._lock = threading.Lock()
        self._clear()

    def _clear(self) -> None:
        self._items: OrderedDict[Key, bytes | None] = OrderedDict()
        self._bytes = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


GRAPHS = OptimizedGraphs()
"""The process's graphs, used by :func:`~.optimizer.optimize`."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=GRAPHS.reset_after_fork)
