"""Traces: record a run as a dependency graph, save it, export it, replay it, analyse it.

- :mod:`.recorder`: :class:`TraceRecorder` and :class:`TraceRecord`, what the engines write
  into while they run (:func:`tag` / :func:`record_ids` link a simpy event to its record);
- :mod:`.capture`: :class:`Recording`, many runs (and partitions) stitched into one trace;
- :mod:`.format`: the versioned JSON-lines file (``docs/trace_format.md``), :class:`Trace`,
  :func:`save`, :func:`load`;
- :mod:`.exporters`: :func:`export` to Chrome/Perfetto JSON or an ONNX Runtime profile, behind a
  small :class:`~.exporters.Exporter` interface;
- :mod:`.retime`: :func:`replay` in ``recorded`` or ``elastic`` mode under another config;
- :mod:`.analysis`: :func:`~.analysis.report` and :func:`~.analysis.diff`;
- :mod:`.sweep`: :func:`~.sweep.sweep`, one trace under a grid of configs on a process pool or
  Ray.

The modules that reach into the device (replay, export) are imported on first use: the device's
engines import the recorder, so this package must not import them back at load time.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .capture import Recording
from .format import SCHEMA_VERSION, Trace, load, save
from .recorder import EDGE_KINDS, KINDS, TraceRecord, TraceRecorder, record_ids, tag

if TYPE_CHECKING:
    from ..config import DeviceConfig
    from .retime import ReplayResult

__all__ = [
    "EDGE_KINDS", "KINDS", "SCHEMA_VERSION", "Recording", "Trace", "TraceRecord",
    "TraceRecorder", "export", "load", "record_ids", "replay", "save", "tag",
]


def replay(trace: Trace | str | os.PathLike[str], config: DeviceConfig | None = None,
           mode: str = "recorded", **options: Any) -> ReplayResult:
    """Replay ``trace`` under ``config`` (see :func:`npu_sim.trace.retime.replay`)."""
    from .retime import replay as _replay

    return _replay(trace, config, mode, **options)


def export(trace: Trace | str | os.PathLike[str], format: str, path: str | os.PathLike[str],
           **options: Any) -> str:
    """Write ``trace`` as ``format`` (``"perfetto"``, ``"ort"``) to ``path``; returns the path
    (see :mod:`npu_sim.trace.exporters`)."""
    from .exporters import export as _export

    return _export(trace, format, path, **options)
