"""The EP runtime: one simulated device per provider, and compiled nodes that run on it.

:class:`NpuRuntime` owns one :class:`npu_sim.Device` and one
:class:`firmware_model.Firmware` in front of it; every program the provider compiles (or loads
from a context binary) is loaded there once. :class:`NpuSimCompiledNode` is what
``NpuSimExecutionProvider.compile`` returns per fused node: built from a
:class:`~firmware_model.program.Program` alone, so a program read back from a context binary
runs through exactly the same path. Its :meth:`~NpuSimCompiledNode.run` moves the inputs through
simulated DMA, runs the commands and returns the outputs; the runtime keeps the simulated
latency, per-engine counters and energy of the last run (:meth:`NpuRuntime.last_run_stats`).

Sessions with ``ep.share_ep_contexts=1`` share one runtime (:mod:`ep.npusim.shared`): runs on it
are serialized by :attr:`NpuRuntime.lock`, and each compiled node also hands the stats of its
own runs to its provider, so a session reports its runs, not another session's.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from firmware_model import Firmware, LoadedProgram, Program
from npu_sim import Device, dtypes
from npu_sim.config import DeviceConfig
from npu_sim.errors import NpuSimError
from npu_sim.hbm import DeviceBuffer
from npu_sim.trace import Recording

from .. import errors
from ..framework.provider import CompiledNode


class NpuRuntime:
    """One simulated device + firmware shared by all of a provider's compiled nodes."""

    def __init__(self, config: DeviceConfig, *, allocator: str = "best_fit",
                 functional: bool = True, device: Device | None = None) -> None:
        self.config = config
        self.functional = functional
        self.device = device if device is not None else Device(config, allocator=allocator)
        self.firmware = Firmware(self.device)
        self.lock = threading.RLock()
        self.last_run: RunCounters | None = None
        """The counters of the last run, summarized when asked (:meth:`last_run_stats`)."""
        self.last_span: tuple[int, int] = (0, 0)
        """Simulated cycles at the start and end of the last run."""

    def load(self, program: Program, *, stream: bool = False,
             pinned: Mapping[int, tuple[DeviceBuffer, int]] | None = None) -> LoadedProgram:
        """Validate and place ``program`` on the device (weights uploaded once; ``stream``:
        uploads left in flight, each kernel waiting for its own weights; ``pinned``: weight
        tensors in caller-provided memory)."""
        if program.hardware_architecture and program.hardware_architecture != self.config.name:
            raise errors.InvalidArgument(
                f"program {program.name!r} was compiled for {program.hardware_architecture!r}; "
                f"this provider's device is {self.config.name!r}")
        try:
            return self.firmware.load(program, functional=self.functional, stream=stream,
                                      pinned=pinned)
        except NpuSimError as exc:
            raise errors.EPFail(f"NpuSim: cannot load program {program.name!r}: {exc}") from None

    def run(self, name: str, loaded: LoadedProgram, inputs: Sequence[np.ndarray] | None,
            outputs: Sequence[int] | None = None) -> list[np.ndarray | None]:
        """Run a loaded program once and record its simulated latency and engine counters
        (``outputs``: the indices of the outputs wanted, default all; see
        :meth:`LoadedProgram.run <firmware_model.loader.LoadedProgram.run>`)."""
        # The device's trace holds the last run only: kept across runs it would grow with every
        # inference of the session.
        self.device.trace.clear()
        before = self.firmware.stats()
        start = self.device.now
        try:
            results = loaded.run(inputs, functional=self.functional, outputs=outputs)
        except NpuSimError as exc:
            raise errors.EPFail(f"NpuSim: running {name!r} failed: {exc}") from None
        self.last_span = (start, self.device.now)
        self.last_run = RunCounters(self.config, name, self.device.now - start, before,
                                    self.firmware.stats())
        return results

    def last_run_stats(self) -> dict[str, Any]:
        """Latency (cycles, microseconds), utilization per engine and counters of the last run."""
        return {} if self.last_run is None else self.last_run.summary()


class RunCounters:
    """One run's span and the device's counters before and after it, summarized
    (:func:`_summarize`) when first asked: most runs are never asked about, and summarizing
    every run cost a 100-op chain's run 5% of its time."""

    __slots__ = ("_config", "_name", "_span", "_before", "_after", "_summary")

    def __init__(self, config: DeviceConfig, name: str, span: int, before: dict[str, Any],
                 after: dict[str, Any]) -> None:
        self._config, self._name, self._span = config, name, span
        self._before, self._after = before, after
        self._summary: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        """The run's stats (a new dict each call)."""
        if self._summary is None:
            before = self._before
            # hbm.* are gauges (bytes in use, fragmentation...): reported as they stand; the
            # rest are counters: what this run added.
            delta = {k: v if k.startswith("hbm.") else v - before.get(k, 0)
                     for k, v in self._after.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)}
            self._summary = _summarize(self._config, self._name, self._span, delta)
        return dict(self._summary)


def run_energy(config: DeviceConfig, span: int, counters: dict[str, float]) -> dict[str, Any]:
    """Energy of a run from its counter deltas over ``span`` cycles (picojoules, watts).

    Dynamic energy is what the launches and DMA chunks did (their counters); static energy is
    every core's leakage for the whole span, busy or idle. ``by_engine`` gives each core its
    launches' dynamic energy plus its leakage and each DMA channel its chunks' energy;
    ``by_component`` splits the same total by action (``hbm`` counts kernel and DMA traffic).
    ``tops_per_w`` is ``2 * MACs`` per picojoule (tera-operations per second per watt).
    """
    leak = span * config.leakage_pj_per_core_cycle
    by_component: dict[str, float] = {}
    for key, value in counters.items():
        for prefix in ("compute.energy_fj.", "dma.energy_fj."):
            if key.startswith(prefix):
                part = key[len(prefix):]
                by_component[part] = by_component.get(part, 0.0) + value / 1000
    by_component["leakage"] = config.cores * leak
    by_engine = {f"core.{c}": counters.get(f"core.{c}.energy_fj", 0) / 1000 + leak
                 for c in range(config.cores)}
    by_engine.update({f"dma.{ch}": counters.get(f"dma.{ch}.energy_fj", 0) / 1000
                      for ch in range(config.dma_channels)})
    total = math.fsum(by_component.values())
    seconds = span / (config.clock_ghz * 1e9)
    return {
        "total_pj": total,
        "dynamic_pj": total - by_component["leakage"],
        "static_pj": by_component["leakage"],
        "by_component": by_component,
        "by_engine": by_engine,
        "average_power_w": total * 1e-12 / seconds if seconds else 0.0,
        "tops_per_w": 2 * counters.get("compute.macs", 0) / total if total else 0.0,
    }


def _summarize(config: DeviceConfig, name: str, span: int, delta: dict[str, float]) -> dict:
    util: dict[str, float] = {}
    for c in range(config.cores):
        util[f"core.{c}"] = delta.get(f"core.{c}.busy_cycles", 0) / span if span else 0.0
    for ch in range(config.dma_channels):
        util[f"dma.{ch}"] = delta.get(f"dma.{ch}.busy_cycles", 0) / span if span else 0.0
    return {
        "node": name,
        "cycles": span,
        "microseconds": config.cycles_to_us(span),
        "utilization": util,
        "energy": run_energy(config, span, delta),
        "counters": delta,
    }


def combine_stats(runs: dict[str, dict[str, Any]], config: DeviceConfig) -> dict[str, Any]:
    """The stats of a whole model from its partitions' (name -> one run's stats): cycles,
    microseconds and counters summed (gauges such as ``hbm.*`` as they stand after the last),
    utilization and energy recomputed from the summed counters over the summed span, and
    ``partitions`` keeping each partition's own stats."""
    if not runs:
        return {}
    span = sum(int(r.get("cycles", 0)) for r in runs.values())
    counters: dict[str, float] = {}
    for r in runs.values():
        for key, value in r.get("counters", {}).items():
            counters[key] = value if key.startswith("hbm.") else counters.get(key, 0) + value
    total = _summarize(config, ", ".join(runs), span, counters)
    total["partitions"] = {name: dict(r) for name, r in runs.items()}
    return total


class NpuSimCompiledNode(CompiledNode):
    """A fused node compiled to a Program and loaded on the provider's device.

    ``input_names`` are the fused node's inputs in the order ``run`` receives them; the program
    takes those of them that are not constants, matched by name. :attr:`last_stats` holds the
    stats of its latest run (its own, also when sessions share the device).
    """

    def __init__(self, name: str, program: Program, runtime: NpuRuntime,
                 input_names: Sequence[str] | None = None,
                 on_run: Callable[[str], object] | None = None, *, stream: bool = False,
                 pinned: Mapping[int, tuple[DeviceBuffer, int]] | None = None) -> None:
        self.name = name
        self.program = program
        self.runtime = runtime
        self.last_run: RunCounters | None = None
        """The counters of this node's latest run (:attr:`last_stats` summarizes them)."""
        self.recording: Recording | None = None
        """While the session profiles: where each run's trace records go."""
        self._on_run = on_run
        self._settings = (input_names, stream, pinned)
        names = [t.name for t in program.input_descs()]
        given = list(input_names) if input_names is not None else names
        missing = [n for n in names if n not in given]
        if missing:  # before loading: nothing to free
            raise errors.InvalidGraph(f"NpuSim: program {program.name!r} needs inputs "
                                      f"{missing} that fused node {name!r} does not provide")
        self._positions = [given.index(n) for n in names]
        self._n_inputs = len(given)
        with runtime.lock:
            self.loaded = runtime.load(program, stream=stream, pinned=pinned)

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Outputs (in the fused node's order) from the inputs (in its order).

        In timing-only mode (provider option ``functional="0"``) no values are computed and
        the outputs are zero-filled arrays of the right shapes and dtypes.
        """
        return self._run(inputs, None)

    def run_partial(self, inputs: Sequence[np.ndarray], wanted: Sequence[bool]) -> list[Any]:
        """A partial run: only the commands the ``wanted`` outputs need do work on the device
        and only those outputs are downloaded (:mod:`firmware_model.prune`); the others are
        zero-filled."""
        return self._run(inputs, [k for k, use in enumerate(wanted) if use])

    def _run(self, inputs: Sequence[np.ndarray], wanted: list[int] | None) -> list[np.ndarray]:
        if len(inputs) != self._n_inputs:
            raise errors.InvalidArgument(f"NpuSim node {self.name!r} takes {self._n_inputs} "
                                         f"inputs, got {len(inputs)}")
        feeds = [inputs[p] for p in self._positions]
        with self.runtime.lock:
            outputs = self.runtime.run(self.name, self.loaded, feeds, wanted)
            self.last_run = self.runtime.last_run
            if self.recording is not None:
                self.recording.add_run(self.name, self.runtime.device.trace.snapshot(),
                                       *self.runtime.last_span)
        if self._on_run is not None:
            self._on_run(self.name)
        return [o if o is not None else np.zeros(t.shape, dtypes.to_numpy(t.dtype))
                for o, t in zip(outputs, self.program.output_descs(), strict=True)]

    @property
    def last_stats(self) -> dict[str, Any]:
        """The stats of this node's latest run ({} before the first)."""
        return {} if self.last_run is None else self.last_run.summary()

    def instance(self) -> NpuSimCompiledNode:
        """The same program loaded again on the same device: a new arena for its activations,
        its weights shared (the weight store finds them resident). The instance's device memory
        is released when it is dropped."""
        input_names, stream, pinned = self._settings
        node = NpuSimCompiledNode(self.name, self.program, self.runtime, input_names,
                                  self._on_run, stream=stream, pinned=pinned)
        node.recording = self.recording
        weakref.finalize(node, _unload, self.runtime, node.loaded)
        return node

    def release(self) -> None:
        """Free the program's device memory."""
        with self.runtime.lock:
            self.loaded.unload()


def _unload(runtime: NpuRuntime, loaded: LoadedProgram) -> None:
    with runtime.lock:
        if loaded.loaded:
            loaded.unload()
