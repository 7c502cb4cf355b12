"""Reading context binaries: validate everything, then hand out programs with zero-copy weights.

:class:`ContextBinary` opens a file through ``mmap`` (:meth:`ContextBinary.open`) or wraps bytes
already in memory (:meth:`ContextBinary.from_bytes`, for EPContext embed mode). Opening checks
the whole file before anything is used: magic, format and SDK versions, hardware architecture,
header and section-table crc32s, the size, every section's bounds, alignment and CRC-32 (the
weights' per block, from the WEIGHT_CHECKSUMS table, on a checksum thread while the records are
decoded; with ``defer_weights`` until :meth:`ContextBinary.verify_weights`), the padding
between parts, and every record of every program. Each count and
length is checked against the bytes that remain *before* anything is allocated from it, so a
corrupt or hostile file costs at most its own size in memory and time. Every failure raises
:class:`ep.errors.InvalidGraph` saying what was wrong; nothing is unpickled or evaluated.

The weights of the returned programs are read-only memoryviews into the mapping (or into the
given bytes): loading a binary copies no weights.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import mmap
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ep.errors import InvalidGraph
from firmware_model.program import Program
from firmware_model.upload import drop_resident

from . import binary_layout as L
from .binary_records import Decoder
from .external_weights import ExternalFiles, ExternalWeightFile, open_external
from .version import FORMAT_VERSION, READABLE_MAJORS, SDK_VERSION, sdk_major


@dataclass(frozen=True)
class WeightsSummary:
    """How the weights blob is shared: ``referenced_bytes`` counts every program's weights,
    ``distinct_bytes`` each distinct blob once, ``section_bytes`` includes alignment padding."""

    blobs: int
    references: int
    referenced_bytes: int
    distinct_bytes: int
    section_bytes: int


def _text(raw: bytes, field: str) -> str:
    text = raw.rstrip(b"\0")
    try:
        if b"\0" in text:
            raise ValueError
        return text.decode("utf-8")
    except ValueError:
        raise InvalidGraph(
            f"header {field} {raw!r} is not a NUL-padded UTF-8 string without NUL"
        ) from None


def _parse_header(view: memoryview, expected_architecture: str | None,
                  expected_config_digest: str | None) -> L.ContextHeader:
    size = len(view)
    head = bytes(view[: len(L.MAGIC)])
    if head != L.MAGIC[: len(head)]:
        raise InvalidGraph(
            f"not an npu-sim context binary: magic {head!r}, expected {L.MAGIC!r}"
        )
    if size < L.HEADER_SIZE:
        raise InvalidGraph(
            f"truncated context binary: {size} bytes, shorter than the {L.HEADER_SIZE}-byte header"
        )
    fields = L.HEADER.unpack_from(view, 0)
    major, minor, header_size, header_crc = fields[1:5]
    if major not in READABLE_MAJORS:
        relation = "newer" if major > FORMAT_VERSION[0] else "older"
        raise InvalidGraph(
            f"format version {major}.{minor} is {relation} than this SDK supports "
            f"({' or '.join(f'{m}.x' for m in READABLE_MAJORS)})"
        )
    if not L.HEADER_SIZE <= header_size <= size:
        raise InvalidGraph(
            f"header size {header_size} is out of range [{L.HEADER_SIZE}, {size}] "
            "(file size)"
        )
    covered = bytearray(view[:header_size])
    covered[L.HEADER_CRC_OFFSET : L.HEADER_CRC_OFFSET + 4] = bytes(4)
    computed = L.crc32(covered)
    if computed != header_crc:
        raise InvalidGraph(
            f"header checksum mismatch: stored crc32 0x{header_crc:08x}, computed 0x{computed:08x}"
        )
    header = L.ContextHeader(
        magic=fields[0], format_version=(major, minor), header_size=header_size,
        header_crc32=header_crc, section_count=fields[5], section_table_offset=fields[6],
        file_size=fields[7], sdk_version=_text(fields[8], "sdk_version"),
        hardware_architecture=_text(fields[9], "hardware_architecture"),
        config_digest=_text(fields[10], "config_digest"), section_table_crc32=fields[11],
    )
    if header.file_size != size:
        state = "truncated context binary" if size < header.file_size else "size mismatch"
        raise InvalidGraph(f"{state}: header says {header.file_size} bytes, file has {size}")
    try:
        theirs = sdk_major(header.sdk_version)
    except ValueError:
        raise InvalidGraph(f"header sdk_version {header.sdk_version!r} is not MAJOR.MINOR.PATCH") \
            from None
    if theirs != sdk_major(SDK_VERSION):
        raise InvalidGraph(
            f"context binary was built by SDK {header.sdk_version}, this SDK is {SDK_VERSION}: "
            "major versions must match; recompile the model"
        )
    if expected_architecture is not None and header.hardware_architecture != expected_architecture:
        raise InvalidGraph(
            f"context binary was compiled for hardware architecture "
            f"{header.hardware_architecture!r}, this device is {expected_architecture!r}; "
            "recompile the model for this device"
        )
    if expected_config_digest is not None and header.config_digest != expected_config_digest:
        raise InvalidGraph(
            f"context binary was compiled for device config {header.config_digest!r}, this "
            f"device's config is {expected_config_digest!r}; recompile the model"
        )
    return header


def _parse_sections(view: memoryview, header: L.ContextHeader) -> list[L.SectionEntry]:
    size = len(view)
    count, table_offset = header.section_count, header.section_table_offset
    table_end = table_offset + count * L.SECTION.size
    if table_offset < header.header_size or table_end > size:
        raise InvalidGraph(
            f"section table of {count} entries at offset {table_offset} does not fit in the "
            f"file: it must lie within [{header.header_size}, {size}]"
        )
    computed = L.crc32(view[table_offset:table_end])
    if computed != header.section_table_crc32:
        raise InvalidGraph(
            f"section table checksum mismatch: stored crc32 0x{header.section_table_crc32:08x}, "
            f"computed 0x{computed:08x}"
        )
    sections = []
    for i in range(count):
        kind, _flags, offset, length, crc, _reserved = L.SECTION.unpack_from(
            view, table_offset + i * L.SECTION.size)
        entry = L.SectionEntry(kind, offset, length, crc)
        alignment = L.section_alignment(kind)
        if offset + length > size or offset % alignment:
            raise InvalidGraph(
                f"section #{i} ({entry.kind_name}) at offset {offset} with length {length} is "
                f"out of range or misaligned: it must end by {size} (file size) and start at a "
                f"multiple of {alignment}"
            )
        sections.append(entry)
    _check_tiling(view, header, sections)
    for i, entry in enumerate(sections):
        if entry.kind == L.SectionKind.WEIGHTS:
            continue  # verified block by block, see _weight_blocks
        computed = L.crc32(view[entry.offset : entry.offset + entry.length])
        if computed != entry.crc32:
            raise InvalidGraph(
                f"checksum mismatch in section #{i} ({entry.kind_name}): stored crc32 "
                f"0x{entry.crc32:08x}, computed 0x{computed:08x}"
            )
    return sections


def _check_tiling(view: memoryview, header: L.ContextHeader,
                  sections: list[L.SectionEntry]) -> None:
    """Header, table and sections must not overlap; what lies between them is short zero padding,
    so every byte of a valid file is covered by a check."""
    parts = [("header", 0, header.header_size),
             ("section table", header.section_table_offset,
              header.section_table_offset + header.section_count * L.SECTION.size)]
    parts += [(f"section {s.kind_name}", s.offset, s.offset + s.length) for s in sections]
    parts.sort(key=lambda part: (part[1], part[2]))
    parts.append(("end of file", len(view), len(view)))
    for (name, _, end), (next_name, start, _) in itertools.pairwise(parts):
        if start < end:
            raise InvalidGraph(f"{name} (ends at {end}) overlaps {next_name} (starts at {start})")
        if start - end >= L.MAX_GAP or any(view[end:start]):
            raise InvalidGraph(
                f"{start - end} bytes between {name} and {next_name} at offset {end} are not "
                f"alignment padding (fewer than {L.MAX_GAP} zero bytes)"
            )


_KINDS = {int(kind): kind for kind in L.SectionKind}
"""The section kinds this reader knows (it skips others), by number."""

_WORKERS = 1
"""One checksum thread: on the two cores these loads are measured on, a second one took the
core the loading thread needed (BERT's load spent 3-7 ms waiting to be scheduled)."""


_SEGMENT = 448 << 20
"""The most bytes of weight blocks one CRC-32 call checks (but for one block larger than this,
up to ``L.MAX_BLOCK``, checked alone). A run of blocks is checked by one call and compared with
the blocks' stored CRC-32s combined (``L.crc32_combine``, ISA-L's); a mismatch is then located
block by block, and reported as before.

What a run's check guarantees: CRC-32 has Hamming distance 3 below 2^32 bits (512 MiB), so it
detects every error of up to 2 bits in the run and every burst of up to 32 bits, and misses any
other error pattern with probability 2^-32. That is weaker than a check per block for patterns
of 3 or more bit errors spread over several blocks: the blocks' checks catch such a pattern
whenever one block holds at most 2 of its bits (or only a burst of up to 32), the run's may not
(4 flipped bits in 4 different 4 KiB blocks of a 128 KiB run can cancel out). Runs are kept for
speed: a call per block made BERT's load wait on the GIL between calls (``_HEAD``)."""

_HEAD = 3 / 4
"""The share of the weights the thread checks in its first call. A call releases the GIL once;
between calls the thread needs it back, and waits up to the 5 ms switch interval while the
loading thread runs Python (a call per 4 MiB block kept BERT's thread waiting more than
working). So the thread checks most of the weights in one call while the load goes on, and
the rest in ``_TAIL`` runs that the loading thread, once it waits, shares with it (from the
back; neither holds the GIL long then)."""

_TAIL = 8
"""The runs the weights after the first call are split into (see ``_HEAD``)."""

_WHOLE = 64 << 20
"""Weights up to this size are checked in one call: about 3 ms, less than the rest of a load
takes, so a tail would only wait for the loading thread (EfficientNet's 21 MiB)."""


@functools.cache
def _pool() -> ThreadPoolExecutor:
    """The checksum thread (``_WORKERS``, one), verifying weight blocks beside the loading
    thread (``L.crc32`` releases the GIL); started once, not per load: starting threads per
    load cost ~2.5 ms of a ~20 ms EPContext load, more on a busy machine."""
    return ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="npu_sim-crc")


if hasattr(os, "register_at_fork"):
    # A forked child has none of the parent's threads: the parent's pool would queue its checks
    # for a thread that never comes (each load then checked inline by the waiter, and the queued
    # items kept views of every binary opened there). The child starts a thread of its own.
    os.register_at_fork(after_in_child=_pool.cache_clear)


@dataclass(frozen=True)
class _Block:
    """One checksummed block of the weights section: file range ``[start, end)``."""

    section: int  # index in the section table
    index: int
    start: int
    end: int
    offset: int  # of the block in the section
    crc32: int

    def error(self, computed: int) -> InvalidGraph:
        return InvalidGraph(
            f"checksum mismatch in section #{self.section} (weights), block {self.index} "
            f"(bytes [{self.offset}, {self.offset + self.end - self.start}) of the section): "
            f"stored crc32 0x{self.crc32:08x}, computed 0x{computed:08x}"
        )


def _weight_blocks(view: memoryview, section: int, weights: L.SectionEntry,
                   checksums: L.SectionEntry) -> list[_Block]:
    """The weights section's blocks and their stored CRC-32s, from the (already verified)
    WEIGHT_CHECKSUMS section, which must describe exactly this weights section."""
    body = view[checksums.offset : checksums.offset + checksums.length]
    where = "section weight_checksums"
    if len(body) < L.CHECKSUMS_HEAD.size:
        raise InvalidGraph(f"{where}: {len(body)} bytes, shorter than its "
                           f"{L.CHECKSUMS_HEAD.size}-byte head")
    block, count = L.CHECKSUMS_HEAD.unpack_from(body, 0)
    if not L.MIN_BLOCK <= block <= L.MAX_BLOCK or block & (block - 1):
        raise InvalidGraph(f"{where}: block size {block} is not a power of two in "
                           f"[{L.MIN_BLOCK}, {L.MAX_BLOCK}]")
    expected = -(-weights.length // block)
    if count != expected:
        raise InvalidGraph(f"{where}: {count} blocks, expected {expected} for {weights.length} "
                           f"bytes of weights in blocks of {block}")
    if len(body) != L.CHECKSUMS_HEAD.size + 4 * count:
        raise InvalidGraph(f"{where}: {len(body)} bytes, expected "
                           f"{L.CHECKSUMS_HEAD.size + 4 * count} for {count} checksums")
    crcs = struct.unpack_from(f"<{count}I", body, L.CHECKSUMS_HEAD.size)
    return [_Block(section, i, weights.offset + i * block,
                   weights.offset + min((i + 1) * block, weights.length), i * block, crc)
            for i, crc in enumerate(crcs)]


def _verify(blocks: list[_Block], crcs: list[int]) -> None:
    """Raise the error of the first block whose computed CRC-32 is not the stored one."""
    bad = next((k for k, b in enumerate(blocks) if crcs[k] != b.crc32), None)
    if bad is not None:
        raise blocks[bad].error(crcs[bad]) from None


def _runs(blocks: list[_Block]) -> list[list[_Block]]:
    """Consecutive blocks grouped into runs, one block at least each: a first run of about
    ``_HEAD`` of the bytes (all up to ``_WHOLE``), then runs of a ``_TAIL``-th of the rest; none
    over ``_SEGMENT`` but a single block larger than it (a file's blocks may be up to
    ``L.MAX_BLOCK``, 1 GiB), which is a run alone, checked against its own stored CRC-32."""
    if not blocks:
        return []
    total = blocks[-1].end - blocks[0].start
    limit = min(max(int(total * _HEAD), _WHOLE), _SEGMENT)
    tail = min(max(-(-(total - limit) // _TAIL), 1), _SEGMENT)
    runs: list[list[_Block]] = []
    for block in blocks:
        if runs and block.end - runs[-1][0].start <= limit:
            runs[-1].append(block)
        else:
            limit = limit if not runs else tail
            runs.append([block])
    return runs


def _combined(run: list[_Block]) -> int:
    """The CRC-32 of a run of blocks, from their stored CRC-32s."""
    crc = run[0].crc32
    for block in run[1:]:
        crc = L.crc32_combine(crc, block.crc32, block.end - block.start)
    return crc


class _Checks:
    """The weights section's CRC-32s, one call per run of blocks (see ``_HEAD``), on the
    checksum thread; whoever waits computes the runs the thread has not started yet itself
    instead of idling. Every size goes to the thread: checked inline before decoding, MobileNet-
    V3's 10 MiB made its load 5.0 -> 5.4 ms and EfficientNet's 21 MiB 7.0 -> 8.3 ms (medians)."""

    def __init__(self, view: memoryview, blocks: list[_Block], mapping: mmap.mmap | None) -> None:
        """``mapping``: the file mapping ``view`` covers from its first byte, if any."""
        self._pid = os.getpid()
        self._runs = _runs(blocks)
        self._mapping = mapping
        self._views = [view[run[0].start : run[-1].end] for run in self._runs]
        self._futures = [_pool().submit(_crc32_then_drop, v, mapping, run[0].start)
                         for v, run in zip(self._views, self._runs, strict=True)]
        if self._futures:
            time.sleep(0)  # hand the GIL over: the thread starts now, not 5 ms into decoding

    def wait(self) -> None:
        """Every run checked; raise the first bad block's error (the views into the binary are
        released first), or, when no block of a bad run is bad read again, that run's."""
        futures, self._futures = self._futures, []
        views, self._views = self._views, []
        crcs: list[int | None] = [None] * len(futures)
        forked = os.getpid() != self._pid  # the thread running a run is the parent's: gone
        for k in reversed(range(len(futures))):  # from the back, while the thread goes on
            if forked or futures[k].cancel():
                crcs[k] = _crc32_then_drop(views[k], self._mapping, self._runs[k][0].start)
        expected = [_combined(run) for run in self._runs]  # while the thread finishes its run
        crcs = [f.result() if crc is None else crc for f, crc in zip(futures, crcs, strict=True)]
        bad = [k for k in range(len(crcs)) if crcs[k] != expected[k]]
        if bad:  # the error path: find the first bad block of the first bad run
            run, whole = self._runs[bad[0]], views[bad[0]]
            base = run[0].start
            block_crcs = [L.crc32(whole[b.start - base : b.end - base]) for b in run]
            views.clear()
            del whole
            _verify(run, block_crcs)
            raise _changed_error(run, crcs[bad[0]], expected[bad[0]])
        views.clear()


def _changed_error(run: list[_Block], computed: int, expected: int) -> InvalidGraph:
    """A run whose CRC-32 was wrong while each of its blocks, read again, is right: its bytes
    changed between the reads (a file rewritten under its mapping)."""
    first, last = run[0], run[-1]
    return InvalidGraph(
        f"checksum mismatch in section #{first.section} (weights), bytes [{first.offset}, "
        f"{last.offset + last.end - last.start}) of the section (blocks {first.index} to "
        f"{last.index}): computed crc32 0x{computed:08x}, the blocks' stored crc32s combine to "
        f"0x{expected:08x}, but every block matched when read again: the bytes changed while "
        "they were checked (was the file modified during the load?)"
    )


def _crc32_then_drop(block: memoryview, mapping: mmap.mmap | None, start: int) -> int:
    """The CRC-32 of a run of weight blocks; a mapped run's pages then leave the resident set (they
    stay in the page cache): opening a binary does not hold its weights in memory twice.

    ``block`` is ``mapping[start:...]`` when the binary was opened from a file: its pages are
    dropped by offset (about 5 us); without ``mapping`` (bytes given to ``from_bytes``),
    ``drop_resident`` finds out whether they are a mapping's (about 20-90 us of numpy, which the
    thread ran holding the GIL the loading thread needs)."""
    crc = L.crc32(block)
    if mapping is None:
        drop_resident(block)
        return crc
    page = mmap.PAGESIZE
    lo, hi = -(-start // page) * page, (start + len(block)) // page * page
    if hi > lo:
        with contextlib.suppress(OSError, ValueError):  # closed: nothing left to drop
            mapping.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    return crc


class ContextBinary:
    """A validated context binary: its header, section table and one program per graph.

    Build it with :meth:`open` (mmap a file) or :meth:`from_bytes` (embed mode). The programs'
    ``weights`` are read-only memoryviews into the underlying buffer. :meth:`close` releases the
    mapping; weight views handed out earlier keep it alive until they are dropped.
    """

    def __init__(self, data: bytes | bytearray | memoryview, *,
                 expected_architecture: str | None = None,
                 expected_config_digest: str | None = None, source: str = "<bytes>",
                 external_folder: str | os.PathLike[str] | None = None,
                 defer_weights: bool = False, _mapping: mmap.mmap | None = None) -> None:
        self.source = source
        self._checks: _Checks | None = None
        self._weights_error: InvalidGraph | None = None  # a bad block, once found
        self._mapping = _mapping
        self._closed = False
        view = memoryview(data).cast("B").toreadonly()
        external_folder = None if external_folder is None else Path(external_folder)
        self._external = ExternalFiles()
        self.header = _parse_header(view, expected_architecture, expected_config_digest)
        self.sections = _parse_sections(view, self.header)
        by_kind: dict[L.SectionKind, L.SectionEntry] = {}
        for entry in self.sections:
            if entry.kind in by_kind:
                raise InvalidGraph(f"section {entry.kind_name} appears more than once")
            kind = _KINDS.get(entry.kind)
            if kind is not None:
                by_kind[kind] = entry
        missing = [kind.name.lower() for kind in L.REQUIRED_SECTIONS if kind not in by_kind]
        if missing:
            raise InvalidGraph(f"required sections missing: {', '.join(missing)}")
        weights = by_kind[L.SectionKind.WEIGHTS]
        blocks = _weight_blocks(view, self.sections.index(weights), weights,
                                by_kind[L.SectionKind.WEIGHT_CHECKSUMS])
        decoder = Decoder(view, by_kind)
        self._external = open_external(decoder.external_refs(), external_folder)
        decoder.external = self._external.views
        self.external_weights = list(self._external.listing)
        """Every external weight the binary refers to (path, size, offset, id), in its order."""
        # The weights' blocks are verified while the records are decoded (and, with
        # ``defer_weights``, while the caller goes on until verify_weights); a bad block is
        # reported first (checksums come before records): whatever fails once the checks run
        # waits for them.
        checks = _Checks(view, blocks, _mapping)
        try:
            programs = decoder.graphs()
            self._sources = decoder.sources
            self._digests = decoder.digests(list(programs))
            self.weights_summary = WeightsSummary(
                blobs=len(decoder.blobs), references=len(decoder.references),
                referenced_bytes=sum(decoder.references),
                distinct_bytes=sum(length for _, _, length in decoder.blobs),
                section_bytes=by_kind[L.SectionKind.WEIGHTS].length,
            )
        except BaseException:
            checks.wait()
            raise
        if not defer_weights:
            checks.wait()
        self._programs = programs
        self._checks = checks if defer_weights else None

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, *,
                   expected_architecture: str | None = None,
                   expected_config_digest: str | None = None,
                   external_folder: str | os.PathLike[str] | None = None,
                   defer_weights: bool = False) -> ContextBinary:
        """Validate and wrap a binary held in memory (weights become views into ``data``, or
        into its external weight files, found relative to ``external_folder``;
        ``defer_weights`` as for :meth:`open`)."""
        return cls(data, expected_architecture=expected_architecture,
                   expected_config_digest=expected_config_digest,
                   external_folder=external_folder, defer_weights=defer_weights)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, expected_architecture: str | None = None,
             expected_config_digest: str | None = None,
             defer_weights: bool = False) -> ContextBinary:
        """Map the file at ``path`` read-only and validate it.

        ``expected_architecture`` / ``expected_config_digest``, when given, must equal what the
        binary was compiled for. ``defer_weights``: the weights' blocks may still be being
        checksummed on the thread when this returns; the caller must call
        :meth:`verify_weights` before the load it is part of succeeds, and may meanwhile only
        place the weights, not compute with them.
        """
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except OSError as exc:
            raise InvalidGraph(f"cannot open context binary {os.fspath(path)!r}: "
                               f"{exc.strerror}") from None
        try:
            return cls(mapping if mapping is not None else b"", source=os.fspath(path),
                       expected_architecture=expected_architecture,
                       expected_config_digest=expected_config_digest,
                       external_folder=Path(path).parent, defer_weights=defer_weights,
                       _mapping=mapping)
        except BaseException:
            _release(mapping)
            raise

    def verify_weights(self) -> None:
        """Wait for the weight blocks still being checksummed (opened with ``defer_weights``);
        a bad block raises :class:`~ep.errors.InvalidGraph` naming it, as opening would have,
        and so does every later call. Returns at once when nothing is pending."""
        checks, self._checks = self._checks, None
        if checks is not None:
            try:
                checks.wait()
            except InvalidGraph as exc:
                self._weights_error = exc
        if self._weights_error is not None:
            raise InvalidGraph(self._weights_error.message)

    def graph_names(self) -> list[str]:
        """The graph names, in file order."""
        self._check_open()
        return list(self._programs)

    def program(self, name: str) -> Program:
        """The program of graph ``name``."""
        self._check_open()
        try:
            return self._programs[name]
        except KeyError:
            raise InvalidGraph(
                f"no graph named {name!r} in context binary {self.source}; "
                f"graphs: {self.graph_names()}"
            ) from None

    def graph_digest(self, name: str) -> str | None:
        """The recorded digest of graph ``name`` (:func:`~ep.npusim.binary_writer.graph_digest`),
        or None in a format 2.0 file, which records none."""
        self._check_open()
        return self._digests.get(name)

    def external_weights_of(self, name: str) -> dict[int, ExternalWeightFile]:
        """The weights of graph ``name`` kept in external files: tensor index -> its file,
        size, offset and id (empty when its weights are in the binary)."""
        self._check_open()
        return {t: self.external_weights[k] for t, k in self._sources.get(name, {}).items()}

    def programs(self) -> list[Program]:
        """Every program, in file order."""
        self._check_open()
        return list(self._programs.values())

    def close(self) -> None:
        """Release the mapping (it stays alive while weight views are still referenced)."""
        with contextlib.suppress(InvalidGraph):  # closing, not loading: nothing is reported
            self.verify_weights()
        self._closed = True
        self._programs = {}
        mapping, self._mapping = self._mapping, None
        _release(mapping)
        self._external.close()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidGraph(f"context binary {self.source} is closed")

    def __enter__(self) -> ContextBinary:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _release(mapping: mmap.mmap | None) -> None:
    """Close ``mapping`` now if no view into it is alive; otherwise the last view closes it."""
    if mapping is not None:
        with contextlib.suppress(BufferError):
            mapping.close()
