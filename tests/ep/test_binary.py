"""Context binary format: round trips, deduplication, zero-copy reads, corruption, atomic writes."""

from __future__ import annotations

import mmap
import os
import re
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from ep.errors import Fail, InvalidArgument, InvalidGraph
from ep.npusim import binary_layout as L
from ep.npusim.binary import ContextBinary, graph_digest, pack_context, write_context_binary
from ep.npusim.version import SDK_VERSION
from firmware_model.program import OFFSET_MASK, KernelLaunch, Program, Region, TensorDesc
from npu_sim import dtypes

# -- strategies -------------------------------------------------------------------------------

names = st.text(max_size=10)
i64 = st.integers(-(2**63), 2**63 - 1)
f64 = st.floats(allow_nan=False)
attr_values = st.one_of(
    i64, f64, names, st.binary(max_size=24),
    st.lists(i64, max_size=5).map(tuple),
    st.lists(f64, min_size=1, max_size=5).map(tuple),
    st.lists(names, min_size=1, max_size=5).map(tuple),
)
# Weight contents drawn from a small pool so equal contents recur within and across graphs.
weight_pool = st.lists(st.binary(max_size=1500), min_size=1, max_size=4)


@st.composite
def programs(draw, pool: list[bytes], name: str) -> Program:
    tensors = tuple(draw(st.lists(st.builds(
        TensorDesc, name=names,
        shape=st.lists(st.integers(0, 2**40), max_size=4).map(tuple),
        dtype=st.sampled_from(dtypes.DTYPES), region=st.sampled_from(list(Region)),
        offset=st.integers(0, OFFSET_MASK),
    ), min_size=1, max_size=6)))
    n = len(tensors)
    index = st.integers(0, n - 1)
    optional = st.integers(-1, n - 1)
    launches = tuple(draw(st.lists(st.builds(
        KernelLaunch, op=names, node=names,
        inputs=st.lists(optional, max_size=4).map(tuple),
        outputs=st.lists(optional, max_size=3).map(tuple),
        attrs=st.dictionaries(names, attr_values, max_size=8),
    ), max_size=4)))
    weights = draw(st.dictionaries(index, st.sampled_from(pool), max_size=n))
    return Program(
        name=name, tensors=tensors, launches=launches,
        commands=draw(st.integers(0, 6).flatmap(lambda k: st.binary(min_size=64 * k,
                                                                     max_size=64 * k))),
        inputs=tuple(draw(st.lists(index, max_size=3))),
        outputs=tuple(draw(st.lists(index, max_size=3))),
        weights=weights, arena_bytes=draw(st.integers(0, 2**64 - 1)),
        hardware_architecture=draw(st.sampled_from(["", "npu-m", "os32"])),
    )


@st.composite
def program_sets(draw) -> list[Program]:
    pool = draw(weight_pool)
    graph_names = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    return [draw(programs(pool, name)) for name in graph_names]


def address(buffer) -> int:
    return np.frombuffer(buffer, np.uint8).__array_interface__["data"][0]


# -- round trips ------------------------------------------------------------------------------


@settings(max_examples=40)
@given(program_sets())
def test_round_trip_preserves_every_program(progs):
    data = pack_context(progs, hardware_architecture="npu-m", config_digest="ab" * 32)
    binary = ContextBinary.from_bytes(data)
    assert binary.graph_names() == [p.name for p in progs]
    assert binary.programs() == progs
    for p in progs:
        assert binary.program(p.name) == p
    assert binary.header.hardware_architecture == "npu-m"
    assert binary.header.config_digest == "ab" * 32
    assert binary.header.sdk_version == SDK_VERSION
    assert binary.header.file_size == len(data)


@settings(max_examples=40)
@given(program_sets())
def test_weights_are_deduplicated_aligned_views(progs):
    data = pack_context(progs, hardware_architecture="npu-m")
    binary = ContextBinary.from_bytes(data)
    base = address(data)
    where: dict[bytes, set[int]] = {}
    for p in binary.programs():
        for blob in p.weights.values():
            assert isinstance(blob, memoryview) and blob.readonly
            offset = address(blob) - base
            assert 0 <= offset and offset + len(blob) <= len(data)
            if len(blob):
                assert offset % 512 == 0
                where.setdefault(bytes(blob), set()).add(offset)
    # Each distinct non-empty content is stored at exactly one place.
    assert all(len(offsets) == 1 for offsets in where.values())
    distinct = {bytes(w) for p in progs for w in p.weights.values()}
    summary = binary.weights_summary
    assert summary.blobs == len(distinct)
    assert summary.distinct_bytes == sum(map(len, distinct))
    assert summary.referenced_bytes == sum(len(w) for p in progs for w in p.weights.values())
    assert summary.section_bytes < summary.distinct_bytes + 512 * max(summary.blobs, 1)


def sample_programs() -> list[Program]:
    """Two graphs sharing a weight, with every attribute type and a command stream."""
    t = (
        TensorDesc("x", (1, 8), "float32", Region.ARENA, 0),
        TensorDesc("w", (8, 8), "float32", Region.WEIGHTS, 0),
        TensorDesc("b", (8,), "float16", Region.WEIGHTS, 512),
        TensorDesc("y", (1, 8), "float32", Region.ARENA, 64),
    )
    attrs = {"alpha": 0.5, "axis": -1, "mode": "same", "blob": b"\x00\x01", "pads": (0, 1),
             "scales": (1.5, 2.0), "names": ("a", "b")}
    w = np.arange(64, dtype=np.float32).tobytes()
    launch = KernelLaunch("Gemm", (0, 1, 2), (3,), attrs, node="gemm_0")
    from firmware_model import commands as fc

    stream = fc.pack([fc.Dma(1, 0x0100000000000000, 0x0100000000000040, 32),
                      fc.Kernel(2, 0, 0, deps=(1,))])
    first = Program("graph_a", t, (launch,), stream, (0,), (3,),
                    {1: w, 2: bytes(16)}, 128, "npu-m")
    second = Program("graph_b", t, (launch,), stream, (0,), (3,),
                     {1: w, 2: b"\x01" * 16}, 128, "npu-m")
    return [first, second]


@pytest.fixture(scope="module")
def sample() -> bytes:
    return pack_context(sample_programs(), hardware_architecture="npu-m",
                        config_digest="0f" * 32)


def test_open_maps_the_file_and_weights_are_views_into_the_mapping(tmp_path, sample):
    path = tmp_path / "model_npusim.bin"
    write_context_binary(path, sample_programs(), hardware_architecture="npu-m",
                         config_digest="0f" * 32)
    assert path.read_bytes() == sample
    binary = ContextBinary.open(path, expected_architecture="npu-m")
    a, b = binary.program("graph_a"), binary.program("graph_b")
    assert [a, b] == sample_programs()
    wa, wb = a.weights[1], b.weights[1]
    assert isinstance(wa.obj, mmap.mmap) and wa.readonly
    # The shared weight is one region of the mapping, not two copies.
    assert np.shares_memory(np.frombuffer(wa, np.uint8), np.frombuffer(wb, np.uint8))
    np.testing.assert_array_equal(np.frombuffer(wa, np.float32), np.arange(64))
    binary.close()  # views still alive: the mapping outlives close() until they are dropped
    assert np.frombuffer(wa, np.float32)[5] == 5.0
    with pytest.raises(InvalidGraph, match="closed"):
        binary.program("graph_a")


def test_context_manager_closes(tmp_path, sample):
    path = tmp_path / "m.bin"
    path.write_bytes(sample)
    with ContextBinary.open(path) as binary:
        assert binary.graph_names() == ["graph_a", "graph_b"]
    with pytest.raises(InvalidGraph, match="closed"):
        binary.programs()


# -- specific errors --------------------------------------------------------------------------


def reseal(data: bytes | bytearray) -> bytes:
    """Recompute every checksum, so a patched field is caught by structural validation alone."""
    data = bytearray(data)
    fields = L.HEADER.unpack_from(data, 0)
    count, table = fields[5], fields[6]
    for i in range(count):
        at = table + i * L.SECTION.size
        if at + L.SECTION.size > len(data):
            break
        _, _, offset, length, _, _ = L.SECTION.unpack_from(data, at)
        if offset + length <= len(data):
            struct.pack_into("<I", data, at + 24, zlib.crc32(data[offset : offset + length]))
    table_end = min(len(data), table + count * L.SECTION.size)
    struct.pack_into("<I", data, L.HEADER.size - 4, zlib.crc32(data[table:table_end]))
    struct.pack_into("<I", data, L.HEADER_CRC_OFFSET, 0)
    struct.pack_into("<I", data, L.HEADER_CRC_OFFSET, zlib.crc32(data[: L.HEADER_SIZE]))
    return bytes(data)


def sections_of(data: bytes) -> dict[str, L.SectionEntry]:
    return {s.kind_name: s for s in ContextBinary.from_bytes(data).sections}


def test_wrong_magic(sample):
    with pytest.raises(InvalidGraph, match=r"not an npu-sim context binary: magic b'ONNXSIMC'"):
        ContextBinary.from_bytes(b"ONNXSIMC" + sample[8:])


def test_newer_format_version(sample):
    data = bytearray(sample)
    struct.pack_into("<HH", data, 8, 4, 0)
    with pytest.raises(InvalidGraph) as info:
        ContextBinary.from_bytes(reseal(data))
    assert info.value.message == "format version 4.0 is newer than this SDK supports (2.x or 3.x)"


def _launch_program(attrs: dict) -> Program:
    t = (TensorDesc("a", (4,), "float32", Region.ARENA, 0),
         TensorDesc("b", (4,), "float32", Region.ARENA, 64),
         TensorDesc("y", (4,), "float32", Region.ARENA, 128))
    return Program("g", t, (KernelLaunch("MatMul", (0, 1), (2,), attrs),), b"", (0, 1), (2,),
                   {}, 192, "npu-m")


@pytest.mark.parametrize("attrs, version", [
    ({}, (2, 2)), ({"activation": "Relu"}, (2, 2)),
    ({"epilogue": ("Add",), "epilogue_args": (1,)}, (3, 0)), ({"input_scale": 1}, (3, 0))])
def test_a_binary_is_3_0_only_when_a_launch_has_a_fused_epilogue(attrs, version, monkeypatch):
    """A 2.x reader accepts any attribute name, so it would run a fused epilogue's host op
    alone and compute other values: such a binary is stamped 3.0, which 2.x readers refuse;
    a binary without one stays 2.2 and still opens in them."""
    from ep.npusim import binary_reader

    data = pack_context([_launch_program(attrs)], hardware_architecture="npu-m")
    binary = ContextBinary.from_bytes(data)
    assert binary.header.format_version == version
    assert binary.program("g").launches[0].attrs == attrs
    monkeypatch.setattr(binary_reader, "READABLE_MAJORS", (2,))  # an SDK from before 3.0
    monkeypatch.setattr(binary_reader, "FORMAT_VERSION", (2, 2))
    if version == (2, 2):
        ContextBinary.from_bytes(data)
    else:
        with pytest.raises(InvalidGraph, match=r"format version 3\.0 is newer than this SDK "
                                               r"supports \(2\.x\)"):
            ContextBinary.from_bytes(data)


def test_format_1_0_is_refused_by_its_version_not_by_a_checksum(sample):
    """1.0 had SHA-256 section checksums in 56-byte table entries; a 2.x reader must say so
    instead of reporting a corrupt table."""
    data = bytearray(sample)
    struct.pack_into("<HH", data, 8, 1, 0)
    with pytest.raises(InvalidGraph) as info:
        ContextBinary.from_bytes(reseal(data))
    assert info.value.message == ("format version 1.0 is older than this SDK supports "
                                  "(2.x or 3.x)")


def test_newer_minor_version_with_an_unknown_section_is_accepted(sample):
    """A minor bump may add section kinds: a 2.0 reader checks their bounds and CRC-32, then
    skips them. Here a kind-99 section is appended and the table moved behind it."""
    data = bytearray(sample)
    (count,) = struct.unpack_from("<I", data, 20)  # sections written (no external weights)
    table_end = L.HEADER_SIZE + count * L.SECTION.size
    old_table = bytes(data[L.HEADER_SIZE : table_end])
    data[L.HEADER_SIZE : table_end] = bytes(table_end - L.HEADER_SIZE)  # now zero padding
    extra = b"future section"
    data += bytes(L.align_up(len(data), 8) - len(data))  # sections are 8-aligned
    extra_at = len(data)
    data += extra + bytes(L.align_up(len(extra), 8) - len(extra))
    table_at = len(data)
    data += old_table + L.SECTION.pack(99, 0, extra_at, len(extra), zlib.crc32(extra), 0)
    struct.pack_into("<HH", data, 8, 2, 7)
    struct.pack_into("<IQQ", data, 20, count + 1, table_at, len(data))
    sealed = bytearray(reseal(data))
    binary = ContextBinary.from_bytes(sealed)
    assert binary.header.format_version == (2, 7)
    assert [s.kind_name for s in binary.sections][-1] == "unknown(99)"
    assert binary.programs() == sample_programs()
    # Its checksum is still verified.
    binary.close()
    sealed[extra_at] ^= 1
    with pytest.raises(InvalidGraph, match=rf"checksum mismatch in section #{count} "
                                           r"\(unknown\(99\)\)"):
        ContextBinary.from_bytes(sealed)


def test_missing_required_section(sample):
    data = bytearray(sample)
    struct.pack_into("<I", data, L.HEADER_SIZE + 4 * L.SECTION.size, 99)  # relabel weights
    with pytest.raises(InvalidGraph, match="required sections missing: weights"):
        ContextBinary.from_bytes(reseal(data))


def test_wrong_architecture(sample):
    with pytest.raises(InvalidGraph, match="compiled for hardware architecture 'npu-m', this "
                                           "device is 'npu-s'"):
        ContextBinary.from_bytes(sample, expected_architecture="npu-s")
    assert ContextBinary.from_bytes(sample, expected_architecture="npu-m")


def test_wrong_config_digest(sample):
    with pytest.raises(InvalidGraph, match="compiled for device config '0f0f"):
        ContextBinary.from_bytes(sample, expected_config_digest="ee" * 32)
    assert ContextBinary.from_bytes(sample, expected_config_digest="0f" * 32)


def test_other_sdk_major_version():
    data = pack_context(sample_programs(), hardware_architecture="npu-m", sdk_version="3.2.1")
    with pytest.raises(InvalidGraph, match=rf"built by SDK 3.2.1, this SDK is {SDK_VERSION}: "
                                           "major versions must match"):
        ContextBinary.from_bytes(data)
    same_major = pack_context(sample_programs(), hardware_architecture="npu-m",
                              sdk_version="0.9.4")
    assert ContextBinary.from_bytes(same_major).header.sdk_version == "0.9.4"


@pytest.mark.parametrize("kind", ["strings", "graphs", "programs", "commands", "weights"])
def test_bad_section_checksum_names_the_section(sample, kind):
    entry = sections_of(sample)[kind]
    data = bytearray(sample)
    data[entry.offset + entry.length - 1] ^= 0x40
    with pytest.raises(InvalidGraph, match=rf"checksum mismatch in section #\d \({kind}\)"):
        ContextBinary.from_bytes(bytes(data))


def test_bad_header_checksum(sample):
    data = bytearray(sample)
    data[100] ^= 1  # inside the architecture field
    with pytest.raises(InvalidGraph, match="header checksum mismatch"):
        ContextBinary.from_bytes(bytes(data))


def test_truncated_file_says_expected_and_actual_size(sample):
    cut = len(sample) - 10
    with pytest.raises(InvalidGraph) as info:
        ContextBinary.from_bytes(sample[:cut])
    assert info.value.message == (
        f"truncated context binary: header says {len(sample)} bytes, file has {cut}"
    )


def test_unknown_graph_lists_the_names(sample):
    binary = ContextBinary.from_bytes(sample)
    with pytest.raises(InvalidGraph, match=r"no graph named 'nope'.*\['graph_a', 'graph_b'\]"):
        binary.program("nope")


def test_malformed_attribute_tag():
    launch = KernelLaunch("Relu", (), (), {"k": 1})
    program = Program("g", (), (launch,), b"", (), (), {}, 0)
    data = bytearray(pack_context([program], hardware_architecture="npu-m"))
    tag_at = sections_of(bytes(data))["programs"].offset + L.PROGRAM.size + L.LAUNCH.size + 4
    assert data[tag_at] == L.AttrTag.INT
    data[tag_at] = 42
    with pytest.raises(InvalidGraph, match=r"malformed attribute tag 42; valid tags are 1 \(INT\)"):
        ContextBinary.from_bytes(reseal(data))


def test_missing_file(tmp_path):
    with pytest.raises(InvalidGraph, match="cannot open context binary"):
        ContextBinary.open(tmp_path / "absent.bin")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    with pytest.raises(InvalidGraph, match="truncated context binary: 0 bytes"):
        ContextBinary.open(path)


# -- corruption -------------------------------------------------------------------------------


def expected_flip_error(sample: bytes, position: int) -> str:
    """What must catch a changed byte at ``position``: the check covering that part."""
    sections = ContextBinary.from_bytes(sample).sections
    table_end = L.HEADER_SIZE + len(sections) * L.SECTION.size
    if position < L.HEADER_SIZE:
        return "header"  # magic, version, size or header checksum: any header check
    if position < table_end:
        return "section table checksum mismatch"
    for i, s in enumerate(sections):
        if s.offset <= position < s.offset + s.length:
            return rf"checksum mismatch in section #{i} \({s.kind_name}\)"
    return "are not alignment padding"


def test_every_single_byte_flip_is_detected(sample):
    """Every byte of a valid file is covered by a checksum or a padding check, and the check
    that fires is the one covering that byte (a CRC-32 catches every change of up to 32 bits,
    so a single changed byte is always caught, whatever its value)."""
    data = bytearray(sample)
    for i in range(len(data)):
        expected = expected_flip_error(sample, i)
        for mask in (0xFF, 0x01):
            data[i] ^= mask
            with pytest.raises(InvalidGraph) as info:
                ContextBinary.from_bytes(bytes(data))
            if expected != "header":
                assert re.search(expected, info.value.message), (i, info.value.message)
            data[i] ^= mask


@settings(max_examples=60)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4))
def test_random_byte_flips_raise_invalid_graph(sample, flips):
    data = bytearray(sample)
    for position, mask in flips:
        data[position % len(data)] ^= mask
    changed = [i for i in range(len(data)) if data[i] != sample[i]]
    if changed:  # flips may cancel out
        with pytest.raises(InvalidGraph) as info:
            ContextBinary.from_bytes(bytes(data))
        # The check that fires covers one of the changed bytes (any check, for the header).
        expected = {expected_flip_error(sample, i) for i in changed}
        assert "header" in expected or any(re.search(e, info.value.message) for e in expected), (
            changed, info.value.message)


def test_truncation_anywhere_is_reported_as_truncation(sample):
    boundaries = {0, 8, L.HEADER_SIZE}
    for s in sections_of(sample).values():
        boundaries |= {s.offset, s.offset + s.length}
    for cut in sorted(set(range(len(sample))) | (boundaries - {len(sample)})):
        with pytest.raises(InvalidGraph, match="truncated context binary"):
            ContextBinary.from_bytes(sample[:cut])


def patched(sample: bytes, kind: str | None, offset: int, fmt: str, value: int) -> bytes:
    """``sample`` with ``value`` written at ``offset`` into section ``kind`` (or the file) and
    every checksum recomputed."""
    base = sections_of(sample)[kind].offset if kind else 0
    data = bytearray(sample)
    struct.pack_into(fmt, data, base + offset, value)
    return reseal(data)


U32_MAX, U64_HALF = 2**32 - 1, 2**63
# field -> (section or None for the file, offset, format, value, what the error must say: the
# value, and the bound it breaks; byte counts the format fixes are computed, not copied)
HUGE_PATCHES = {
    "section table length": (None, L.HEADER_SIZE + 16, "<Q", U64_HALF,
                             rf"section #0 \(strings\) at offset \d+ with length {U64_HALF} is out "
                             r"of range or misaligned: it must end by \d+ \(file size\)"),
    "section table offset": (None, L.HEADER_SIZE + 8, "<Q", 2**64 - 512,
                             rf"section #0 \(strings\) at offset {2**64 - 512} with length \d+ is "
                             r"out of range or misaligned"),
    "section count": (None, 20, "<I", U32_MAX,
                      rf"section table of {U32_MAX} entries at offset {L.HEADER_SIZE} does not "
                      r"fit in the file: it must lie within \[\d+, \d+\]"),
    "section table offset in header": (None, 24, "<Q", 2**62,
                                       rf"section table of {len(L.SectionKind) - 1} entries at "
                                       rf"offset {2**62} does not fit in the file"),
    "string count": ("strings", 0, "<I", U32_MAX,
                     rf"section strings: {U32_MAX} x string length needs {4 * U32_MAX} bytes at "
                     r"offset 4, only \d+ remain"),
    "string length": ("strings", 4, "<I", U32_MAX,
                      rf"section strings: string 0 needs {U32_MAX} bytes at offset \d+, only \d+ "
                      "remain"),
    "graph count": ("graphs", 0, "<I", U32_MAX,
                    rf"section graphs: {U32_MAX} graph entries needs {U32_MAX * L.GRAPH.size} "
                    r"bytes at offset 4, only \d+ remain"),
    "graph record length": ("graphs", 4 + 16, "<Q", U64_HALF,
                            rf"graph 'graph_a': program record at 0 with length {U64_HALF} runs "
                            r"past the programs section \(\d+ bytes\)"),
    "program name id": ("graphs", 4, "<I", U32_MAX,
                        rf"section graphs, entry 0: string id {U32_MAX} is out of range "
                        r"\[0, \d+\)"),
    "commands length": ("programs", 24, "<Q", U64_HALF,
                        rf"graph 'graph_a': command stream at 0 with length {U64_HALF} runs past "
                        r"the commands section \(\d+ bytes\)"),
    "tensor count": ("programs", 32, "<I", U32_MAX,
                     rf"graph 'graph_a': {U32_MAX} tensors needs {U32_MAX * L.TENSOR.size} bytes"),
    "launch count": ("programs", 36, "<I", U32_MAX,
                     rf"graph 'graph_a': {U32_MAX} launches needs {U32_MAX * L.LAUNCH.size} bytes"),
    "input count": ("programs", 40, "<I", U32_MAX,
                    rf"graph 'graph_a': {U32_MAX} x input tensor index needs {4 * U32_MAX} bytes"),
    "weight count": ("programs", 48, "<I", U32_MAX,
                     rf"graph 'graph_a': {U32_MAX} weights needs {U32_MAX * L.WEIGHT.size} bytes"),
    "tensor rank": ("programs", L.PROGRAM.size + 6, "<H", 2**16 - 1,
                    rf"graph 'graph_a': {2**16 - 1} x tensor 0 dimension needs "
                    rf"{8 * (2**16 - 1)} bytes"),
    "tensor dtype": ("programs", L.PROGRAM.size + 4, "<B", 200,
                     rf"tensor 0: dtype code 200 or region 1 is unknown \(dtype codes "
                     rf"0..{len(dtypes.DTYPES) - 1}, regions \[0, 1, 2, 3\]\)"),
    "tensor region": ("programs", L.PROGRAM.size + 5, "<B", 9,
                      r"tensor 0: dtype code 0 or region 9 is unknown"),
}


@pytest.mark.parametrize("field", sorted(HUGE_PATCHES))
def test_huge_lengths_are_refused_before_allocating(sample, field):
    *patch, message = HUGE_PATCHES[field]
    data = patched(sample, *patch)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidGraph, match=message):
            ContextBinary.from_bytes(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20 * len(sample) + 256 * 1024


def record_fields(sample: bytes) -> dict[str, list[tuple[int, str, bool]]]:
    """``(offset, struct format, reserved)`` of the fixed fields of each metadata section of
    ``sample``, walked with the layout from docs/binary_format.md (launches, whose attributes
    are variable, are left out: random offsets still reach them)."""
    secs = sections_of(sample)
    graphs = secs["graphs"]
    fields: dict[str, list[tuple[int, str, bool]]] = {
        "strings": [(0, "<I", False)], "graphs": [(0, "<I", False)], "programs": []}
    (count,) = struct.unpack_from("<I", sample, graphs.offset)
    fields["strings"] += [(4 + 4 * i, "<I", False) for i in range(
        struct.unpack_from("<I", sample, secs["strings"].offset)[0])]
    for g in range(count):
        at = 4 + g * L.GRAPH.size
        fields["graphs"] += [(at, "<I", False), (at + 4, "<I", True), (at + 8, "<Q", False),
                             (at + 16, "<Q", False)]
        rec = struct.unpack_from("<Q", sample, graphs.offset + at + 8)[0]
        header = L.PROGRAM.unpack_from(sample, secs["programs"].offset + rec)
        n_tensors, _, n_inputs, n_outputs, n_weights = header[5:]
        fields["programs"] += [(rec, "<I", False), (rec + 4, "<I", True)]
        fields["programs"] += [(rec + o, "<Q", False) for o in (8, 16, 24)]
        fields["programs"] += [(rec + o, "<I", False) for o in range(32, 52, 4)]
        at = rec + L.PROGRAM.size
        for _ in range(n_tensors):
            rank = struct.unpack_from("<H", sample, secs["programs"].offset + at + 6)[0]
            fields["programs"] += [(at, "<I", False), (at + 4, "<B", False),
                                   (at + 5, "<B", False), (at + 6, "<H", False),
                                   (at + 8, "<Q", False)]
            fields["programs"] += [(at + 16 + 8 * d, "<Q", False) for d in range(rank)]
            at += L.TENSOR.size + 8 * rank
        fields["programs"] += [(at + 4 * i, "<I", False) for i in range(n_inputs + n_outputs)]
        at += 4 * (n_inputs + n_outputs)
        for _ in range(n_weights):
            fields["programs"] += [(at, "<I", False), (at + 4, "<I", True),
                                   (at + 8, "<Q", False), (at + 16, "<Q", False)]
            at += L.WEIGHT.size
    return fields


def string_table(data: bytes) -> set[str]:
    """Every string of the STRINGS section, parsed here independently of the reader."""
    at = sections_of(data)["strings"].offset
    (count,) = struct.unpack_from("<I", data, at)
    lengths = struct.unpack_from(f"<{count}I", data, at + 4)
    at += 4 + 4 * count
    table = set()
    for n in lengths:
        table.add(data[at : at + n].decode("utf-8"))
        at += n
    return table


def assert_consistent(data: bytes, binary: ContextBinary) -> None:
    """What any file the reader accepts must decode to (docs/binary_format.md's MUSTs)."""
    secs = {s.kind_name: s for s in binary.sections}
    weights, commands = secs["weights"], secs["commands"]
    strings = string_table(data)
    base = address(data)
    for p in binary.programs():
        n = len(p.tensors)
        assert {p.name, p.hardware_architecture} <= strings
        for t in p.tensors:
            assert t.name in strings and t.dtype in dtypes.DTYPES and isinstance(t.region, Region)
        assert all(0 <= i < n for i in p.inputs + p.outputs + tuple(p.weights))
        for launch in p.launches:
            assert {launch.op, launch.node} <= strings
            assert all(-1 <= i < n for i in launch.inputs + launch.outputs)
        for blob in p.weights.values():  # a read-only view inside WEIGHTS, 512-aligned
            at = address(blob) - base
            assert blob.readonly and weights.offset <= at <= at + len(blob) <= weights.offset + \
                weights.length
            assert (at - weights.offset) % L.WEIGHT_ALIGN == 0 or not len(blob)
        assert p.commands in data[commands.offset : commands.offset + commands.length]
    # The programs are ones the writer takes, and writing them back is a fixed point of
    # read-after-write (bytes, so a patched NaN attribute compares equal to itself).
    head = binary.header
    again = pack_context(binary.programs(), hardware_architecture=head.hardware_architecture,
                         config_digest=head.config_digest, sdk_version=head.sdk_version)
    assert pack_context(ContextBinary.from_bytes(again).programs(),
                        hardware_architecture=head.hardware_architecture,
                        config_digest=head.config_digest, sdk_version=head.sdk_version) == again


@settings(max_examples=150)
@given(st.data())
def test_patched_and_resealed_metadata_never_escapes_invalid_graph(sample, data):
    """Any u8/u16/u32/u64 patched into a metadata section is refused with InvalidGraph, or
    decodes to programs that satisfy the format's rules; a patch that changes no byte or only a
    reserved field decodes to the original programs."""
    kind = data.draw(st.sampled_from(["strings", "graphs", "programs"]))
    entry = sections_of(sample)[kind]
    known = record_fields(sample)[kind]
    field = data.draw(st.one_of(st.sampled_from(known), st.tuples(
        st.integers(0, entry.length - 8), st.sampled_from(["<B", "<H", "<I", "<Q"]),
        st.just(False))))
    offset, fmt, reserved = field
    size = struct.calcsize(fmt)
    old = int.from_bytes(sample[entry.offset + offset : entry.offset + offset + size], "little")
    value = data.draw(st.one_of(st.just(old), st.integers(0, 3), st.just(2 ** (8 * size) - 1),
                                st.integers(0, 2 ** (8 * size) - 1), st.just(old + 1 - 2 * (
                                    old == 2 ** (8 * size) - 1))))
    patched_data = patched(sample, kind, offset, fmt, value)
    try:
        binary = ContextBinary.from_bytes(patched_data)
    except InvalidGraph:
        assert value != old, "an unchanged file must load"
        event(f"{kind}: refused")
        return
    event(f"{kind}: loaded")
    assert_consistent(patched_data, binary)
    if value == old or reserved:
        assert binary.programs() == sample_programs()


# -- writer input and atomic writes -----------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    ({"name": "graph_a"}, "graph name 'graph_a' appears more than once"),
    ({"inputs": (9,)}, r"inputs: tensor index 9 is out of range \[0, 4\)"),
    ({"weights": {7: b"x"}}, r"weights: tensor index 7 is out of range"),
    ({"launches": (KernelLaunch("A", (), (), {"x": None}),)}, "NoneType is not an attribute"),
    ({"launches": (KernelLaunch("A", (), (), {"x": (1, "a")}),)}, "only ints, only floats"),
    ({"launches": (KernelLaunch("A", (), (), {"x": 2**63}),)}, "do not fit"),
    ({"arena_bytes": -1}, "do not fit"),
])
def test_writer_refuses_bad_programs(change, message):
    first, second = sample_programs()
    bad = Program(**{**second.__dict__, **change})
    with pytest.raises(InvalidArgument, match=message):
        pack_context([first, bad], hardware_architecture="npu-m")


def test_writer_refuses_bad_header_strings():
    with pytest.raises(InvalidArgument, match="hardware_architecture"):
        pack_context(sample_programs(), hardware_architecture="x" * 129)
    with pytest.raises(InvalidArgument, match="sdk_version"):
        pack_context(sample_programs(), hardware_architecture="npu-m", sdk_version="1\0")


@pytest.mark.parametrize("failing", ["replace", "fsync"])
def test_failed_write_leaves_no_file_and_keeps_the_old_one(tmp_path, monkeypatch, failing):
    path = tmp_path / "model_npusim.bin"
    path.write_bytes(b"previous contents")

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, boom)
    with pytest.raises(Fail, match="model_npusim.bin.*No space left on device"):
        write_context_binary(path, sample_programs(), hardware_architecture="npu-m")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["model_npusim.bin"]
    assert path.read_bytes() == b"previous contents"


def test_bad_program_writes_nothing(tmp_path):
    first, _ = sample_programs()
    with pytest.raises(InvalidArgument, match="graph name 'graph_a' appears more than once"):
        write_context_binary(tmp_path / "m.bin", [first, first], hardware_architecture="npu-m")
    assert os.listdir(tmp_path) == []


@settings(max_examples=30)
@given(program_sets())
def test_graph_digests_identify_programs_whatever_binary_holds_them(progs):
    """Each graph's recorded digest is graph_digest(program): the same program has the same
    digest alone or beside others (offsets and string ids differ), and any weight byte or
    attribute change changes it."""
    together = ContextBinary.from_bytes(pack_context(progs, hardware_architecture="npu-m"))
    for p in progs:
        alone = ContextBinary.from_bytes(pack_context([p], hardware_architecture="npu-m"))
        assert together.graph_digest(p.name) == alone.graph_digest(p.name) == graph_digest(p)
    changed = progs[0]
    if changed.weights:
        index, data = next(iter(changed.weights.items()))
        flipped = bytes([data[0] ^ 1]) + bytes(data[1:]) if len(data) else data
        if flipped != bytes(data):
            other = Program(changed.name, changed.tensors, changed.launches, changed.commands,
                            changed.inputs, changed.outputs,
                            {**changed.weights, index: flipped}, changed.arena_bytes)
            assert graph_digest(other) != graph_digest(changed)


def test_a_2_0_file_without_graph_digests_still_reads(sample):
    """GRAPH_DIGESTS is optional (added in 2.1): relabelled as an unknown kind, the file reads and
    reports no digests."""
    data = bytearray(sample)
    index = [s.kind for s in ContextBinary.from_bytes(sample).sections].index(
        L.SectionKind.GRAPH_DIGESTS)
    struct.pack_into("<I", data, L.HEADER_SIZE + index * L.SECTION.size, 99)
    binary = ContextBinary.from_bytes(reseal(data))
    assert binary.programs() == sample_programs()
    assert {binary.graph_digest(name) for name in binary.graph_names()} == {None}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_given_as_a_context_binary_is_refused_at_once(tmp_path):
    """``ContextBinary.open`` opens without blocking: a FIFO is not a regular file, refused at
    once instead of waiting for a writer."""
    import time

    from tests.ep.test_external_data import _fifo_in_place_of

    path = tmp_path / "m_npusim.bin"
    path.write_bytes(b"")
    _fifo_in_place_of(path)
    start = time.monotonic()
    with pytest.raises(InvalidGraph, match="not a regular file"):
        ContextBinary.open(path)
    assert time.monotonic() - start < 3, "the open waited on the FIFO"
