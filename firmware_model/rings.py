"""Submission and completion rings: the memory the host and the firmware share, per queue.

A queue has two circular buffers with the same number of entries, ``ring_entries``:

- the **submission ring** holds 64-byte command descriptors (:mod:`firmware_model.commands`).
  The host writes descriptors at ``tail`` and then *rings the doorbell* with the new tail; the
  firmware fetches from its fetch pointer up to that tail. **Fetching frees the slot**: the
  firmware copies the descriptor into its own tracking table, so the ring bounds only the
  descriptors written and not yet fetched, never the commands in flight. A submission longer
  than the ring is streamed by the host (``Firmware.submit``): several doorbells, each
  announcing a refill of the slots fetched since the last.
- the **completion ring** holds one :data:`COMPLETION_BYTES`-byte entry per finished command,
  written by the firmware in completion order and drained by the host
  (:meth:`CompletionRing.drain`). The firmware never posts into a full completion ring: it
  holds finished commands' entries back until the host has drained (flow control).

Positions are monotonically increasing sequence numbers; slot = position mod entries. The raw
write (:meth:`SubmissionRing.write`) of more descriptors than there are free slots is refused
whole (:class:`RingOverflow`) and nothing is written.

Completion entry (little-endian, 32 bytes)::

    offset  size  field
    0       4     cmd_id    u32, the command's id
    4       2     status    u16, a Status value (0 = OK)
    6       2     queue     u16, the queue index
    8       4     seq       u32, the command's ring position (mod 2**32): identifies submission
    12      4     reserved  0
    16      8     start     u64, cycle the command started executing (its deps were met)
    24      8     end       u64, cycle it completed
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from npu_sim.errors import ConfigError, InvalidCommand

from .commands import COMMAND_BYTES

COMPLETION_BYTES = 32
_COMPLETION = struct.Struct("<IHHIIQQ")
assert _COMPLETION.size == COMPLETION_BYTES


class Status(IntEnum):
    """Completion status of a command. Everything but ``OK`` is a fault."""

    OK = 0
    INVALID_OPCODE = 1  # the descriptor does not decode (unknown opcode, bad ndeps, reserved bits)
    MISSING_DEPENDENCY = 2  # a dep names no earlier command of the submission
    DMA_FAULT = 3  # a DMA range is outside any allocation/mapping, or unaligned
    KERNEL_FAULT = 4  # the kernel rejected its launch or failed
    INVALID_LAUNCH = 5  # launch index out of range, no program loaded, or bad core mask
    INVALID_SEMAPHORE = 6  # semaphore index out of range
    DUPLICATE_ID = 7  # the cmd_id was already used earlier in the submission
    WAIT_TIMEOUT = 8  # the watchdog found the device idle with this WAIT unsatisfied
    CANCELLED = 9  # not run because a dependency did not complete OK


@dataclass(frozen=True)
class Completion:
    """A decoded completion entry, plus the fault message from the firmware's fault log."""

    queue: int
    seq: int
    cmd_id: int
    status: Status
    start: int
    end: int
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


class RingOverflow(InvalidCommand):
    """A raw write needs more submission-ring slots than are free. Nothing was written."""


class SubmissionRing:
    """The descriptor ring of one queue: host writes at ``tail``, firmware fetches in order."""

    def __init__(self, entries: int, scope: str) -> None:
        if isinstance(entries, bool) or not isinstance(entries, int) or not 1 <= entries <= 65536:
            raise ConfigError("ring_entries", entries, "an integer in [1, 65536]")
        self.entries = entries
        self.scope = scope
        self._buf = bytearray(entries * COMMAND_BYTES)
        self.tail = 0  # next position the host writes
        self.fetched = 0  # next position the firmware fetches; every slot before it is free

    @property
    def free(self) -> int:
        """Slots the host may write now: those not holding a written, unfetched descriptor."""
        return self.entries - (self.tail - self.fetched)

    def write(self, data: bytes) -> int:
        """Append whole descriptors; returns the position of the first. All or nothing."""
        count = len(data) // COMMAND_BYTES
        if len(data) % COMMAND_BYTES:
            raise InvalidCommand(self.scope, f"submission of {len(data)} bytes is not a multiple "
                                             f"of {COMMAND_BYTES}")
        if count > self.free:
            raise RingOverflow(self.scope, f"submission of {count} commands does not fit the "
                                           f"submission ring: {self.free} of {self.entries} "
                                           f"slots free (write at most {self.free}, or stream "
                                           f"the rest as the firmware fetches)")
        first = self.tail
        for i in range(count):
            slot = (first + i) % self.entries * COMMAND_BYTES
            self._buf[slot:slot + COMMAND_BYTES] = data[i * COMMAND_BYTES:(i + 1) * COMMAND_BYTES]
        self.tail += count
        return first

    def fetch(self) -> tuple[int, bytes]:
        """The next descriptor for the firmware: ``(position, 64 bytes)``; frees its slot."""
        if self.fetched >= self.tail:
            raise AssertionError(f"{self.scope}: fetch past tail {self.tail}")
        pos = self.fetched
        slot = pos % self.entries * COMMAND_BYTES
        self.fetched += 1
        return pos, bytes(self._buf[slot:slot + COMMAND_BYTES])


class CompletionRing:
    """The completion ring of one queue: firmware posts at ``tail``, host drains from ``head``."""

    def __init__(self, entries: int, queue: int) -> None:
        self.entries = entries
        self.queue = queue
        self._buf = bytearray(entries * COMPLETION_BYTES)
        self.tail = 0
        self.head = 0

    @property
    def pending(self) -> int:
        """Entries posted and not yet drained."""
        return self.tail - self.head

    @property
    def free(self) -> int:
        """Entries the firmware may post now."""
        return self.entries - self.pending

    def post(self, cmd_id: int, status: Status, seq: int, start: int, end: int) -> None:
        """Write one entry. The firmware posts only into free entries; check it anyway."""
        if self.pending >= self.entries:
            raise AssertionError(f"completion ring of queue {self.queue} overflowed")
        slot = self.tail % self.entries * COMPLETION_BYTES
        _COMPLETION.pack_into(self._buf, slot, cmd_id, int(status), self.queue,
                              seq & 0xFFFFFFFF, 0, start, end)
        self.tail += 1

    def drain(self) -> list[tuple[int, Status, int, int, int, int]]:
        """Decode and consume every pending entry: ``(cmd_id, status, queue, seq, start, end)``."""
        out = []
        while self.head < self.tail:
            slot = self.head % self.entries * COMPLETION_BYTES
            cmd_id, status, queue, seq, _, start, end = _COMPLETION.unpack_from(self._buf, slot)
            out.append((cmd_id, Status(status), queue, seq, start, end))
            self.head += 1
        return out
