"""Shrink a failing model to a small reproducer by deleting nodes (delta debugging).

A candidate deletes a set of nodes (never a ``Constant`` alone: it goes with its last reader):
each deleted output something still reads becomes a new
graph input (typed by ONNX shape inference), a deleted graph output is dropped, a tensor nobody
reads any more becomes a graph output, and initializers nobody reads go. The candidate is kept
when it still fails the same way (the same outcome, and for a localized difference the same
culprit op type). Chunks of halving size are tried, then
single nodes, until no single deletion keeps the failure (1-minimal). Inputs for new graph
inputs come from :func:`ep.testing.fuzz.build.feeds` with the case's feed seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import onnx
from onnx import helper

from .build import feeds
from .run import run_case


def signature(result: dict) -> tuple:
    """What must stay the same for a smaller model to count as the same failure."""
    return (result["outcome"], result.get("culprit"))


def without(model: onnx.ModelProto, drop: set[int]) -> onnx.ModelProto | None:
    """``model`` without the nodes at indices ``drop``; None if nothing would remain."""
    typed = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    typed.update({v.name: v for v in [*model.graph.input, *model.graph.output]})
    kept = [n for k, n in enumerate(model.graph.node) if k not in drop]
    read = {i for n in kept for i in n.input if i}
    kept = [n for n in kept if n.op_type != "Constant" or n.output[0] in read]
    made = {o for n in kept for o in n.output}
    inits = {t.name: t for t in model.graph.initializer}
    outputs = [o for o in model.graph.output if o.name in made]
    listed = {o.name for o in outputs}
    for n in kept:  # what nobody reads any more becomes an output: no dead nodes
        for o in n.output:
            if o and o not in read and o not in listed and o in typed:
                outputs.append(typed[o])
                listed.add(o)
    needed = read | {o.name for o in outputs}
    inputs = [v for v in model.graph.input if v.name in needed]
    have = {v.name for v in inputs} | made | set(inits)
    for name in sorted(needed - have):
        if name not in typed:
            return None
        inputs.append(typed[name])
    if not outputs or not any(n.op_type != "Constant" for n in kept):
        return None
    graph = helper.make_graph(kept, model.graph.name, inputs, outputs,
                              [t for name, t in inits.items() if name in needed])
    out = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    try:
        onnx.checker.check_model(out, full_check=True)
    except Exception:  # noqa: BLE001 - a deletion that breaks the model is not a candidate
        return None
    return out


def minimize(model: onnx.ModelProto, feed_seed: int, budget_s: float = 60.0,
             fails: Callable[[onnx.ModelProto], bool] | None = None,
             optimize: bool = True) -> onnx.ModelProto:
    """The smallest model found within ``budget_s`` seconds that fails like ``model`` (run
    with ``optimize`` as :func:`~ep.testing.fuzz.run.run_case` takes it)."""
    if fails is None:
        target = signature(run_case(model, feeds(model, feed_seed), optimize=optimize))

        def fails(m: onnx.ModelProto) -> bool:
            return signature(run_case(m, feeds(m, feed_seed), optimize=optimize)) == target

    deadline = time.monotonic() + budget_s
    chunk = max(1, len(model.graph.node) // 2)
    while chunk >= 1 and time.monotonic() < deadline:
        shrunk = False
        start = 0
        # Constant nodes go with their last reader: deleting one alone would turn a constant
        # axes or shape into a graph input, which changes what the model means
        ops = [k for k, n in enumerate(model.graph.node) if n.op_type != "Constant"]
        while start < len(ops) and time.monotonic() < deadline:
            candidate = without(model, set(ops[start:start + chunk]))
            if candidate is not None and fails(candidate):
                model, shrunk = candidate, True
                ops = [k for k, n in enumerate(model.graph.node) if n.op_type != "Constant"]
            else:
                start += chunk
        if not shrunk:
            chunk //= 2
    return model
