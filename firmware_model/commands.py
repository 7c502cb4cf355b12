"""Command descriptors: the fixed 64-byte binary records the host writes into a submission ring.

Every descriptor is little-endian and exactly :data:`COMMAND_BYTES` long::

    offset  size  field
    0       1     opcode   (Opcode)
    1       1     flags    reserved, must be 0
    2       2     ndeps    number of valid entries in deps (0..MAX_DEPS)
    4       4     cmd_id   u32, unique within a submission
    8       32    deps     u32[8]: ids of earlier commands of the same submission; unused slots 0
    40      24    payload  opcode-specific; every byte not used by the opcode must be 0

Payloads (offsets relative to byte 40):

- ``NOP``, ``BARRIER``: none (all 24 bytes reserved);
- ``DMA``: u64 src @0, u64 dst @8, u64 nbytes @16;
- ``KERNEL``: u32 launch @0, u32 pad @4 (0), u64 core_mask @8, 8 reserved bytes;
- ``SIGNAL``, ``WAIT``: u32 semaphore @0, u32 value @4, 16 reserved bytes.

Decoding is strict: an unknown opcode, ``ndeps > MAX_DEPS``, a nonzero reserved byte or a length
that is not a multiple of 64 raises :class:`~npu_sim.errors.InvalidCommand` naming the byte
offset, so a corrupt stream never decodes into something the firmware would run by accident.
The dataclasses validate their fields when built (:func:`unpack` builds them from a checked row
without that: fixed-width fields cannot be out of range), so ``unpack(pack(cmds)) == cmds``
always holds.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from enum import IntEnum

from npu_sim.errors import InvalidCommand

from .program import OFFSET_MASK, REGION_SHIFT, Region

COMMAND_BYTES = 64
MAX_DEPS = 8
U32_MAX = (1 << 32) - 1
U64_MAX = (1 << 64) - 1

_HEADER = struct.Struct("<BBHI8I")  # opcode, flags, ndeps, cmd_id, deps[8]: 40 bytes
_PAYLOAD_AT = _HEADER.size
_DMA = struct.Struct("<QQQ")
_KERNEL = struct.Struct("<IIQ8x")
_SEM = struct.Struct("<II16x")
_EMPTY = bytes(24)
_SCOPE = "npu.fw"


class Opcode(IntEnum):
    """What a descriptor asks the firmware to do."""

    NOP = 0
    DMA = 1
    KERNEL = 2
    SIGNAL = 3
    WAIT = 4
    BARRIER = 5


def _check_uint(cls_name: str, name: str, value: object, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise InvalidCommand(_SCOPE, f"{cls_name}.{name}={value!r} is invalid; expected an "
                             f"integer in [0, {limit}]")
    return value


@dataclass(frozen=True)
class _Base:
    """Fields every command has: its id and the ids of the commands it waits for."""

    cmd_id: int
    deps: tuple[int, ...] = field(default=(), kw_only=True)

    def __post_init__(self) -> None:
        name = type(self).__name__
        _check_uint(name, "cmd_id", self.cmd_id, U32_MAX)
        deps = tuple(self.deps)
        if len(deps) > MAX_DEPS:
            raise InvalidCommand(_SCOPE, f"{name} {self.cmd_id} has {len(deps)} deps; at most "
                                 f"{MAX_DEPS} fit a descriptor (chain Nop joins for more)")
        for d in deps:
            _check_uint(name, "deps[]", d, U32_MAX)
        object.__setattr__(self, "deps", deps)
        for field_name in _own_fields(type(self)):
            _check_uint(name, field_name, getattr(self, field_name), _LIMITS[field_name])


@functools.cache
def _own_fields(cls: type) -> tuple[str, ...]:
    """The fields of a command class besides ``cmd_id`` and ``deps`` (looked up once a class:
    ``dataclasses.fields`` per command was a fifth of decoding a stream)."""
    return tuple(f.name for f in fields(cls) if f.name not in ("cmd_id", "deps"))


_LIMITS = {"src": U64_MAX, "dst": U64_MAX, "nbytes": U64_MAX, "launch": U32_MAX,
           "core_mask": U64_MAX, "semaphore": U32_MAX, "value": U32_MAX}


@dataclass(frozen=True)
class Nop(_Base):
    """Does nothing. With deps it is a join: it completes once all of them have."""

    opcode = Opcode.NOP


@dataclass(frozen=True)
class Dma(_Base):
    """Copy ``nbytes`` from ``src`` to ``dst`` (HBM addresses, host IOVAs or relocatable)."""

    src: int
    dst: int
    nbytes: int
    opcode = Opcode.DMA


@dataclass(frozen=True)
class Kernel(_Base):
    """Run launch ``launch`` of the loaded program on the cores in ``core_mask`` (0 = all)."""

    launch: int
    core_mask: int
    opcode = Opcode.KERNEL


@dataclass(frozen=True)
class Signal(_Base):
    """Add ``value`` to semaphore ``semaphore`` (semaphores are counters; see docs/firmware.md)."""

    semaphore: int
    value: int
    opcode = Opcode.SIGNAL


@dataclass(frozen=True)
class Wait(_Base):
    """Wait until semaphore ``semaphore`` holds at least ``value``."""

    semaphore: int
    value: int
    opcode = Opcode.WAIT


@dataclass(frozen=True)
class Barrier(_Base):
    """Wait for every earlier command of the submission; every later one waits for it."""

    opcode = Opcode.BARRIER


Command = Nop | Dma | Kernel | Signal | Wait | Barrier
_CLASSES: dict[Opcode, type] = {Opcode.NOP: Nop, Opcode.DMA: Dma, Opcode.KERNEL: Kernel,
                                 Opcode.SIGNAL: Signal, Opcode.WAIT: Wait, Opcode.BARRIER: Barrier}
_CLASSES_BY_TYPE = {cls: op for op, cls in _CLASSES.items()}


def encode(cmd: Command) -> bytes:
    """The 64-byte descriptor of one command."""
    try:
        op = _CLASSES_BY_TYPE[type(cmd)]
    except KeyError:
        raise InvalidCommand(_SCOPE, f"cannot encode {type(cmd).__name__}; expected one of "
                             f"{[c.__name__ for c in _CLASSES.values()]}") from None
    deps = cmd.deps + (0,) * (MAX_DEPS - len(cmd.deps))
    header = _HEADER.pack(op, 0, len(cmd.deps), cmd.cmd_id, *deps)
    if isinstance(cmd, Dma):
        payload = _DMA.pack(cmd.src, cmd.dst, cmd.nbytes)
    elif isinstance(cmd, Kernel):
        payload = _KERNEL.pack(cmd.launch, 0, cmd.core_mask)
    elif isinstance(cmd, (Signal, Wait)):
        payload = _SEM.pack(cmd.semaphore, cmd.value)
    else:
        payload = _EMPTY
    return header + payload


def pack(commands: Sequence[Command]) -> bytes:
    """The concatenated descriptors of ``commands``."""
    return b"".join(encode(c) for c in commands)


_OPCODES = {int(o): o for o in Opcode}


def decode(data: bytes | bytearray | memoryview, offset: int = 0) -> Command:
    """Decode the descriptor at ``offset``; malformed bytes raise InvalidCommand with the offset."""
    if offset < 0 or offset + COMMAND_BYTES > len(data):
        raise InvalidCommand(_SCOPE, f"descriptor at byte {offset} is truncated: "
                             f"{len(data) - offset} bytes left, a descriptor is {COMMAND_BYTES}")
    opcode, flags, ndeps, cmd_id, *deps = _HEADER.unpack_from(data, offset)
    payload = bytes(data[offset + _PAYLOAD_AT:offset + COMMAND_BYTES])

    def bad(at: int, what: str) -> InvalidCommand:
        return InvalidCommand(_SCOPE, f"descriptor at byte {offset} (byte {offset + at}): {what}")

    op = _OPCODES.get(opcode)
    if op is None or op not in _CLASSES:
        valid = ", ".join(f"{o.value}={o.name}" for o in Opcode)
        raise bad(0, f"unknown opcode {opcode}; valid opcodes: {valid}")
    if flags:
        raise bad(1, f"flags={flags:#x}; the flags byte is reserved and must be 0")
    if ndeps > MAX_DEPS:
        raise bad(2, f"ndeps={ndeps}; at most {MAX_DEPS}")
    for i in range(ndeps, MAX_DEPS):
        if deps[i]:
            raise bad(8 + 4 * i, f"unused dep slot {i} holds {deps[i]}; it must be 0")
    dep_ids = tuple(deps[:ndeps])
    if op is Opcode.DMA:
        return Dma(cmd_id, *_DMA.unpack(payload), deps=dep_ids)
    if op is Opcode.KERNEL:
        launch, pad, mask = _KERNEL.unpack(payload)
        used = 16
        if pad:
            raise bad(_PAYLOAD_AT + 4, f"KERNEL pad word holds {pad}; it must be 0")
        result: Command = Kernel(cmd_id, launch, mask, deps=dep_ids)
    elif op in (Opcode.SIGNAL, Opcode.WAIT):
        used = 8
        result = _CLASSES[op](cmd_id, *_SEM.unpack(payload), deps=dep_ids)
    else:
        used = 0
        result = _CLASSES[op](cmd_id, deps=dep_ids)
    if payload.count(0, used) != len(payload) - used:  # a scan in C; the loop names the byte
        i = next(i for i in range(used, len(payload)) if payload[i])
        raise bad(_PAYLOAD_AT + i, f"reserved payload byte {i} of {op.name} holds "
                  f"{payload[i]:#04x}; it must be 0")
    return result


def unpack(data: bytes | bytearray | memoryview) -> list[Command]:
    """Decode a stream of descriptors (the inverse of :func:`pack`).

    Each descriptor is read as one row of integers and checked with a few comparisons
    (:func:`_well_formed`); a row that fails them is decoded again by :func:`decode`, which
    names the offending byte (a load spent ~3.5 us a command in :func:`decode` and the
    dataclasses' field checks, which a descriptor's fixed-width fields cannot fail)."""
    if len(data) % COMMAND_BYTES:
        raise InvalidCommand(_SCOPE, f"command stream of {len(data)} bytes is not a multiple of "
                             f"{COMMAND_BYTES}; {len(data) % COMMAND_BYTES} bytes trail at byte "
                             f"{len(data) - len(data) % COMMAND_BYTES}")
    return [_well_formed(row) or decode(data, k * COMMAND_BYTES)
            for k, row in enumerate(_ROW.iter_unpack(data))]


_ROW = struct.Struct(_HEADER.format + "QQQ")
"""A whole descriptor: the header, then the payload as three u64 words."""
_LOW = U32_MAX
_new = object.__new__
_OP_KERNEL, _OP_DMA, _OP_SIGNAL, _OP_WAIT, _OP_NOP, _OP_BARRIER = (
    int(Opcode.KERNEL), int(Opcode.DMA), int(Opcode.SIGNAL), int(Opcode.WAIT), int(Opcode.NOP),
    int(Opcode.BARRIER))
"""The opcodes as plain ints: comparing a row's opcode with an ``Opcode`` member took 3x as long
(the enum's attribute lookup), a sixth of :func:`unpack`'s time."""


def _well_formed(row: tuple[int, ...]) -> Command | None:
    """The command of a descriptor read as :data:`_ROW`, or None if any byte is wrong (a
    reserved byte set, an unknown opcode, too many deps): :func:`decode` then says which.

    Built without the dataclasses' ``__post_init__``: a field read from a u32 / u64 slot is in
    range by construction, and ``ndeps <= MAX_DEPS`` is checked here."""
    opcode, flags, ndeps = row[0], row[1], row[2]
    if flags or ndeps > MAX_DEPS or any(row[4 + ndeps : 12]):
        return None
    a, b, c = row[12], row[13], row[14]
    if opcode == _OP_KERNEL:
        if a > _LOW or c:  # the pad word, the 8 reserved bytes
            return None
        cmd = _new(Kernel)
        cmd.__dict__.update(cmd_id=row[3], deps=row[4 : 4 + ndeps], launch=a, core_mask=b)
    elif opcode == _OP_DMA:
        cmd = _new(Dma)
        cmd.__dict__.update(cmd_id=row[3], deps=row[4 : 4 + ndeps], src=a, dst=b, nbytes=c)
    elif opcode == _OP_SIGNAL or opcode == _OP_WAIT:
        if b or c:
            return None
        cmd = _new(Signal if opcode == _OP_SIGNAL else Wait)
        cmd.__dict__.update(cmd_id=row[3], deps=row[4 : 4 + ndeps], semaphore=a & _LOW,
                            value=a >> 32)
    elif opcode == _OP_NOP or opcode == _OP_BARRIER:
        if a or b or c:
            return None
        cmd = _new(Nop if opcode == _OP_NOP else Barrier)
        cmd.__dict__.update(cmd_id=row[3], deps=row[4 : 4 + ndeps])
    else:
        return None
    return cmd


def describe_address(address: int) -> str:
    """An address as a person reads it: ``arena+0x40``, ``weights+0x0`` or absolute hex."""
    region, offset = address >> REGION_SHIFT, address & OFFSET_MASK
    if region in (Region.ARENA, Region.WEIGHTS, Region.HOST):
        return f"{Region(region).name.lower()}+{offset:#x}"
    return f"{address:#x}"


def describe(cmd: Command) -> str:
    """One line for a command, as the ``inspect`` CLI prints it."""
    head = f"#{cmd.cmd_id} {type(cmd).opcode.name}"
    if isinstance(cmd, Dma):
        body = (f" {describe_address(cmd.src)} -> {describe_address(cmd.dst)} "
                f"{cmd.nbytes} B")
    elif isinstance(cmd, Kernel):
        body = f" launch={cmd.launch} cores={'all' if not cmd.core_mask else hex(cmd.core_mask)}"
    elif isinstance(cmd, (Signal, Wait)):
        rel = "+=" if isinstance(cmd, Signal) else ">="
        body = f" sem[{cmd.semaphore}] {rel} {cmd.value}"
    else:
        body = ""
    deps = f" after {','.join(map(str, cmd.deps))}" if cmd.deps else ""
    return head + body + deps


__all__ = [
    "COMMAND_BYTES", "MAX_DEPS", "Barrier", "Command", "Dma", "Kernel", "Nop", "Opcode", "Signal",
    "Wait", "decode", "describe", "describe_address", "encode", "pack", "unpack",
]
