"""Elastic replay: a trace's work re-timed under another config on the device's own engines.

Each kernel is re-priced by :func:`npu_sim.compute.price` on its new core count, each DMA
transfer re-chunked by :func:`npu_sim.dma.chunk_plan` and each chunk timed with the channel
setup and :func:`npu_sim.dma.chunk_link`; commands and host steps are zero-time joins. They run
on a :mod:`.schedule` clock with the config's engines (its cores, ``dma_channels`` channels
first come first served, one host link, one HBM port), taking the same steps in the same order
as the device's simpy processes, so under the recording config the timeline comes back cycle
for cycle. :func:`npu_sim.trace.retime.replay` is the public entry; this module is its engine
room: :func:`retime` returns the figures and a function that builds the re-timed records.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from typing import Any

from ..compute import price
from ..config import DeviceConfig
from ..dma import chunk_energy, chunk_link, chunk_plan
from ..dtypes import TensorSpec
from ..errors import NpuSimError, TraceError
from ..kernels.registry import lookup
from .control import DERIVED, rederived, without
from .format import Trace
from .recorder import TraceRecord
from .schedule import URGENT, Action, Clock, Event, Pool, Resource, all_of, each

NOT_REPLAYED = DERIVED
"""Edge tags elastic replay drops: the new config's engine capacity re-derives them."""

COMPILER_FIELDS = ("cores", "array_rows", "array_cols", "dataflow", "stationary_load",
                   "sram_bytes_per_core", "vector_lanes")
"""Config fields the compiler's core split, placement and tiling depend on."""

SplitRule = Callable[[DeviceConfig, str, list, list, dict], int]
"""``split(config, op, in_specs, out_specs, attrs)``: how many cores the compiler gives a
launch under ``config``."""


def retime(trace: Trace, config: DeviceConfig, split: SplitRule | None) -> tuple[
        int, dict[str, int], Callable[[], tuple[TraceRecord, ...]], tuple[str, ...],
        dict[str, float]]:
    """``trace`` re-timed under ``config``: its makespan, busy cycles per engine, a function
    that builds the re-timed records, the flags and the energy by component.

    The cyclic collector is off meanwhile: a replay allocates tens of thousands of small
    objects (events, actions, entries), so the collector's thresholds set off collections
    that walk every young object, and now and then a full one that walks the whole process;
    a replay leaves no cyclic garbage for them to find (what it builds is freed by reference
    counting or returned). The collector is turned back on only if it was on (another thread
    turning it off or on meanwhile costs time, never results)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _Elastic(trace, config, split).run()
    finally:
        if enabled:
            gc.enable()


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
    first: int
    """The id of its first record: where its step goes in record order."""
    nbytes: int
    direction: str
    name: str
    scope: str

    @classmethod
    def of(cls, records: list[TraceRecord]) -> _Transfer:
        first = records[0]
        nbytes = int(first.work.get("transfer_bytes") or sum(r.work["bytes"] for r in records))
        return cls(tuple(records), frozenset(r.id for r in records), min(r.id for r in records),
                   nbytes,
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
    replayed ones but ``completion``). ``priced`` keeps, per ``(split rule, config)`` of the
    last :data:`PRICED_CONFIGS` replays, each launch key's core split and each
    ``(key, cores)``'s cost, so a replay repeated under one config (a sweep's neighbours, a
    benchmark) re-decides and re-prices nothing: both are pure functions of those inputs."""

    steps: tuple[tuple[str, Any, tuple[int, ...], int], ...]
    launches: dict[int, tuple]
    starts: dict[int, tuple[int, ...]]
    priced: dict[tuple[Any, DeviceConfig], tuple[dict, dict]]


PRICED_CONFIGS = 16
"""How many ``(split rule, config)`` pairs' splits and costs a prepared trace keeps."""


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
        delay = 0 if deps else max(recorded_ready - origin, 0)
        if rec.kind == "dma":
            transfer = transfers[rec.id]
            if rec.id == transfer.first:
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
    prepared = _PREPARED[id(trace)] = _Prepared(tuple(steps), launches, starts, {})
    weakref.finalize(trace, _PREPARED.pop, id(trace), None)
    return prepared


def _figures(entries: list[tuple]) -> tuple[dict[str, int], dict[str, float]]:
    """Busy cycles per engine and energy by component of replay's entries (in id order), as
    :func:`npu_sim.trace.retime.busy_cycles` and the recorded replay's energy total count
    them on the records."""
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
                values = numeric[id(e[8])] = energy_parts(getattr(e[8], "energy", None))
        elif kind == "dma":
            busy[f"dma{e[7]}"] = busy.get(f"dma{e[7]}", 0) + e[2] - e[1]
            values = e[13].items()  # chunk_energy: numbers only
        else:
            values = energy_parts(e[4].work.get("energy"))
        for part, value in values:
            energy[part] = energy.get(part, 0.0) + value
    return busy, energy


def energy_parts(parts: Any) -> list[tuple[str, Any]]:
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
                "link": link, "energy": dict(energy)}  # chunks of one size share ``energy``
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
        priced = self.prepared.priced
        cached = priced.get((split, config))
        if cached is None:
            if len(priced) >= PRICED_CONFIGS:
                del priced[next(iter(priced))]  # the oldest
            cached = priced[(split, config)] = ({}, {})
        # Per distinct launch: its core split; per (launch, cores): its cost.
        self.splits: dict[int, int] = cached[0]
        self.costs: dict[tuple[int, int], Any] = cached[1]
        self.sized: dict[tuple[int, str], tuple] = {}  # per chunk size: link, cycles, energy
        self.setup = config.dma_setup_cycles
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

    def run(self) -> tuple:
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
        return (makespan, busy, lambda: rederived([_record(e, config) for e in entries]),
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
            count, chunk, at = len(pieces), self._chunk, clock.at
            done = _Countdown(count, partial(clock.soon, finished.fire)).step
            for i, (off, n) in enumerate(pieces):
                at(0, partial(chunk, transfer, ids[i], off, n, i, count, submit, ready_at, done),
                   URGENT)

        self._after(deps, delay, ready)

    def _chunk(self, transfer: _Transfer, rid: int, off: int, n: int, index: int, count: int,
               submit: int, ready: int, done: Action) -> None:
        """One chunk: take a channel, spend the setup on it, then hold the link (or the HBM
        port) for the chunk's bytes; ``done`` one step after."""
        clock, channels = self.clock, self.channels
        sized = self.sized.get((n, transfer.direction))
        if sized is None:
            cfg = self.config
            link, cycles = chunk_link(cfg, n, transfer.direction)
            sized = self.sized[(n, transfer.direction)] = (
                link, cycles, self.links[link],
                chunk_energy(cfg, n, transfer.direction == "d2d"))
        link, cycles, port, energy = sized
        at, setup = clock.at, self.setup

        def moved(start: int, ch: int) -> None:
            port.release()
            channels.put(ch)
            entry = (rid, start, clock.now, "dma", transfer, submit, ready, ch, n, off, index,
                     count, link, energy)
            if rid in transfer.ids:
                self.out[rid] = entry
            else:
                self.extra.append(entry)
            clock.soon(done)

        def granted(ch: int) -> None:
            at(setup, partial(port.acquire, partial(at, cycles, partial(moved, clock.now, ch))))

        channels.take(granted)


class _Countdown:
    """Runs ``action`` at the last of ``count`` steps: a transfer done with its last chunk (what
    waiting on each chunk's event in turn comes to, for a fraction of the events)."""

    __slots__ = ("left", "action")

    def __init__(self, count: int, action: Action) -> None:
        self.left, self.action = count, action

    def step(self) -> None:
        self.left -= 1
        if not self.left:
            self.action()


def _transfers(records: tuple[TraceRecord, ...]) -> dict[int, _Transfer]:
    """Record id -> the DMA transfer it is a chunk of."""
    groups: dict[Any, list[TraceRecord]] = {}
    for r in records:
        if r.kind == "dma":
            # The chunks of one transfer share its number, addresses and dependencies (a run
            # re-emitted later has other dependencies, so its transfers stay its own).
            key = (r.work.get("transfer"), r.work.get("src"), r.work.get("dst"),
                   without(r.edges, NOT_REPLAYED)) \
                if "transfer" in r.work else ("chunk", r.id)
            groups.setdefault(key, []).append(r)
    out: dict[int, _Transfer] = {}
    for members in groups.values():
        members.sort(key=lambda r: (int(r.work.get("chunk", 0)), r.id))
        transfer = _Transfer.of(members)
        for m in members:
            out[m.id] = transfer
    return out
