"""The trace recorder: one record per DMA chunk, kernel, sync or firmware command.

A trace is a dependency graph, not just a timeline. Each :class:`TraceRecord` carries

- *where* it ran: the ``engine`` (``"dma0"``, ``"core1"``, ``"link"``) and the component
  ``scope`` (``"npu.dma0"``);
- *when* it ran under the config that recorded it: ``start`` and ``end`` in cycles;
- *what it depended on*: ``deps``, the ids of earlier records that had to finish first;
- *what work it did*, independent of the config: ``work`` holds bytes moved, MACs, tensor
  shapes and dtypes, the op and its attributes.

The last two are what make a trace replayable under another :class:`~npu_sim.DeviceConfig`: a
replayer re-prices each record's work and re-schedules it after its deps. Engines that produce
simpy events tag them with the id of their last record (:func:`tag`), so whoever waits on an
event can name it as a dependency (:func:`record_ids`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

KINDS = ("dma", "kernel", "sync", "command")
"""The record kinds a trace holds."""

_TAG = "npu_trace_record"


@dataclass(frozen=True)
class TraceRecord:
    """One traced operation: identity, placement, timing, dependencies and config-free work."""

    id: int
    kind: str
    engine: str
    scope: str
    name: str
    start: int
    end: int
    deps: tuple[int, ...] = ()
    work: dict[str, Any] = field(default_factory=dict)

    @property
    def cycles(self) -> int:
        """Duration in cycles."""
        return self.end - self.start


class TraceRecorder:
    """Collects :class:`TraceRecord` objects in the order they are recorded.

    Ids increase from 0 and are never reused, even across :meth:`clear`, so an event tagged
    before a clear can never be mistaken for a later record.
    """

    def __init__(self) -> None:
        self._records: list[TraceRecord] = []
        self._next_id = 0

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
    ) -> int:
        """Append a record and return its id. ``deps`` must name records already recorded."""
        if kind not in KINDS:
            raise ValueError(f"trace record kind {kind!r} is invalid; expected one of {KINDS}")
        if not 0 <= start <= end:
            raise ValueError(f"trace record {name!r}: start={start}, end={end}; need 0<=start<=end")
        deps = tuple(sorted(set(int(d) for d in deps)))
        rid = self._next_id
        if deps and not 0 <= deps[0] <= deps[-1] < rid:
            raise ValueError(f"trace record {name!r}: deps {deps} must be ids in [0, {rid})")
        rec = TraceRecord(rid, kind, engine, scope, name, int(start), int(end), deps,
                          dict(work or {}))
        self._records.append(rec)
        self._next_id += 1
        return rid

    @property
    def next_id(self) -> int:
        """The id the next record will get."""
        return self._next_id

    def extend(self, records: Iterable[TraceRecord]) -> None:
        """Append records built elsewhere (a replayed run's copies), whatever their fields.

        Their ids must continue this recorder's sequence and their deps name earlier records.
        """
        for rec in records:
            if rec.id != self._next_id or (rec.deps and not 0 <= rec.deps[0] <= rec.deps[-1]
                                           < rec.id):
                raise ValueError(f"trace record {rec.name!r}: id {rec.id} deps {rec.deps}; "
                                 f"expected id {self._next_id} and earlier deps")
            self._records.append(rec)
            self._next_id += 1

    @property
    def records(self) -> tuple[TraceRecord, ...]:
        """All records, in id order."""
        return tuple(self._records)

    def clear(self) -> None:
        """Forget every record (ids keep counting up)."""
        self._records.clear()

    def __len__(self) -> int:
        return len(self._records)


def tag(event: Any, record_id: int) -> None:
    """Remember on a simpy event which trace record its completion corresponds to."""
    setattr(event, _TAG, record_id)


def record_ids(events: Iterable[Any]) -> tuple[int, ...]:
    """The trace record ids tagged on ``events`` (untagged events contribute nothing)."""
    ids = (getattr(ev, _TAG, None) for ev in events)
    return tuple(i for i in ids if i is not None)
