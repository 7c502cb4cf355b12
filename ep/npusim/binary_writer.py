"""Writing context binaries: many compiled programs and their weights in one file.

:func:`pack_context` encodes a sequence of :class:`~firmware_model.program.Program` into the
layout of ``docs/binary_format.md``; :func:`write_context_binary` writes the same bytes to a
file atomically. Weights are stored once per distinct content (by sha256) across every program
of the file, each 512-byte aligned, and are streamed to the file from the programs' own buffers
rather than copied into one big intermediate blob.

Bad input (a duplicate graph name, a tensor index out of range, an attribute of a type the format
has no tag for, a value that does not fit its field) raises :class:`ep.errors.InvalidArgument`
naming the graph and the field.
"""

from __future__ import annotations

import hashlib
import os
import struct
import weakref
from collections.abc import Sequence
from numbers import Integral, Real
from pathlib import Path

from ep.errors import InvalidArgument
from ep.framework.files import atomic_write
from firmware_model.program import AttrValue, KernelLaunch, Program, TensorDesc
from npu_sim import dtypes
from npu_sim.errors import ConfigError

from . import binary_layout as L
from .external_weights import ExternalSpec, ExternalWeightFile, WeightWriter
from .version import SDK_VERSION, format_version

Buffer = bytes | bytearray | memoryview


class _Strings:
    """The string table being built: each distinct string once, referenced by index."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def add(self, text: str) -> int:
        if not isinstance(text, str):
            raise InvalidArgument(f"expected a string, got {type(text).__name__} {text!r}")
        return self._ids.setdefault(text, len(self._ids))

    def encode(self) -> bytes:
        encoded = [s.encode("utf-8") for s in self._ids]
        out = bytearray(L.STR_COUNT.pack(len(encoded)))
        for raw in encoded:
            out += L.STR_LEN.pack(len(raw))
        for raw in encoded:
            out += raw
        return bytes(out)


class _Weights:
    """The weights blob being built: distinct contents, each at a 512-byte aligned offset."""

    def __init__(self) -> None:
        self._by_digest: dict[bytes, int] = {}
        self.known: dict[int, bytes] = {}
        """SHA-256 by ``key`` (the id of a program's weight object) of every weight added, so the
        graph digests need not hash the weights again."""
        self.pieces: list[Buffer] = []
        self.size = 0

    def add(self, data: Buffer, target: int | None = None,
            key: int | None = None) -> tuple[int, int]:
        """``(source, offset)`` of ``data``'s blob: source 0 (WEIGHTS) and its offset, added if
        new: at ``target`` (the distance the program's layout puts it from its previous weight)
        when that is aligned, free and pads less than ``WEIGHT_MAX_PAD``, else at the next
        aligned offset."""
        digest = self.known.get(key) if key is not None else None
        if digest is None:
            digest = hashlib.sha256(data).digest()
            if key is not None:
                self.known[key] = digest
        if digest in self._by_digest:
            return 0, self._by_digest[digest]
        offset = L.align_up(self.size, L.WEIGHT_ALIGN)
        if target is not None and target % L.WEIGHT_ALIGN == 0 and \
                offset <= target < self.size + L.WEIGHT_MAX_PAD:
            offset = target
        if offset > self.size:
            self.pieces.append(bytes(offset - self.size))
        self.pieces.append(data)
        self.size = offset + len(data)
        self._by_digest[digest] = offset
        return 0, offset


class _ExternalWeights(_Weights):
    """The weights blob of a binary whose weights live in external files: each non-empty weight
    is an EXTERNAL_WEIGHTS entry (its file and offset fixed by :class:`WeightWriter` before the
    layout); empty ones stay in WEIGHTS (a file of 0 bytes would hold nothing to check)."""

    def __init__(self, locations: dict[str, tuple[str, int]], digests: dict[int, str],
                 strings: _Strings, base: Path) -> None:
        super().__init__()
        self._base = base
        self._locations = locations
        self._digests = digests  # id of a program's weight buffer -> its sha256 (hex)
        self._strings = strings
        self._entries: dict[str, int] = {}  # sha256 -> entry index
        self.table = bytearray()
        self.listing: list[ExternalWeightFile] = []

    def add(self, data: Buffer, target: int | None = None,
            key: int | None = None) -> tuple[int, int]:
        if not len(data):
            return super().add(data, target)
        digest = self._digests.get(key) if key is not None else None
        digest = digest or hashlib.sha256(data).hexdigest()
        if key is not None:
            self.known[key] = bytes.fromhex(digest)
        file, offset = self._locations[digest]
        if digest not in self._entries:
            self._entries[digest] = len(self._entries)
            self.table += L.EXTERNAL.pack(self._strings.add(file), 0, offset, len(data),
                                          bytes.fromhex(digest))
            self.listing.append(ExternalWeightFile(str(self._base / file), len(data), offset,
                                                   digest))
        return self._entries[digest] + 1, offset

    def section(self) -> bytes:
        return L.COUNT.pack(len(self._entries)) + bytes(self.table)

def _pack(layout: struct.Struct, *values: object, what: str) -> bytes:
    try:
        return layout.pack(*values)
    except struct.error:
        raise InvalidArgument(f"{what}: values {values} do not fit the binary format") from None


def _index_list(values: Sequence[int], n_tensors: int, lowest: int, what: str) -> bytes:
    for value in values:
        if not isinstance(value, Integral) or not lowest <= value < n_tensors:
            raise InvalidArgument(
                f"{what}: tensor index {value!r} is out of range [{lowest}, {n_tensors})"
            )
    return struct.pack(f"<{len(values)}i", *values)


def _encode_attr(name: str, value: AttrValue, strings: _Strings, what: str) -> bytes:
    where = f"{what}, attribute {name!r}"
    tag, payload = _attr_payload(value, strings, where)
    return L.ATTR.pack(strings.add(name), tag) + payload


def _attr_payload(value: AttrValue, strings: _Strings, where: str) -> tuple[int, bytes]:
    if isinstance(value, str):
        return L.AttrTag.STRING, L.COUNT.pack(strings.add(value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return L.AttrTag.BYTES, _pack(L.COUNT, len(data), what=where) + data
    if isinstance(value, Integral):
        return L.AttrTag.INT, _pack(L.I64, int(value), what=where)
    if isinstance(value, Real):
        return L.AttrTag.FLOAT, L.F64.pack(float(value))
    if isinstance(value, (tuple, list)):
        items = list(value)
        count = L.COUNT.pack(len(items))
        if all(isinstance(v, Integral) for v in items):
            return L.AttrTag.INTS, count + _pack(
                struct.Struct(f"<{len(items)}q"), *map(int, items), what=where)
        if all(isinstance(v, Real) and not isinstance(v, Integral) for v in items):
            return L.AttrTag.FLOATS, count + struct.pack(f"<{len(items)}d", *map(float, items))
        if all(isinstance(v, str) for v in items):
            ids = [strings.add(v) for v in items]
            return L.AttrTag.STRINGS, count + struct.pack(f"<{len(ids)}I", *ids)
        kinds = sorted({type(v).__name__ for v in items})
        raise InvalidArgument(
            f"{where}: a list must hold only ints, only floats or only strings, got {kinds}"
        )
    raise InvalidArgument(
        f"{where}: {type(value).__name__} is not an attribute type; expected int, float, str, "
        "bytes or a tuple of int, float or str"
    )


def _encode_tensor(t: TensorDesc, strings: _Strings, what: str) -> bytes:
    try:
        code = dtypes.code(t.dtype)
    except ConfigError:
        raise InvalidArgument(
            f"{what}: dtype {t.dtype!r} is not one of {list(dtypes.DTYPES)}"
        ) from None
    shape = tuple(t.shape)
    head = _pack(L.TENSOR, strings.add(t.name), code, int(t.region), len(shape), t.offset,
                 what=what)
    return head + _pack(struct.Struct(f"<{len(shape)}Q"), *shape, what=f"{what} shape")


def _encode_launch(k: KernelLaunch, n_tensors: int, strings: _Strings, what: str) -> bytes:
    attrs = dict(k.attrs)
    out = bytearray(_pack(L.LAUNCH, strings.add(k.op), strings.add(k.node), len(k.inputs),
                          len(k.outputs), len(attrs), what=what))
    out += _index_list(k.inputs, n_tensors, -1, f"{what} inputs")
    out += _index_list(k.outputs, n_tensors, -1, f"{what} outputs")
    for name, value in attrs.items():
        out += _encode_attr(name, value, strings, what)
    return bytes(out)


def _encode_program(p: Program, strings: _Strings, weights: _Weights,
                    commands: list[bytes], commands_size: int) -> bytes:
    what = f"graph {p.name!r}"
    n = len(p.tensors)
    for key in p.weights:
        if not isinstance(key, Integral) or not 0 <= key < n:
            raise InvalidArgument(f"{what} weights: tensor index {key!r} is out of range [0, {n})")
    stream = bytes(p.commands)
    commands.append(stream)
    out = bytearray(_pack(
        L.PROGRAM, strings.add(p.hardware_architecture), 0, p.arena_bytes, commands_size,
        len(stream), n, len(p.launches), len(p.inputs), len(p.outputs), len(p.weights),
        what=what,
    ))
    for i, t in enumerate(p.tensors):
        out += _encode_tensor(t, strings, f"{what} tensor {i}")
    out += _index_list(p.inputs, n, 0, f"{what} inputs")
    out += _index_list(p.outputs, n, 0, f"{what} outputs")
    # Blobs are added in the program's WEIGHTS order with its distances, so that a loader can
    # move runs of them as single DMAs; the records list them by tensor index.
    placed: dict[int, tuple[int, int]] = {}
    previous: tuple[int, int] | None = None  # (WEIGHTS offset, blob offset) of the last weight
    for index in sorted(p.weights, key=lambda i: (p.tensors[i].offset, i)):
        data = p.weights[index]
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument(
                f"{what} weight of tensor {index}: expected bytes, got {type(data).__name__}"
            )
        view = memoryview(data).cast("B")
        at = p.tensors[index].offset
        source, blob = weights.add(view, None if previous is None else
                                   previous[1] + at - previous[0], key=id(data))
        placed[index] = (source, blob, len(view))
        if source == 0:
            previous = (at, blob)
    for index in sorted(placed):
        out += L.WEIGHT.pack(index, *placed[index])
    for i, launch in enumerate(p.launches):
        out += _encode_launch(launch, n, strings, f"{what} launch {i}")
    return bytes(out)


class _WeightHashes:
    """Stands in for :class:`_Weights` when a program is encoded for its digest: every blob at
    offset 0 (so the record does not depend on a binary's layout), each content's SHA-256 kept."""

    def __init__(self, known: dict[int, bytes]) -> None:
        self.digests: list[bytes] = []
        self.known = known

    def add(self, data: Buffer, target: int | None = None,
            key: int | None = None) -> tuple[int, int]:
        known = self.known.get(key) if key is not None else None
        if known is None:
            known = hashlib.sha256(data).digest()
            if key is not None:
                self.known[key] = known
        self.digests.append(known)
        return 0, 0


_DIGESTS: dict[int, tuple[weakref.ref[Program], str, dict[int, bytes]]] = {}
"""Per live program (by id): its graph digest and its weights' SHA-256s (by id of the weight
object), so a program's weights are hashed once at compile whichever comes first, the binary
or the EPContext node's ``notes``. An entry leaves with its program."""


def _recall(program: Program) -> tuple[str, dict[int, bytes]] | None:
    entry = _DIGESTS.get(id(program))
    if entry is None or entry[0]() is not program:
        return None
    return entry[1], entry[2]


def graph_digest(program: Program, known: dict[int, bytes] | None = None) -> str:
    """The identity of a compiled graph: SHA-256 of its program record (as encoded alone, with
    its own string table), its command stream and the SHA-256 of each of its weights. The same
    program gives the same digest in any binary; any change to what it computes changes it.
    EPContext nodes record it and loading checks it against the binary's GRAPH_DIGESTS.
    ``known`` maps ids of the program's weight objects to SHA-256s computed already; the
    result is remembered while ``program`` lives (programs are immutable)."""
    recalled = _recall(program)
    if recalled is not None:
        return recalled[0]
    strings, commands = _Strings(), []
    ids = {id(data) for data in program.weights.values()}
    weights = _WeightHashes({k: v for k, v in (known or {}).items() if k in ids})
    record = _encode_program(program, strings, weights, commands, 0)  # type: ignore[arg-type]
    digest = hashlib.sha256()
    for part in (program.name.encode("utf-8"), strings.encode(), record, *commands):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    for blob in weights.digests:
        digest.update(blob)
    key = id(program)
    _DIGESTS[key] = (weakref.ref(program, lambda _ref: _DIGESTS.pop(key, None)),
                     digest.hexdigest(), weights.known)
    return digest.hexdigest()


def _header_text(value: str, size: int, field: str) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else b"\0"
    if len(raw) > size or b"\0" in raw:
        raise InvalidArgument(
            f"{field} {value!r} must be a string of at most {size} UTF-8 bytes without NUL"
        )
    return raw


def _block_checksums(pieces: Sequence[Buffer], block: int) -> bytes:
    """The WEIGHT_CHECKSUMS section of the weights blob made of ``pieces``: the CRC-32 of each
    ``block``-byte block (the last one shorter)."""
    crcs: list[int] = []
    crc, filled = 0, 0
    for piece in pieces:
        view = memoryview(piece).cast("B")
        while len(view):
            take = min(block - filled, len(view))
            crc, filled, view = L.crc32(view[:take], crc), filled + take, view[take:]
            if filled == block:
                crcs.append(crc)
                crc, filled = 0, 0
    if filled:
        crcs.append(crc)
    return L.CHECKSUMS_HEAD.pack(block, len(crcs)) + struct.pack(f"<{len(crcs)}I", *crcs)


def _external(programs: Sequence[Program], spec: ExternalSpec,
              strings: _Strings) -> _ExternalWeights:
    """Write the programs' non-empty weights to the weight folder (:class:`WeightWriter`) and
    return the weights blob that refers to them."""
    writer = WeightWriter(spec)
    digests: dict[int, str] = {}
    for p in programs:
        for data in p.weights.values():
            if id(data) not in digests and isinstance(data, (bytes, bytearray, memoryview)):
                view = memoryview(data).cast("B")
                if len(view):
                    digests[id(data)] = writer.add(view)
    return _ExternalWeights(writer.commit(), digests, strings, spec.binary_folder)


def _layout(programs: Sequence[Program], hardware_architecture: str, config_digest: str,
            sdk_version: str, weights_block: int = L.WEIGHTS_BLOCK,
            external: ExternalSpec | None = None) -> tuple[list[Buffer], list[ExternalWeightFile]]:
    """The file as a list of pieces whose concatenation is the binary, and the external
    weights it refers to (with ``external``, after writing them)."""
    if not isinstance(weights_block, int) or not L.MIN_BLOCK <= weights_block <= L.MAX_BLOCK \
            or weights_block & (weights_block - 1):
        raise InvalidArgument(f"weights_block {weights_block!r} must be a power of two in "
                              f"[{L.MIN_BLOCK}, {L.MAX_BLOCK}]")
    arch = _header_text(hardware_architecture, 128, "hardware_architecture")
    digest = _header_text(config_digest, 64, "config_digest")
    sdk = _header_text(sdk_version, 32, "sdk_version")
    strings = _Strings()
    weights = _Weights() if external is None else _external(programs, external, strings)
    for p in programs:  # weights the EPContext notes hashed already
        recalled = _recall(p)
        if recalled is not None:
            weights.known.update(recalled[1])
    commands: list[bytes] = []
    commands_size = 0
    graphs = bytearray(L.GRAPH_COUNT.pack(len(programs)))
    digests = bytearray(L.GRAPH_COUNT.pack(len(programs)))
    records = bytearray()
    seen: set[str] = set()
    for p in programs:
        if p.name in seen:
            raise InvalidArgument(f"graph name {p.name!r} appears more than once")
        seen.add(p.name)
        record = _encode_program(p, strings, weights, commands, commands_size)
        commands_size += len(commands[-1])
        graphs += L.GRAPH.pack(strings.add(p.name), 0, len(records), len(record))
        records += record
        digests += bytes.fromhex(graph_digest(p, weights.known))
    sections: list[tuple[L.SectionKind, list[Buffer]]] = [
        (L.SectionKind.STRINGS, [strings.encode()]),
        (L.SectionKind.GRAPHS, [bytes(graphs)]),
        (L.SectionKind.PROGRAMS, [bytes(records)]),
        (L.SectionKind.COMMANDS, commands),
        (L.SectionKind.WEIGHTS, weights.pieces),
        (L.SectionKind.WEIGHT_CHECKSUMS, [_block_checksums(weights.pieces, weights_block)]),
        (L.SectionKind.GRAPH_DIGESTS, [bytes(digests)]),
    ]
    if isinstance(weights, _ExternalWeights):
        sections.append((L.SectionKind.EXTERNAL_WEIGHTS, [weights.section()]))
    table_offset = L.HEADER_SIZE
    position = table_offset + L.SECTION.size * len(sections)
    body: list[Buffer] = []
    table = bytearray()
    for kind, pieces in sections:
        offset = L.align_up(position, L.section_alignment(kind))
        body.append(bytes(offset - position))
        crc, length = 0, 0
        for piece in pieces:
            crc = L.crc32(piece, crc)
            length += len(piece)
        if kind == L.SectionKind.WEIGHTS:
            crc = 0  # covered block by block by WEIGHT_CHECKSUMS
        body.extend(pieces)
        table += L.SECTION.pack(kind, 0, offset, length, crc, 0)
        position = offset + length
    header = bytearray(L.HEADER_SIZE)
    version = format_version({name for p in programs for k in p.launches for name in k.attrs})
    L.HEADER.pack_into(header, 0, L.MAGIC, *version, L.HEADER_SIZE, 0, len(sections),
                       table_offset, position, sdk, arch, digest, L.crc32(table))
    struct.pack_into("<I", header, L.HEADER_CRC_OFFSET, L.crc32(header))
    listing = weights.listing if isinstance(weights, _ExternalWeights) else []
    return [bytes(header), bytes(table), *body], listing


def pack_context(programs: Sequence[Program], *, hardware_architecture: str,
                 config_digest: str = "", sdk_version: str = SDK_VERSION,
                 weights_block: int = L.WEIGHTS_BLOCK,
                 external: ExternalSpec | None = None) -> bytes:
    """Encode ``programs`` (one per graph, distinct names) into a context binary.

    ``hardware_architecture`` is the device config name the programs were compiled for (readers
    may require it to match); ``config_digest`` the :attr:`DeviceConfig.digest` of that config.
    ``weights_block`` is the block size of the weights' checksums (a power of two).
    With ``external`` the weights are written to its folder (:mod:`ep.npusim.external_weights`)
    and the binary refers to them.
    """
    return b"".join(_layout(programs, hardware_architecture, config_digest, sdk_version,
                            weights_block, external)[0])


def pack_context_listing(programs: Sequence[Program], *, hardware_architecture: str,
                         config_digest: str = "", external: ExternalSpec | None = None,
                         ) -> tuple[bytes, list[ExternalWeightFile]]:
    """:func:`pack_context`, and the external weights the bytes refer to."""
    pieces, listing = _layout(programs, hardware_architecture, config_digest, SDK_VERSION,
                              external=external)
    return b"".join(pieces), listing


def write_context_binary(path: str | os.PathLike[str], programs: Sequence[Program], *,
                         hardware_architecture: str, config_digest: str = "",
                         sdk_version: str = SDK_VERSION,
                         external: ExternalSpec | None = None) -> list[ExternalWeightFile]:
    """Write ``programs`` as a context binary at ``path``, atomically.

    The bytes go to a temporary file in the same folder, which is fsynced and then renamed over
    ``path``; on any error the temporary file is removed and ``path`` is left as it was.
    With ``external`` the weights go to external files first (their folder keeps what it wrote:
    content-addressed, listed in its meta.json, harmless); returns those weights.
    """
    pieces, listing = _layout(programs, hardware_architecture, config_digest, sdk_version,
                              external=external)
    atomic_write(path, pieces)
    return listing


__all__ = ["graph_digest", "pack_context", "pack_context_listing", "write_context_binary"]
