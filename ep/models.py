"""Models built in code: the bundled default model that ``npu-sim run`` runs.

No model file is committed; :func:`tiny_cnn` builds the same ONNX model every time from a fixed
seed. It is small enough to simulate in a fraction of a second and exercises what an EP
developer cares about: Conv + BatchNormalization + activation chains the compiler fuses, a
depthwise convolution, residual additions, pooling, a classifier head, and one operator the
NPU does not take (TopK), so a run shows a CPU fallback partition and data crossing between the
two providers.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DEFAULT_MODEL_NAME = "tiny_cnn"


def tiny_cnn(seed: int = 0, batch: int = 1, image: int = 64, classes: int = 10) -> onnx.ModelProto:
    """A small MobileNet-flavoured CNN with a TopK head (opset 17), weights from ``seed``."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def const(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def conv_bn(name: str, x: str, cin: int, cout: int, k: int, *, stride: int = 1,
                group: int = 1, act: str | None = "Relu") -> str:
        fan_in = cin // group * k * k
        w = const(f"{name}.w", rng.normal(0, np.sqrt(2 / fan_in), (cout, cin // group, k, k)))
        nodes.append(helper.make_node(
            "Conv", [x, w], [f"{name}.conv"], name=f"{name}.conv", kernel_shape=[k, k],
            pads=[k // 2] * 4, strides=[stride, stride], group=group))
        bn = [const(f"{name}.bn.{p}", v) for p, v in (
            ("scale", rng.uniform(0.5, 1.5, cout)), ("bias", rng.normal(0, 0.1, cout)),
            ("mean", rng.normal(0, 0.1, cout)), ("var", rng.uniform(0.5, 1.5, cout)))]
        out = f"{name}.bn"
        nodes.append(helper.make_node("BatchNormalization", [f"{name}.conv", *bn], [out],
                                      name=f"{name}.bn", epsilon=1e-5))
        if act == "Relu":
            nodes.append(helper.make_node("Relu", [out], [f"{name}.relu"], name=f"{name}.relu"))
            return f"{name}.relu"
        if act == "Relu6":
            lo, hi = const(f"{name}.clip.min", np.array(0.0)), const(f"{name}.clip.max",
                                                                     np.array(6.0))
            nodes.append(helper.make_node("Clip", [out, lo, hi], [f"{name}.clip"],
                                          name=f"{name}.clip"))
            return f"{name}.clip"
        return out

    x = conv_bn("stem", "image", 3, 16, 3, stride=2)
    # Inverted-residual block: expand, depthwise, project, add.
    h = conv_bn("b1.expand", x, 16, 32, 1, act="Relu6")
    h = conv_bn("b1.dw", h, 32, 32, 3, group=32, act="Relu6")
    h = conv_bn("b1.project", h, 32, 16, 1, act=None)
    nodes.append(helper.make_node("Add", [x, h], ["b1.out"], name="b1.add"))
    nodes.append(helper.make_node("MaxPool", ["b1.out"], ["pool"], name="pool",
                                  kernel_shape=[2, 2], strides=[2, 2]))
    h = conv_bn("b2.conv1", "pool", 16, 32, 3)
    h = conv_bn("b2.conv2", h, 32, 32, 3, act=None)
    s = conv_bn("b2.shortcut", "pool", 16, 32, 1, act=None)
    nodes.append(helper.make_node("Add", [s, h], ["b2.sum"], name="b2.add"))
    nodes.append(helper.make_node("Relu", ["b2.sum"], ["b2.out"], name="b2.relu"))
    nodes.append(helper.make_node("GlobalAveragePool", ["b2.out"], ["gap"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["gap"], ["features"], name="flatten"))
    fc_w = const("fc.w", rng.normal(0, np.sqrt(1 / 32), (32, classes)))
    fc_b = const("fc.b", rng.normal(0, 0.01, classes))
    nodes.append(helper.make_node("MatMul", ["features", fc_w], ["fc.mm"], name="fc.matmul"))
    nodes.append(helper.make_node("Add", ["fc.mm", fc_b], ["logits"], name="fc.add"))
    nodes.append(helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax",
                                  axis=-1))
    inits.append(numpy_helper.from_array(np.array([3], dtype=np.int64), "topk.k"))
    nodes.append(helper.make_node("TopK", ["probabilities", "topk.k"], ["top3", "top3_index"],
                                  name="topk", axis=-1))

    graph = helper.make_graph(
        nodes, DEFAULT_MODEL_NAME,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [batch, 3, image, image])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [batch, classes]),
         helper.make_tensor_value_info("top3", TensorProto.FLOAT, [batch, 3]),
         helper.make_tensor_value_info("top3_index", TensorProto.INT64, [batch, 3])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8,
                              producer_name="npu-sim")
    onnx.checker.check_model(model)
    return model


def sample_input(model: onnx.ModelProto, seed: int = 0,
                 dims: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Random inputs for every graph input of ``model`` (static shapes; a symbolic dim as
    ``dims`` sizes it, else 1)."""
    from npu_sim import dtypes

    rng = np.random.default_rng(seed)
    init_names = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        ttype = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (dims or {}).get(d.dim_param, 1)
                 for d in ttype.shape.dim]
        dtype = dtypes.to_numpy(dtypes.from_onnx(ttype.elem_type))
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[vi.name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            feeds[vi.name] = rng.integers(0, 10, shape).astype(dtype)
    return feeds
