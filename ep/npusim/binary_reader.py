"""Reading context binaries: validate everything, then hand out programs with zero-copy weights.

:class:`ContextBinary` opens a file through ``mmap`` (:meth:`ContextBinary.open`) or wraps bytes
already in memory (:meth:`ContextBinary.from_bytes`, for EPContext embed mode). Opening checks
the whole file before anything is used: magic, format and SDK versions, hardware architecture,
header and section-table crc32s, the size, every section's bounds, alignment and CRC-32 (the
weights' per block, from the WEIGHT_CHECKSUMS table, on a checksum thread while the records are
decoded; with ``defer_weights`` until :meth:`ContextBinary.verify_weights`; not again for a file
whose weights were checked whole and whose status has not changed since,
:mod:`~ep.npusim.verified_files`), the padding between parts, and every record of every
program. Each count and length is checked against the bytes that remain *before* anything is
allocated from it, so a corrupt or hostile file costs at most its own size in memory and time.
Every failure raises :class:`ep.errors.InvalidGraph` saying what was wrong; nothing is unpickled
or evaluated.

The weights of the returned programs are read-only memoryviews into the mapping (or into the
given bytes): loading a binary copies no weights.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ep.errors import InvalidArgument, InvalidGraph
from ep.framework.files import open_regular
from firmware_model.program import Program
from firmware_model.validate import validate_structure

from . import binary_cache
from . import binary_layout as L
from .binary_records import Decoder
from .external_weights import ExternalFiles, ExternalWeightFile, open_external
from .verified_files import VERIFIED, FileIdentity
from .version import FORMAT_VERSION, READABLE_MAJORS, SDK_VERSION, sdk_major
from .weight_checks import BlockChecks, checksum_table, start_thread


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


def _parse_sections(view: memoryview, header: L.ContextHeader,
                    ) -> tuple[list[L.SectionEntry], dict[int, bytes]]:
    """The section table, every entry checked, and a copy of each metadata section's bytes
    (:data:`~ep.npusim.binary_cache.METADATA`) by its index in the table: their CRC-32 is
    computed over the copy, which is also what is decoded and what keys the cache, so the
    bytes checked, the key and the records decoded are one snapshot even if the file changes
    while it is being read."""
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
    copies: dict[int, bytes] = {}
    for i, entry in enumerate(sections):
        if entry.kind == L.SectionKind.WEIGHTS:
            continue  # verified block by block, see weight_checks.checksum_table
        body = view[entry.offset : entry.offset + entry.length]
        if entry.kind in binary_cache.METADATA:
            body = copies[i] = body.tobytes()
        computed = L.crc32(body)
        if computed != entry.crc32:
            raise InvalidGraph(
                f"checksum mismatch in section #{i} ({entry.kind_name}): stored crc32 "
                f"0x{entry.crc32:08x}, computed 0x{computed:08x}"
            )
    return sections, copies


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


def _read_table(view: memoryview, expected_architecture: str | None,
                expected_config_digest: str | None,
                ) -> tuple[L.ContextHeader, list[L.SectionEntry],
                           dict[L.SectionKind, L.SectionEntry], dict[L.SectionKind, bytes]]:
    """The header, the section table, the known sections by kind, all checked, and the
    checked copies of the metadata sections by kind (see :func:`_parse_sections`)."""
    header = _parse_header(view, expected_architecture, expected_config_digest)
    sections, copies = _parse_sections(view, header)
    by_kind: dict[L.SectionKind, L.SectionEntry] = {}
    metadata: dict[L.SectionKind, bytes] = {}
    for i, entry in enumerate(sections):
        if entry.kind in by_kind:
            raise InvalidGraph(f"section {entry.kind_name} appears more than once")
        kind = _KINDS.get(entry.kind)
        if kind is not None:
            by_kind[kind] = entry
            if i in copies:
                metadata[kind] = copies[i]
    missing = [kind.name.lower() for kind in L.REQUIRED_SECTIONS if kind not in by_kind]
    if missing:
        raise InvalidGraph(f"required sections missing: {', '.join(missing)}")
    return header, sections, by_kind, metadata


def _views(metadata: dict[L.SectionKind, bytes]) -> dict[L.SectionKind, memoryview]:
    """What :class:`~ep.npusim.binary_records.Decoder` reads: views of the checked copies that
    key the cache, never of the (possibly changing) file."""
    return {kind: memoryview(body) for kind, body in metadata.items()}


def remember(path: str | os.PathLike[str] | None = None, *,
             data: bytes | None = None) -> None:
    """Decode the context binary just written at ``path`` (or held in ``data``, embed mode)
    into :data:`~ep.npusim.binary_cache.DECODED`, so its first load finds its records decoded.
    It decodes the file's own bytes, as a load does (the same function on the same bytes), and
    reads only its metadata.
    The programs' structure is validated for the firmware's loader
    (:func:`~firmware_model.validate.validate_structure`), and the checksum thread started,
    for the same first load.

    Give exactly one of ``path`` and ``data`` (else :class:`~ep.errors.InvalidArgument`).
    Nothing else is reported: a file that cannot be read or decoded is not kept, and its load
    says why."""
    if (path is None) == (data is None):
        raise InvalidArgument(
            f"remember() takes exactly one of path and data, got "
            f"{'both' if data is not None else 'neither'}")
    start_thread()
    mapping = None
    try:
        if data is None:
            with open(path, "rb") as f:
                mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        view = memoryview(mapping if mapping is not None else data).cast("B").toreadonly()
        header, _, by_kind, metadata = _read_table(view, None, None)
        section = by_kind[L.SectionKind.WEIGHTS]
        weights = view[section.offset : section.offset + section.length]
        key = binary_cache.key(header.format_version, metadata, len(weights))
        if binary_cache.DECODED.get(key) is None:
            decoder = Decoder(_views(metadata), len(weights))
            decoder.external_refs()
            decoded = decoder.decode()
            binary_cache.DECODED.put(key, decoded)
            for name, template in decoded.programs.items():
                if name not in decoded.sources:  # its weights are all in the binary
                    validate_structure(template.bind(weights, ()))
    except (OSError, ValueError, InvalidGraph):
        return
    finally:  # views into the mapping, released before closing it
        view = weights = decoder = None
        _release(mapping)


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
                 defer_weights: bool = False, _mapping: mmap.mmap | None = None,
                 _file: tuple[FileIdentity, int] | None = None, _recheck: bool = False) -> None:
        """``_file``: the identity of the file ``_mapping`` maps and the clock read before its
        status was (:mod:`~ep.npusim.verified_files`); ``_recheck``: check the weights even if
        that file is trusted."""
        self.source = source
        self._checks: BlockChecks | None = None
        self._file = _file  # recorded as verified once every weight block matched
        self._mapping = _mapping
        self._closed = False
        view = memoryview(data).cast("B").toreadonly()
        external_folder = None if external_folder is None else Path(external_folder)
        self._external = ExternalFiles()
        self.header, self.sections, by_kind, metadata = _read_table(
            view, expected_architecture, expected_config_digest)
        weights = by_kind[L.SectionKind.WEIGHTS]
        table = checksum_table(view, self.sections.index(weights), weights,
                               by_kind[L.SectionKind.WEIGHT_CHECKSUMS])
        weights_body = view[weights.offset : weights.offset + weights.length]
        key = binary_cache.key(self.header.format_version, metadata, weights.length)
        decoded = binary_cache.DECODED.get(key)
        decoder = Decoder(_views(metadata), weights.length) if decoded is None else None
        refs = decoder.external_refs() if decoder is not None else decoded.external_refs
        self._external = open_external(refs, external_folder)
        self.external_weights = list(self._external.listing)
        """Every external weight the binary refers to (path, size, offset, id), in its order."""
        # The weights' blocks are verified while the records are decoded (and, with
        # ``defer_weights``, while the caller goes on until verify_weights); a bad block is
        # reported first (checksums come before records): whatever fails once the checks run
        # waits for them.
        if _file is None or _recheck or not VERIFIED.trusted(_file[0]):
            self._checks = BlockChecks(view, table.blocks(), _mapping)
        try:
            if decoder is not None:
                decoded = decoder.decode()
                binary_cache.DECODED.put(key, decoded)
            external = self._external.views
            programs = {name: template.bind(weights_body, external)
                        for name, template in decoded.programs.items()}
            self._sources = decoded.sources
            self._digests = decoded.digests
            self.weights_summary = WeightsSummary(
                blobs=decoded.blobs, references=decoded.references,
                referenced_bytes=decoded.referenced_bytes,
                distinct_bytes=decoded.distinct_bytes, section_bytes=weights.length)
        except BaseException:
            self.verify_weights()
            raise
        if not defer_weights:
            self.verify_weights()
        self._programs = programs

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
             defer_weights: bool = False, recheck: bool = False) -> ContextBinary:
        """Map the file at ``path`` read-only and validate it.

        ``expected_architecture`` / ``expected_config_digest``, when given, must equal what the
        binary was compiled for. ``defer_weights``: the weights' blocks may still be being
        checksummed on the thread when this returns; the caller must call
        :meth:`verify_weights` before the load it is part of succeeds, and may meanwhile only
        place the weights, not compute with them. The weights of a file checked whole before
        and unchanged since are not read again (:mod:`~ep.npusim.verified_files`) unless
        ``recheck``.
        """
        try:  # a FIFO there is refused, not waited on (open_regular)
            clock = time.time_ns()
            fd, status = open_regular(path)
            with open(fd, "rb") as f:
                size = status.st_size
                mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except OSError as exc:
            raise InvalidGraph(f"cannot open context binary {os.fspath(path)!r}: "
                               f"{exc.strerror}") from None
        try:
            return cls(mapping if mapping is not None else b"", source=os.fspath(path),
                       expected_architecture=expected_architecture,
                       expected_config_digest=expected_config_digest,
                       external_folder=Path(path).parent, defer_weights=defer_weights,
                       _mapping=mapping, _file=(FileIdentity.of(status), clock),
                       _recheck=recheck)
        except BaseException:
            _release(mapping)
            raise

    def verify_weights(self) -> None:
        """Wait for the weight blocks still being checksummed (opened with ``defer_weights``);
        a bad block raises :class:`~ep.errors.InvalidGraph` naming it, as opening would have,
        and so does every later call. Returns at once when nothing is pending."""
        if self._checks is not None:
            self._checks.wait()
            if self._file is not None:
                VERIFIED.record(*self._file)
                self._file = None

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
