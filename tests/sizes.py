"""The memory an object holds, measured: what the caches' estimates are checked against."""

from __future__ import annotations

import sys
from types import MappingProxyType


def deep_size(obj: object, seen: set[int] | None = None) -> int:
    """``sys.getsizeof`` summed over ``obj`` and everything it reaches through containers,
    mappings (read-only ones too) and instance ``__dict__``s, each object once."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return size
    if isinstance(obj, MappingProxyType):
        return size + deep_size(dict(obj), seen)
    if isinstance(obj, dict):
        return size + sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    if isinstance(obj, (tuple, list, set, frozenset)):
        return size + sum(deep_size(item, seen) for item in obj)
    if hasattr(obj, "__dict__"):
        return size + deep_size(obj.__dict__, seen)
    return size
