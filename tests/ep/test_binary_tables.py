"""The tensor and launch tables: read by a fast loop, reported by the record-by-record reader.

A wrong record after good ones must still be named exactly (its index, field and value), and
tables with every attribute kind must decode to what was packed."""

from __future__ import annotations

import struct

import pytest

from ep.errors import InvalidGraph
from ep.npusim import binary_layout as L
from ep.npusim.binary import ContextBinary, pack_context
from firmware_model.program import KernelLaunch, Program, Region, TensorDesc

ATTRS = {"k": 3, "s": "same"}
LAUNCH_BYTES = L.LAUNCH.size + 4 + 4 + (L.ATTR.size + 8) + (L.ATTR.size + 4)


def program(launches: tuple[KernelLaunch, ...] | None = None) -> Program:
    tensors = (TensorDesc("x", (1, 4), "float32", Region.ARENA, 0),
               TensorDesc("y", (4,), "float16", Region.ARENA, 64))
    launches = launches or tuple(KernelLaunch("Relu", (0,), (1,), ATTRS, f"n{k}")
                                 for k in range(3))
    return Program("g", tensors, launches, b"", (0,), (1,), {}, 128, "npu-m")


def packed(prog: Program) -> bytes:
    return pack_context([prog], hardware_architecture="npu-m")


def patched(data: bytes, offset: int, fmt: str, value: int, kind: str = "programs") -> bytes:
    """``data`` with ``value`` at ``offset`` into section ``kind``, checksums resealed."""
    binary = ContextBinary.from_bytes(data)
    section = next(s for s in binary.sections if s.kind_name == kind)
    out = bytearray(data)
    struct.pack_into(fmt, out, section.offset + offset, value)
    fields = L.HEADER.unpack_from(out, 0)
    count, table = fields[5], fields[6]
    for i in range(count):
        at = table + i * L.SECTION.size
        kind, flags, start, length, crc, reserved = L.SECTION.unpack_from(out, at)
        L.SECTION.pack_into(out, at, kind, flags, start, length,
                            L.crc32(out[start:start + length]), reserved)
    struct.pack_into("<I", out, L.HEADER.size - 4, L.crc32(out[table:table + count
                                                                 * L.SECTION.size]))
    struct.pack_into("<I", out, L.HEADER_CRC_OFFSET, 0)
    struct.pack_into("<I", out, L.HEADER_CRC_OFFSET, L.crc32(out[:L.HEADER_SIZE]))
    return bytes(out)


def launch_at(k: int) -> int:
    """Offset of launch ``k`` in the programs section of :func:`program`'s binary."""
    tensors = 2 * L.TENSOR.size + 8 * (2 + 1)
    return L.PROGRAM.size + tensors + 4 + 4 + k * LAUNCH_BYTES


@pytest.mark.parametrize("attrs", [
    ATTRS,
    {"blob": b"\x00\x01", "names": ("a", "b"), "alpha": 0.5, "pads": (0, 1),
     "scales": (1.5, 2.0), "empty": ()},
])
def test_tables_decode_to_what_was_packed(attrs):
    prog = program(tuple(KernelLaunch("Relu", (0, -1), (1,), attrs, f"n{k}") for k in range(3)))
    assert ContextBinary.from_bytes(packed(prog)).program("g") == prog


def test_layout_of_the_sample_is_what_the_offsets_assume():
    data = packed(program())
    op_id, node_id, n_in, n_out, n_attrs = L.LAUNCH.unpack_from(
        data, next(s for s in ContextBinary.from_bytes(data).sections
                   if s.kind_name == "programs").offset + launch_at(1))
    assert (n_in, n_out, n_attrs) == (1, 1, 2)


@pytest.mark.parametrize("where, fmt, value, message", [
    (L.LAUNCH.size, "<i", 7, r"graph 'g': launch 1 input 7 is out of range \[-1, 2\)"),
    (L.LAUNCH.size + 4, "<i", -2, r"graph 'g': launch 1 output -2 is out of range \[-1, 2\)"),
    (L.LAUNCH.size + 8 + 4, "<B", 99,
     r"graph 'g', launch 1 attribute 'k': malformed attribute tag 99"),
    (L.LAUNCH.size + 8, "<I", 10**6,
     r"graph 'g', launch 1: string id 1000000 is out of range"),
    (L.LAUNCH.size + 8 + L.ATTR.size + 8 + L.ATTR.size, "<I", 10**6,
     r"graph 'g', launch 1 attribute 's': string id 1000000 is out of range"),
])
def test_a_wrong_launch_after_good_ones_is_named(where, fmt, value, message):
    data = patched(packed(program()), launch_at(1) + where, fmt, value)
    with pytest.raises(InvalidGraph, match=message):
        ContextBinary.from_bytes(data)


def test_a_repeated_attribute_after_good_launches_is_named():
    """The fast loop finds a repeated name by the count of what it read; the record reader
    then names the attribute."""
    data = packed(program())
    programs = next(s for s in ContextBinary.from_bytes(data).sections if s.kind_name == "programs")
    first = launch_at(1) + L.LAUNCH.size + 8
    (k_id,) = struct.unpack_from("<I", data, programs.offset + first)
    data = patched(data, first + L.ATTR.size + 8, "<I", k_id)  # 's' renamed 'k'
    with pytest.raises(InvalidGraph, match=r"graph 'g', launch 1: attribute 'k' appears twice"):
        ContextBinary.from_bytes(data)


def test_a_wrong_tensor_after_a_good_one_is_named():
    data = patched(packed(program()), L.PROGRAM.size + L.TENSOR.size + 16 + 5, "<B", 9)
    with pytest.raises(InvalidGraph, match=r"graph 'g', tensor 1: dtype code \d+ or region 9 is "
                                           "unknown"):
        ContextBinary.from_bytes(data)


@pytest.mark.parametrize("name", ["plain_ascii", "x\u00e9\u4e2d\U0001f600"])
def test_strings_decode_whether_or_not_they_are_ascii(name):
    prog = program(tuple(KernelLaunch("Relu", (0,), (1,), {"s": name}, f"{name}{k}")
                         for k in range(3)))
    assert ContextBinary.from_bytes(packed(prog)).program("g") == prog


def test_a_string_that_is_not_utf8_is_named():
    data = packed(program())
    strings = next(s for s in ContextBinary.from_bytes(data).sections if s.kind_name == "strings")
    count, first = struct.unpack_from("<II", data, strings.offset)
    data = patched(data, 4 + 4 * count + first, "<B", 0xFF, kind="strings")
    with pytest.raises(InvalidGraph, match=r"section strings: string 1 is not valid UTF-8"):
        ContextBinary.from_bytes(data)


BLOB_ATTRS = {"blob": b"\x00\x01", "names": ("a", "b")}
BLOB_LAUNCH = L.LAUNCH.size + 4 + 4 + (L.ATTR.size + 4 + 2) + (L.ATTR.size + 4 + 2 * 4)


@pytest.mark.parametrize("where, message", [
    (L.ATTR.size, r"graph 'g': launch 1 attribute 'blob' needs 1000000 bytes"),
    (L.ATTR.size + 4 + 2 + L.ATTR.size + 4,
     r"graph 'g', launch 1 attribute 'names': string id 1000000 is out of range"),
])
def test_a_wrong_bytes_or_strings_attribute_after_good_ones_is_named(where, message):
    prog = program(tuple(KernelLaunch("Relu", (0,), (1,), BLOB_ATTRS, f"n{k}")
                         for k in range(3)))
    assert ContextBinary.from_bytes(packed(prog)).program("g") == prog
    data = patched(packed(prog), launch_at(0) + BLOB_LAUNCH + L.LAUNCH.size + 8 + where, "<I",
                   10**6)
    with pytest.raises(InvalidGraph, match=message):
        ContextBinary.from_bytes(data)


def wide_program() -> Program:
    """Records past the fast loops' precompiled layouts: rank 10, 20 inputs, 20-item arrays,
    and weights whose entries follow each other in their table."""
    tensors = (TensorDesc("x", (1,) * 10, "float32", Region.ARENA, 0),
               TensorDesc("y", (2,), "float32", Region.ARENA, 64),
               *(TensorDesc(f"w{k}", (4,), "float32", Region.WEIGHTS, 512 * k) for k in range(6)))
    attrs = {"ints": tuple(range(-3, 37)), "floats": tuple(k / 4 for k in range(17)),
             "names": tuple(f"s{k}" for k in range(20)), "n": 17}
    launch = KernelLaunch("Add", (0, *range(2, 8), *([-1] * 13)), (1,), attrs, "wide")
    weights = {2 + k: struct.pack("<4f", k, k + 1, k + 2, k + 3) for k in range(6)}
    return Program("g", tensors, (launch, launch), b"", (0,), (1,), weights, 128, "npu-m")


def weight_at(k: int) -> int:
    """Offset of weight entry ``k`` in the programs section of :func:`wide_program`'s binary."""
    tensors = 8 * L.TENSOR.size + 8 * (10 + 1 + 6)
    return L.PROGRAM.size + tensors + 4 + 4 + k * L.WEIGHT.size


def test_records_past_the_fast_layouts_decode_to_what_was_packed():
    prog = wide_program()
    decoded = ContextBinary.from_bytes(packed(prog)).program("g")
    assert decoded == prog
    assert {k: bytes(v) for k, v in decoded.weights.items()} == prog.weights


@pytest.mark.parametrize("where, fmt, value, message", [
    (weight_at(4) + 8, "<Q", 100,
     r"graph 'g', weight of tensor 6: blob at 100 with length 16 must start at a multiple of "
     "512"),
    (weight_at(5) + 4, "<I", 3,
     r"graph 'g', weight of tensor 7: source 3 at \d+ with length 16 names no external weight"),
    (weight_at(3), "<I", 2, r"graph 'g': weight tensor index 2 is out of range \[0, 8\) or "
                            "repeated"),
    (L.PROGRAM.size + L.TENSOR.size + 80 + 5, "<B", 9,
     r"graph 'g', tensor 1: dtype code \d+ or region 9 is unknown"),
])
def test_a_wrong_weight_or_tensor_after_wide_records_is_named(where, fmt, value, message):
    data = patched(packed(wide_program()), where, fmt, value)
    with pytest.raises(InvalidGraph, match=message):
        ContextBinary.from_bytes(data)


def test_a_wrong_index_or_item_in_a_wide_launch_is_named():
    data = packed(wide_program())
    first = weight_at(6)  # the first launch: its head, 20 inputs, 1 output, then attributes
    bad_input = patched(data, first + L.LAUNCH.size + 4 * 19, "<i", 8)
    with pytest.raises(InvalidGraph, match=r"graph 'g': launch 0 input 8 is out of range "
                                           r"\[-1, 8\)"):
        ContextBinary.from_bytes(bad_input)
    ints = L.ATTR.size + 4 + 40 * 8
    floats = L.ATTR.size + 4 + 17 * 8
    names = first + L.LAUNCH.size + 4 * 21 + ints + floats + L.ATTR.size + 4 + 4 * 19
    with pytest.raises(InvalidGraph, match=r"graph 'g', launch 0 attribute 'names': string id "
                                           "1000000 is out of range"):
        ContextBinary.from_bytes(patched(data, names, "<I", 10**6))
