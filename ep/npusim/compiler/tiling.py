"""Tiling: how many cores each launch uses, its SRAM tiles, and which cores run it.

For every launch the compiler decides the *core split*: how many cores ``k`` the launch runs
on. The launch's price as the device computes it (:func:`ep.npusim.ops.price`: the kernel's own
cycles, else :func:`npu_sim.cost.op_cost`) decides how work splits over ``k`` cores (a GEMM or
convolution along output rows ``M``, output columns ``N``, the reduction ``K`` or whole groups,
whichever is fastest) and how many of them get any; ``k`` is the smallest count whose cost is
within :data:`SPLIT_GAIN` of the best over ``1..cores``: a small op stays on fewer cores when
splitting does not pay, leaving the others free for an independent branch.

The *SRAM tiling* is the cost model's own: the tile shape (``m, n, k`` for a GEMM, a run of
``elements`` for a vector op) and the SRAM bytes it takes are those the launch's cycles and HBM
traffic were priced with (``Cost.tile``, ``Cost.sram_bytes``), so the report cannot disagree
with the cycles.

:func:`assign_cores` then places each launch on concrete cores by list scheduling over the
launch DAG with the cost model's cycles: a launch takes the ``k`` cores that are free earliest
once its inputs are ready, so independent branches land on disjoint cores. The mask becomes the
KERNEL command's ``core_mask``.

A plan is a pure function of the config, the op, its operands' types and its attributes (and
the pricing function the device uses for the op): :class:`PlanCache` keeps the plans it has made,
a bounded number of them, so launches of the same shape, in one partition or in the next
session's, are priced once (a depthwise block of a MobileNet repeats a handful of shapes).
"""

from __future__ import annotations

import functools
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from npu_sim import kernels as npu_kernels
from npu_sim.config import DeviceConfig
from npu_sim.dtypes import TensorSpec

from ..ops import price
from .ir import TensorType

_CONFIGS = 64
"""Distinct configs :meth:`PlanCache.planner` keeps one instance of."""

SPLIT_GAIN = 0.05
"""Another core must save at least this fraction of the launch's cycles to be worth taking."""


@dataclass(frozen=True)
class TilePlan:
    """The tiling decision for one launch (recorded per launch in the compile report)."""

    cores: int
    tile: tuple[tuple[str, int], ...]
    sram_bytes: int
    cycles: int
    cycles_one_core: int
    engine: str
    split: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The plan as the compile report records it."""
        return {"cores": self.cores, "split": self.split, "tile": dict(self.tile),
                "sram_bytes": self.sram_bytes, "cycles": self.cycles,
                "cycles_one_core": self.cycles_one_core, "engine": self.engine}


def plan_launch(
    config: DeviceConfig,
    op: str,
    in_specs: Sequence[TensorSpec | None],
    out_specs: Sequence[TensorSpec],
    attrs: Mapping[str, Any],
) -> TilePlan:
    """Choose the core split of one launch; its tiles are the cost model's for that split."""
    costs = [price(config, op, in_specs, out_specs, attrs, k)
             for k in range(1, config.cores + 1)]
    best = min(c.total_cycles for c in costs)
    cores = next(k for k, c in enumerate(costs, 1) if c.total_cycles <= best * (1 + SPLIT_GAIN))
    chosen = costs[cores - 1]
    return TilePlan(cores, getattr(chosen, "tile", ()), getattr(chosen, "sram_bytes", 0),
                    chosen.total_cycles, costs[0].total_cycles,
                    getattr(chosen, "engine", "vector"), getattr(chosen, "split", ""))


class PlanCache:
    """Tile plans by (config, op, operand types, attributes, pricing function), the
    ``capacity`` most recently used; safe to share between threads.

    Attributes are keyed by their ``repr`` (plain values with sorted keys: exact), which keeps
    apart values that compare equal, such as ``-0.0`` and ``0.0``, should a kernel's own cycles
    function tell them apart (the cost model's cache does not). The key holds the op's kernel
    cycles function (or None: the cost model's price), so a kernel registered again under the
    same name is not priced with the old one. The rest of the pricing (the cost model's
    handlers, :data:`SPLIT_GAIN`) is module state, fixed at import.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._plans: OrderedDict[tuple, TilePlan] = OrderedDict()
        self._configs: dict[DeviceConfig, DeviceConfig] = {}
        self._lock = threading.Lock()

    def planner(self, config: DeviceConfig) -> Callable[..., TilePlan]:
        """:meth:`plan` for ``config``, which it keys by one instance of the equal configs it
        has seen: a session builds its own config, and comparing two configs field by field
        on every lookup cost more than the rest of the lookup."""
        with self._lock:
            if len(self._configs) >= _CONFIGS and config not in self._configs:
                self._configs.clear()  # keys holding the old instances still compare equal
            config = self._configs.setdefault(config, config)
        return functools.partial(self.plan, config)

    def plan(
        self,
        config: DeviceConfig,
        op: str,
        in_types: Sequence[TensorType | None],
        out_types: Sequence[TensorType],
        attrs: Mapping[str, Any],
    ) -> TilePlan:
        """:func:`plan_launch` of operands of these ``(dtype, shape)`` types (None: omitted)."""
        key = (config, op, tuple(in_types), tuple(out_types), repr(attrs),
               npu_kernels.lookup(op).cycles)
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                return plan
        plan = plan_launch(config, op, [None if t is None else TensorSpec(t[1], t[0])
                                        for t in in_types],
                           [TensorSpec(shape, dtype) for dtype, shape in out_types], attrs)
        with self._lock:
            self._plans[key] = plan
            while len(self._plans) > self.capacity:
                self._plans.popitem(last=False)
        return plan

    def __len__(self) -> int:
        return len(self._plans)

    def reset_lock(self) -> None:
        """A new lock, for a forked child (the parent's may have been held by a thread)."""
        self._lock = threading.Lock()


PLANS = PlanCache(4096)
"""The compiler's plans (a few hundred bytes each): the bench set's models have 17 (GPT-2) to
57 (EfficientNet) distinct launches each, so this holds those of many models."""

if hasattr(os, "register_at_fork"):
    # A thread holding the lock when the process forks never releases it in the child: the
    # child starts with a lock of its own (the plans stay valid).
    os.register_at_fork(after_in_child=PLANS.reset_lock)


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
