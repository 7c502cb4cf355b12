"""Deferred trace records: a replayed run re-emits its records in one call, built when read."""

from __future__ import annotations

import pytest

from npu_sim.trace import TraceRecorder


def _copies(recorder_records, shift):
    return lambda: [r.shifted(0, ids=shift) for r in recorder_records]


def test_deferred_records_are_built_only_when_read_and_keep_their_place():
    rec = TraceRecorder()
    first = rec.record("kernel", "core0", "npu.core0", "a", 0, 10)
    rec.record("kernel", "core0", "npu.core0", "b", 10, 20, deps=[first])
    built = []

    def make():
        built.append(1)
        return [r.shifted(20, ids=2) for r in original]

    original = rec.records
    rec.defer(2, make)
    after = rec.record("dma", "dma0", "npu.dma0", "c", 40, 45, deps=[3])
    assert (len(rec), rec.next_id, after, built) == (5, 5, 4, [])
    snapshot = rec.snapshot()
    assert built == []
    records = list(snapshot)
    assert [r.id for r in records] == [0, 1, 2, 3, 4] and records[3].deps == (2,)
    assert [r.start for r in records] == [0, 10, 20, 30, 40]
    assert rec.records == tuple(records) and len(built) == 2  # the snapshot, then the recorder
    assert rec.records == tuple(records)  # built once: the recorder keeps what it built
    assert len(built) == 2


def test_deferred_records_with_other_ids_are_refused_when_read():
    rec = TraceRecorder()
    rec.record("kernel", "core0", "npu.core0", "a", 0, 10)
    rec.defer(1, _copies(rec.records, 5))
    with pytest.raises(ValueError, match="expected 1..1"):
        _ = rec.records


def test_clear_drops_deferred_records_unbuilt():
    rec = TraceRecorder()
    rec.defer(3, lambda: pytest.fail("built"))
    rec.clear()
    assert (len(rec), rec.records, rec.next_id) == (0, (), 3)
