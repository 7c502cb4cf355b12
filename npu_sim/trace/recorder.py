"""The trace recorder: one record per DMA chunk, kernel, sync or firmware command.

A trace is a dependency graph, not just a timeline. Each :class:`TraceRecord` carries

- *where* it ran: the ``engine`` (``"dma0"``, ``"core1"``, ``"fw.q0"``, ``"host"``) and the
  component ``scope`` (``"npu.dma0"``);
- *when* it ran under the config that recorded it: ``submit`` (handed to the engine),
  ``ready`` (its dependencies done), ``start`` and ``end``, all in cycles;
- *what it depended on*: ``deps``, the ids of earlier records that had to finish first, and
  ``why`` beside them, one :data:`EDGE_KINDS` tag per dependency;
- *what work it did*, independent of the config: ``work`` holds bytes moved, MACs, tensor
  shapes and dtypes, the op and its attributes.

The last two are what make a trace replayable under another :class:`~npu_sim.DeviceConfig`
(:mod:`npu_sim.trace.retime`). Engines that produce simpy events tag them with the id of their
last record (:func:`tag`), so whoever waits on an event can name it as a dependency
(:func:`record_ids`). Records are plain data: they can be copied, shifted in time
(:meth:`TraceRecord.shifted`) and appended again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("dma", "kernel", "sync", "command")
"""The record kinds a trace holds."""

EDGE_KINDS = ("data", "arena", "barrier", "order", "engine", "completion", "host")
"""Why a record waited for a dependency:

- ``data``: it reads what the dependency wrote, or the firmware started it on the dependency's
  behalf (a DMA or kernel after the commands its command waited for);
- ``arena``: it writes memory the dependency used (an arena-reuse anti-dependency);
- ``barrier``: a BARRIER command orders the two;
- ``order``: queue order (implied by the other edges on this device, so never recorded here);
- ``engine``: it waited for the engine (core, channel) the dependency held (derived after the
  run by :mod:`npu_sim.trace.control`);
- ``completion``: a command completes when its device work does;
- ``host``: the host submitted it after the dependency (a run, a partition) finished.
"""

_TAG = "npu_trace_record"


@dataclass(frozen=True)
class TraceRecord:
    """One traced operation: identity, placement, timing, dependencies and config-free work.

    ``submit`` and ``ready`` default to ``start`` (-1 means "not recorded"); ``why`` holds one
    :data:`EDGE_KINDS` tag per entry of ``deps`` (empty means all ``data``).
    """

    id: int
    kind: str
    engine: str
    scope: str
    name: str
    start: int
    end: int
    deps: tuple[int, ...] = ()
    work: dict[str, Any] = field(default_factory=dict)
    why: tuple[str, ...] = ()
    submit: int = -1
    ready: int = -1

    @property
    def cycles(self) -> int:
        """Duration in cycles."""
        return self.end - self.start

    def edge_kind(self, index: int) -> str:
        """The tag of ``deps[index]``."""
        return self.why[index] if self.why else "data"

    @property
    def edges(self) -> tuple[tuple[int, str], ...]:
        """``(dependency id, why)`` pairs."""
        return tuple((d, self.edge_kind(i)) for i, d in enumerate(self.deps))

    def with_edges(self, edges: Sequence[tuple[int, str]], **changes: Any) -> TraceRecord:
        """A copy whose dependencies are ``edges`` (``(id, why)`` pairs; all ``data``: no
        ``why``), with ``changes`` to other fields."""
        why = tuple(w for _, w in edges)
        return dataclasses.replace(self, deps=tuple(d for d, _ in edges),
                                   why=() if all(w == "data" for w in why) else why, **changes)

    def shifted(self, cycles: int, ids: int = 0) -> TraceRecord:
        """A copy ``cycles`` later, with this id and every dependency id moved by ``ids``."""
        return dataclasses.replace(
            self, id=self.id + ids, deps=tuple(d + ids for d in self.deps),
            start=self.start + cycles, end=self.end + cycles,
            submit=self.submit + cycles if self.submit >= 0 else -1,
            ready=self.ready + cycles if self.ready >= 0 else -1)


class TraceRecorder:
    """Collects :class:`TraceRecord` objects in the order they are recorded.

    Ids increase from 0 and are never reused, even across :meth:`clear`, so an event tagged
    before a clear can never be mistaken for a later record. A session that profiles takes
    each run's :attr:`records` before the next run clears them.
    """

    def __init__(self) -> None:
        self._records: list[TraceRecord | _Deferred] = []
        self._next_id = 0
        self._deferred = 0  # entries of _records that are _Deferred

    def record(
        self,
        kind: str,
        engine: str,
        scope: str,
        name: str,
        start: int,
        end: int,
        deps: Iterable[int] = (),
        work: Mapping[str, Any] | None = None,
        *,
        why: Iterable[str] | None = None,
        submit: int = -1,
        ready: int = -1,
    ) -> int:
        """Append a record and return its id. ``deps`` must name records already recorded;
        ``why`` (same length as ``deps``) tags each edge, default ``data``."""
        if kind not in KINDS:
            raise ValueError(f"trace record kind {kind!r} is invalid; expected one of {KINDS}")
        if not 0 <= start <= end:
            raise ValueError(f"trace record {name!r}: start={start}, end={end}; need 0<=start<=end")
        rid = self._next_id
        if why is None:  # the common case: every edge is data
            dep_ids = tuple(sorted({int(d) for d in deps}))
            reasons: tuple[str, ...] = ()
        else:
            edges: dict[int, str] = {}
            for d, reason in zip(deps, why, strict=True):
                edges.setdefault(int(d), reason)  # the first reason given for an edge wins
            dep_ids = tuple(sorted(edges))
            reasons = tuple(edges[d] for d in dep_ids)
            if any(r not in EDGE_KINDS for r in reasons):
                raise ValueError(f"trace record {name!r}: edge kinds {reasons}; expected each "
                                 f"one of {EDGE_KINDS}")
            if all(r == "data" for r in reasons):
                reasons = ()
        if dep_ids and not 0 <= dep_ids[0] <= dep_ids[-1] < rid:
            raise ValueError(f"trace record {name!r}: deps {dep_ids} must be ids in [0, {rid})")
        rec = TraceRecord(rid, kind, engine, scope, name, int(start), int(end), dep_ids,
                          dict(work or {}), reasons, int(submit), int(ready))
        self._records.append(rec)
        self._next_id += 1
        return rid

    @property
    def next_id(self) -> int:
        """The id the next record will get."""
        return self._next_id

    def defer(self, count: int, make: Callable[[], Sequence[TraceRecord]]) -> None:
        """Reserve the next ``count`` ids for records that ``make()`` builds when they are first
        read: a replayed run re-emits its records in one call, and a run nobody reads the trace
        of never pays for building them. ``make`` must give records with exactly those ids
        (whatever their other fields), each depending only on earlier records, and give the
        same records however often it is called."""
        if count:
            self._records.append(_Deferred(self._next_id, count, make))
            self._next_id += count
            self._deferred += 1

    @property
    def records(self) -> tuple[TraceRecord, ...]:
        """All records, in id order."""
        if self._deferred:
            self._records = list(_built(self._records))
            self._deferred = 0
        return tuple(self._records)

    def snapshot(self) -> Iterable[TraceRecord]:
        """The records as they stand, without building deferred ones yet: they are built when
        the snapshot is iterated (a profiling session keeps each run's snapshot and builds the
        records once, when it writes the trace)."""
        return _Snapshot(tuple(self._records))

    def clear(self) -> None:
        """Forget every record (ids keep counting up)."""
        self._records.clear()
        self._deferred = 0

    def __len__(self) -> int:
        return sum(r.count if isinstance(r, _Deferred) else 1 for r in self._records) \
            if self._deferred else len(self._records)


@dataclass(frozen=True)
class _Deferred:
    """Ids ``first .. first + count - 1``, whose records ``make()`` builds when read."""

    first: int
    count: int
    make: Callable[[], Sequence[TraceRecord]]


def _built(entries: Iterable[TraceRecord | _Deferred]) -> Iterator[TraceRecord]:
    """The records of ``entries`` with every deferred run built and checked."""
    for entry in entries:
        if not isinstance(entry, _Deferred):
            yield entry
            continue
        records = entry.make()
        ids = [r.id for r in records]
        if ids != list(range(entry.first, entry.first + entry.count)) or any(
                r.deps and not 0 <= r.deps[0] <= r.deps[-1] < r.id for r in records):
            raise ValueError(f"deferred trace records have ids {ids[:3]}...; expected "
                             f"{entry.first}..{entry.first + entry.count - 1}, each depending "
                             "on earlier records")
        yield from records


class _Snapshot:
    """A recorder's entries at one moment; deferred records are built when iterated."""

    __slots__ = ("_entries",)

    def __init__(self, entries: tuple[TraceRecord | _Deferred, ...]) -> None:
        self._entries = entries

    def __iter__(self) -> Iterator[TraceRecord]:
        return _built(self._entries)


def tag(event: Any, record_id: int) -> None:
    """Remember on a simpy event which trace record its completion corresponds to."""
    setattr(event, _TAG, record_id)


def record_ids(events: Iterable[Any]) -> tuple[int, ...]:
    """The trace record ids tagged on ``events`` (untagged events contribute nothing)."""
    ids = (getattr(ev, _TAG, None) for ev in events)
    return tuple(i for i in ids if i is not None)
