"""Typed errors raised by the simulated device.

Every error names the component scope that raised it (``npu.hbm``, ``npu.dma1``, ``npu.core0``),
the offending value, and what would have been valid. Nothing in the simulator warns and carries
on: a condition the hardware would fault on raises one of these, and the device state is left as
it was before the failing call.

The hierarchy::

    NpuSimError
    ├── ConfigError          a DeviceConfig field is out of range, or a config file is malformed
    ├── HbmError
    │   ├── HbmOutOfMemory   no free block is large enough for an allocation
    │   └── InvalidFree      zero/negative size, double free, a buffer of another device
    ├── DmaFault             out-of-bounds, freed or unaligned DMA descriptor
    ├── KernelError          a kernel cannot take the shapes, dtypes or attributes it was given
    ├── InvalidCommand       a firmware command descriptor is malformed (raised by firmware_model)
    ├── DeviceFault          the firmware posted a fault completion for a submission
    └── TraceError           a trace file or trace is malformed, or cannot be replayed
"""

from __future__ import annotations


class NpuSimError(Exception):
    """Base class of every error the simulator raises on purpose."""

    def __init__(self, scope: str, message: str) -> None:
        # Exception.__init__ is not called, so ``args`` stay the concrete class's constructor
        # arguments and ``type(e)(*e.args)`` rebuilds the error (simpy does exactly that when a
        # failed event crashes ``run()``; pickling relies on it too).
        self.scope = scope
        self.message = message

    def __str__(self) -> str:
        return f"{self.scope}: {self.message}" if self.scope else self.message


class ConfigError(NpuSimError, ValueError):
    """A device configuration value is invalid.

    ``field`` names the offending parameter (or key in a config file), ``value`` is what was
    given, and ``valid`` describes the allowed range or choices.
    """

    def __init__(self, field: str, value: object, valid: str) -> None:
        self.field = field
        self.value = value
        self.valid = valid
        super().__init__("npu.config", f"{field}={value!r} is invalid; expected {valid}")


class HbmError(NpuSimError):
    """Base class of HBM allocator errors."""


class HbmOutOfMemory(HbmError, MemoryError):
    """No free block can hold the requested allocation.

    Carries the request (``nbytes``, after alignment), the total free bytes and the largest free
    block, so a caller can tell exhaustion from fragmentation.
    """

    def __init__(self, scope: str, nbytes: int, free_bytes: int, largest_free_block: int) -> None:
        self.nbytes = nbytes
        self.free_bytes = free_bytes
        self.largest_free_block = largest_free_block
        super().__init__(
            scope,
            f"cannot allocate {format_bytes(nbytes)} (free {format_bytes(free_bytes)}, "
            f"largest block {format_bytes(largest_free_block)})",
        )


class InvalidFree(HbmError, ValueError):
    """An allocation or free request is malformed: bad size, double free, foreign buffer."""


class DmaFault(NpuSimError):
    """A DMA descriptor addresses memory it may not touch. No byte was moved."""


class KernelError(NpuSimError, ValueError):
    """A kernel cannot execute with the given shapes, dtypes or attributes.

    ``op`` is the kernel (ONNX op type) and ``node`` the graph node it was launched for.
    """

    def __init__(self, op: str, node: str, message: str) -> None:
        self.op = op
        self.node = node
        where = f"{op} (node {node!r})" if node else op
        super().__init__("npu.core", f"{where}: {message}")


class InvalidCommand(NpuSimError, ValueError):
    """A firmware command descriptor or program is malformed."""


class DeviceFault(NpuSimError):
    """The firmware completed a command with a fault status.

    ``status`` is the completion status name, ``command_id`` the faulting command.
    """

    def __init__(self, scope: str, command_id: int, status: str, message: str) -> None:
        self.command_id = command_id
        self.status = status
        super().__init__(scope, f"command {command_id} faulted with {status}: {message}")


class TraceError(NpuSimError, ValueError):
    """A trace cannot be read, exported or replayed.

    ``where`` names the file and line (``"run.trace.jsonl:12"``) or the record; the message says
    what is wrong and what would be valid.
    """

    def __init__(self, where: str, message: str) -> None:
        self.where = where
        super().__init__("npu.trace", f"{where}: {message}" if where else message)


def format_bytes(n: int) -> str:
    """Human-readable byte count: ``3.2 GiB``, ``512 B``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
