"""``SessionOptions.optimized_model_filepath``: the optimized model written as onnxruntime
writes it.

onnxruntime serializes the graph it optimized at session creation, and refuses a session with
compiled nodes: ``FAIL``, "Unable to serialize model as it contains compiled nodes. Please
disable any execution providers which generate compiled nodes." (``inference_session.cc``).
Every partition a provider other than ``CPUExecutionProvider`` takes is such a node here (the
NPU compiles its partitions; an EPContext node is one). A session all on the CPU provider is
onnxruntime's own session: the file is what onnxruntime writes for the same model and options,
written by onnxruntime (its optimization level, free dimensions and ``session.`` config
entries, which set where large initializers go).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import onnxruntime

from ..errors import Fail
from .cpu import same_error
from .options import SessionOptions
from .registry import CPU_PROVIDER as CPU

COMPILED = ("Unable to serialize model as it contains compiled nodes. Please disable any "
            "execution providers which generate compiled nodes.")


def write(source: str | os.PathLike[str] | bytes, options: SessionOptions,
          providers: Sequence[str]) -> None:
    """Write the optimized model to ``options.optimized_model_filepath`` (set), for a session
    of ``source`` whose partitions run on ``providers``; ``Fail`` if any is compiled."""
    if any(p != CPU for p in providers):
        raise Fail(COMPILED)
    ort_options = onnxruntime.SessionOptions()
    ort_options.graph_optimization_level = _level(options.graph_optimization_level)
    ort_options.optimized_model_filepath = os.fspath(options.optimized_model_filepath)
    ort_options.log_severity_level = options.log_severity_level  # its warnings, as it logs them
    for dim, value in options.free_dimension_overrides.items():
        ort_options.add_free_dimension_override_by_name(dim, int(value))
    for denotation, value in options.free_dimension_denotations.items():
        ort_options.add_free_dimension_override_by_denotation(denotation, int(value))
    for key, value in options.config_entries().items():
        if key.startswith("session."):
            ort_options.add_session_config_entry(key, value)
    try:
        onnxruntime.InferenceSession(source, ort_options, providers=[CPU])
    except Exception as exc:  # noqa: BLE001 - onnxruntime's refusal, with its status
        raise same_error(exc)(f"cannot write the optimized model to "
                              f"{options.optimized_model_filepath!r}: {exc}") from None


def _level(level: Any) -> onnxruntime.GraphOptimizationLevel:
    return onnxruntime.GraphOptimizationLevel(int(level))
