"""``SessionOptions.optimized_model_filepath`` and the options' defaults, compared with the
installed onnxruntime on the same model and options."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ep

NPU, CPU = "NpuSimExecutionProvider", "CPUExecutionProvider"


def foldable() -> bytes:
    """MatMul by a constant, an Identity and a Relu over a free dimension N: basic optimization
    removes the Identity; the levels above it fuse more."""
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Identity", ["a"], ["b"]),
         helper.make_node("Relu", ["b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.parametrize("level", ["ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"])
@pytest.mark.parametrize("free_dims", [{}, {"N": 4}])
def test_a_cpu_session_writes_what_onnxruntime_writes(tmp_path: Path, level, free_dims) -> None:
    written = []
    for lib in (ort, ep):
        options = lib.SessionOptions()
        options.graph_optimization_level = getattr(lib.GraphOptimizationLevel, level)
        options.log_severity_level = 3
        for dim, value in free_dims.items():
            options.add_free_dimension_override_by_name(dim, value)
        options.optimized_model_filepath = str(tmp_path / f"{lib.__name__}.onnx")
        lib.InferenceSession(foldable(), options, providers=[CPU])
        written.append((tmp_path / f"{lib.__name__}.onnx").read_bytes())
    assert written[0] == written[1]


def test_a_session_with_npu_partitions_cannot_be_written(tmp_path: Path) -> None:
    options = ep.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "opt.onnx")
    with pytest.raises(ep.Fail) as info:
        ep.InferenceSession(foldable(), options, providers=[(NPU, {"N": "4"}), CPU])
    assert info.value.message == ("Unable to serialize model as it contains compiled nodes. "
                                  "Please disable any execution providers which generate "
                                  "compiled nodes.")
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_path_fails_with_onnxruntime_status(tmp_path: Path) -> None:
    target = str(tmp_path / "missing" / "opt.onnx")
    errors = []
    for lib in (ort, ep):
        options = lib.SessionOptions()
        options.log_severity_level = 3
        options.optimized_model_filepath = target
        with pytest.raises(Exception) as info:
            lib.InferenceSession(foldable(), options, providers=[CPU])
        errors.append(info.value)
    assert type(errors[1]).__name__ == type(errors[0]).__name__
    assert str(errors[0]).split(" : ")[-1] in str(errors[1])
    assert list(tmp_path.iterdir()) == []


def test_the_plain_options_start_at_onnxruntime_defaults() -> None:
    theirs, ours = ort.SessionOptions(), ep.SessionOptions()
    for name in ("log_severity_level", "log_verbosity_level", "logid", "enable_cpu_mem_arena",
                 "enable_mem_pattern", "enable_mem_reuse", "use_deterministic_compute",
                 "use_per_session_threads", "optimized_model_filepath", "enable_profiling",
                 "intra_op_num_threads", "inter_op_num_threads", "profile_file_prefix"):
        assert getattr(ours, name) == getattr(theirs, name), name
    for name in ("execution_mode", "execution_order", "graph_optimization_level"):
        assert int(getattr(ours, name)) == int(getattr(theirs, name)), name
    assert {m.name: m.value for m in ep.ExecutionOrder} == \
        {name: int(value) for name, value in ort.ExecutionOrder.__members__.items()}
