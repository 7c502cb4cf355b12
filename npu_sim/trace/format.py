"""The trace file: versioned JSON lines (normative spec: ``docs/trace_format.md``).

Line 1 is the header: ``format`` (``"npu-sim-trace"``), ``schema`` (``"MAJOR.MINOR"``), the full
device ``config`` and its ``config_digest``, ``clock_ghz``, ``model``, ``sdk_version``, the
number of ``records`` that follow and free-form ``meta``. Every further line is one record, in id
order, each after every record it depends on.

Reading never evaluates anything from the file (plain ``json``), checks every line and raises
:class:`~npu_sim.errors.TraceError` naming the line and what is wrong: not JSON, a field missing
or of the wrong type, an unknown schema major version, a config that does not match its digest,
ids out of order, a dependency on a missing record, a cycle, fewer records than the header
announces. Writing is atomic: a temporary file in the target's folder, renamed over it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import DeviceConfig
from ..errors import ConfigError, TraceError
from ..files import write_atomic
from .recorder import EDGE_KINDS, KINDS, TraceRecord

FORMAT = "npu-sim-trace"
SCHEMA_VERSION = (1, 1)
"""``(major, minor)``: a reader takes any minor of its major (unknown fields are ignored)."""


@dataclass(frozen=True)
class Trace:
    """A recorded trace: the device config it ran on, the model, and its records in id order."""

    config: DeviceConfig
    records: tuple[TraceRecord, ...]
    model: str = ""
    sdk_version: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def start(self) -> int:
        """First cycle of any record (0 for an empty trace)."""
        return min((r.start for r in self.records), default=0)

    @property
    def end(self) -> int:
        """Last cycle of any record."""
        return max((r.end for r in self.records), default=0)

    @property
    def makespan(self) -> int:
        """Cycles from the first start to the last end."""
        return self.end - self.start

    def by_id(self) -> dict[int, TraceRecord]:
        """Records by id."""
        return {r.id: r for r in self.records}


# -- writing ------------------------------------------------------------------------------------


def header(trace: Trace) -> dict[str, Any]:
    """The header object of ``trace``."""
    return {
        "format": FORMAT, "schema": f"{SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]}",
        "model": trace.model, "sdk_version": trace.sdk_version,
        "clock_ghz": trace.config.clock_ghz, "config": trace.config.to_dict(),
        "config_digest": trace.config.digest, "records": len(trace.records),
        "meta": _plain(trace.meta),
    }


def record_to_json(rec: TraceRecord) -> dict[str, Any]:
    """One record as its JSON object."""
    return {
        "id": rec.id, "kind": rec.kind, "name": rec.name, "engine": rec.engine,
        "scope": rec.scope, "submit": rec.submit if rec.submit >= 0 else rec.start,
        "ready": rec.ready if rec.ready >= 0 else rec.start, "start": rec.start, "end": rec.end,
        "deps": [[d, why] for d, why in rec.edges], "work": _plain(rec.work),
    }


def lines(trace: Trace) -> Iterator[bytes]:
    """The file's lines, encoded, each ending in a newline."""
    dump = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    yield (dump(header(trace)) + "\n").encode("utf-8")
    for rec in trace.records:
        yield (dump(record_to_json(rec)) + "\n").encode("utf-8")


def save(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` to ``path`` atomically; returns the path."""
    return write_atomic(path, lines(trace))


def _plain(value: Any) -> Any:
    """``value`` as JSON data: tuples become lists, bytes ``{"$bytes": hex}``, numpy scalars
    and arrays plain numbers and lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes": bytes(value).hex()}
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def unplain(value: Any) -> Any:
    """Inverse of the encoding of bytes in ``work`` (lists stay lists)."""
    if isinstance(value, dict):
        if set(value) == {"$bytes"} and isinstance(value["$bytes"], str):
            return bytes.fromhex(value["$bytes"])
        return {k: unplain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unplain(v) for v in value]
    return value


# -- reading ------------------------------------------------------------------------------------


def load(source: str | os.PathLike[str] | Trace) -> Trace:
    """A trace from a ``.trace.jsonl`` path (or ``source`` itself if already loaded)."""
    if isinstance(source, Trace):
        return source
    path = Path(source)
    try:
        with path.open("rb") as f:
            return parse(f, path.name)
    except OSError as exc:
        raise TraceError(str(path), f"cannot read the trace ({exc.strerror})") from None


def parse(lines_in: Iterable[bytes | str], name: str = "<trace>") -> Trace:
    """A trace from its lines; :class:`TraceError` names the first bad line."""
    it = iter(lines_in)
    first = next(it, None)
    if first is None:
        raise TraceError(f"{name}:1", "empty file; expected a header line")
    head = _json_line(first, name, 1)
    config, expected = _check_header(head, name)
    records: list[TraceRecord] = []
    seen: set[int] = set()
    forward: dict[int, tuple[int, int]] = {}  # record id -> (a later id it names, its line)
    for lineno, raw in enumerate(it, start=2):
        if not (raw.strip() if isinstance(raw, str) else raw.strip()):
            raise TraceError(f"{name}:{lineno}", "empty line; every line after the header is "
                                                 "one record")
        rec = _record(_json_line(raw, name, lineno), name, lineno)
        if records and rec.id <= records[-1].id:
            raise TraceError(f"{name}:{lineno}", f"record id {rec.id} follows id "
                                                 f"{records[-1].id}; records must be in "
                                                 "increasing id order (reordered lines?)")
        for d in rec.deps:
            if d not in seen:
                forward.setdefault(rec.id, (d, lineno))
        seen.add(rec.id)
        records.append(rec)
    if len(records) != expected:
        raise TraceError(f"{name}:{len(records) + 2}",  # the first line missing or extra
                         f"truncated: the header announces {expected} records, the file holds "
                         f"{len(records)}" if len(records) < expected else
                         f"the header announces {expected} records, the file holds "
                         f"{len(records)}")
    if forward:
        _explain_forward(records, forward, seen, name)
    return Trace(config, tuple(records), str(head.get("model", "")),
                 str(head.get("sdk_version", "")), dict(head.get("meta") or {}))


def _json_line(raw: bytes | str, name: str, lineno: int) -> Any:
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"{name}:{lineno}", f"not valid JSON ({exc}); a cut-off line means "
                                             "the file was truncated") from None
    if not isinstance(value, dict):
        raise TraceError(f"{name}:{lineno}", f"a JSON {type(value).__name__}; expected an "
                                             "object")
    return value


def _check_header(head: dict, name: str) -> tuple[DeviceConfig, int]:
    where = f"{name}:1"
    if head.get("format") != FORMAT:
        raise TraceError(where, f"format={head.get('format')!r}; expected {FORMAT!r} (is this "
                                "a trace header?)")
    schema = head.get("schema")
    try:
        major, minor = (int(p) for p in str(schema).split("."))
    except ValueError:
        raise TraceError(where, f"schema={schema!r}; expected 'MAJOR.MINOR'") from None
    if major != SCHEMA_VERSION[0]:
        raise TraceError(where, f"schema version {schema} is not readable by this SDK, which "
                                f"reads schema {SCHEMA_VERSION[0]}.x (written by sdk "
                                f"{head.get('sdk_version', '?')!r}); re-record the trace or "
                                f"convert it with an SDK that reads both")
    if not isinstance(head.get("config"), dict):
        raise TraceError(where, "config missing; expected the full device config object")
    try:
        config = DeviceConfig.from_dict(head["config"])
    except ConfigError as exc:
        raise TraceError(where, f"config: {exc.message}") from None
    if head.get("config_digest") != config.digest:
        raise TraceError(where, f"config_digest {head.get('config_digest')!r} does not match the "
                                f"config ({config.digest}); the header was edited")
    count = head.get("records")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise TraceError(where, f"records={count!r}; expected the record count, an int >= 0")
    return config, count


_INT_FIELDS = ("id", "submit", "ready", "start", "end")
_STR_FIELDS = ("kind", "name", "engine", "scope")


def _record(obj: dict, name: str, lineno: int) -> TraceRecord:
    where = f"{name}:{lineno}"
    for key in _INT_FIELDS:
        value = obj.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TraceError(where, f"{key}={value!r}; expected an int >= 0")
    for key in _STR_FIELDS:
        if not isinstance(obj.get(key), str):
            raise TraceError(where, f"{key}={obj.get(key)!r}; expected a string")
    if obj["kind"] not in KINDS:
        raise TraceError(where, f"kind={obj['kind']!r}; expected one of {list(KINDS)}")
    if not obj["submit"] <= obj["ready"] <= obj["start"] <= obj["end"]:
        raise TraceError(where, f"record {obj['id']}: submit={obj['submit']} ready="
                                f"{obj['ready']} start={obj['start']} end={obj['end']}; "
                                "expected submit <= ready <= start <= end")
    deps = obj.get("deps")
    if not isinstance(deps, list):
        raise TraceError(where, f"deps={deps!r}; expected a list of [id, why] pairs")
    ids, why = [], []
    for edge in deps:
        if (not isinstance(edge, list) or len(edge) != 2 or isinstance(edge[0], bool)
                or not isinstance(edge[0], int) or edge[1] not in EDGE_KINDS):
            raise TraceError(where, f"dependency {edge!r}; expected [record id, one of "
                                    f"{list(EDGE_KINDS)}]")
        if edge[0] == obj["id"]:
            raise TraceError(where, f"record {obj['id']} depends on itself (a cycle)")
        ids.append(edge[0])
        why.append(edge[1])
    if len(set(ids)) != len(ids):
        raise TraceError(where, f"record {obj['id']} names a dependency twice: {ids}")
    work = obj.get("work")
    if not isinstance(work, dict):
        raise TraceError(where, f"work={work!r}; expected an object")
    order = sorted(range(len(ids)), key=ids.__getitem__)
    reasons = tuple(why[i] for i in order)
    return TraceRecord(obj["id"], obj["kind"], obj["engine"], obj["scope"], obj["name"],
                       obj["start"], obj["end"], tuple(ids[i] for i in order), unplain(work),
                       () if all(r == "data" for r in reasons) else reasons,
                       obj["submit"], obj["ready"])


def _explain_forward(records: list[TraceRecord], forward: dict[int, tuple[int, int]],
                     seen: set[int], name: str) -> None:
    """Raise for the first record that names a dependency not before it: missing, or a cycle
    (found by following dependencies), or just out of order."""
    line_of = {r.id: i + 2 for i, r in enumerate(records)}
    deps = {r.id: r.deps for r in records}
    rid, (dep, lineno) = min(forward.items(), key=lambda kv: kv[1][1])
    if dep not in seen:
        raise TraceError(f"{name}:{lineno}", f"record {rid} depends on record {dep}, which is "
                                             "not in the trace")
    cycle = _find_cycle(deps, rid)
    if cycle:
        path = " -> ".join(map(str, cycle))
        raise TraceError(f"{name}:{lineno}", f"dependency cycle {path} (lines "
                                             f"{', '.join(str(line_of[c]) for c in cycle[:-1])})"
                                             "; a trace is acyclic")
    raise TraceError(f"{name}:{lineno}", f"record {rid} depends on record {dep}, which comes "
                                         f"later (line {line_of[dep]}); every record must "
                                         "follow its dependencies")


def _find_cycle(deps: dict[int, tuple[int, ...]], start: int) -> list[int]:
    """A dependency cycle through ``start`` (``[start, ..., start]``), or ``[]``."""
    stack = [(start, iter(deps.get(start, ())))]
    path, on_path = [start], {start}
    visited: set[int] = set()
    while stack:
        node, children = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            visited.add(node)
            on_path.discard(path.pop())
        elif child == start:
            return [*path, start]
        elif child not in on_path and child not in visited:
            stack.append((child, iter(deps.get(child, ()))))
            path.append(child)
            on_path.add(child)
    return []
