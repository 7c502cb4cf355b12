"""Epilogue fusion (``ep.npusim.compiler.epilogue``): each pattern against onnxruntime, the
cases that must not fuse, fused == unfused on generated shapes, and programs of models without
the patterns unchanged (so their simulated cycles are too).

Values come from two independent paths: an ``ep.InferenceSession`` on the device (compared with
onnxruntime in the same test), and ``test_compiler.replay`` of the compiled program with the
pass on and off (compared with each other).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import ep
from ep.npusim.compiler import compile_partition, rewrite
from firmware_model.commands import unpack
from npu_sim.config import DeviceConfig
from npu_sim.cost import op_cost
from npu_sim.dtypes import TensorSpec
from tests.ep.npusim_graphs import as_fused, conv_bn_relu, matmul_add, model, ort_run, qdq_conv
from tests.ep.test_compiler import replay

F, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
NPU_M = DeviceConfig.preset("npu-m")
RTOL, ATOL = 1e-4, 1e-5


def _w(seed: int, *shape: int, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


def conv_then(tail: list, out_shape=(1, 8, 6, 6), extra_inputs=(), inits=None, c=4,
              elem=F, outputs=None):
    """x (1, c, 6, 6) -> Conv 3x3 pad 1 to ``t`` (1, 8, 6, 6) -> ``tail`` nodes ending in ``y``."""
    dtype = np.float16 if elem == F16 else np.float32
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], pads=[1, 1, 1, 1]), *tail]
    weights = {"w": _w(1, 8, c, 3, 3, dtype=dtype), "b": _w(2, 8, dtype=dtype), **(inits or {})}
    ins = [("x", elem, (1, c, 6, 6)), *extra_inputs]
    return model(nodes, ins, outputs or [("y", elem, out_shape)], weights)


def launches(m) -> list[tuple[str, tuple]]:
    """(op, epilogue steps) of each launch of ``m`` compiled whole; a fused input scale shows as
    a leading ``"input_scale"`` step."""
    program = compile_partition(as_fused(m), NPU_M).program
    return [(launch.op, ("input_scale",) * ("input_scale" in launch.attrs)
             + tuple(launch.attrs.get("epilogue", ()))) for launch in program.launches]


def squeeze_excite(reader: list, out_shape=(1, 8, 6, 6), outputs=None, extra_inputs=()):
    """t -> GlobalAveragePool -> Sigmoid -> s; u = Mul(t, s) -> ``reader`` nodes."""
    return conv_then([helper.make_node("GlobalAveragePool", ["t"], ["p"]),
                      helper.make_node("Sigmoid", ["p"], ["s"]),
                      helper.make_node("Mul", ["t", "s"], ["u"]), *reader],
                     out_shape=out_shape, outputs=outputs, extra_inputs=extra_inputs,
                     inits={"w2": _w(9, 5, 8, 1, 1), "w3": _w(10, 5, 8, 3, 3),
                            "wd": _w(11, 8, 1, 3, 3)})


def feeds_for(m, seed: int = 0) -> dict[str, np.ndarray]:
    out = {}
    for k, i in enumerate(m.graph.input):
        dtype = np.float16 if i.type.tensor_type.elem_type == F16 else np.float32
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        out[i.name] = _w(seed + 10 + k, *shape, dtype=dtype)
    return out


def assert_matches_onnxruntime(m) -> list[np.ndarray]:
    feeds = feeds_for(m)
    got = ep.InferenceSession(m.SerializeToString()).run(None, feeds)
    for g, e in zip(got, ort_run(m, feeds), strict=True):
        tol = (1e-3, 1e-3) if e.dtype == np.float16 else (RTOL, ATOL)
        np.testing.assert_allclose(g, e, rtol=tol[0], atol=tol[1])
    return got


def hard_swish(t: str, y: str) -> list:
    return [helper.make_node("HardSigmoid", [t], [t + "_g"], alpha=1 / 6, beta=0.5),
            helper.make_node("Mul", [t, t + "_g"], [y])]


FUSED = {
    "hard-swish (HardSigmoid + Mul)": (conv_then(hard_swish("t", "y")),
                                       [("Conv", ("Gate:HardSigmoid",))]),
    "SiLU (Sigmoid + Mul, operands swapped)": (
        conv_then([helper.make_node("Sigmoid", ["t"], ["s"]),
                   helper.make_node("Mul", ["s", "t"], ["y"])]),
        [("Conv", ("Gate:Sigmoid",))]),
    "residual Add then Relu6 (Clip)": (
        conv_then([helper.make_node("Add", ["r", "t"], ["a"]),
                   helper.make_node("Clip", ["a", "lo", "hi"], ["y"])],
                  extra_inputs=[("r", F, (1, 8, 6, 6))],
                  inits={"lo": np.float32(0), "hi": np.float32(6)}),
        [("Conv", ("Add", "Clip"))]),
    "two-input Sum as the residual (light_resnet50's form), then Relu": (
        conv_then([helper.make_node("Sum", ["t", "r"], ["a"]),
                   helper.make_node("Relu", ["a"], ["y"])],
                  extra_inputs=[("r", F, (1, 8, 6, 6))]),
        [("Conv", ("Add", "Relu"))]),
    "hard-swish then residual Add": (
        conv_then([*hard_swish("t", "h"), helper.make_node("Add", ["h", "r"], ["y"])],
                  extra_inputs=[("r", F, (1, 8, 6, 6))]),
        [("Conv", ("Gate:HardSigmoid", "Add"))]),
    "per-channel scale (Mul broadcast 1xCx1x1)": (
        conv_then([helper.make_node("Mul", ["t", "s"], ["y"])], inits={"s": _w(3, 1, 8, 1, 1)}),
        [("Conv", ("Mul",))]),
    "Add broadcast over channels (1x1xHxW), then HardSigmoid": (
        conv_then([helper.make_node("Add", ["t", "p"], ["a"]),
                   helper.make_node("HardSigmoid", ["a"], ["y"])],
                  extra_inputs=[("p", F, (1, 1, 6, 6))]),
        [("Conv", ("Add", "HardSigmoid"))]),
    "operand computed after the host (host moves)": (
        conv_then([helper.make_node("Neg", ["x2"], ["n"]),
                   helper.make_node("Add", ["t", "n"], ["y"])],
                  extra_inputs=[("x2", F, (1, 8, 6, 6))]),
        [("Neg", ()), ("Conv", ("Add",))]),
    "squeeze-excite scale into the 1x1 Conv reading it": (
        squeeze_excite([helper.make_node("Conv", ["u", "w2"], ["y"])], out_shape=(1, 5, 6, 6)),
        [("Conv", ()), ("GlobalAveragePool", ()), ("Sigmoid", ()), ("Conv", ("input_scale",))]),
    "squeeze-excite scale into a padded 3x3 Conv, then a residual Add": (
        squeeze_excite([helper.make_node("Conv", ["u", "w3"], ["c"], pads=[1, 1, 1, 1]),
                        helper.make_node("Add", ["c", "r"], ["y"])], out_shape=(1, 5, 6, 6),
                       extra_inputs=[("r", F, (1, 5, 6, 6))]),
        [("Conv", ()), ("GlobalAveragePool", ()), ("Sigmoid", ()),
         ("Conv", ("input_scale", "Add"))]),
    "MatMul 3-D + bias + scale": (
        model([helper.make_node("MatMul", ["a", "w"], ["t"]),
               helper.make_node("Add", ["t", "b"], ["u"]),
               helper.make_node("Mul", ["u", "s"], ["y"])],
              [("a", F, (2, 5, 16))], [("y", F, (2, 5, 8))],
              {"w": _w(4, 16, 8), "b": _w(5, 8), "s": _w(6, 8)}),
        [("MatMul", ("Add", "Mul"))]),
}


@pytest.mark.parametrize("name", FUSED)
def test_pattern_fuses_and_matches_onnxruntime(name):
    m, want = FUSED[name]
    assert launches(m) == want
    assert_matches_onnxruntime(m)


NOT_FUSED = {
    "host output also read elsewhere": (
        conv_then([helper.make_node("Add", ["t", "r"], ["y"]),
                   helper.make_node("Relu", ["t"], ["z"])],
                  extra_inputs=[("r", F, (1, 8, 6, 6))],
                  outputs=[("y", F, (1, 8, 6, 6)), ("z", F, (1, 8, 6, 6))]),
        [("Conv", ()), ("Add", ()), ("Relu", ())]),
    "host output is a graph output": (
        conv_then([helper.make_node("Add", ["t", "r"], ["y"])],
                  extra_inputs=[("r", F, (1, 8, 6, 6))],
                  outputs=[("y", F, (1, 8, 6, 6)), ("t", F, (1, 8, 6, 6))]),
        [("Conv", ()), ("Add", ())]),
    "float16 (one rounding instead of one per op)": (
        conv_then([helper.make_node("Add", ["t", "r"], ["y"])],
                  extra_inputs=[("r", F16, (1, 8, 6, 6))], elem=F16),
        [("Conv", ()), ("Add", ())]),
    "operand larger than the output (the output would broadcast)": (
        model([helper.make_node("Conv", ["x", "w"], ["t"]),
               helper.make_node("Add", ["t", "r"], ["y"])],
              [("x", F, (1, 4, 1, 1)), ("r", F, (1, 8, 3, 3))], [("y", F, (1, 8, 3, 3))],
              {"w": _w(7, 8, 4, 1, 1)}),
        [("Conv", ()), ("Add", ())]),
    "gate read elsewhere too": (
        conv_then([*hard_swish("t", "y"), helper.make_node("Neg", ["t_g"], ["z"])],
                  outputs=[("y", F, (1, 8, 6, 6)), ("z", F, (1, 8, 6, 6))]),
        [("Conv", ()), ("HardSigmoid", ()), ("Mul", ()), ("Neg", ())]),
    "squeeze-excite scale (the scale is computed from the output)": (
        conv_then([helper.make_node("GlobalAveragePool", ["t"], ["p"]),
                   helper.make_node("Sigmoid", ["p"], ["s"]),
                   helper.make_node("Mul", ["t", "s"], ["y"])]),
        [("Conv", ()), ("GlobalAveragePool", ()), ("Sigmoid", ()), ("Mul", ())]),
    "scale read by a depthwise Conv (group > 1)": (
        squeeze_excite([helper.make_node("Conv", ["u", "wd"], ["y"], group=8,
                                         pads=[1, 1, 1, 1])]),
        [("Conv", ()), ("GlobalAveragePool", ()), ("Sigmoid", ()), ("Mul", ()), ("Conv", ())]),
    "scaled map read by the Conv and a graph output": (
        squeeze_excite([helper.make_node("Conv", ["u", "w2"], ["y"])],
                       outputs=[("y", F, (1, 5, 6, 6)), ("u", F, (1, 8, 6, 6))]),
        [("Conv", ()), ("GlobalAveragePool", ()), ("Sigmoid", ()), ("Mul", ()), ("Conv", ())]),
    "three-input Sum": (
        conv_then([helper.make_node("Sum", ["t", "r", "r"], ["y"])],
                  extra_inputs=[("r", F, (1, 8, 6, 6))]),
        [("Conv", ()), ("Sum", ())]),
    "Sub (not an epilogue op)": (
        conv_then([helper.make_node("Sub", ["t", "r"], ["y"])],
                  extra_inputs=[("r", F, (1, 8, 6, 6))]),
        [("Conv", ()), ("Sub", ())]),
}


@pytest.mark.parametrize("name", NOT_FUSED)
def test_non_fusable_case_stays_unfused_and_matches_onnxruntime(name):
    m, want = NOT_FUSED[name]
    assert launches(m) == want
    assert_matches_onnxruntime(m)


def _without_pass(monkeypatch):
    monkeypatch.setattr(rewrite, "fuse_epilogues", lambda graph: 0)


def _program(m):
    return compile_partition(as_fused(m), NPU_M).program


@pytest.mark.parametrize("build", [conv_bn_relu, matmul_add, qdq_conv,
                                   lambda: matmul_add(act="Relu")])
def test_models_without_the_patterns_compile_to_the_same_program(build, monkeypatch):
    m = build()
    fused = _program(m)
    _without_pass(monkeypatch)
    plain = _program(m)
    assert fused.launches == plain.launches
    assert fused.commands == plain.commands
    assert fused.tensors == plain.tensors


TAILS = ["hard_swish", "silu", "add", "mul_channel", "add_relu", "hard_swish_add", "se_conv"]


def _tail(kind: str, shape: tuple[int, ...]) -> tuple[list, list, dict]:
    c = shape[1]
    if kind == "hard_swish":
        return hard_swish("t", "y"), [], {}
    if kind == "silu":
        return [helper.make_node("Sigmoid", ["t"], ["s"]),
                helper.make_node("Mul", ["t", "s"], ["y"])], [], {}
    if kind == "add":
        return [helper.make_node("Add", ["t", "r"], ["y"])], [("r", F, shape)], {}
    if kind == "mul_channel":
        return [helper.make_node("Mul", ["s", "t"], ["y"])], [], {"s": _w(8, 1, c, 1, 1)}
    if kind == "se_conv":  # the scale goes into the Conv reading the scaled map
        return [helper.make_node("GlobalAveragePool", ["t"], ["p"]),
                helper.make_node("HardSigmoid", ["p"], ["s"]),
                helper.make_node("Mul", ["s", "t"], ["u"]),
                helper.make_node("Conv", ["u", "w2"], ["y"])], [], {"w2": _w(12, c, c, 1, 1)}
    if kind == "add_relu":
        return [helper.make_node("Add", ["t", "r"], ["a"]),
                helper.make_node("Relu", ["a"], ["y"])], [("r", F, shape)], {}
    return ([*hard_swish("t", "h"), helper.make_node("Add", ["r", "h"], ["y"])],
            [("r", F, shape)], {})


@settings(max_examples=25, deadline=None)
@given(c=st.integers(1, 6), m=st.integers(1, 9), hw=st.integers(1, 7),
       kernel=st.sampled_from([1, 3]), depthwise=st.booleans(),
       kind=st.sampled_from(TAILS), seed=st.integers(0, 2**16))
def test_fused_equals_unfused_on_generated_shapes(c, m, hw, kernel, depthwise, kind, seed):
    """The fusion invariant: the same program values with the pass on and off (the same bits,
    except the squeeze-excite scale folded into weights: float32 tolerance), and both match
    onnxruntime (float32 tolerance)."""
    if depthwise:
        m = c
    shape = (1, m, hw, hw)
    tail, extra, inits = _tail(kind, shape)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"], pads=[kernel // 2] * 4,
                              group=c if depthwise else 1), *tail]
    weights = {"w": _w(seed, m, 1 if depthwise else c, kernel, kernel), "b": _w(seed + 1, m),
               **inits}
    mdl = model(nodes, [("x", F, (1, c, hw, hw)), *extra], [("y", F, shape)], weights)
    feeds = feeds_for(mdl, seed)
    fused = _program(mdl)
    fusions = ("epilogue", "input_scale")
    assert any(k in launch.attrs for launch in fused.launches for k in fusions)
    with pytest.MonkeyPatch.context() as mp:
        _without_pass(mp)
        plain = _program(mdl)
    assert not any(k in launch.attrs for launch in plain.launches for k in fusions)
    ins = [feeds[i.name] for i in mdl.graph.input]
    got, want = replay(fused, ins)[0], replay(plain, ins)[0]
    if kind == "se_conv":
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    else:
        assert got.tobytes() == want.tobytes()
    np.testing.assert_allclose(got, ort_run(mdl, feeds)[0], rtol=RTOL, atol=ATOL)


def test_fused_launch_costs_less_than_its_parts():
    """The epilogue runs on the vector unit beside the array, and the intermediate tensor never
    goes through HBM: the fused launch moves fewer bytes and takes fewer cycles than the Conv
    plus the standalone ops, and more than the bare Conv (its vector work is priced)."""
    x, w, b = TensorSpec((1, 64, 28, 28), "float32"), TensorSpec((64, 64, 1, 1), "float32"), \
        TensorSpec((64,), "float32")
    y = TensorSpec((1, 64, 28, 28), "float32")
    bare = op_cost(NPU_M, "Conv", [x, w, b], [y], {})
    steps = {"epilogue": ("Gate:HardSigmoid", "Add"), "epilogue_args": (2, 3),
             "epilogue_params": (1 / 6, 0.5)}
    fused = op_cost(NPU_M, "Conv", [x, w, b, y], [y], steps)
    parts = [bare, op_cost(NPU_M, "HardSigmoid", [y], [y], {}),
             op_cost(NPU_M, "Mul", [y, y], [y], {}), op_cost(NPU_M, "Add", [y, y], [y], {})]
    assert fused.hbm_bytes == bare.hbm_bytes + y.nbytes  # the residual, read once
    assert fused.hbm_bytes < sum(p.hbm_bytes for p in parts)
    assert bare.total_cycles <= fused.total_cycles < sum(p.total_cycles for p in parts)
    assert fused.energy["vector"] > bare.energy["vector"]


def test_input_scale_costs_its_multiplies_and_its_bytes():
    x, w = TensorSpec((1, 96, 14, 14), "float32"), TensorSpec((40, 96, 1, 1), "float32")
    s, y = TensorSpec((1, 96, 1, 1), "float32"), TensorSpec((1, 40, 14, 14), "float32")
    bare = op_cost(NPU_M, "Conv", [x, w], [y], {})
    fused = op_cost(NPU_M, "Conv", [x, w, None, s], [y], {"input_scale": 3})
    mul = op_cost(NPU_M, "Mul", [x, s], [x], {})
    assert fused.hbm_bytes == bare.hbm_bytes + s.nbytes
    assert fused.energy["vector"] > bare.energy["vector"]
    assert bare.total_cycles <= fused.total_cycles < bare.total_cycles + mul.total_cycles


def test_fused_commands_are_fewer():
    m, _ = FUSED["hard-swish then residual Add"]
    fused = _program(m)
    with pytest.MonkeyPatch.context() as mp:
        _without_pass(mp)
        plain = _program(m)
    assert len(unpack(fused.commands)) < len(unpack(plain.commands))
