"""Decoding the metadata sections of a context binary: strings, graph index, program records.

Runs after :mod:`ep.npusim.binary_reader` has checked the header, the section table and every
section's bounds and checksum; what is checked here is the *content*: every count against the
bytes left in its section before reading (so nothing is allocated from an unchecked length),
every string id, tensor index, dtype code, region, attribute tag and weight blob reference.
Failures raise :class:`ep.errors.InvalidGraph` naming the graph and record.
"""

from __future__ import annotations

import contextlib
import itertools
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from ep.errors import InvalidGraph
from firmware_model.program import AttrValue, KernelLaunch, Program, Region, TensorDesc
from npu_sim import dtypes

from . import binary_layout as L
from .external_weights import ExternalRef

_TAGS = frozenset(L.AttrTag)
"""Valid attribute tags (built once: iterating the enum per attribute cost ~1 ms a load)."""
_INT, _FLOAT, _STRING, _BYTES, _INTS, _FLOATS, _STRINGS = (
    int(L.AttrTag.INT), int(L.AttrTag.FLOAT), int(L.AttrTag.STRING), int(L.AttrTag.BYTES),
    int(L.AttrTag.INTS), int(L.AttrTag.FLOATS), int(L.AttrTag.STRINGS))


_REGIONS = {int(r): r for r in Region}

_new = object.__new__
"""The fast loops build their records as ``_new(cls)`` and ``__dict__.update(fields)`` (as
``commands.unpack`` does): the same frozen dataclass instance as ``cls(**fields)``, in a
quarter of its time (``TensorDesc``: 1.5 -> 0.35 us); every field has been checked by then."""

_MAX_RANK = 8
_RANKED = tuple(struct.Struct(f"{L.TENSOR.format}{rank}Q") for rank in range(_MAX_RANK + 1))
"""A tensor record with its dimensions, for the ranks a fast loop reads in one call."""

_MAX_IO = 16
_IO: dict[tuple[int, int], struct.Struct] = {}
"""A launch record's head and its input and output indices by (inputs, outputs), each count at
most ``_MAX_IO`` (so a hostile file adds at most 289 small entries); more are read in parts."""

_ATTR_HEAD = struct.Struct(L.ATTR.format + "I")
"""An attribute's name id, tag and first u32 of its payload (every tag's payload has 4 bytes at
least): a STRING's string id, or the count of a BYTES, INTS, FLOATS or STRINGS value."""
_ATTR_SIZE = L.ATTR.size

_MAX_ITEMS = 16
_ITEMS = {code: tuple(struct.Struct(f"<{n}{code}") for n in range(_MAX_ITEMS + 1))
          for code in "qdI"}
"""Attribute arrays of up to ``_MAX_ITEMS`` items, by item code."""


def _items(code: str, n: int) -> struct.Struct:
    return _ITEMS[code][n] if n <= _MAX_ITEMS else struct.Struct(f"<{n}{code}")


class _Cursor:
    """Reads packed records from one section, refusing to run past its end; each read names
    what it reads (``what``), for the error. The tables' fast loops (:meth:`Decoder.tensors`,
    :meth:`Decoder.launches`) do not go through it: a cursor reads headers, and a table's
    records only once the fast loop has found one wrong, to name what is wrong."""

    def __init__(self, view: memoryview, where: str) -> None:
        self.view = view
        self.pos = 0
        self.where = where

    def need(self, nbytes: int, what: str) -> None:
        left = len(self.view) - self.pos
        if nbytes > left:
            raise InvalidGraph(
                f"{self.where}: {what} needs {nbytes} bytes at offset {self.pos}, only {left} "
                "remain"
            )

    def take(self, layout: struct.Struct, what: str) -> tuple:
        self.need(layout.size, what)
        values = layout.unpack_from(self.view, self.pos)
        self.pos += layout.size
        return values

    def array(self, code: str, count: int, what: str) -> tuple:
        nbytes = count * struct.calcsize(code)
        if nbytes > len(self.view) - self.pos:
            self.need(nbytes, f"{count} x {what}")
        values = struct.unpack_from(f"<{count}{code}", self.view, self.pos)
        self.pos += nbytes
        return values

    def raw(self, nbytes: int, what: str) -> bytes:
        self.need(nbytes, what)
        data = self.view[self.pos : self.pos + nbytes].tobytes()
        self.pos += nbytes
        return data

    def finish(self) -> None:
        if self.pos != len(self.view):
            raise InvalidGraph(
                f"{self.where}: {len(self.view) - self.pos} unexpected bytes after offset "
                f"{self.pos}"
            )


def _parse_strings(view: memoryview) -> list[str]:
    cur = _Cursor(view, "section strings")
    (count,) = cur.take(L.STR_COUNT, "string count")
    lengths = cur.array("I", count, "string length")
    ends = list(itertools.accumulate(lengths))
    if not ends or ends[-1] <= len(view) - cur.pos:  # all there: one copy, sliced
        raw = cur.raw(ends[-1] if ends else 0, "strings")
        with contextlib.suppress(UnicodeDecodeError):  # else the loop names the string
            if raw.isascii():  # byte offsets are character offsets: decoded once, sliced
                text = raw.decode("ascii")
                strings = [text[a:b] for a, b in itertools.pairwise([0, *ends])]
            else:
                strings = [raw[a:b].decode("utf-8") for a, b in itertools.pairwise([0, *ends])]
            cur.finish()
            return strings
        cur.pos -= len(raw)
    strings = []
    for i, length in enumerate(lengths):
        raw = cur.raw(length, f"string {i}")
        try:
            strings.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise InvalidGraph(f"section strings: string {i} is not valid UTF-8") from None
    cur.finish()
    return strings


WeightSpec = tuple[int, int, int, int]
"""A program's weight as its record says: tensor index, source (0: the WEIGHTS section; k >= 1:
external entry k - 1), offset and length."""


@dataclass(frozen=True)
class Template:
    """A decoded program without its weights' bytes: every :class:`Program` field but
    ``weights`` (and its ``weights_bytes``), and where each weight lies (:data:`WeightSpec`).
    Holds no view of the binary, only values decoded from it."""

    fields: Mapping[str, object]
    weights: tuple[WeightSpec, ...]

    def bind(self, weights: memoryview, external: Sequence[memoryview]) -> Program:
        """The program, its weights views of ``weights`` (the WEIGHTS section of this load's
        binary) and of ``external`` (this load's views of the EXTERNAL_WEIGHTS entries)."""
        program = _new(Program)
        program.__dict__.update(self.fields)
        program.__dict__["weights"] = {
            index: weights[offset : offset + length] if source == 0 else external[source - 1]
            for index, source, offset, length in self.weights}
        return program


@dataclass(frozen=True)
class Decoded:
    """Everything a context binary's records decode to that does not depend on where the
    binary lies: a function of the metadata sections' bytes and the weights section's length
    alone (:mod:`ep.npusim.binary_cache` keeps it across loads, and shares it between them).
    Immutable: tuples, strings, numbers, bytes, frozen records and read-only mappings
    (``MappingProxyType``, also each launch's ``attrs``) of them."""

    programs: Mapping[str, Template]
    external_refs: tuple[ExternalRef, ...]
    sources: Mapping[str, Mapping[int, int]]
    """Graph -> tensor -> EXTERNAL_WEIGHTS entry, for weights kept in external files."""
    digests: Mapping[str, str]
    blobs: int
    references: int
    referenced_bytes: int
    distinct_bytes: int


class Decoder:
    """Decodes the graph index and program records once the sections are known to be sound.

    ``bodies`` holds the bytes of each metadata section by kind (the WEIGHTS section need not
    be there: only its length, ``weights_length``, matters to the records)."""

    def __init__(self, bodies: Mapping[L.SectionKind, memoryview], weights_length: int):
        self.strings = _parse_strings(bodies[L.SectionKind.STRINGS])
        self.programs_view = bodies[L.SectionKind.PROGRAMS]
        self.commands_view = bodies[L.SectionKind.COMMANDS]
        self.weights_length = weights_length
        self.graphs_view = bodies[L.SectionKind.GRAPHS]
        self.digests_view = bodies.get(L.SectionKind.GRAPH_DIGESTS)
        self.external_view = bodies.get(L.SectionKind.EXTERNAL_WEIGHTS)
        self.external_refs_cache: list[ExternalRef] = []
        self.sources: dict[str, dict[int, int]] = {}  # graph -> tensor -> external entry
        self.blobs: set[tuple[int, int, int]] = set()  # distinct (source, offset, length)
        self.references: list[int] = []

    def decode(self) -> Decoded:
        """Every graph's program template, digest and weight references (call
        :meth:`external_refs` first)."""
        programs = self.graphs()
        return Decoded(
            programs=MappingProxyType(programs), external_refs=tuple(self.external_refs_cache),
            sources=MappingProxyType({name: MappingProxyType(tensors)
                                      for name, tensors in self.sources.items()}),
            digests=MappingProxyType(self.digests(list(programs))), blobs=len(self.blobs),
            references=len(self.references), referenced_bytes=sum(self.references),
            distinct_bytes=sum(length for _, _, length in self.blobs))

    def external_refs(self) -> list[ExternalRef]:
        """The EXTERNAL_WEIGHTS entries (format 2.2; none in older files)."""
        if self.external_view is None:
            return []
        cur = _Cursor(self.external_view, "section external_weights")
        (count,) = cur.take(L.COUNT, "entry count")
        cur.need(count * L.EXTERNAL.size, f"{count} entries")
        refs = []
        for i in range(count):
            file_id, _, offset, length, digest = cur.take(L.EXTERNAL, f"entry {i}")
            file = self.string(file_id, f"section external_weights, entry {i}")
            refs.append(ExternalRef(file, offset, length, digest))
        cur.finish()
        self.external_refs_cache = refs
        return refs

    def string(self, index: int, where: str) -> str:
        if index >= len(self.strings):
            raise InvalidGraph(
                f"{where}: string id {index} is out of range "
                f"[0, {len(self.strings)})"
            )
        return self.strings[index]

    def digests(self, names: list[str]) -> dict[str, str]:
        """Graph name -> its recorded digest (hex); empty for a 2.0 file, which has none."""
        if self.digests_view is None:
            return {}
        cur = _Cursor(self.digests_view, "section graph_digests")
        (count,) = cur.take(L.GRAPH_COUNT, "digest count")
        if count != len(names):
            raise InvalidGraph(f"section graph_digests: {count} digests for {len(names)} graphs")
        raw = cur.raw(count * L.DIGEST_SIZE, f"{count} digests")
        cur.finish()
        return {name: raw[i * L.DIGEST_SIZE:(i + 1) * L.DIGEST_SIZE].hex()
                for i, name in enumerate(names)}

    def graphs(self) -> dict[str, Template]:
        cur = _Cursor(self.graphs_view, "section graphs")
        (count,) = cur.take(L.GRAPH_COUNT, "graph count")
        cur.need(count * L.GRAPH.size, f"{count} graph entries")
        programs: dict[str, Template] = {}
        for i in range(count):
            name_id, _, offset, length = cur.take(L.GRAPH, f"graph entry {i}")
            name = self.string(name_id, f"section graphs, entry {i}")
            if name in programs:
                raise InvalidGraph(f"section graphs: graph name {name!r} appears twice")
            if offset + length > len(self.programs_view):
                raise InvalidGraph(
                    f"graph {name!r}: program record at {offset} with length {length} runs past "
                    f"the programs section ({len(self.programs_view)} bytes)"
                )
            record = self.programs_view[offset : offset + length]
            programs[name] = self.program(name, _Cursor(record, f"graph {name!r}"))
        cur.finish()
        return programs

    def indices(self, cur: _Cursor, count: int, n_tensors: int, lowest: int,
                what: str) -> tuple[int, ...]:
        values = cur.array("i", count, what)
        if values and (min(values) < lowest or max(values) >= n_tensors):
            value = next(v for v in values if not lowest <= v < n_tensors)
            raise InvalidGraph(
                f"{cur.where}: {what} {value} is out of range "
                f"[{lowest}, {n_tensors})"
            )
        return values

    def program(self, name: str, cur: _Cursor) -> Template:
        (arch_id, _, arena, cmd_offset, cmd_length, n_tensors, n_launches, n_inputs, n_outputs,
         n_weights) = cur.take(L.PROGRAM, "program header")
        if cmd_offset + cmd_length > len(self.commands_view):
            raise InvalidGraph(
                f"{cur.where}: command stream at {cmd_offset} with length {cmd_length} runs past "
                f"the commands section ({len(self.commands_view)} bytes)"
            )
        cur.need(n_tensors * L.TENSOR.size, f"{n_tensors} tensors")
        tensors = self.tensors(cur, n_tensors)
        inputs = self.indices(cur, n_inputs, n_tensors, 0, "input tensor index")
        outputs = self.indices(cur, n_outputs, n_tensors, 0, "output tensor index")
        cur.need(n_weights * L.WEIGHT.size, f"{n_weights} weights")
        table = cur.view[cur.pos : cur.pos + n_weights * L.WEIGHT.size]
        cur.pos += len(table)
        weights: dict[int, WeightSpec] = {}
        for index, source, offset, length in L.WEIGHT.iter_unpack(table):
            if index >= n_tensors or index in weights:
                raise InvalidGraph(
                    f"{cur.where}: weight tensor index {index} is out of range [0, {n_tensors}) "
                    "or repeated"
                )
            if source == 0:
                self.blob(offset, length, cur.where, index)
            else:
                self.external_blob(source, offset, length, cur.where, index)
                self.sources.setdefault(name, {})[index] = source - 1
            weights[index] = (index, source, offset, length)
        cur.need(n_launches * L.LAUNCH.size, f"{n_launches} launches")
        launches = self.launches(cur, n_launches, n_tensors)
        cur.finish()
        in_weights = Region.WEIGHTS
        return Template(MappingProxyType({
            "name": name, "tensors": tensors, "launches": launches,
            "commands": self.commands_view[cmd_offset : cmd_offset + cmd_length].tobytes(),
            "inputs": inputs, "outputs": outputs, "arena_bytes": arena,
            "hardware_architecture": self.string(arch_id, cur.where),
            "weights_bytes": max((t.offset + t.nbytes for t in tensors if t.region is in_weights),
                                 default=0),
        }), tuple(weights.values()))

    def blob(self, offset: int, length: int, where: str, index: int) -> None:
        """Check the weight of tensor ``index`` in the weights section (``where``: the
        program's label, completed only when the blob is wrong)."""
        if offset % L.WEIGHT_ALIGN or offset + length > self.weights_length:
            raise InvalidGraph(
                f"{where}, weight of tensor {index}: blob at {offset} with length {length} "
                f"must start at a multiple of {L.WEIGHT_ALIGN} and end by "
                f"{self.weights_length} (weights section size)"
            )
        self.blobs.add((0, offset, length))
        self.references.append(length)

    def external_blob(self, source: int, offset: int, length: int, where: str,
                      index: int) -> None:
        """Check the weight of tensor ``index`` in external file entry ``source - 1``; offset
        and length must be the entry's."""
        refs = self.external_refs_cache
        if not 1 <= source <= len(refs) or (refs[source - 1].offset, refs[source - 1].length) \
                != (offset, length):
            raise InvalidGraph(
                f"{where}, weight of tensor {index}: source {source} at {offset} with length "
                f"{length} names no external weight; expected 0 (weights section) or an entry "
                f"in [1, {len(refs)}] with the entry's offset and length")
        self.blobs.add((source, offset, length))
        self.references.append(length)

    # Tables are read by a fast loop that checks everything but names nothing; at the first
    # record it finds wrong (or any it does not handle) the record-by-record reader below takes
    # over from that record and reports what is wrong (a small model's load spent ~1 ms on
    # building the readers' labels and calls).

    def tensors(self, cur: _Cursor, count: int) -> tuple[TensorDesc, ...]:
        view, strings, regions, names = cur.view, self.strings, _REGIONS, dtypes.DTYPES
        ranked, size, rank_at, out = _RANKED, L.TENSOR.size, L.TENSOR_RANK_AT, []
        pos = cur.pos
        try:
            for _ in range(count):
                rank = view[pos + rank_at] | view[pos + rank_at + 1] << 8  # u16, little-endian
                if rank <= _MAX_RANK:
                    record = ranked[rank].unpack_from(view, pos)
                    shape = record[5:]
                else:
                    record = L.TENSOR.unpack_from(view, pos)
                    shape = struct.unpack_from(f"<{rank}Q", view, pos + size)
                tensor = _new(TensorDesc)
                tensor.__dict__.update({
                    "name": strings[record[0]], "shape": shape, "dtype": names[record[1]],
                    "region": regions[record[2]], "offset": record[4]})
                out.append(tensor)
                pos += size + 8 * rank
        except (struct.error, IndexError, KeyError):
            pass
        cur.pos = pos
        out.extend(self.tensor(cur, i) for i in range(len(out), count))
        return tuple(out)

    def launches(self, cur: _Cursor, count: int, n_tensors: int) -> tuple[KernelLaunch, ...]:
        out: list[KernelLaunch] = []
        for i in range(count):
            try:
                out.append(self._launch_unnamed(cur, n_tensors))
            except (struct.error, IndexError, ValueError):  # names what is wrong, or decodes
                out.append(self.launch(cur, i, n_tensors))
        return tuple(out)

    def _launch_unnamed(self, cur: _Cursor, n_tensors: int) -> KernelLaunch:
        """One well-formed launch, or ValueError / IndexError / struct.error with ``cur`` left
        at its start (:meth:`launch` then names what is wrong)."""
        view, strings, pos = cur.view, self.strings, cur.pos
        n_in, n_out = L.LAUNCH_COUNTS.unpack_from(view, pos + L.LAUNCH_COUNTS_AT)
        layout = _IO.get((n_in, n_out))
        if layout is None and n_in <= _MAX_IO and n_out <= _MAX_IO:
            layout = _IO[n_in, n_out] = struct.Struct(f"{L.LAUNCH.format}{n_in + n_out}i")
        if layout is not None:
            record = layout.unpack_from(view, pos)
            op_id, node_id, n_attrs = record[0], record[1], record[4]
            ios = record[5:]
            pos += layout.size
        else:
            op_id, node_id, _, _, n_attrs = L.LAUNCH.unpack_from(view, pos)
            ios = struct.unpack_from(f"<{n_in + n_out}i", view, pos + L.LAUNCH.size)
            pos += L.LAUNCH.size + 4 * (n_in + n_out)
        if ios and (min(ios) < -1 or max(ios) >= n_tensors):
            raise ValueError("tensor index out of range")
        attrs: dict[str, AttrValue] = {}
        head, ints = _ATTR_HEAD.unpack_from, _ITEMS["q"]
        for _ in range(n_attrs):
            name_id, tag, word = head(view, pos)
            name = strings[name_id]  # repeated: found by the count after the loop
            pos += _ATTR_SIZE  # the payload starts at ``word``
            if tag == _INTS and word <= _MAX_ITEMS:  # the commonest: kernel shapes, pads...
                attrs[name] = ints[word].unpack_from(view, pos + 4)
                pos += 4 + 8 * word
            elif tag == _INTS or tag == _FLOATS or tag == _STRINGS:
                items = _items("q" if tag == _INTS else "d" if tag == _FLOATS else "I", word)
                value = items.unpack_from(view, pos + 4)
                attrs[name] = value if tag != _STRINGS else tuple(strings[s] for s in value)
                pos += 4 + items.size
            elif tag == _STRING:
                attrs[name] = strings[word]
                pos += 4
            elif tag == _INT:
                attrs[name] = L.I64.unpack_from(view, pos)[0]
                pos += 8
            elif tag == _FLOAT:
                attrs[name] = L.F64.unpack_from(view, pos)[0]
                pos += 8
            elif tag == _BYTES:
                if pos + 4 + word > len(view):
                    raise ValueError("bytes past the section's end")
                attrs[name] = view[pos + 4 : pos + 4 + word].tobytes()
                pos += 4 + word
            else:
                raise ValueError("malformed attribute tag")
        if len(attrs) != n_attrs:
            raise ValueError("attribute repeated")
        launch = _new(KernelLaunch)
        launch.__dict__.update({"op": strings[op_id], "inputs": ios[:n_in],
                                "outputs": ios[n_in:], "attrs": MappingProxyType(attrs),
                                "node": strings[node_id]})
        cur.pos = pos
        return launch

    def tensor(self, cur: _Cursor, i: int) -> TensorDesc:
        name_id, dtype_code, region_code, rank, offset = cur.take(L.TENSOR, f"tensor {i}")
        shape = cur.array("Q", rank, f"tensor {i} dimension")
        region = _REGIONS.get(region_code)
        if region is None or not 0 <= dtype_code < len(dtypes.DTYPES):
            raise InvalidGraph(
                f"{cur.where}, tensor {i}: dtype code {dtype_code} or region {region_code} is "
                f"unknown (dtype codes 0..{len(dtypes.DTYPES) - 1}, regions "
                f"{[int(r) for r in Region]})"
            )
        dtype = dtypes.DTYPES[dtype_code]
        name = self.string(name_id, f"{cur.where}, tensor {i}")
        return TensorDesc(name, shape, dtype, region, offset)

    def launch(self, cur: _Cursor, i: int, n_tensors: int) -> KernelLaunch:
        where = f"{cur.where}, launch {i}"
        op_id, node_id, n_in, n_out, n_attrs = cur.take(L.LAUNCH, f"launch {i}")
        inputs = self.indices(cur, n_in, n_tensors, -1, f"launch {i} input")
        outputs = self.indices(cur, n_out, n_tensors, -1, f"launch {i} output")
        cur.need(n_attrs * (L.ATTR.size + 4), f"{n_attrs} attributes")
        attrs: dict[str, AttrValue] = {}
        for _ in range(n_attrs):
            name_id, tag = cur.take(L.ATTR, f"launch {i} attribute")
            name = self.string(name_id, where)
            if name in attrs:
                raise InvalidGraph(f"{where}: attribute {name!r} appears twice")
            attrs[name] = self.attr(cur, tag, f"launch {i} attribute {name!r}")
        return KernelLaunch(op=self.string(op_id, where), inputs=inputs, outputs=outputs,
                            attrs=MappingProxyType(attrs), node=self.string(node_id, where))

    def attr(self, cur: _Cursor, tag: int, what: str) -> AttrValue:
        """One attribute's value; ``what`` names it."""
        if tag not in _TAGS:
            raise InvalidGraph(
                f"{cur.where}, {what}: malformed attribute tag {tag}; valid tags "
                f"are {', '.join(f'{t.value} ({t.name})' for t in L.AttrTag)}"
            )
        if tag == _INT:
            return cur.take(L.I64, what)[0]
        if tag == _FLOAT:
            return cur.take(L.F64, what)[0]
        if tag == _STRING:
            return self.string(cur.take(L.COUNT, what)[0], f"{cur.where}, {what}")
        (count,) = cur.take(L.COUNT, what + " length")
        if tag == _BYTES:
            return cur.raw(count, what)
        if tag == _INTS:
            return cur.array("q", count, what)
        if tag == _FLOATS:
            return cur.array("d", count, what)
        ids = cur.array("I", count, what)  # AttrTag.STRINGS
        return tuple(self.string(s, f"{cur.where}, {what}") for s in ids)
