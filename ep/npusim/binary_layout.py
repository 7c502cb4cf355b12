"""The byte layout of a context binary, shared by its writer and its reader.

``docs/binary_format.md`` is the normative specification; this module is its transcription into
``struct`` formats and constants, so the writer (:mod:`ep.npusim.binary_writer`) and the reader
(:mod:`ep.npusim.binary_reader`) cannot disagree about where a field lives. Everything is
little-endian and packed (no implicit padding inside records).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from isal import isal_zlib

crc32 = isal_zlib.crc32
"""CRC-32 as ``zlib.crc32`` computes it (the same values), by ISA-L: 6-8x faster here (carry-less
multiply), and it releases the GIL. The weights' checksums bound how fast a binary opens: a
1.1 GiB binary took 0.3-0.6 s to verify with zlib."""
crc32_combine = isal_zlib.crc32_combine
"""``crc32_combine(crc(A), crc(B), len(B)) == crc(A + B)``, as zlib's C function of that name."""

MAGIC = b"NPUSIMCB"

HEADER = struct.Struct("<8sHHIIIQQ32s128s64sI")
"""magic, format major, format minor, header size, header crc32, section count,
section table offset, file size, SDK version, hardware architecture, config digest,
section table crc32."""

HEADER_SIZE = 320
"""Bytes reserved for the header; the bytes after ``HEADER.size`` are reserved (written as 0)."""

HEADER_CRC_OFFSET = 16
"""Byte offset of the header crc32, which covers the header with this field read as zero."""

SECTION = struct.Struct("<IIQQII")
"""kind, flags (reserved, 0), offset, length, CRC-32 of the section's bytes, reserved (0)."""

SECTION_ALIGN = 8
WEIGHT_ALIGN = 512
"""Weights blobs start at multiples of this many bytes from the start of the file."""

MAX_GAP = WEIGHT_ALIGN
"""Bytes between consecutive parts of a file are alignment padding: zero and fewer than this."""

WEIGHT_MAX_PAD = 4096
"""A writer pads between a program's consecutive weights as the program's WEIGHTS region does
(so a loader moves a run of them as one DMA) only while the padding is shorter than this."""

CHECKSUMS_HEAD = struct.Struct("<II")
"""WEIGHT_CHECKSUMS section: block size, block count; followed by ``count`` u32 CRC-32s."""

WEIGHTS_BLOCK = 4 * 1024 * 1024
"""Block size a writer uses for the weights' block checksums (verified in parallel)."""

MIN_BLOCK = 4096
MAX_BLOCK = 1 << 30
"""A block size is a power of two in ``[MIN_BLOCK, MAX_BLOCK]``."""

STR_COUNT = struct.Struct("<I")
STR_LEN = struct.Struct("<I")
GRAPH_COUNT = struct.Struct("<I")
GRAPH = struct.Struct("<IIQQ")
"""name string id, reserved, record offset in PROGRAMS, record length."""

PROGRAM = struct.Struct("<IIQQQIIIII")
"""hardware architecture string id, reserved, arena bytes, commands offset in COMMANDS,
commands length, tensor count, launch count, input count, output count, weight count."""

TENSOR = struct.Struct("<IBBHQ")
"""name string id, dtype code, region, rank, offset; followed by ``rank`` u64 dimensions."""
TENSOR_RANK_AT = struct.calcsize("<IBB")
"""Where a TENSOR record's u16 rank starts."""

WEIGHT = struct.Struct("<IIQQ")
"""tensor index, source (0: WEIGHTS; k >= 1: entry k - 1 of EXTERNAL_WEIGHTS, format 2.2), blob
offset (in WEIGHTS, or in the external file), blob length."""

EXTERNAL = struct.Struct("<IIQQ32s")
"""EXTERNAL_WEIGHTS entry (format 2.2): file string id (path relative to the binary's folder),
reserved, offset in the file, length, SHA-256 of the weight's bytes."""

LAUNCH = struct.Struct("<IIHHI")
"""op string id, node string id, input count, output count, attribute count; followed by
the input and output tensor indices (i32, -1 = omitted) and the attributes."""

LAUNCH_COUNTS = struct.Struct("<HH")
"""The input and output counts of a LAUNCH record, at :data:`LAUNCH_COUNTS_AT` of it."""
LAUNCH_COUNTS_AT = struct.calcsize("<II")

ATTR = struct.Struct("<IB")
"""attribute name string id, tag; followed by the tag's payload."""

COUNT = struct.Struct("<I")
I64 = struct.Struct("<q")
F64 = struct.Struct("<d")


class SectionKind(IntEnum):
    """What a section holds. Readers skip kinds they do not know (see the versioning policy)."""

    STRINGS = 1
    GRAPHS = 2
    PROGRAMS = 3
    COMMANDS = 4
    WEIGHTS = 5
    WEIGHT_CHECKSUMS = 6
    GRAPH_DIGESTS = 7
    EXTERNAL_WEIGHTS = 8


REQUIRED_SECTIONS = tuple(k for k in SectionKind
                          if k not in (SectionKind.GRAPH_DIGESTS, SectionKind.EXTERNAL_WEIGHTS))
"""Kinds 1-6; GRAPH_DIGESTS (format 2.1) and EXTERNAL_WEIGHTS (2.2) are optional, so older
files still read."""

DIGEST_SIZE = 32
"""GRAPH_DIGESTS section: u32 count (the graph count), then one SHA-256 per graph in GRAPHS
order."""


class AttrTag(IntEnum):
    """Type tag of an attribute value; the payload follows the tag."""

    INT = 1  # i64
    FLOAT = 2  # f64
    STRING = 3  # u32 string id
    BYTES = 4  # u32 length, bytes
    INTS = 5  # u32 count, count x i64
    FLOATS = 6  # u32 count, count x f64
    STRINGS = 7  # u32 count, count x u32 string id


@dataclass(frozen=True)
class ContextHeader:
    """The decoded fixed header of a context binary."""

    magic: bytes
    format_version: tuple[int, int]
    header_size: int
    header_crc32: int
    section_count: int
    section_table_offset: int
    file_size: int
    sdk_version: str
    hardware_architecture: str
    config_digest: str
    section_table_crc32: int


@dataclass(frozen=True)
class SectionEntry:
    """One row of the section table. ``kind`` is an int so unknown kinds survive decoding."""

    kind: int
    offset: int
    length: int
    crc32: int

    @property
    def kind_name(self) -> str:
        """The section kind's name, or ``unknown(N)``."""
        try:
            return SectionKind(self.kind).name.lower()
        except ValueError:
            return f"unknown({self.kind})"


def align_up(value: int, alignment: int) -> int:
    """``value`` rounded up to a multiple of ``alignment``."""
    return -(-value // alignment) * alignment


def section_alignment(kind: int) -> int:
    """Alignment of a section's offset in the file."""
    return WEIGHT_ALIGN if kind == SectionKind.WEIGHTS else SECTION_ALIGN
