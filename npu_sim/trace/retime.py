"""Replaying a trace: the recorded timeline, or the same work re-timed under another config.

:func:`replay` takes a trace (or its path) and a :class:`~npu_sim.DeviceConfig`:

- ``mode="recorded"`` returns the recorded records and makespan, after checking that every
  record starts after the dependencies it waited for ended (a hand-edited timeline fails);
- ``mode="elastic"`` (:mod:`.elastic`) re-times every record with the device's own pricing on
  a fresh clock of :mod:`.schedule` (simpy's event order without simpy's cost): each kernel through
  :func:`npu_sim.compute.price` (the kernel's cycles function or :func:`npu_sim.cost.op_cost`)
  on the new core count, each DMA transfer re-chunked with
  :func:`npu_sim.dma.chunk_plan` and each chunk timed with the channel setup and
  :func:`npu_sim.dma.chunk_link`, exactly as :mod:`npu_sim.dma` runs it (channels first come
  first served, one host link, one HBM port, in-order completion). Commands and host steps are
  zero-time joins. Dependencies tagged ``engine`` or ``order`` are not replayed: the engines'
  capacity under the new config decides those.

What replay cannot know is flagged in :attr:`ReplayResult.flags`: the compiler chose each
launch's core split and core placement with the recording config's cost model, and tiled it to
that config's SRAM. By default the recorded split is kept (a launch that used every core uses
every new core; a smaller split keeps its cores, clamped). A caller that knows the compiler's
rule passes it as ``split(config, op, in_specs, out_specs, attrs) -> cores`` (the EP's is
:func:`ep.traces.compiler_split`): a launch whose split changes is then placed on the cores
that free up first, by list scheduling as the compiler places launches.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from ..config import DeviceConfig
from ..errors import TraceError
from .elastic import COMPILER_FIELDS, NOT_REPLAYED, SplitRule, energy_parts, retime
from .format import Trace, load
from .recorder import TraceRecord

__all__ = ["COMPILER_FIELDS", "MODES", "NOT_REPLAYED", "ReplayResult", "SplitRule", "busy_cycles",
           "replay"]

MODES = ("recorded", "elastic")


@dataclass(frozen=True)
class ReplayResult:
    """What a replay found: ``makespan`` in cycles, busy cycles per engine, the re-timed
    :attr:`records`, any ``energy`` by component the cost model reported, and ``flags``
    naming what replay could not know. ``timeline()`` builds the records; they are built when
    first read, so a sweep, which reads only the figures, never pays for them."""

    mode: str
    config: DeviceConfig
    makespan: int
    busy: dict[str, int]
    timeline: Callable[[], tuple[TraceRecord, ...]] = field(repr=False, compare=False)
    flags: tuple[str, ...] = ()
    energy: dict[str, float] = field(default_factory=dict)

    @cached_property
    def records(self) -> tuple[TraceRecord, ...]:
        """The re-timed records, in id order (same ids; a re-chunked DMA transfer keeps its
        last chunk's id and its other chunks get fresh ones after the trace's last)."""
        return self.timeline()

    @property
    def microseconds(self) -> float:
        """The makespan in microseconds at the config's clock."""
        return self.config.cycles_to_us(self.makespan)

    @property
    def utilization(self) -> dict[str, float]:
        """Busy cycles over the makespan, per engine."""
        span = self.makespan or 1
        return {engine: busy / span for engine, busy in sorted(self.busy.items())}

    def as_trace(self, source: Trace) -> Trace:
        """The re-timed records as a trace of ``config`` (to export or analyse)."""
        return Trace(self.config, self.records, source.model, source.sdk_version,
                     {**source.meta, "replayed_from": source.config.digest, "mode": self.mode})


def replay(trace: Trace | str | os.PathLike[str], config: DeviceConfig | None = None,
           mode: str = "recorded", *, split: SplitRule | None = None) -> ReplayResult:
    """Replay ``trace`` (loaded or a path) under ``config`` (default: the recording's);
    ``split`` re-decides each launch's core count in elastic mode (see the module doc)."""
    trace = load(trace)
    if mode not in MODES:
        raise TraceError("replay", f"mode={mode!r}; expected one of {list(MODES)}")
    if config is None:
        config = trace.config
    if not isinstance(config, DeviceConfig):
        raise TraceError("replay", f"config={config!r}; expected a DeviceConfig")
    if mode == "recorded":
        _check_timeline(trace)
        records = trace.records
        return ReplayResult(mode, trace.config, trace.makespan, busy_cycles(records),
                            lambda: records, (), _energy(records))
    return ReplayResult("elastic", config, *retime(trace, config, split))


def busy_cycles(records: tuple[TraceRecord, ...] | list[TraceRecord]) -> dict[str, int]:
    """Busy cycles per hardware engine: each core a kernel ran on, each DMA channel."""
    busy: dict[str, int] = {}
    for r in records:
        if r.kind == "kernel":
            for c in r.work.get("core_ids") or [r.engine.removeprefix("core")]:
                busy[f"core{c}"] = busy.get(f"core{c}", 0) + r.cycles
        elif r.kind == "dma":
            busy[r.engine] = busy.get(r.engine, 0) + r.cycles
    return busy


def _energy(records) -> dict[str, float]:
    total: dict[str, float] = {}
    for r in records:
        for part, value in energy_parts(r.work.get("energy")):
            total[part] = total.get(part, 0.0) + value
    return total


def _check_timeline(trace: Trace) -> None:
    by_id = trace.by_id()
    for rec in trace.records:
        for d, why in rec.edges:
            dep = by_id.get(d)
            if dep is None:
                raise TraceError(f"record {rec.id}", f"depends on record {d}, which is not in "
                                                     "the trace")
            limit = rec.end if why == "completion" else rec.start
            if why not in NOT_REPLAYED and limit < dep.end:
                verb = "ends" if why == "completion" else "starts"
                raise TraceError(f"record {rec.id}", f"{rec.name!r} {verb} at "
                                                     f"cycle {limit}, before its {why} dependency"
                                                     f" {d} ({dep.name!r}) ends at {dep.end}; "
                                                     "the timeline was edited")
