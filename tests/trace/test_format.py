"""The trace file: round trip, and typed errors naming the line for every kind of bad input."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npu_sim.config import DeviceConfig
from npu_sim.errors import TraceError
from npu_sim.trace import EDGE_KINDS, Trace, TraceRecord, load, save
from npu_sim.trace.format import lines, parse


@st.composite
def traces(draw) -> Trace:
    """Random acyclic traces: each record depends on a subset of earlier ones."""
    n = draw(st.integers(0, 25))
    records = []
    for i in range(n):
        deps = sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else []
        why = tuple(draw(st.sampled_from(EDGE_KINDS)) for _ in deps)
        start = draw(st.integers(0, 10_000))
        records.append(TraceRecord(
            i, draw(st.sampled_from(["dma", "kernel", "sync", "command"])), f"e{i % 3}",
            "npu.x", draw(st.text(max_size=8)), start, start + draw(st.integers(0, 500)),
            tuple(deps), {"bytes": draw(st.integers(0, 1 << 40)), "attrs": {"k": [1, 2]},
                          "blob": b"\x00\xff"},
            () if all(w == "data" for w in why) else why, start, start))
    return Trace(DeviceConfig.preset("npu-s"), tuple(records), "m", "0.1.0", {"x": 1})


@given(traces())
def test_save_load_round_trip(tmp_path_factory, trace):
    path = tmp_path_factory.mktemp("t") / "a.trace.jsonl"
    save(trace, path)
    back = load(path)
    assert back == trace


def _lines(trace: Trace) -> list[bytes]:
    return list(lines(trace))


@pytest.fixture
def small(cnn_trace) -> list[bytes]:
    return _lines(cnn_trace)


def _error(raw: list[bytes]) -> TraceError:
    with pytest.raises(TraceError) as info:
        parse(raw, "t.jsonl")
    return info.value


def test_truncated_file_names_where(small):
    err = _error(small[:-3])
    assert "truncated" in str(err) and err.where == f"t.jsonl:{len(small) - 2}"
    err = _error([*small[:-1], small[-1][:20]])  # a line cut mid-way
    assert err.where == f"t.jsonl:{len(small)}" and "not valid JSON" in str(err)


def test_reordered_lines(small):
    swapped = [small[0], small[2], small[1], *small[3:]]
    err = _error(swapped)
    assert err.where == "t.jsonl:3" and "increasing id order" in str(err)


def test_unknown_schema_version(small):
    head = json.loads(small[0])
    head["schema"] = "2.0"
    err = _error([json.dumps(head).encode(), *small[1:]])
    assert err.where == "t.jsonl:1" and "schema version 2.0" in str(err) and "1.x" in str(err)


def test_newer_minor_schema_reads(small):
    head = json.loads(small[0])
    head["schema"] = "1.7"
    head["something_new"] = True
    assert len(parse([json.dumps(head).encode(), *small[1:]]).records) == len(small) - 1


def test_hand_edited_config_fails_its_digest(small):
    head = json.loads(small[0])
    head["config"]["hbm_gbps"] = 1.0
    err = _error([json.dumps(head).encode(), *small[1:]])
    assert "config_digest" in str(err) and err.where == "t.jsonl:1"


def test_hand_edited_record_fields(small):
    rec = json.loads(small[5])
    rec["end"] = rec["start"] - 1 if rec["start"] else -1
    err = _error([*small[:5], json.dumps(rec).encode(), *small[6:]])
    assert err.where == "t.jsonl:6"
    rec = json.loads(small[5])
    rec["kind"] = "teleport"
    assert "kind='teleport'" in str(_error([*small[:5], json.dumps(rec).encode(), *small[6:]]))


def test_dependency_on_missing_record(small):
    rec = json.loads(small[4])
    rec["deps"] = [[999999, "data"]]
    err = _error([*small[:4], json.dumps(rec).encode(), *small[5:]])
    assert err.where == "t.jsonl:5" and "999999" in str(err) and "not in the trace" in str(err)


def test_cycle_is_named(small):
    a, b = json.loads(small[3]), json.loads(small[6])
    a["deps"] = [[b["id"], "data"]]  # 3's record now waits for 6's, which reaches back to it
    b["deps"] = [[a["id"], "data"]]
    raw = [*small[:3], json.dumps(a).encode(), *small[4:6], json.dumps(b).encode(), *small[7:]]
    err = _error(raw)
    assert "cycle" in str(err) and f"{a['id']} -> {b['id']} -> {a['id']}" in str(err)
    self_dep = json.loads(small[3])
    self_dep["deps"] = [[self_dep["id"], "data"]]
    assert "itself" in str(_error([*small[:3], json.dumps(self_dep).encode(), *small[4:]]))


def test_not_a_trace(tmp_path):
    path = tmp_path / "x.trace.jsonl"
    path.write_text('[1, 2]\n')
    with pytest.raises(TraceError, match="expected an object"):
        load(path)
    path.write_text("")
    with pytest.raises(TraceError, match="empty file"):
        load(path)
    with pytest.raises(TraceError, match="cannot read"):
        load(tmp_path / "missing.trace.jsonl")


def test_save_never_leaves_a_half_written_file(tmp_path, cnn_trace, monkeypatch):
    path = tmp_path / "a.trace.jsonl"
    save(cnn_trace, path)
    before = path.read_bytes()

    def broken(trace):
        yield b"{}\n"
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("npu_sim.trace.format.lines", broken)
    with pytest.raises(OSError):
        save(cnn_trace, path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == \
        ["a.trace.jsonl"]
