"""Weight streaming: a session's weights go to HBM by DMA when it is created, and the first run
computes each layer as soon as that layer's weights have arrived (provider option
``weight_streaming``, default 1), instead of loading everything and then running."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ep
from tests.ep.npusim_graphs import model, ort_run, rng

NPU = "NpuSimExecutionProvider"


def layers(n: int = 6, k: int = 384, m: int = 64, seed: int = 11) -> onnx.ModelProto:
    """x (m, k) -> n x (MatMul by a (k, k) weight -> Relu) -> y: one weight per layer."""
    r = rng(seed)
    nodes, inits, x = [], {}, "x"
    for i in range(n):
        inits[f"w{i}"] = r.normal(0, 1 / np.sqrt(k), (k, k)).astype(np.float32)
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
        y = "y" if i == n - 1 else f"a{i}"
        nodes.append(helper.make_node("Relu", [f"h{i}"], [y], name=f"relu{i}"))
        x = y
    F = TensorProto.FLOAT
    return model(nodes, [("x", F, (m, k))], [("y", F, (m, k))], inits)


def first_result(source: onnx.ModelProto, streaming: str, feed: dict[str, np.ndarray]):
    """(outputs, simulated cycles from session creation to the first result, the device's
    trace of that run) on a fresh device."""
    session = ep.InferenceSession(source.SerializeToString(),
                                  providers=[(NPU, {"weight_streaming": streaming})])
    device = session._providers[0].runtime.device  # a new device: its clock began at 0
    if streaming == "1":
        assert device.now == 0  # nothing waited for the uploads
    outputs = session.run(None, feed)
    return outputs, device.now, device.trace.records


def test_streaming_reaches_the_first_result_sooner_with_the_same_values():
    source = layers()
    feed = {"x": rng(1).normal(0, 1, (64, 384)).astype(np.float32)}
    want = ort_run(source, feed)
    streamed, t_stream, trace = first_result(source, "1", feed)
    loaded, t_load, _ = first_result(source, "0", feed)
    for got in (streamed, loaded):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
    assert t_stream < t_load
    # Load-then-run pays every upload before any compute; streaming hides all compute but the
    # last layer's behind the uploads: the saving is at least the compute of the first layers.
    kernels = [r for r in trace if r.kind == "kernel"]
    hidden = sum(r.cycles for r in kernels[:-2])
    assert t_load - t_stream >= hidden > 0


def test_kernels_depend_on_their_weights_uploads_and_overlap_them():
    source = layers()
    feed = {"x": rng(1).normal(0, 1, (64, 384)).astype(np.float32)}
    _, _, trace = first_result(source, "1", feed)
    by_id = {r.id: r for r in trace}
    matmuls = [r for r in trace if r.kind == "kernel" and r.work["op"] == "MatMul"]
    assert len(matmuls) == 6
    uploads = []
    for kernel in matmuls:  # each MatMul waits for the DMA of its own weight, named in its deps
        deps = [by_id[d] for d in kernel.deps if d in by_id and by_id[d].kind == "dma"]
        assert deps and all(d.work["direction"] == "h2d" and d.end <= kernel.start for d in deps)
        uploads.append(deps)
    assert len({d.id for deps in uploads for d in deps}) == len(matmuls)  # one weight each
    # DMA and compute overlap: the first layer has finished before the last weight arrived.
    assert matmuls[0].end < max(d.end for d in uploads[-1])


def test_constant_outputs_wait_for_their_uploads():
    """Outputs that are weights are read back by DMA, which waits for the streamed uploads: a
    partition that only hands out constants (no input, no kernel) starts its output DMAs at
    once, while the second constant's upload is still queued behind the first's."""
    c = rng(3).normal(0, 1, (256, 1024)).astype(np.float32)  # 1 MiB
    graph = helper.make_graph(  # one partition whose two outputs fold to constants
        [helper.make_node("Neg", ["c"], ["y0"], name="neg0"),
         helper.make_node("Neg", ["y0"], ["y1"], name="neg1"),
         helper.make_node("Softsign", ["x"], ["z"], name="soft")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (3, 4))],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, (256, 1024))
         for i in range(2)] + [helper.make_tensor_value_info("z", TensorProto.FLOAT, (3, 4))],
        initializer=[onnx.numpy_helper.from_array(c, "c")])
    source = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    so = ep.SessionOptions()
    so.graph_optimization_level = ep.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ep.InferenceSession(source.SerializeToString(), so, providers=[NPU])
    assert session.get_node_assignment()["neg1"] == NPU
    x = rng(4).normal(0, 1, (3, 4)).astype(np.float32)
    y0, y1, z = session.run(None, {"x": x})
    np.testing.assert_array_equal(y0, -c)
    np.testing.assert_array_equal(y1, c)
    np.testing.assert_allclose(z, ort_run(source, {"x": x})[2], rtol=1e-6)


@pytest.mark.parametrize("value", ["2", "yes"])
def test_bad_streaming_option(value):
    with pytest.raises(ep.errors.InvalidArgument, match="weight_streaming"):
        ep.InferenceSession(layers(n=1, k=8, m=2).SerializeToString(),
                            providers=[(NPU, {"weight_streaming": value})])


def test_streaming_through_the_chain_is_the_per_weight_uploads(monkeypatch):
    """The firmware streams weights through ``Device.memcpy_h2d_chain``; the first run's
    values, cycles and trace (the uploads' transfers and chunks among the kernels) are what one
    ``memcpy_h2d_async`` per weight, each behind the previous, gave. Both ways, same test."""
    from npu_sim import Device

    source = layers(n=4, k=256)  # 256 KiB weights: several chunks each
    feed = {"x": rng(2).normal(0, 1, (64, 256)).astype(np.float32)}
    chained = first_result(source, "1", feed)

    def per_weight(self, dst, copies, *, after=None, share=False):
        arrivals, last = [], after
        for host, offset in copies:
            last = self.memcpy_h2d_async(dst, host, offset,
                                         deps=[] if last is None else [last], share=share)
            arrivals.append(last)
        return arrivals

    monkeypatch.setattr(Device, "memcpy_h2d_chain", per_weight)
    reference = first_result(source, "1", feed)
    np.testing.assert_array_equal(chained[0][0], reference[0][0])
    assert chained[1] == reference[1]

    def fields(trace):
        return [(r.kind, r.engine, r.scope, r.name, r.start, r.end, r.deps, r.work, r.submit,
                 r.ready) for r in trace]

    assert fields(chained[2]) == fields(reference[2])
    assert sum(r.kind == "dma" and r.work["direction"] == "h2d" for r in chained[2]) > 4
