"""The bench set of issue 13, built in code with random weights (nothing is downloaded).

- ``chain``: 100 small elementwise ops on 1x64x8x8 (per-command overhead);
- ``light_resnet50``: onnx's backend test model (ConstantOfShape weights, as shipped);
- ``mobilenet_v3``: MobileNet-V3-Small's layout (depthwise convs, squeeze-excite, hard-swish);
- ``efficientnet``: EfficientNet-B0's layout (MBConv, squeeze-excite, SiLU);
- ``bert``: transformers' default ``BertModel`` (BERT-base), sequence 128;
- ``gpt2``: a decoder of GPT-2 small's sizes (``ep.models_decoder``), prefill of 64 tokens.

The convolutional nets and BERT are torch modules exported with torch's TorchScript
exporter (opset 17), as users export them. Each builder writes ``<name>.onnx`` into a folder and
returns its path and feeds.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import TensorProto, helper

LIGHT = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"
Feeds = dict[str, np.ndarray]


def chain(folder: Path, n: int = 100) -> tuple[Path, Feeds]:
    """``n`` elementwise ops, each one command on the NPU."""
    ops = ["Relu", "Sigmoid", "Tanh", "Abs", "Neg"]
    nodes = [helper.make_node(ops[i % len(ops)], [f"t{i - 1}" if i else "x"], [f"t{i}"])
             for i in range(n)]
    shape = [1, 64, 8, 8]
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(f"t{n - 1}", TensorProto.FLOAT,
                                                             shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "chain.onnx"
    onnx.save(model, path)
    return path, {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def light_resnet50(folder: Path) -> tuple[Path, Feeds]:
    path = folder / "light_resnet50.onnx"
    shutil.copy(LIGHT, path)
    name = onnx.load(path, load_external_data=False).graph.input[0].name
    return path, {name: np.random.default_rng(0).random((1, 3, 224, 224), np.float32)}


def _export(module, args: tuple, names: list[str], path: Path) -> None:
    import torch

    with torch.no_grad():
        torch.onnx.export(module.eval(), args, str(path), input_names=names,
                          output_names=["y"], opset_version=17, dynamo=False)


def _convnet(folder: Path, name: str, build: Callable[[], object]) -> tuple[Path, Feeds]:
    import torch

    torch.manual_seed(0)
    x = torch.randn(1, 3, 224, 224)
    path = folder / f"{name}.onnx"
    _export(build(), (x,), ["x"], path)
    return path, {"x": x.numpy()}


def _blocks():
    """Torch building blocks of the two mobile nets (imported lazily: torch is optional)."""
    from torch import nn

    class SqueezeExcite(nn.Module):
        def __init__(self, c: int, squeezed: int, act: type, gate: type) -> None:
            super().__init__()
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc1, self.act = nn.Conv2d(c, squeezed, 1), act()
            self.fc2, self.gate = nn.Conv2d(squeezed, c, 1), gate()

        def forward(self, x):
            return x * self.gate(self.fc2(self.act(self.fc1(self.pool(x)))))

    def conv(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
             act: type | None = None) -> nn.Sequential:
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, act()) if act else nn.Sequential(*layers)

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, expand: int, cout: int, k: int, stride: int,
                     se: int, act: type, gate: type) -> None:
            super().__init__()
            layers = [] if expand == cin else [conv(cin, expand, 1, act=act)]
            layers.append(conv(expand, expand, k, stride, groups=expand, act=act))
            if se:
                layers.append(SqueezeExcite(expand, se, act if gate is nn.Sigmoid else nn.ReLU,
                                            gate))
            layers.append(conv(expand, cout, 1))
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            y = self.body(x)
            return x + y if self.residual else y

    return nn, conv, InvertedResidual


def mobilenet_v3(folder: Path) -> tuple[Path, Feeds]:
    """MobileNet-V3-Small: (cin, expand, cout, kernel, stride, squeeze-excite, hard-swish)."""
    def build():
        nn, conv, block = _blocks()
        spec = [(16, 16, 16, 3, 2, 8, 0), (16, 72, 24, 3, 2, 0, 0), (24, 88, 24, 3, 1, 0, 0),
                (24, 96, 40, 5, 2, 24, 1), (40, 240, 40, 5, 1, 64, 1), (40, 240, 40, 5, 1, 64, 1),
                (40, 120, 48, 5, 1, 32, 1), (48, 144, 48, 5, 1, 40, 1),
                (48, 288, 96, 5, 2, 72, 1), (96, 576, 96, 5, 1, 144, 1),
                (96, 576, 96, 5, 1, 144, 1)]
        layers = [conv(3, 16, 3, 2, act=nn.Hardswish)]
        layers += [block(cin, e, cout, k, s, se, nn.Hardswish if hs else nn.ReLU,
                         nn.Hardsigmoid) for cin, e, cout, k, s, se, hs in spec]
        layers += [conv(96, 576, 1, act=nn.Hardswish), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                   nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, 1000)]
        return nn.Sequential(*layers)

    return _convnet(folder, "mobilenet_v3", build)


def efficientnet(folder: Path) -> tuple[Path, Feeds]:
    """EfficientNet-B0: (expand ratio, kernel, stride, cin, cout, repeats), SiLU, SE 0.25."""
    def build():
        nn, conv, block = _blocks()
        spec = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2),
                (6, 3, 2, 40, 80, 3), (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4),
                (6, 3, 1, 192, 320, 1)]
        layers = [conv(3, 32, 3, 2, act=nn.SiLU)]
        for ratio, k, stride, cin, cout, repeats in spec:
            for r in range(repeats):
                c = cin if r == 0 else cout
                layers.append(block(c, c * ratio, cout, k, stride if r == 0 else 1,
                                    max(1, c // 4), nn.SiLU, nn.Sigmoid))
        layers += [conv(320, 1280, 1, act=nn.SiLU), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                   nn.Linear(1280, 1000)]
        return nn.Sequential(*layers)

    return _convnet(folder, "efficientnet", build)


def _transformer(folder: Path, name: str, model, seq: int, names: tuple[str, ...],
                 vocab: int) -> tuple[Path, Feeds]:
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            out = self.model(**dict(zip(names, inputs, strict=True)))
            return out.logits if hasattr(out, "logits") else out.last_hidden_state

    rng = np.random.default_rng(0)
    every = {"input_ids": rng.integers(0, vocab, (1, seq)).astype(np.int64),
             "attention_mask": np.ones((1, seq), np.int64),
             "token_type_ids": np.zeros((1, seq), np.int64)}
    feeds = {n: every[n] for n in names}
    path = folder / f"{name}.onnx"
    _export(Wrapped(), tuple(torch.from_numpy(feeds[n]) for n in names), list(names), path)
    return path, feeds


def bert(folder: Path) -> tuple[Path, Feeds]:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig()
    return _transformer(folder, "bert", transformers.BertModel(config), 128,
                        ("input_ids", "attention_mask", "token_type_ids"), config.vocab_size)


def gpt2(folder: Path) -> tuple[Path, Feeds]:
    """GPT-2 small's sizes (vocab 50257, 12 layers of 768, 12 heads) on the project's own
    decoder built in code (``ep.models_decoder``): prefill of 64 tokens. (transformers' GPT-2
    does not export with the TorchScript exporter here: its mask code uses ``aten::diff``.)"""
    from ep.models_decoder import DecoderSpec, prefill

    spec = DecoderSpec(vocab=50257, dim=768, heads=12, layers=12, prompt=64, cache=64)
    model = prefill(spec)
    # Its weights are scaled for the test sizes (dim 64); at dim 768 the attention logits grow
    # so large that softmax turns into argmax and float32 rounding flips tokens. Scale the
    # blocks' matrices back to unit gain, as trained weights are.
    for tensor in model.graph.initializer:
        if tensor.name.startswith("l") and len(tensor.dims) == 2:
            w = onnx.numpy_helper.to_array(tensor) * np.float32((64 / spec.dim) ** 0.5)
            tensor.CopyFrom(onnx.numpy_helper.from_array(w, tensor.name))
    path = folder / "gpt2.onnx"
    onnx.save(model, path)
    ids = np.random.default_rng(0).integers(0, spec.vocab, (1, spec.prompt)).astype(np.int64)
    return path, {"input_ids": ids}


BENCH_SET: dict[str, Callable[[Path], tuple[Path, Feeds]]] = {
    "chain": chain, "light_resnet50": light_resnet50, "mobilenet_v3": mobilenet_v3,
    "efficientnet": efficientnet, "bert": bert, "gpt2": gpt2,
}
