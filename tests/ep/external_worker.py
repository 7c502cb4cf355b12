"""A compiler process for the external-weights tests: compiles models into one shared folder.

Run by ``multiprocessing`` (spawn) from ``test_external_weights.py``; it is a module of its own
so the child processes import only it, not the test module.
"""

from __future__ import annotations

from pathlib import Path

import onnx

import ep
from tests.ep.npusim_graphs import matmul_add

NPU = "NpuSimExecutionProvider"


def shared_model(seed: int, act: str | None = None) -> onnx.ModelProto:
    """A MatMul-Add with 256 KiB of weights; the same ``seed`` gives the same weights."""
    return matmul_add(m=2, k=256, n=256, act=act, seed=seed)


def compile_models(folder: str, mode: str, jobs: list[tuple[str, int, str | None]]) -> list[str]:
    """Compile each ``(model name, seed, activation)`` into ``folder`` with
    ``external_weights=mode``; returns the EPContext model paths."""
    out = []
    for name, seed, act in jobs:
        path = Path(folder) / f"{name}.onnx"
        onnx.save(shared_model(seed, act), path)
        so = ep.SessionOptions()
        so.add_session_config_entry("ep.context_enable", "1")
        ep.InferenceSession(str(path), so, providers=[(NPU, {"external_weights": mode})])
        out.append(str(path.with_name(f"{name}_ctx.onnx")))
    return out
