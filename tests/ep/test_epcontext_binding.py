"""EPContext binding you can trust: I/O by position with checks, graph identity by digest,
per-binary graph lookup, no silent replacement of a binary, loader refusals as InvalidGraph."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, compose, helper

import ep
from ep.framework import epcontext as E
from ep.npusim.binary import ContextBinary, write_context_binary
from ep.npusim.epcontext import recorded_digest
from tests.ep.test_epcontext_load import ctx_nodes, gen_options, set_attr

NPU = "NpuSimExecutionProvider"
F = TensorProto.FLOAT


def two_output_model(scale: float = 1.0) -> onnx.ModelProto:
    """x -> Relu -> r -> Mul(s) -> Neg -> n: two outputs of one NPU partition, same type and
    shape."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "s"], ["xs"], name="mul"),
             helper.make_node("Neg", ["xs"], ["n"], name="neg")]
    graph = helper.make_graph(
        nodes, "two", [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info("r", F, [2, 3]),
         helper.make_tensor_value_info("n", F, [2, 3])],
        [helper.make_tensor("s", F, [], [scale])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


X = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
R = np.maximum(X, 0)


def compile_ctx(folder: Path, name: str = "m", scale: float = 1.0, **entries: str) -> Path:
    onnx.save(two_output_model(scale), folder / f"{name}.onnx")
    ep.InferenceSession(str(folder / f"{name}.onnx"), gen_options(**entries), providers=[NPU])
    return folder / f"{name}_ctx.onnx"


def test_edges_renamed_outside_the_node_still_bind(tmp_path: Path) -> None:
    ctx = onnx.load(compile_ctx(tmp_path))
    renamed = compose.add_prefix(ctx, "a/", rename_nodes=False, rename_functions=False,
                                 rename_initializers=False, rename_value_infos=True)
    onnx.save(renamed, tmp_path / "renamed.onnx")
    got = ep.InferenceSession(str(tmp_path / "renamed.onnx"), providers=[NPU]).run(
        None, {"a/x": X})
    np.testing.assert_array_equal(got[0], R)
    np.testing.assert_array_equal(got[1], -R)


def test_swapped_outputs_are_invalid_graph_not_swapped_values(tmp_path: Path) -> None:
    path = compile_ctx(tmp_path)
    ctx = onnx.load(path)
    (node,) = ctx_nodes(ctx)
    outputs = list(node.output)
    del node.output[:]
    node.output.extend(reversed(outputs))
    onnx.save(ctx, path)
    with pytest.raises(ep.InvalidGraph, match=r"output 0 is 'n', but the compiled graph's "
                                              r"output 0 is 'r' .* permuted"):
        ep.InferenceSession(str(path), providers=[NPU])


def test_an_input_of_another_type_is_invalid_graph(tmp_path: Path) -> None:
    path = compile_ctx(tmp_path)
    ctx = onnx.load(path)
    ctx.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 4
    onnx.save(ctx, path)
    with pytest.raises(ep.InvalidGraph, match=r"input 0 'x' is float32\[2, 4\]; the compiled "
                                              r"graph's input 0 'x' is float32\[2, 3\]"):
        ep.InferenceSession(str(path), providers=[NPU])


def test_a_binary_replaced_under_an_older_model_is_refused(tmp_path: Path) -> None:
    old = tmp_path / "old"
    new = tmp_path / "new"
    old.mkdir(), new.mkdir()
    compile_ctx(old, scale=1.0)
    compile_ctx(new, scale=2.0)  # same graph name, other weights
    (old / "m_npusim.bin").write_bytes((new / "m_npusim.bin").read_bytes())
    with pytest.raises(ep.InvalidGraph, match="compiled to graph digest .* the binary was "
                                              "replaced"):
        ep.InferenceSession(str(old / "m_ctx.onnx"), providers=[NPU])


def test_two_binaries_with_the_same_graph_name_each_serve_their_node(tmp_path: Path) -> None:
    """Two models compiled apart (both name their graph NpuSim_0) merged into one: each main
    node gets the graph of its own binary."""
    a = onnx.load(compile_ctx(tmp_path, "a", scale=1.0))
    b = onnx.load(compile_ctx(tmp_path, "b", scale=3.0))
    merged = compose.merge_models(compose.add_prefix(a, "a/"), compose.add_prefix(b, "b/"),
                                  io_map=[])
    onnx.save(merged, tmp_path / "merged.onnx")
    out = ep.InferenceSession(str(tmp_path / "merged.onnx"), providers=[NPU]).run(
        ["a/n", "b/n"], {"a/x": X, "b/x": X})
    np.testing.assert_array_equal(out[0], -R)
    np.testing.assert_array_equal(out[1], -3 * R)


def test_a_single_graph_binary_serves_a_node_of_another_name(tmp_path: Path) -> None:
    path = compile_ctx(tmp_path)
    ctx = onnx.load(path)
    (node,) = ctx_nodes(ctx)
    node.name = "renamed_by_a_tool"
    set_attr(node, "partition_name", None)
    onnx.save(ctx, path)
    got = ep.InferenceSession(str(path), providers=[NPU]).run(None, {"x": X})
    np.testing.assert_array_equal(got[1], -R)


def test_generation_never_replaces_an_existing_binary(tmp_path: Path) -> None:
    (tmp_path / "m_npusim.bin").write_bytes(b"precious")
    with pytest.raises(ep.Fail, match="m_npusim.bin.*exists already"):
        compile_ctx(tmp_path)
    assert (tmp_path / "m_npusim.bin").read_bytes() == b"precious"
    assert not (tmp_path / "m_ctx.onnx").exists()


def test_a_forged_binary_the_loader_refuses_is_invalid_graph(tmp_path: Path) -> None:
    """Checksums pass (the binary is well formed) but the program asks for a kernel the device
    does not have: the firmware loader's reason, as InvalidGraph."""
    path = compile_ctx(tmp_path)
    with ContextBinary.open(tmp_path / "m_npusim.bin") as binary:
        (program,) = binary.programs()
        digest = binary.header.config_digest
        forged = dataclasses.replace(program, launches=tuple(
            dataclasses.replace(k, op="Frobnicate") for k in program.launches))
        forged = dataclasses.replace(forged, weights={k: bytes(v) for k, v in
                                                      program.weights.items()})
    (tmp_path / "m_npusim.bin").unlink()
    write_context_binary(tmp_path / "m_npusim.bin", [forged], hardware_architecture="npu-m",
                         config_digest=digest)
    ctx = onnx.load(path)
    (node,) = ctx_nodes(ctx)
    assert recorded_digest(E.parse_ep_context_node(node)) is not None
    set_attr(node, "notes", None)  # an older node without a digest: the loader is the check
    onnx.save(ctx, path)
    with pytest.raises(ep.InvalidGraph, match="unknown kernels: Frobnicate") as info:
        ep.InferenceSession(str(path), providers=[NPU])
    assert info.value.message.startswith(E.LOAD_ERROR)
