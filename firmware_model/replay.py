"""Schedule replay: later runs of a loaded program reuse the schedule its first run recorded.

A program's commands start and end at cycles that depend on shapes, the device config and what
else the device is doing, never on tensor values. So once a run of a loaded program has gone
through the full simulation (rings, doorbells, simpy processes per command and DMA chunk) on an
otherwise idle device, a later run on an idle device would do exactly the same again: the same
completions at the same cycles (shifted to the current clock), the same counter increments, the
same trace records. :class:`Schedule` keeps what that run produced; :meth:`Schedule.replay`
computes the values (input copies, each kernel in command order, output copies) and re-emits the
rest, shifted: the clock and the device's and firmware's counters advance by the recorded
amounts, the ring positions move as the submission's would, and every trace record is copied
with its ids, deps and cycles rebased (and host I/O addresses, which differ per run, replaced),
whatever other fields it carries.

What makes it exact:

- *Which programs.* Only bodies of KERNEL, NOP and BARRIER commands (no DMA, SIGNAL or WAIT) in
  which every pair of kernels touching overlapping arena bytes, one of them writing, is ordered
  by dependencies (:func:`replayable`). Then the firmware runs each such pair one after the
  other, and computing every kernel at once in command order (a topological order) reads and
  writes exactly what the simulation does. Compiled programs are built that way
  (``ep.npusim.compiler.emit``); anything else always takes the simulation.
- *No copy.* A kernel registered ``writes_into`` (Conv, Gemm, MatMul, MaxPool,
  GlobalAveragePool) gets its outputs' arena views as ``out=`` and computes there, unless an
  output's bytes overlap one of the launch's inputs (the arena reuses memory): that output
  keeps the copy from a result of its own.
- *When.* Recording and replay need an idle firmware and device (nothing submitted and not yet
  drained, no simpy event pending): the schedule is then a function of the program alone. A
  kernel registered again since the recording invalidates it.
- *Faults.* Values can fault (a Gather index out of range) or a kernel can return what its
  output does not hold. Values are computed before anything else changes, so on any exception
  :meth:`Schedule.replay` returns ``False`` having touched nothing but arena bytes the run
  rewrites anyway, and the caller runs the simulation, which reports the fault exactly as
  always.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from npu_sim import dtypes
from npu_sim.dma import HOST_IOVA_BASE
from npu_sim.errors import NpuSimError
from npu_sim.kernels import registry
from npu_sim.trace import TraceRecord

from .commands import Barrier, Kernel, Nop
from .program import Region

if TYPE_CHECKING:
    from .loader import LoadedProgram
    from .processor import Firmware

_HEX = re.compile(r"0x[0-9a-f]+")


def idle(fw: Firmware) -> bool:
    """Whether nothing is in flight on ``fw`` or its device: the state a schedule is exact in.

    A run's last completion leaves a few events due at the current cycle (processes ending);
    they are processed first (as the next step of the clock would), which changes nothing.
    """
    env = fw.env
    if fw._pending or fw._sem_waiters:
        return False
    while env.peek() == env.now:
        env.step()
    return env.peek() == float("inf")


def replayable(loaded: LoadedProgram) -> bool:
    """Whether ``loaded``'s body may be replayed: only KERNEL/NOP/BARRIER commands, and every
    conflicting pair of kernels (overlapping arena bytes, one writing) ordered by dependencies."""
    commands = loaded.commands
    if not all(isinstance(c, (Kernel, Nop, Barrier)) for c in commands):
        return False
    ancestors: list[int] = []
    position: dict[int, int] = {}
    since: list[int] = []
    barrier: int | None = None
    for i, c in enumerate(commands):
        deps = [position[d] for d in c.deps]
        if isinstance(c, Barrier):
            deps += since
        if barrier is not None:
            deps.append(barrier)
        reach = 0
        for d in deps:
            reach |= ancestors[d] | (1 << d)
        ancestors.append(reach)
        position[c.cmd_id] = i
        if isinstance(c, Barrier):
            barrier, since = i, []
        else:
            since.append(i)
    spans = []  # (lo, hi, command position, writes) of every arena operand
    tensors, launches = loaded.program.tensors, loaded.program.launches
    for i, c in enumerate(commands):
        if isinstance(c, Kernel):
            launch = launches[c.launch]
            for writes, indices in ((False, launch.inputs), (True, launch.outputs)):
                for t in indices:
                    if t >= 0 and tensors[t].region == Region.ARENA and tensors[t].nbytes:
                        lo = tensors[t].offset
                        spans.append((lo, lo + tensors[t].nbytes, i, writes))
    return conflicts_ordered(spans, ancestors)


def conflicts_ordered(spans: list[tuple[int, int, int, bool]], ancestors: Sequence[int]) -> bool:
    """Whether every two accesses ``(lo, hi, command, writes)`` of ``spans`` that share a byte,
    one writing, by two commands, are ordered: the later command's ``ancestors`` bit set holds
    the earlier (commands are numbered in a topological order).

    Checked per elementary segment (between consecutive span ends), where every covering span
    shares every byte: in command order, each write must follow the previous write and the
    reads since it, and each read the last write; the ancestor relation being transitive, that
    orders every pair. A chain of n kernels through two reused buffers costs O(n log n), where
    checking every pair of overlapping spans cost O(n^2) (1.4 s of a 2,000-kernel chain's
    first run)."""
    bounds = sorted({p for lo, hi, _, _ in spans for p in (lo, hi)})
    starts: dict[int, list[tuple[int, int, int, bool]]] = {}
    for span in spans:
        starts.setdefault(span[0], []).append(span)
    covering: list[tuple[int, int, int, bool]] = []
    for point in bounds[:-1]:
        covering = [s for s in covering if s[1] > point] + starts.get(point, [])
        if len(covering) > 1 and not _ordered_in(covering, ancestors):
            return False
    return True


def _ordered_in(covering: list[tuple[int, int, int, bool]], ancestors: Sequence[int]) -> bool:
    """The check of :func:`conflicts_ordered` for spans that all share a byte."""
    last_write: int | None = None
    reads: list[int] = []  # commands reading since the last write
    for _, _, i, writes in sorted(covering, key=lambda s: (s[2], s[3])):
        before = ancestors[i]
        if last_write is not None and last_write != i and not before >> last_write & 1:
            return False
        if writes:
            if any(r != i and not before >> r & 1 for r in reads):
                return False
            last_write, reads = i, []
        else:
            reads.append(i)
    return True


@dataclass(eq=False)
class _Step:
    """One kernel launch, resolved once: typed views of its outputs in HBM and the function
    that computes it from its inputs' views (:func:`_runner`)."""

    outputs: list[np.ndarray]
    run: Callable[[], Any]


def _runner(entry: registry.Kernel, inputs: list[np.ndarray | None],
            outputs: list[np.ndarray], attrs: dict[str, Any]) -> Callable[[], Any]:
    """What computes a launch each run: the kernel prepared once for its operands
    (:attr:`~registry.Kernel.prepare`), else its values function, given fresh attributes each
    time and ``out=`` (:func:`_into`) if it :attr:`~registry.Kernel.writes_into`."""
    into = _into(inputs, outputs) if entry.writes_into else None
    if entry.prepare is not None:
        try:
            return entry.prepare(inputs, dict(attrs), into)
        except Exception:  # noqa: BLE001 - values() raises it again, as the simulation did
            pass
    if into is None:
        return lambda: entry.values(inputs, dict(attrs))
    return lambda: entry.values(inputs, dict(attrs), out=into)


def _into(inputs: Sequence[np.ndarray | None],
          outputs: Sequence[np.ndarray]) -> list[np.ndarray | None]:
    """Each output view a kernel may compute into: None where its bytes overlap an input's (the
    arena reuses memory; writing there would change what the kernel still reads)."""
    return [None if any(a is not None and np.may_share_memory(out, a) for a in inputs)
            else out for out in outputs]


def _typed_view(loaded: LoadedProgram, tensor: int, *, writable: bool) -> np.ndarray:
    address, spec = loaded.operand(tensor)
    hbm = loaded.firmware.device.hbm
    # Read-only operands peek: weights mapped from a file are read where they lie.
    raw = np.zeros(0, np.uint8) if not spec.nbytes else \
        hbm.view(address, spec.nbytes) if writable else hbm.peek(address, spec.nbytes)
    array = raw.view(dtypes.to_numpy(spec.dtype)).reshape(spec.shape)
    array.flags.writeable = writable
    return array


def shared_steps(loaded: LoadedProgram) -> list[_Step]:
    """The prepared kernel steps of ``loaded``, made once for all its functional schedules: a
    program's runs cycle through a few schedules (the DMA channel orders), and preparing each
    launch once per schedule made every prepared launch time its split and whole ways
    (:class:`npu_sim.kernels.cores.Choice`) over twice as many runs, each with buffers of its
    own. Made again when a kernel was registered anew since (the steps call the kernels they
    were prepared with)."""
    kernels = tuple(registry.lookup(launch.op, launch.node)
                    for launch in loaded.program.launches)
    held = loaded.prepared  # the same launches: the program's, which never change
    if held is None or any(a is not b for a, b in zip(held[0], kernels, strict=True)):
        held = loaded.prepared = (kernels, _steps(loaded))
    return held[1]


def _steps(loaded: LoadedProgram) -> list[_Step]:
    launches = loaded.program.launches
    steps = []
    for c in loaded.commands:
        if isinstance(c, Kernel):
            launch = launches[c.launch]
            entry = registry.lookup(launch.op, launch.node)
            inputs = [None if t < 0 else _typed_view(loaded, t, writable=False)
                      for t in launch.inputs]
            outputs = [_typed_view(loaded, t, writable=True) for t in launch.outputs]
            steps.append(_Step(outputs, _runner(entry, inputs, outputs, launch.attrs)))
    return steps


class _Rebase:
    """Host I/O addresses differ per run: replaces every recorded one (as an int, or as hex in
    text) by this run's, anywhere inside a record's fields."""

    def __init__(self, old: Sequence[int], new: Sequence[int]) -> None:
        self.ints = dict(zip(old, new, strict=True))
        self.texts = {f"{o:#x}": f"{n:#x}" for o, n in self.ints.items()}

    def __call__(self, value: Any) -> Any:
        if isinstance(value, bool):
            return value
        if isinstance(value, int):
            return self.ints.get(value, value)
        if isinstance(value, str):
            return _HEX.sub(lambda m: self.texts.get(m.group(), m.group()), value)
        if isinstance(value, dict):
            return {k: self(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self(v) for v in value)
        return value


def _mentions_host(value: Any) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return value >= HOST_IOVA_BASE
    if isinstance(value, str):
        return any(int(h, 16) >= HOST_IOVA_BASE for h in _HEX.findall(value))
    if isinstance(value, dict):
        return any(_mentions_host(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_mentions_host(v) for v in value)
    return False


def key(loaded: LoadedProgram, functional: bool, queue: int) -> tuple[bool, int, tuple[int, ...]]:
    """What a run's schedule depends on besides the program: the mode, the queue, and the order
    the DMA channels will be handed out in (a run leaves them permuted, so a program's runs
    cycle through a few schedules, each recorded once)."""
    return functional, queue, loaded.firmware.device.dma_channel_order


class Schedule:
    """What one simulated run of a loaded program produced, ready to be re-emitted."""

    def __init__(self, loaded: LoadedProgram, *, functional: bool, queue: int, commands: int,
                 channels: tuple[int, ...], start: int, cycles: int, counters: dict[str, int],
                 records: list[TraceRecord], iovas: list[int], transfers: int = 0) -> None:
        self.functional = functional
        self.queue = queue
        self.commands = commands
        self.cycles = cycles
        self.channels = channels
        self.device_counters = {k: v for k, v in counters.items() if not k.startswith("fw.")}
        self.fw_counters = {k: v for k, v in counters.items() if k.startswith("fw.")}
        self.start = start
        self.first_id = records[0].id if records else 0
        self.transfers = transfers
        """DMA transfers issued before the run: its chunk records number theirs from here."""
        self.records = [dict(r.__dict__) for r in records]
        self.host_records = {k for k, r in enumerate(self.records) if _mentions_host(r)}
        self.iovas = iovas
        self.steps = shared_steps(loaded) if functional else []
        self.kernels = {registry.lookup(launch.op) for launch in loaded.program.launches}
        program = loaded.program
        self.in_views = [_typed_view(loaded, i, writable=True) for i in program.inputs]
        self.out_views = [_typed_view(loaded, i, writable=False) for i in program.outputs]

    @classmethod
    def begin(cls, loaded: LoadedProgram, queue: int) -> dict[str, Any] | None:
        """What to note before a run that may be recorded, or None if it cannot be."""
        fw = loaded.firmware
        if not idle(fw):
            return None
        return {"stats": fw.stats(), "next_id": fw.device.trace.next_id, "now": fw.device.now,
                "channels": fw.device.dma_channel_order, "transfers": fw.device.dma.transfers}

    @classmethod
    def end(cls, loaded: LoadedProgram, before: dict[str, Any], *, functional: bool,
            queue: int, commands: int, iovas: list[int]) -> Schedule | None:
        """The schedule of the run that just completed OK, or None if it cannot be replayed
        (the device was not idle, a gauge moved, a record depends on an earlier run)."""
        fw = loaded.firmware
        device = fw.device
        if not idle(fw):
            return None
        after = fw.stats()
        counters = {}
        for key, value in after.items():
            if key == "device.cycles":
                continue
            old = before["stats"].get(key)
            if key.startswith(("dma.", "compute.", "core.", "fw.")):
                counters[key] = value - (old or 0)
            elif value != old:
                return None  # a gauge (HBM, weights) moved: not a pure run
        first = before["next_id"]
        records = [r for r in device.trace.records if r.id >= first]
        if [r.id for r in records] != list(range(first, device.trace.next_id)) or \
                any(d < first for r in records for d in r.deps):
            return None
        return cls(loaded, functional=functional, queue=queue, commands=commands,
                   channels=device.dma_channel_order,
                   start=before["now"], cycles=device.now - before["now"],
                   counters=counters, records=records, iovas=iovas,
                   transfers=before["transfers"])

    def replay(self, loaded: LoadedProgram, host_in: Sequence[np.ndarray],
               host_out: Sequence[np.ndarray]) -> bool:
        """Run ``loaded`` from the schedule: True when done, False (nothing recorded, no
        simulated state changed) when the simulation must run instead."""
        fw = loaded.firmware
        device = fw.device
        if not idle(fw) or not self._same_kernels():
            return False
        if self.functional:
            for array, view in zip(host_in, self.in_views, strict=True):
                if array.nbytes:
                    view[...] = array
            if not self._compute():
                return False
        iovas = []
        try:
            for array in [*host_in, *host_out]:
                if array.nbytes:
                    iovas.append(device.map_host(array))
            if self.functional:
                for array, view in zip(host_out, self.out_views, strict=True):
                    if array.nbytes:
                        array[...] = view
        finally:
            for iova in iovas:
                device.unmap_host(iova)
        self._emit(device, iovas)
        fw._queues[self.queue].skip(self.commands)
        for key, value in self.fw_counters.items():
            fw._counters[key] += value
        device.fast_forward(self.cycles, self.device_counters, self.channels)
        return True

    def _same_kernels(self) -> bool:
        """Whether every kernel (values and cycles) is still the one recorded with."""
        try:
            return all(registry.lookup(k.name) is k for k in self.kernels)
        except NpuSimError:  # unregistered since
            return False

    def _compute(self) -> bool:
        """Every kernel in command order; False if one raised or returned the wrong thing."""
        for step in self.steps:
            try:
                results = step.run()
                if len(results) < len(step.outputs):
                    return False
                for out, value in zip(step.outputs, results, strict=False):
                    if getattr(value, "shape", None) != out.shape or \
                            getattr(value, "dtype", None) != out.dtype:
                        return False
                    if value is not out:
                        out[...] = value
            except Exception:  # the simulation reports it, exactly as it always does
                return False
        return True

    def _emit(self, device: Any, iovas: list[int]) -> None:
        """Copies of the recorded trace records, rebased to the current ids, clock and host
        addresses; built only when someone reads the trace (:meth:`TraceRecorder.defer`)."""
        trace = device.trace
        shifts = (trace.next_id - self.first_id, device.dma.transfers - self.transfers,
                  device.now - self.start)
        rebase = _Rebase(self.iovas, list(iovas)) if self.host_records else None
        trace.defer(len(self.records), functools.partial(self._copies, shifts, rebase))

    def _copies(self, shifts: tuple[int, int, int], rebase: _Rebase | None) -> list[TraceRecord]:
        id_shift, transfer_shift, cycle_shift = shifts
        new = object.__new__
        out = []
        for k, fields in enumerate(self.records):
            fields = dict(fields)
            if rebase is not None and k in self.host_records:
                fields = rebase(fields)
            fields["work"] = dict(fields["work"])
            if "transfer" in fields["work"]:  # DMA transfers are numbered like record ids
                fields["work"]["transfer"] += transfer_shift
            rec = new(TraceRecord)
            rec.__dict__.update(fields)
            # every cycle field and id moves; the rest is copied as recorded
            out.append(rec.shifted(cycle_shift, id_shift))
        return out
