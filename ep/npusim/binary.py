"""Context binaries: the simulator's file format for compiled programs.

One context binary holds many compiled graphs (one :class:`~firmware_model.program.Program` per
EPContext node, addressed by graph name) and one weights blob in which each distinct weight is
stored once, 512-byte aligned. ``docs/binary_format.md`` is the normative specification.

- :func:`pack_context` / :func:`write_context_binary` (atomic) write one;
- :class:`ContextBinary` reads one, through ``mmap`` or from bytes, validating every byte and
  raising :class:`ep.errors.InvalidGraph` on anything wrong; weights come back as zero-copy views.

The layout lives in :mod:`ep.npusim.binary_layout`, the writer in :mod:`ep.npusim.binary_writer`
and the reader in :mod:`ep.npusim.binary_reader`; this module is the public face.
"""

from __future__ import annotations

from .binary_layout import ContextHeader, SectionEntry, SectionKind
from .binary_reader import ContextBinary, WeightsSummary
from .binary_writer import graph_digest, pack_context, pack_context_listing, write_context_binary

__all__ = [
    "ContextBinary",
    "ContextHeader",
    "SectionEntry",
    "SectionKind",
    "WeightsSummary",
    "graph_digest",
    "pack_context",
    "pack_context_listing",
    "write_context_binary",
]
