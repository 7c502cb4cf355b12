"""Command descriptors: layout, strict decoding, round trip, and the rings' byte formats."""

from __future__ import annotations

import struct
from collections import Counter

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from firmware_model.commands import (
    COMMAND_BYTES,
    MAX_DEPS,
    Barrier,
    Dma,
    Kernel,
    Nop,
    Opcode,
    Signal,
    Wait,
    decode,
    describe,
    pack,
    unpack,
)
from firmware_model.program import Region, reloc
from firmware_model.rings import (
    COMPLETION_BYTES,
    CompletionRing,
    RingOverflow,
    Status,
    SubmissionRing,
)
from npu_sim.errors import InvalidCommand

U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)
DEPS = st.lists(U32, max_size=MAX_DEPS).map(tuple)

COMMANDS = st.one_of(
    st.builds(Nop, U32, deps=DEPS),
    st.builds(Dma, U32, U64, U64, U64, deps=DEPS),
    st.builds(Kernel, U32, U32, U64, deps=DEPS),
    st.builds(Signal, U32, U32, U32, deps=DEPS),
    st.builds(Wait, U32, U32, U32, deps=DEPS),
    st.builds(Barrier, U32, deps=DEPS),
)


@given(st.lists(COMMANDS, max_size=12))
def test_pack_unpack_round_trip(cmds):
    data = pack(cmds)
    assert len(data) == COMMAND_BYTES * len(cmds)
    assert unpack(data) == cmds


@st.composite
def mangled_streams(draw: st.DrawFn) -> tuple[str, bytes]:
    """A packed valid stream with one kind of damage, or plain random bytes.

    Random bytes alone almost never decode (a valid opcode, zero reserved bytes...), so most
    examples start from a real stream: junk appended or spliced in, bytes overwritten, the
    stream cut, or a whole valid descriptor spliced in at any offset. Some of these decode,
    some do not; the test checks both happen.
    """
    how = draw(st.sampled_from(["random", "append", "splice", "overwrite", "truncate",
                                "descriptor"]))
    if how == "random":
        return how, draw(st.binary(max_size=4 * COMMAND_BYTES))
    raw = bytearray(pack(draw(st.lists(COMMANDS, min_size=1, max_size=4))))
    if how == "append":
        raw += draw(st.binary(max_size=2 * COMMAND_BYTES))
    elif how == "splice":
        at = draw(st.integers(0, len(raw)))
        raw[at:at] = draw(st.binary(min_size=1, max_size=COMMAND_BYTES))
    elif how == "overwrite":
        for _ in range(draw(st.integers(1, 3))):
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    elif how == "truncate":
        del raw[draw(st.integers(0, len(raw) - 1)):]
    else:
        at = draw(st.integers(0, len(raw)))
        raw[at:at] = pack([draw(COMMANDS)])
    return how, bytes(raw)


def test_arbitrary_bytes_decode_or_raise_invalid_command():
    outcomes: Counter[str] = Counter()

    @settings(max_examples=300)
    @given(mangled_streams())
    def decode_or_raise(case: tuple[str, bytes]) -> None:
        how, data = case
        try:
            cmds = unpack(data)
        except InvalidCommand:
            outcomes["invalid"] += 1
            event(f"{how}: InvalidCommand")
            return
        outcomes["decoded"] += bool(cmds)
        event(f"{how}: decoded")
        # Decoding is strict, so anything that decodes has exactly one encoding: these bytes.
        assert pack(cmds) == data

    decode_or_raise()
    # Both branches of the property ran: non-empty streams decoded, and others were refused.
    assert outcomes["decoded"] > 0 and outcomes["invalid"] > 0, outcomes


@settings(max_examples=100)
@given(st.lists(COMMANDS, min_size=1, max_size=4), st.data())
def test_corrupted_stream_decodes_canonically_or_raises(cmds, data):
    raw = bytearray(pack(cmds))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    try:
        decoded = unpack(bytes(raw))
    except InvalidCommand:
        return
    assert pack(decoded) == bytes(raw)


@settings(max_examples=200)
@given(mangled_streams())
def test_unpack_agrees_with_decoding_each_descriptor(case):
    """unpack's fast path (one row of integers a descriptor) gives what decode gives for each
    descriptor alone: the same commands, or the same error naming the same byte."""
    _, data = case

    def outcome(read) -> tuple[str, object]:
        try:
            return "ok", read()
        except InvalidCommand as exc:
            return "error", exc.message

    whole = len(data) - len(data) % COMMAND_BYTES
    one_by_one = outcome(lambda: [decode(data, at) for at in range(0, whole, COMMAND_BYTES)])
    fast = outcome(lambda: unpack(data))
    if whole == len(data):
        assert fast == one_by_one
    else:
        assert fast[0] == "error" and "is not a multiple of" in fast[1]


def test_a_bad_descriptor_deep_in_a_stream_is_named_by_its_byte():
    cmds = [Kernel(i, i, 0, deps=(i - 1,) if i else ()) for i in range(50)]
    raw = bytearray(pack(cmds))
    raw[37 * COMMAND_BYTES + 40 + 20] = 7  # KERNEL's reserved payload byte 20 of descriptor 37
    with pytest.raises(InvalidCommand, match=f"descriptor at byte {37 * COMMAND_BYTES} "
                                             rf"\(byte {37 * COMMAND_BYTES + 60}\): reserved "
                                             "payload byte 20 of KERNEL holds 0x07"):
        unpack(bytes(raw))


def test_layout_matches_the_documented_offsets():
    # Built by hand from the table in docs/firmware.md, not with pack().
    raw = struct.pack("<BBHI", Opcode.DMA, 0, 2, 7) + struct.pack("<8I", 3, 5, *[0] * 6)
    raw += struct.pack("<QQQ", 0x1000, reloc(Region.ARENA, 64), 256)
    assert decode(raw) == Dma(7, 0x1000, (1 << 56) | 64, 256, deps=(3, 5))
    kraw = struct.pack("<BBHI8I", Opcode.KERNEL, 0, 0, 9, *[0] * 8)
    kraw += struct.pack("<IIQ", 4, 0, 0b101) + bytes(8)
    assert decode(kraw) == Kernel(9, 4, 0b101)
    sraw = struct.pack("<BBHI8I", Opcode.SIGNAL, 0, 0, 1, *[0] * 8)
    sraw += struct.pack("<II", 3, 2) + bytes(16)
    assert decode(sraw) == Signal(1, 3, 2)
    assert pack([Dma(7, 0x1000, (1 << 56) | 64, 256, deps=(3, 5))]) == raw


def _raw(opcode=0, flags=0, ndeps=0, cmd_id=1, deps=(0,) * 8, payload=bytes(24)) -> bytearray:
    return bytearray(struct.pack("<BBHI8I", opcode, flags, ndeps, cmd_id, *deps) + payload)


@pytest.mark.parametrize("raw, where, what", [
    (_raw(opcode=6), "byte 64 (byte 64)", "unknown opcode 6"),
    (_raw(opcode=255), "byte 64 (byte 64)", "valid opcodes: 0=NOP"),
    (_raw(flags=1), "byte 65", "flags"),
    (_raw(ndeps=9), "byte 66", "ndeps=9"),
    (_raw(ndeps=1, deps=(1, 2, 0, 0, 0, 0, 0, 0)), "byte 76", "unused dep slot 1"),
    (_raw(opcode=Opcode.NOP, payload=bytes(23) + b"\x01"), "byte 127", "reserved payload byte"),
    (_raw(opcode=Opcode.KERNEL, payload=bytes(4) + b"\x01" + bytes(19)), "byte 108", "pad"),
    (_raw(opcode=Opcode.KERNEL, payload=bytes(16) + b"\x01" + bytes(7)), "byte 120",
     "reserved payload byte 16"),
    (_raw(opcode=Opcode.WAIT, payload=bytes(8) + b"\x02" + bytes(15)), "byte 112",
     "reserved payload byte 8"),
])
def test_malformed_descriptor_names_its_byte_offset(raw, where, what):
    stream = pack([Nop(0)]) + bytes(raw)  # the bad descriptor is the second one, at byte 64
    with pytest.raises(InvalidCommand) as info:
        unpack(stream)
    assert where in str(info.value) and what in str(info.value)


def test_length_not_a_multiple_of_64_is_rejected():
    with pytest.raises(InvalidCommand, match="not a multiple of 64; 10 bytes trail at byte 64"):
        unpack(pack([Nop(1)]) + bytes(10))


@pytest.mark.parametrize("build, match", [
    (lambda: Nop(1, deps=tuple(range(9))), "at most 8"),
    (lambda: Nop(-1), "cmd_id=-1"),
    (lambda: Dma(1, 0, 0, 2**64), "nbytes"),
    (lambda: Kernel(1, 2**32, 0), "launch"),
    (lambda: Signal(1, 0, True), "value=True"),
    (lambda: Wait(1, 0, 1, deps=(2**32,)), "deps"),
])
def test_out_of_range_fields_are_refused_at_construction(build, match):
    with pytest.raises(InvalidCommand, match=match):
        build()


def test_describe_is_one_readable_line_per_opcode():
    lines = [describe(c) for c in (
        Nop(1, deps=(0,)), Dma(2, reloc(Region.WEIGHTS, 0x40), reloc(Region.ARENA, 0), 128),
        Kernel(3, 1, 0), Kernel(4, 0, 0b11), Signal(5, 2, 1), Wait(6, 2, 3), Barrier(7))]
    assert lines == [
        "#1 NOP after 0",
        "#2 DMA weights+0x40 -> arena+0x0 128 B",
        "#3 KERNEL launch=1 cores=all",
        "#4 KERNEL launch=0 cores=0x3",
        "#5 SIGNAL sem[2] += 1",
        "#6 WAIT sem[2] >= 3",
        "#7 BARRIER",
    ]


def test_submission_ring_wraps_refuses_overflow_whole_and_frees_slots_on_fetch():
    ring = SubmissionRing(4, "npu.fw.q0")
    assert ring.write(pack([Nop(i) for i in range(3)])) == 0
    with pytest.raises(RingOverflow, match="2 commands does not fit.*1 of 4 slots free"):
        ring.write(pack([Nop(10), Nop(11)]))
    assert ring.tail == 3 and ring.free == 1  # nothing written
    for k in range(3):
        ring.fetch()
        assert ring.free == 2 + k  # fetching frees the slot
    first = ring.write(pack([Nop(20), Nop(21), Nop(22)]))  # wraps around slot 3 -> 0 -> 1
    assert first == 3
    assert [decode(ring.fetch()[1]).cmd_id for _ in range(3)] == [20, 21, 22]


def test_completion_entry_layout():
    cq = CompletionRing(2, queue=3)
    cq.post(cmd_id=7, status=Status.DMA_FAULT, seq=2**32 + 5, start=10, end=2**40)
    raw = bytes(cq._buf[:COMPLETION_BYTES])
    assert struct.unpack("<IHHIIQQ", raw) == (7, 3, 3, 5, 0, 10, 2**40)
    assert (cq.pending, cq.free) == (1, 1)
    assert cq.drain() == [(7, Status.DMA_FAULT, 3, 5, 10, 2**40)]
    assert (cq.pending, cq.free) == (0, 2)
