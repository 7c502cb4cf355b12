"""Decoded context-binary records, kept across loads of the same bytes.

Decoding a binary's program records is a pure function of its metadata sections' bytes (strings,
graphs, programs, commands, graph digests, external weight entries) and of its weights section's
length: :class:`~ep.npusim.binary_records.Decoded` holds the result without any view of the
binary (weights are :data:`~ep.npusim.binary_records.WeightSpec` positions, bound to each load's
own mapping by :meth:`~ep.npusim.binary_records.Template.bind`). :data:`DECODED` keeps the last
few results, keyed by those exact bytes (not a digest of them), so a model loaded again, in
this session or another, skips decoding (MobileNet-V3's 64 launches: about 0.45 ms of a 2.5 ms
load). Everything that is per load is still done per load by the reader: the header (and the
architecture and config digest the session expects), the section table, every section's
CRC-32, the weights' blocks, external files. A binary whose metadata differs in one byte has
another key: it is decoded afresh and fails, if it does, with the fresh decode's error (failed
decodes are not kept).

The cache holds immutable values (strings, numbers, tuples, bytes, frozen records and
read-only ``MappingProxyType`` mappings, each launch's ``attrs`` among them), which every load
of the same bytes shares, and never a view of a file, so a closed session's binary is unmapped
as before. It is bounded in entries and in an estimate of the memory an entry holds
(:func:`footprint`), and safe to use from several threads (:class:`~ep.framework.lru.BoundedLru`;
two threads may decode the same bytes at once, and either result is kept).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ep.framework.lru import MISSING, BoundedLru

from . import binary_layout as L
from .binary_records import Decoded

DECODER_VERSION = 1
"""Part of every key: bump it when decoding changes what it produces from the same bytes."""

METADATA = frozenset(k for k in L.SectionKind
                     if k not in (L.SectionKind.WEIGHTS, L.SectionKind.WEIGHT_CHECKSUMS))
"""The sections decoding reads (the weight checksums are checked per load, not decoded)."""
_ORDER = tuple(k for k in L.SectionKind if k in METADATA)
"""Their order in a key."""

Key = tuple


def key(format_version: tuple[int, int], bodies: Mapping[L.SectionKind, bytes | memoryview],
        weights_length: int) -> Key:
    """The cache key of a binary: what decoding depends on, its metadata sections' bytes
    (absent optional sections as None), the weights section's length and the format version.
    The reader passes the very ``bytes`` it checked and decodes (kept as they are, not
    copied), so an entry is always the decode of its own key."""
    return (DECODER_VERSION, format_version, weights_length,
            *(bytes(bodies[kind]) if kind in bodies else None for kind in _ORDER))


FOOTPRINT_FACTOR = 13
"""An entry's memory per byte of its key's metadata: the key itself (1) and the decoded records,
estimated at 12 x the bytes they are decoded from. Python objects are that much larger than
their packed records (a tensor's 40-odd bytes become a ``TensorDesc`` of about 500, a launch's
attributes a dict of about 2 KB, the command bytes stay bytes); the tests' sample binary
decodes to 8.7 x its 1,268 metadata bytes (11,035 bytes of objects, ``sys.getsizeof`` summed
over everything reachable, shared strings once), and a test checks that the estimate stays
above that measure."""


def footprint(k: Key) -> int:
    """The estimated memory of an entry keyed ``k``: :data:`FOOTPRINT_FACTOR` x its metadata
    bytes."""
    return FOOTPRINT_FACTOR * sum(len(part) for part in k if isinstance(part, bytes))


class DecodedCache(BoundedLru[Key, Decoded]):
    """A small LRU of :class:`Decoded` by :func:`key`, at most ``entries`` of them and
    ``max_bytes`` of estimated memory (:func:`footprint`, key and decoded records: 64 MiB by
    default, so binaries with up to about 1.2 MiB of metadata each, 4 of them at least); a
    binary whose entry alone would exceed ``max_bytes / 4`` is not kept."""

    def __init__(self, entries: int = 8, max_bytes: int = 64 << 20) -> None:
        super().__init__(entries, max_bytes, lambda k, _: footprint(k))

    def get(self, k: Key) -> Decoded | None:
        """The decoded records of ``k``, if kept (then most recently used)."""
        found = self.lookup(k)
        return None if found is MISSING else found


DECODED = DecodedCache()
"""The process's cache, used by :class:`~ep.npusim.binary_reader.ContextBinary`."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=DECODED.reset_after_fork)
