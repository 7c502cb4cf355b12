"""firmware_model: the device firmware, a command processor in front of the simulated NPU.

The host writes fixed-size binary command descriptors into a submission ring and rings a
doorbell; the firmware decodes them, tracks their dependencies, dispatches them to DMA channels
and compute cores concurrently, and posts a completion with a status for each. A malformed
command faults its completion and never the simulator; the device stays usable.
"""

from .commands import (
    COMMAND_BYTES,
    MAX_DEPS,
    Barrier,
    Command,
    Dma,
    Kernel,
    Nop,
    Opcode,
    Signal,
    Wait,
    describe,
    pack,
    unpack,
)
from .loader import LoadedProgram, run_program, validate
from .processor import Firmware
from .program import KernelLaunch, Program, Region, TensorDesc, reloc
from .queue import Submission
from .rings import COMPLETION_BYTES, Completion, RingOverflow, Status

__all__ = [
    "COMMAND_BYTES",
    "COMPLETION_BYTES",
    "MAX_DEPS",
    "Barrier",
    "Command",
    "Completion",
    "Dma",
    "Firmware",
    "Kernel",
    "KernelLaunch",
    "LoadedProgram",
    "Nop",
    "Opcode",
    "Program",
    "Region",
    "RingOverflow",
    "Signal",
    "Status",
    "Submission",
    "TensorDesc",
    "Wait",
    "describe",
    "pack",
    "reloc",
    "run_program",
    "unpack",
    "validate",
]
