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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..config import DeviceConfig
from ..dtypes import TensorSpec
from ..errors import KernelError
from .energy import dynamic, launch_energy


@dataclass(frozen=True)
class Cost:
    """Cycles of one kernel launch, with the work behind them.

    ``total_cycles = max(compute_cycles, memory_cycles) + overhead_cycles``. ``hbm_bytes``
    counts every byte moved between HBM and SRAM including re-fetches; ``refetch`` is that over
    the bytes of the operands themselves (1.0 when every tile fitted SRAM), and ``notes`` says
    what was re-fetched and why. ``engine`` is ``"array"``, ``"vector"`` or ``"none"`` (a view);
    ``cores`` is the number of cores that got work.

    ``split`` is how an array op's work was divided over the cores: ``"M"`` (output rows),
    ``"N"`` (output columns), ``"K"`` (the reduction, partial sums added on the vector unit),
    ``"items"`` (whole GEMMs: groups, batch) or ``""`` (not a GEMM). ``tile`` is the per-core
    SRAM tiling the cycles were priced with (``(("m", tm), ("n", tn), ("k", tk))`` for a GEMM,
    ``(("elements", e),)`` for a vector op) and ``sram_bytes`` the SRAM it occupies on one core.
    ``energy`` is picojoules by component (:mod:`npu_sim.cost.energy`).
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
    split: str = ""
    tile: tuple[tuple[str, int], ...] = ()
    sram_bytes: int = 0
    energy: Mapping[str, float] = field(default_factory=dict, hash=False, compare=False)

    @property
    def energy_pj(self) -> float:
        """Total energy of the launch (dynamic and leakage), in picojoules."""
        return math.fsum(self.energy.values())

    @property
    def dynamic_energy_pj(self) -> float:
        """Energy of the launch's actions (everything but leakage), in picojoules."""
        return dynamic(self.energy)


def launch_cycles(config: DeviceConfig, compute: int, hbm_bytes: int, first_tile: int,
                  last_tile: int) -> tuple[int, int, int]:
    """``(memory, overhead, total)`` cycles of a launch (the module docstring's sums)."""
    bw = config.hbm_bytes_per_cycle
    memory = math.ceil(hbm_bytes / bw) if hbm_bytes else 0
    fill = config.hbm_latency_cycles + math.ceil(first_tile / bw) if first_tile else 0
    drain = math.ceil(last_tile / bw) if last_tile else 0
    overhead = config.launch_overhead_cycles + fill + drain
    return memory, overhead, max(compute, memory) + overhead


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
    split: str = "",
    tile: tuple[tuple[str, int], ...] = (),
    sram_bytes: int = 0,
    dtype: str = "float32",
    array_macs: int = 0,
    vector_ops: float = 0.0,
    engine_read: int = 0,
    engine_written: int = 0,
    hbm_out: int = 0,
) -> Cost:
    """Assemble a :class:`Cost` from engine cycles, HBM traffic and the first/last tile bytes.

    The energy arguments (``dtype`` of the work, ``array_macs``, ``vector_ops``, SRAM bytes the
    engines read and write, ``hbm_out`` of the ``hbm_bytes`` that leave for HBM) are priced by
    :func:`~npu_sim.cost.energy.launch_energy`, with leakage over the total cycles.
    """
    memory, overhead, total = launch_cycles(config, compute, hbm_bytes, first_tile, last_tile)
    hbm_out = min(hbm_out, hbm_bytes)
    energy = launch_energy(
        config, dtype=dtype, array_macs=array_macs, vector_ops=vector_ops,
        engine_read=engine_read, engine_written=engine_written, hbm_in=hbm_bytes - hbm_out,
        hbm_out=hbm_out, cycles=total, cores=cores,
    )
    return Cost(
        compute_cycles=compute,
        memory_cycles=memory,
        overhead_cycles=overhead,
        total_cycles=total,
        macs=macs,
        hbm_bytes=hbm_bytes,
        engine=engine,
        refetch=refetch,
        cores=cores,
        notes=notes,
        split=split,
        tile=tile,
        sram_bytes=sram_bytes,
        energy=energy,
    )


def spec(op: str, specs: Sequence[TensorSpec | None], index: int, what: str) -> TensorSpec:
    """``specs[index]``, or a KernelError naming the missing operand."""
    if index >= len(specs) or specs[index] is None:
        raise KernelError(op, "", f"missing {what} (operand {index}); got {len(specs)} operands")
    return specs[index]


def present(specs: Sequence[TensorSpec | None], indices: Sequence[int]) -> int:
    """Total bytes of the operands at ``indices`` that are given (optional ones may be None)."""
    return sum(specs[i].nbytes for i in indices if i < len(specs) and specs[i] is not None)
