"""Energy of a launch, in the spirit of Accelergy: actions counted, each times its energy.

The cost model already counts what a launch does: MACs, vector lane-operations and bytes moved
between HBM and SRAM. The energy model adds what the engines read from and write to SRAM, and
prices every action with a per-action energy from the :class:`~npu_sim.config.DeviceConfig`
(``*_mac_pj``, ``sram_read_pj_per_byte``, ``sram_write_pj_per_byte``, ``hbm_pj_per_byte``,
``leakage_pj_per_core_cycle``). A launch's energy is a dict of picojoules by component:

- ``array``: MACs on the systolic array times the MAC energy of the operand dtype;
- ``vector``: lane-operations on the vector unit, each priced as one MAC of the element's dtype;
- ``sram_read`` / ``sram_write``: bytes the engines read and write, plus every byte arriving from
  HBM (written into SRAM) or leaving for it (read out of SRAM);
- ``hbm``: bytes moved between HBM and SRAM, re-fetches included;
- ``leakage``: the cores that got work, for the launch's cycles (static; the other components are
  dynamic, and a view has none of them).

SRAM traffic of a GEMM depends on the dataflow (see :func:`array_sram_bytes`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

from ..config import DeviceConfig
from .systolic import ACC_BYTES


def femtojoules(pj: float) -> int:
    """``pj`` picojoules as whole femtojoules: the device's energy counters are integers, so
    they add up to the same total in any order (a replayed run's counters equal a simulated
    run's bit for bit) and a sub-femtojoule rounding per action is far below the model's
    accuracy."""
    return round(pj * 1000)


DYNAMIC = ("array", "vector", "sram_read", "sram_write", "hbm")
"""The dynamic components; ``leakage`` is the static one."""


class Energy(Mapping):
    """Picojoules by component, read-only (costs are cached and shared) and picklable."""

    __slots__ = ("_pj",)

    def __init__(self, values: Mapping[str, float]) -> None:
        self._pj = dict(values)

    def __getitem__(self, key: str) -> float:
        return self._pj[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._pj)

    def __len__(self) -> int:
        return len(self._pj)

    def __repr__(self) -> str:
        return f"Energy({self._pj!r})"

    def __reduce__(self):
        return Energy, (self._pj,)


def array_sram_bytes(config: DeviceConfig, m: int, n: int, k: int, a_item: int, b_item: int,
                     out_item: int) -> tuple[int, int]:
    """``(read, written)`` SRAM bytes of one ``(m x k) @ (k x n)`` GEMM on one core's array.

    Output-stationary: every fold reads its ``R`` rows of A and ``C`` columns of B, so A is read
    once per column fold and B once per row fold; the outputs are written once. Weight-
    (input-)stationary: the stationary operand is read once, the streamed one once per column
    fold of the stationary, and partial sums go back to SRAM between reduction folds (32-bit,
    read and written once per extra fold).
    """
    if not (m and n and k):
        return 0, 0
    rows, cols = config.array_rows, config.array_cols
    a, b, out = m * k * a_item, k * n * b_item, m * n * out_item
    if config.dataflow == "os":
        return a * -(-n // cols) + b * -(-m // rows), out
    partial = m * n * ACC_BYTES * (-(-k // rows) - 1)
    if config.dataflow == "ws":
        read = b + a * -(-n // cols)
    else:  # "is": A stays, B streams once per column fold of A (M laid over the columns)
        read = a + b * -(-m // cols)
    return read + partial, out + partial


def launch_energy(
    config: DeviceConfig,
    *,
    dtype: str,
    array_macs: int = 0,
    vector_ops: float = 0.0,
    engine_read: int = 0,
    engine_written: int = 0,
    hbm_in: int = 0,
    hbm_out: int = 0,
    cycles: int = 0,
    cores: int = 1,
) -> Mapping[str, float]:
    """Picojoules by component (module docstring) for one launch, read-only."""
    mac = config.mac_pj(dtype)
    energy = {
        "array": array_macs * mac,
        "vector": vector_ops * mac,
        "sram_read": (engine_read + hbm_out) * config.sram_read_pj_per_byte,
        "sram_write": (engine_written + hbm_in) * config.sram_write_pj_per_byte,
        "hbm": (hbm_in + hbm_out) * config.hbm_pj_per_byte,
        "leakage": cycles * cores * config.leakage_pj_per_core_cycle,
    }
    return Energy(energy)


def dynamic(energy: Mapping[str, float]) -> float:
    """The dynamic part of a launch's energy (everything but leakage), in picojoules."""
    return math.fsum(v for k, v in energy.items() if k != "leakage")
