"""Reference results from onnxruntime's CPU provider for single ONNX nodes.

Every kernel test compares against this: build a one-node model with the given inputs and
attributes, run it with ``CPUExecutionProvider`` on the same inputs, return the outputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from npu_sim import dtypes


def single_node_model(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: Mapping[str, Any] | None = None,
    n_outputs: int = 1,
    opset: int = 17,
    domain: str = "",
    constant_inputs: Sequence[int] = (),
) -> onnx.ModelProto:
    """A model with one node; input ``i`` is an initializer if ``i`` is in ``constant_inputs``.

    ``None`` inputs become omitted optional inputs (empty names).
    """
    in_names, graph_inputs, inits = [], [], []
    for i, arr in enumerate(inputs):
        if arr is None:
            in_names.append("")
            continue
        name = f"in{i}"
        in_names.append(name)
        if i in constant_inputs:
            inits.append(onnx.numpy_helper.from_array(np.asarray(arr), name))
        else:
            elem = dtypes.to_onnx(dtypes.from_numpy(arr.dtype))
            graph_inputs.append(helper.make_tensor_value_info(name, elem, arr.shape))
    out_names = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, in_names, out_names, domain=domain, **(attrs or {}))
    # Name-only outputs: onnxruntime infers their types (it rejects elem_type 0, UNDEFINED).
    outputs = [onnx.ValueInfoProto(name=n) for n in out_names]
    graph = helper.make_graph([node], "single", graph_inputs, outputs, initializer=inits)
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def run_ort(
    op_type: str,
    inputs: Sequence[np.ndarray | None],
    attrs: Mapping[str, Any] | None = None,
    n_outputs: int = 1,
    opset: int = 17,
    domain: str = "",
    constant_inputs: Sequence[int] = (),
) -> list[np.ndarray]:
    """Run one node on onnxruntime's CPU provider and return its outputs."""
    model = single_node_model(op_type, inputs, attrs, n_outputs, opset, domain, constant_inputs)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(
        model.SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    feed = {
        f"in{i}": a
        for i, a in enumerate(inputs)
        if a is not None and i not in constant_inputs
    }
    return sess.run(None, feed)
