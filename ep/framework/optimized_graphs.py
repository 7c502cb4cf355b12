"""onnxruntime's optimized graphs, kept across sessions of the same model in a process.

:func:`~.optimizer.optimize` shows onnxruntime the model without its weights and reads back the
graph its basic optimization makes: a CPU session created for nothing else, the largest single
step of a session's creation (a MobileNet-V3-like model's creation from source: 39.8 ms with
it, 33.0 kept, alternating in one process). What onnxruntime makes of those bytes depends only
on them, the free-dimension overrides and onnxruntime itself, so :data:`GRAPHS` keeps the
result, onnxruntime's serialized output (or None where onnxruntime could not load the model,
or the error it refused it with),
keyed by the SHA-256 of the exact bytes it was shown and the overrides. A session of a model
already created in this process (tests, instances, sweeps) parses the kept bytes instead; a
model differing in any byte onnxruntime sees, a small constant or a name, is another key. The
weights were never part of it: each session puts its own back.

Bounded in entries and in bytes, safe to use from several threads and emptied in a forked
child (:class:`~.lru.BoundedLru`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

from ..errors import Fail, InvalidGraph
from .lru import BoundedLru

Key = tuple[bytes, tuple[tuple[str, int], ...]]


def key(shown: bytes, free_dims: Mapping[str, int]) -> Key:
    """The key of onnxruntime's optimization of ``shown`` (the serialized model it is shown)
    with the free-dimension overrides ``free_dims``."""
    return hashlib.sha256(shown).digest(), tuple(sorted((str(d), int(v))
                                                        for d, v in free_dims.items()))


class OptimizedGraphs(BoundedLru[Key, bytes | InvalidGraph | Fail | None]):
    """onnxruntime's serialized optimized graphs by :func:`key` (or None: it could not load the
    model; or the error it refused the model with): at most ``entries`` of them and
    ``max_bytes`` of graphs."""

    def __init__(self, entries: int = 32, max_bytes: int = 64 << 20) -> None:
        super().__init__(entries, max_bytes,
                         lambda _, graph: len(graph) if isinstance(graph, bytes) else 0)


GRAPHS = OptimizedGraphs()
"""The process's graphs, used by :func:`~.optimizer.optimize`."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=GRAPHS.reset_after_fork)
