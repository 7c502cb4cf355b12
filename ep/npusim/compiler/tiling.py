"""Tiling: how many cores each launch uses, its SRAM tiles, and which cores run it.

For every launch the compiler decides

- the *core split*: how many cores ``k`` the launch runs on. The launch's price, as the device
  computes it (:func:`ep.npusim.ops.price`: the kernel's own cycles, else
  :func:`npu_sim.cost.op_cost`), decides how work splits over ``k`` cores and how many of them
  get any; ``k`` is the smallest count whose cost is within :data:`SPLIT_GAIN` of the best over
  ``1..cores``: a small op stays on fewer cores when splitting does not pay, leaving the others
  free for an independent branch;
- the *SRAM tiling*: per core, tile sizes that fit ``sram_bytes_per_core`` with the streamed
  operands double-buffered. Which ops are GEMM-shaped is their operator catalogue entry's
  :class:`~ep.npusim.ops.Tiling`. A GEMM-shaped op (Conv as im2col, Gemm, MatMul and their QLinear
  forms) tiles ``(tm, tn, tk)``: ``2 * (tm*tk + tk*tn) * itemsize + tm*tn * 4`` bytes (the
  accumulator is 32-bit); a vector op tiles a run of elements through ``2 * operands`` buffers.
  Tiles start at the whole per-core problem and the largest dimension is halved until they fit.

:func:`assign_cores` then places each launch on concrete cores by list scheduling over the
launch DAG with the cost model's cycles: a launch takes the ``k`` cores that are free earliest
once its inputs are ready, so independent branches land on disjoint cores. The mask becomes the
KERNEL command's ``core_mask``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from npu_sim.config import DeviceConfig
from npu_sim.dtypes import TensorSpec, itemsize

from ..ops import Tiling, entry, ops_where, price

SPLIT_GAIN = 0.05
"""Another core must save at least this fraction of the launch's cycles to be worth taking."""

GEMM_OPS = ops_where(tiling=Tiling.GEMM)
CONV_OPS = ops_where(tiling=Tiling.CONV)
ACC_BYTES = 4


@dataclass(frozen=True)
class TilePlan:
    """The tiling decision for one launch (recorded per launch in the compile report)."""

    cores: int
    tile: tuple[tuple[str, int], ...]
    sram_bytes: int
    cycles: int
    cycles_one_core: int
    engine: str

    def as_dict(self) -> dict[str, Any]:
        return {"cores": self.cores, "tile": dict(self.tile),
                "sram_bytes": self.sram_bytes, "cycles": self.cycles,
                "cycles_one_core": self.cycles_one_core, "engine": self.engine}


def plan_launch(
    config: DeviceConfig,
    op: str,
    in_specs: Sequence[TensorSpec | None],
    out_specs: Sequence[TensorSpec],
    attrs: Mapping[str, Any],
) -> TilePlan:
    """Choose the core split and SRAM tiles of one launch (see the module docstring)."""
    costs = [price(config, op, in_specs, out_specs, attrs, k)
             for k in range(1, config.cores + 1)]
    best = min(c.total_cycles for c in costs)
    cores = next(k for k, c in enumerate(costs, 1) if c.total_cycles <= best * (1 + SPLIT_GAIN))
    tile, sram = _tiles(config, op, in_specs, out_specs, attrs, cores)
    chosen = costs[cores - 1]
    return TilePlan(cores, tile, sram, chosen.total_cycles, costs[0].total_cycles,
                    getattr(chosen, "engine", "vector"))


def _tiles(
    config: DeviceConfig,
    op: str,
    in_specs: Sequence[TensorSpec | None],
    out_specs: Sequence[TensorSpec],
    attrs: Mapping[str, Any],
    cores: int,
) -> tuple[tuple[tuple[str, int], ...], int]:
    """Per-core tile sizes that fit SRAM double-buffered, and the bytes they take."""
    sram = config.sram_bytes_per_core
    gemm = _gemm_dims(op, in_specs, out_specs, attrs)
    if gemm is not None:
        m, n, k, dtype = gemm
        isz = itemsize(dtype)
        dims = {"m": max(1, -(-m // cores)), "n": max(1, n), "k": max(1, k)}

        def footprint(d: dict[str, int]) -> int:
            return 2 * (d["m"] * d["k"] + d["k"] * d["n"]) * isz + d["m"] * d["n"] * ACC_BYTES

        while footprint(dims) > sram and max(dims.values()) > 1:
            key = max(dims, key=dims.__getitem__)
            dims[key] = -(-dims[key] // 2)
        return tuple(dims.items()), footprint(dims)
    operands = [s for s in (*in_specs, *out_specs) if s is not None]
    elements = max((s.size for s in operands), default=0)
    per_core = -(-elements // cores)
    element_bytes = sum(itemsize(s.dtype) for s in operands) or 1
    tile = max(1, min(per_core, sram // (2 * element_bytes)))
    return (("elements", tile),), 2 * tile * element_bytes


def _gemm_dims(
    op: str,
    in_specs: Sequence[TensorSpec | None],
    out_specs: Sequence[TensorSpec],
    attrs: Mapping[str, Any],
) -> tuple[int, int, int, str] | None:
    """``(M, N, K, dtype)`` of the GEMM a launch performs (per group for a convolution)."""
    if not out_specs or not in_specs or in_specs[0] is None:
        return None
    out, x = out_specs[0].shape, in_specs[0]
    if op in GEMM_OPS and len(out) >= 1:
        k = x.shape[-1] if not attrs.get("transA", 0) else x.shape[0]
        if len(x.shape) == 1:
            k = x.shape[0]
        return max(1, math.prod(out[:-1])), out[-1], k, x.dtype
    if op in CONV_OPS and len(out) >= 3:
        w_index = entry(op).weight_input
        w = in_specs[w_index] if len(in_specs) > w_index else None
        if w is None:
            return None
        groups = int(attrs.get("group", 1))
        m = out[0] * math.prod(out[2:])
        if op == "ConvTranspose":
            return m, w.shape[1], math.prod(w.shape[2:]) * w.shape[0] // groups, x.dtype
        return m, w.shape[0] // groups, math.prod(w.shape[1:]), x.dtype
    return None


def assign_cores(
    config: DeviceConfig,
    plans: Sequence[TilePlan],
    deps: Sequence[Sequence[int]],
) -> list[int]:
    """A core mask per launch, by list scheduling in launch order (see the module docstring).

    ``deps[i]`` are the launches launch ``i`` must follow. Returns bit masks over
    ``config.cores`` cores with ``plans[i].cores`` bits set.
    """
    free_at = [0] * config.cores
    finish: list[int] = []
    masks: list[int] = []
    for plan, before in zip(plans, deps, strict=True):
        ready = max((finish[d] for d in before), default=0)
        order = sorted(range(config.cores), key=lambda c: (max(free_at[c], ready), c))
        chosen = sorted(order[:plan.cores])
        start = max(ready, *(free_at[c] for c in chosen))
        end = start + plan.cycles
        for c in chosen:
            free_at[c] = end
        finish.append(end)
        masks.append(sum(1 << c for c in chosen))
    return masks
