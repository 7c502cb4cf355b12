"""The :class:`Cost` of one kernel launch and how its parts add up.

Every launch is priced the same way, whatever the engine::

    total = max(compute, memory) + overhead
    overhead = launch + fill + drain

``compute`` is the busiest core's engine time, ``memory`` the HBM traffic at the HBM bandwidth
(shared by all cores). Tiles are double-buffered, so compute and memory overlap except for the
first tile, which must arrive before compute starts (``fill``: HBM latency plus the tile's
transfer), and the last output tile, which leaves after compute ends (``drain``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..config import DeviceConfig
from ..dtypes import TensorSpec
from ..errors import KernelError


@dataclass(frozen=True)
class Cost:
    """Cycles of one kernel launch, with the work behind them.

    ``total_cycles = max(compute_cycles, memory_cycles) + overhead_cycles``. ``hbm_bytes``
    counts every byte moved between HBM and SRAM including re-fetches; ``refetch`` is that over
    the bytes of the operands themselves (1.0 when every tile fitted SRAM), and ``notes`` says
    what was re-fetched and why. ``engine`` is ``"array"``, ``"vector"`` or ``"none"`` (a view);
    ``cores`` is the number of cores that got work.
    """

    compute_cycles: int
    memory_cycles: int
    overhead_cycles: int
    total_cycles: int
    macs: int = 0
    hbm_bytes: int = 0
    engine: str = "none"
    refetch: float = 1.0
    cores: int = 1
    notes: str = ""


def make_cost(
    config: DeviceConfig,
    *,
    compute: int,
    hbm_bytes: int,
    first_tile: int,
    last_tile: int,
    engine: str,
    cores: int,
    macs: int = 0,
    refetch: float = 1.0,
    notes: str = "",
) -> Cost:
    """Assemble a :class:`Cost` from engine cycles, HBM traffic and the first/last tile bytes."""
    bw = config.hbm_bytes_per_cycle
    memory = math.ceil(hbm_bytes / bw) if hbm_bytes else 0
    fill = config.hbm_latency_cycles + math.ceil(first_tile / bw) if first_tile else 0
    drain = math.ceil(last_tile / bw) if last_tile else 0
    overhead = config.launch_overhead_cycles + fill + drain
    return Cost(
        compute_cycles=compute,
        memory_cycles=memory,
        overhead_cycles=overhead,
        total_cycles=max(compute, memory) + overhead,
        macs=macs,
        hbm_bytes=hbm_bytes,
        engine=engine,
        refetch=refetch,
        cores=cores,
        notes=notes,
    )


def spec(op: str, specs: Sequence[TensorSpec | None], index: int, what: str) -> TensorSpec:
    """``specs[index]``, or a KernelError naming the missing operand."""
    if index >= len(specs) or specs[index] is None:
        raise KernelError(op, "", f"missing {what} (operand {index}); got {len(specs)} operands")
    return specs[index]


def present(specs: Sequence[TensorSpec | None], indices: Sequence[int]) -> int:
    """Total bytes of the operands at ``indices`` that are given (optional ones may be None)."""
    return sum(specs[i].nbytes for i in indices if i < len(specs) and specs[i] is not None)
