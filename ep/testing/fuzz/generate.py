"""Random valid ONNX models from a seed: the fuzzer's generator.

:func:`generate` ``(seed, index)`` is deterministic: one model of 1-3 graph inputs (float32
mostly; float16, integers and booleans too) and three to ``max_nodes`` (24) operators drawn
uniformly from the catalogue (:data:`CATALOGUE`, 109 entries over 108 operator types of
the default domain: elementwise math, comparisons and logic, reductions, normalizations, layout
and indexing, shape subgraphs, convolutions, pools and GEMMs), at an opset drawn from
:data:`OPSETS`. Every tensor nothing reads becomes a graph output, so no node is dead. The
generator is independent of the compiler it tests: it never looks at what the NPU supports,
only at ONNX's operator schemas through ONNX's shape inference.
"""

from __future__ import annotations

import numpy as np
import onnx

from . import ops_math, ops_tensor  # noqa: F401 - importing registers the ops
from .build import Builder, Invalid

CATALOGUE = dict(ops_math.OPS)  # ops_tensor registers into the same table
"""entry name -> (first opset, proposer)."""
OPSETS = (13, 17, 18, 20, 21)
INPUT_DTYPES = ("float32",) * 14 + ("float16",) * 2 + ("int64", "int32", "bool")


def generate(seed: int, index: int, max_nodes: int = 24) -> onnx.ModelProto:
    """Model number ``index`` of the campaign ``seed`` (always the same model)."""
    rng = np.random.default_rng([seed, index])
    b = Builder(rng, int(rng.choice(OPSETS)))
    for _ in range(int(rng.integers(1, 4))):
        rank = int(rng.choice([1, 2, 3, 4, 4, 3, 0]))
        dims = rng.integers(1, 7, rank)
        if rank and rng.random() < 0.05:  # an empty tensor
            dims[int(rng.integers(rank))] = 0
        b.add_input(str(rng.choice(INPUT_DTYPES)), dims.tolist())
    names = sorted(n for n, (since, _) in CATALOGUE.items() if since <= b.opset)
    target = int(rng.integers(3, max_nodes + 1))
    attempts = 0
    while _real_nodes(b) < target and attempts < 20 * target:
        attempts += 1
        name = names[int(rng.integers(len(names)))]
        state = b.snapshot()
        try:
            CATALOGUE[name][1](b)
        except (Invalid, ValueError, IndexError, ZeroDivisionError):
            # proposers draw attributes from dims; an empty dim leaves nothing to draw from
            b.rollback(state)
    read = {i for n in b.nodes for i in n.input}
    leaves = [t for t in b.pool if t.name not in read and t not in b.inputs]
    if not leaves:  # nothing was accepted: an Identity keeps the model valid
        leaves = b.add("Identity", [b.inputs[0].name])
    model = b.model(leaves)
    onnx.checker.check_model(model, full_check=True)
    return model


def _real_nodes(b: Builder) -> int:
    return sum(n.op_type != "Constant" for n in b.nodes)
