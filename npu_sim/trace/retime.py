"""Replaying a trace: the recorded timeline, or the same work re-timed under another config.

:func:`replay` takes a trace (or its path) and a :class:`~npu_sim.DeviceConfig`:

- ``mode="recorded"`` returns the recorded records and makespan, after checking that every
  record starts after the dependencies it waited for ended (a hand-edited timeline fails);
- ``mode="elastic"`` re-times every record with the device's own pricing on a fresh clock of
  :mod:`.schedule` (simpy's event order without simpy's cost): each kernel through
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
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, partial
from operator import itemgetter
from typing import Any

from ..compute import price
from ..config import DeviceConfig
from ..dma import chunk_energy, chunk_link, chunk_plan
from ..dtypes import TensorSpec
from ..errors import NpuSimError, TraceError
from ..kernels.registry import lookup
from .format import Trace, load
from .recorder import TraceRecord
from .schedule import URGENT, Action, Clock, Event, Pool, Resource, all_of, each

MODES = ("recorded", "elastic")
NOT_REPLAYED = frozenset({"engine", "order"})
"""Edge tags elastic replay drops: the new config's engine capacity re-derives them."""

COMPILER_FIELDS = ("cores", "array_rows", "array_cols", "dataflow", "stationary_load",
                   "sram_bytes_per_core", "vector_lanes")
"""Config fields the compiler's core split, placement and tiling depend on."""


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


SplitRule = Callable[[DeviceConfig, str, list, list, dict], int]
"""``split(config, op, in_specs, out_specs, attrs)``: how many cores the compiler gives a
launch under ``config``."""


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
    return _Elastic(trace, config, split).run()


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
        energy = r.work.get("energy")
        if energy:
            for part, value in energy.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
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


def _spec(entry: Any) -> TensorSpec | None:
    if entry is None:
        return None
    shape, dtype = entry
    return TensorSpec(tuple(int(x) for x in shape), str(dtype))


def _attr(value: Any) -> Any:
    return tuple(_attr(v) for v in value) if isinstance(value, list) else value


def _moved(rec: TraceRecord, start: int, end: int, submit: int, ready: int,
           rid: int | None = None, engine: str | None = None, scope: str | None = None,
           name: str | None = None, work: dict[str, Any] | None = None) -> TraceRecord:
    """``dataclasses.replace`` for the fields replay changes, at a fraction of its cost."""
    return TraceRecord(rec.id if rid is None else rid, rec.kind, engine or rec.engine,
                       scope or rec.scope, rec.name if name is None else name, start, end,
                       rec.deps, rec.work if work is None else work, rec.why, submit, ready)


@dataclass(frozen=True)
class _Transfer:
    """A recorded DMA transfer: its chunk records in chunk order, and what re-chunking it
    needs (its bytes, direction, name and scope without the chunk or channel number)."""

    records: tuple[TraceRecord, ...]
    ids: frozenset[int]
    nbytes: int
    direction: str
    name: str
    scope: str

    @classmethod
    def of(cls, records: list[TraceRecord]) -> _Transfer:
        first = records[0]
        nbytes = int(first.work.get("transfer_bytes") or sum(r.work["bytes"] for r in records))
        return cls(tuple(records), frozenset(r.id for r in records), nbytes,
                   first.work.get("direction", "h2d"), first.name.split("[", 1)[0],
                   first.scope.rstrip("0123456789"))


@dataclass(frozen=True)
class _Prepared:
    """What every replay of a trace needs, worked out once per trace (a sweep replays one
    trace many times).

    ``steps`` has one ``(kind, what, deps, delay)`` per kernel, transfer and join in record
    order: ``what`` is the record (the :class:`_Transfer` for a DMA transfer, set up at its
    lowest record id), ``deps`` the ids of the records it waits for, ``delay`` the cycles it
    waited from the trace's start when it waits for nothing. ``launches`` holds each kernel's
    ``(op, node, in_specs, out_specs, attrs, key)``, ``key`` one small int per distinct op,
    operands and attributes; ``starts`` each join's dependencies that mark its start (all
    replayed ones but ``completion``)."""

    steps: tuple[tuple[str, Any, tuple[int, ...], int], ...]
    launches: dict[int, tuple]
    starts: dict[int, tuple[int, ...]]


_PREPARED: dict[int, _Prepared] = {}


def _prepare(trace: Trace) -> _Prepared:
    """The :class:`_Prepared` of ``trace``, kept while the trace lives."""
    prepared = _PREPARED.get(id(trace))
    if prepared is not None:
        return prepared
    keys: dict[tuple, int] = {}
    launches: dict[int, tuple] = {}
    steps: list[tuple[str, Any, tuple[int, ...], int]] = []
    starts: dict[int, tuple[int, ...]] = {}
    transfers = _transfers(trace.records)
    origin = trace.start
    for rec in trace.records:
        edges = [(d, why) for d, why in rec.edges if why not in NOT_REPLAYED]
        deps = tuple(d for d, _ in edges)
        recorded_ready = rec.ready if rec.ready >= 0 else rec.start
        delay = 0 if rec.deps else max(recorded_ready - origin, 0)
        if rec.kind == "dma":
            transfer = transfers[rec.id]
            if rec.id == min(r.id for r in transfer.records):
                steps.append(("dma", transfer, deps, delay))
        elif rec.kind == "kernel":
            steps.append(("kernel", rec, deps, delay))
            w = rec.work
            op, node = str(w.get("op", rec.name)), str(w.get("node", rec.name))
            attrs = {k: _attr(v) for k, v in (w.get("attrs") or {}).items()}
            ins = [_spec(s) for s in w.get("inputs", [])]
            outs = [_spec(s) for s in w.get("outputs", [])]
            key = keys.setdefault((op, tuple(ins), tuple(outs), repr(sorted(attrs.items()))),
                                  len(keys))
            launches[rec.id] = (op, node, ins, outs, attrs, key)
        else:
            steps.append(("join", rec, deps, delay))
            starts[rec.id] = tuple(d for d, why in edges if why != "completion")
    prepared = _PREPARED[id(trace)] = _Prepared(tuple(steps), launches, starts)
    weakref.finalize(trace, _PREPARED.pop, id(trace), None)
    return prepared


def _figures(entries: list[tuple]) -> tuple[dict[str, int], dict[str, float]]:
    """Busy cycles per engine and energy by component of replay's entries (in id order), as
    :func:`busy_cycles` and :func:`_energy` count them on the records."""
    busy: dict[str, int] = {}
    energy: dict[str, float] = {}
    numeric: dict[int, list] = {}  # each distinct launch cost's numbers, picked out once
    for e in entries:
        kind = e[3]
        if kind == "kernel":
            for c in e[7]:
                busy[f"core{c}"] = busy.get(f"core{c}", 0) + e[2] - e[1]
            values = numeric.get(id(e[8]))  # the cost lives in the entry: its id is its own
            if values is None:
                values = numeric[id(e[8])] = _numbers(getattr(e[8], "energy", None))
        elif kind == "dma":
            busy[f"dma{e[7]}"] = busy.get(f"dma{e[7]}", 0) + e[2] - e[1]
            values = e[13].items()  # chunk_energy: numbers only
        else:
            values = _numbers(e[4].work.get("energy"))
        for part, value in values:
            energy[part] = energy.get(part, 0.0) + value
    return busy, energy


def _numbers(parts: Any) -> list[tuple[str, Any]]:
    """The ``(component, number)`` pairs of an energy mapping (other values are skipped)."""
    return [(part, value) for part, value in (parts or {}).items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)]


def _record(entry: tuple, config: DeviceConfig) -> TraceRecord:
    """The re-timed record of one of replay's entries ``(id, start, end, kind, ...)``."""
    rid, start, end, kind = entry[:4]
    if kind == "kernel":
        rec, submit, ready, ids, cost = entry[4:]
        w = rec.work
        work = {**w, "cores": len(ids), "core_ids": ids, "macs": int(cost.macs or 0),
                "unit": getattr(cost, "engine", w.get("unit", "array")),
                "hbm_bytes": int(getattr(cost, "hbm_bytes", 0) or 0)}
        energy = getattr(cost, "energy", None)
        if energy:
            work["energy"] = dict(energy)
        else:
            work.pop("energy", None)
        return _moved(rec, start, end, submit, ready, engine=f"core{ids[0]}",
                      scope=f"npu.core{ids[0]}", work=work)
    if kind == "dma":
        transfer, submit, ready, ch, n, off, index, count, link, energy = entry[4:]
        first = transfer.records[0]
        work = {**first.work, "bytes": n, "offset": off, "chunk": index, "chunks": count,
                "link": link, "energy": energy}
        name = transfer.name if count == 1 else f"{transfer.name}[{index}/{count}]"
        return _moved(first, start, end, submit, ready, rid=rid, engine=f"dma{ch}",
                      scope=f"{transfer.scope}{ch}", name=name, work=work)
    return _moved(entry[4], start, end, start, start)


class _Elastic:
    """One elastic replay: the device's engines on a :mod:`.schedule` clock, fed the trace's
    work. Each kernel, DMA transfer and DMA chunk runs the same steps, in the same order, as
    the device's simpy processes, so ties between records break as they do on the device."""

    def __init__(self, trace: Trace, config: DeviceConfig, split: SplitRule | None) -> None:
        self.trace, self.config, self.split = trace, config, split
        self.prepared = _prepare(trace)
        self.free_at = [0] * config.cores  # when each core is next free, as placed so far
        self.splits: dict[Any, int] = {}  # per distinct launch: its core split, its cost
        self.costs: dict[Any, Any] = {}
        self.joined: list[tuple[TraceRecord, int, int]] = []
        self.clock = clock = Clock()
        self.cores = [Resource(clock) for _ in range(config.cores)]
        self.channels = Pool(clock, range(config.dma_channels))
        self.links = {"link": Resource(clock), "hbm": Resource(clock)}
        # What replay found, per record: (id, start, end, kind, ...), see _record.
        self.out: dict[int, tuple] = {}
        self.extra: list[tuple] = []
        self.next_id = max((r.id for r in trace.records), default=-1) + 1
        self.flags: list[str] = []

    def run(self) -> ReplayResult:
        clock = self.clock
        done: dict[int, Event] = {}
        for kind, what, dep_ids, delay in self.prepared.steps:
            deps = [done[d] for d in dep_ids]
            if kind == "join":
                done[what.id] = self._join(what, deps, delay)
                continue
            finished = Event()
            if kind == "kernel":
                done[what.id] = finished
                clock.at(0, partial(self._kernel, what, deps, delay, finished), URGENT)
            else:
                for member in what.records:
                    done[member.id] = finished
                clock.at(0, partial(self._transfer, what, deps, delay, finished), URGENT)
        try:
            clock.run()
        except NpuSimError as exc:
            raise TraceError("replay", f"cannot re-price the trace under {self.config.name!r}: "
                                       f"{exc}") from None
        self._join_starts()
        entries = sorted([*self.out.values(), *self.extra], key=itemgetter(0))
        makespan = max((e[2] for e in entries), default=0) - min(
            (e[1] for e in entries), default=0)
        self._flag_compiler_choices()
        busy, energy = _figures(entries)
        config = self.config
        return ReplayResult("elastic", config, makespan, busy,
                            lambda: tuple(_record(e, config) for e in entries),
                            tuple(self.flags), energy)

    def _flag_compiler_choices(self) -> None:
        old, new = self.trace.config, self.config
        changed = [f for f in COMPILER_FIELDS if getattr(old, f) != getattr(new, f)]
        if changed and self.split is not None:
            self.flags.append(
                f"compiler-dependent: {', '.join(changed)} changed; core splits re-decided by "
                "the given split rule and placed by list scheduling; SRAM tiling as recorded")
        elif changed:
            self.flags.append(
                f"compiler-dependent: {', '.join(changed)} changed; the compiler chose each "
                "launch's core split, placement and tiling for the recorded config and might "
                "choose differently for this one (replay keeps the recorded choices)")

    def _after(self, deps: list[Event], delay: int, action: Action) -> None:
        """Run ``action`` ``delay`` cycles from now, then once ``deps`` have happened."""
        clock = self.clock
        if delay:
            clock.at(delay, partial(all_of, clock, deps, action) if deps else action)
        elif deps:
            all_of(clock, deps, action)
        else:
            action()

    def _join(self, rec: TraceRecord, deps: list[Event], delay: int) -> Event:
        """A command or host step: done when everything it waited for is. It started once
        its dependencies other than ``completion`` (the work it completes with) were done;
        that start is filled in after the run (:meth:`_join_starts`)."""
        clock = self.clock
        if delay:
            timer = Event()
            clock.at(delay, timer.fire)
            deps.append(timer)
        finished = Event()

        def finish() -> None:
            self.joined.append((rec, clock.now, delay))
            clock.soon(finished.fire)

        all_of(clock, deps, finish)
        return finished

    def _join_starts(self) -> None:
        out, starts = self.out, self.prepared.starts
        for rec, end, delay in self.joined:
            start = max([delay, *(out[d][2] for d in starts[rec.id] if d in out)]) \
                if rec.deps else delay
            out[rec.id] = (rec.id, start, end, "join", rec)

    def _core_ids(self, rec: TraceRecord, k: int | None) -> list[int]:
        """The cores of a launch: as recorded (clamped), or ``k`` placed by list scheduling
        when the split rule changed the recorded count."""
        recorded = [int(c) for c in rec.work.get("core_ids") or [0]]
        total = self.config.cores
        if k is not None and (k != len(recorded) or total != self.trace.config.cores):
            now = self.clock.now
            free = [max(at, now) for at in self.free_at]
            return sorted(sorted(range(total), key=free.__getitem__)[:k])  # stable: ties by core
        if len(recorded) >= self.trace.config.cores:
            return list(range(total))
        k = min(len(recorded), total)
        ids = [c for c in recorded if c < total][:k]
        ids += [c for c in range(total) if c not in ids][:k - len(ids)]
        return sorted(ids)

    def _kernel(self, rec: TraceRecord, deps: list[Event], delay: int, finished: Event) -> None:
        """A launch: wait for its dependencies, take its cores (in core order, each first come
        first served), hold them for its re-priced cycles."""
        clock = self.clock
        submit = clock.now

        def ready() -> None:
            ready_at = clock.now
            op, node, ins, outs, attrs, key = self.prepared.launches[rec.id]
            k = None
            if self.split is not None:
                k = self.splits.get(key)
                if k is None:
                    k = self.splits[key] = int(self.split(self.config, op, ins, outs, attrs))
            ids = self._core_ids(rec, k)
            cost = self.costs.get((key, len(ids)))
            if cost is None:
                cost = self.costs[(key, len(ids))] = price(
                    self.config, lookup(op, node), op, node, ins, outs, attrs, len(ids))
            cycles = int(cost.total_cycles)
            free_at = self.free_at
            begin = max([ready_at, *(free_at[c] for c in ids)])
            for c in ids:
                free_at[c] = begin + cycles
            requests = [self.cores[c].request() for c in ids]
            each(requests, lambda: clock.at(cycles, partial(
                self._kernel_end, rec, ids, cost, submit, ready_at, clock.now, finished)))

        self._after(deps, delay, ready)

    def _kernel_end(self, rec: TraceRecord, ids: list[int], cost: Any, submit: int, ready: int,
                    start: int, finished: Event) -> None:
        for c in ids:
            self.cores[c].release()
        self.out[rec.id] = (rec.id, start, self.clock.now, "kernel", rec, submit, ready, ids,
                            cost)
        self.clock.soon(finished.fire)

    def _transfer(self, transfer: _Transfer, deps: list[Event], delay: int,
                  finished: Event) -> None:
        """A DMA transfer: wait for its dependencies, re-chunk it, start every chunk at once;
        it is done when its chunks are, in order (as the device reports completions)."""
        clock = self.clock
        submit = clock.now

        def ready() -> None:
            ready_at = clock.now
            pieces = chunk_plan(self.config, transfer.nbytes)
            # The last chunk keeps the id dependents name; others keep theirs or get fresh ones.
            old = [r.id for r in transfer.records]
            fresh = list(range(self.next_id, self.next_id + max(len(pieces) - len(old), 0)))
            self.next_id += len(fresh)
            ids = (old[:-1] + fresh)[:len(pieces) - 1] + [old[-1]]
            chunks = []
            for i, (off, n) in enumerate(pieces):
                chunk = Event()
                chunks.append(chunk)
                clock.at(0, partial(self._chunk, transfer, ids[i], off, n, i, len(pieces),
                                    submit, ready_at, chunk), URGENT)
            each(chunks, lambda: clock.soon(finished.fire))

        self._after(deps, delay, ready)

    def _chunk(self, transfer: _Transfer, rid: int, off: int, n: int, index: int, count: int,
               submit: int, ready: int, finished: Event) -> None:
        """One chunk: take a channel, spend the setup on it, then hold the link (or the HBM
        port) for the chunk's bytes."""
        clock, cfg = self.clock, self.config
        got = self.channels.get()
        link, cycles = chunk_link(cfg, n, transfer.direction)
        port = self.links[link]

        def moved(start: int) -> None:
            port.release()
            ch = got.value
            self.channels.put(ch)
            entry = (rid, start, clock.now, "dma", transfer, submit, ready, ch, n, off, index,
                     count, link, chunk_energy(cfg, n, transfer.direction == "d2d"))
            if rid in transfer.ids:
                self.out[rid] = entry
            else:
                self.extra.append(entry)
            clock.soon(finished.fire)

        def granted() -> None:
            start = clock.now
            clock.at(cfg.dma_setup_cycles,
                     lambda: port.request().then(lambda: clock.at(cycles, partial(moved, start))))

        got.then(granted)


def _transfers(records: tuple[TraceRecord, ...]) -> dict[int, _Transfer]:
    """Record id -> the DMA transfer it is a chunk of."""
    groups: dict[Any, list[TraceRecord]] = {}
    for r in records:
        if r.kind == "dma":
            # The chunks of one transfer share its number, addresses and dependencies (a run
            # re-emitted later has other dependencies, so its transfers stay its own).
            key = (r.work.get("transfer"), r.work.get("src"), r.work.get("dst"), r.deps) \
                if "transfer" in r.work else ("chunk", r.id)
            groups.setdefault(key, []).append(r)
    out: dict[int, _Transfer] = {}
    for members in groups.values():
        members.sort(key=lambda r: (int(r.work.get("chunk", 0)), r.id))
        transfer = _Transfer.of(members)
        for m in members:
            out[m.id] = transfer
    return out
