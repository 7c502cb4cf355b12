"""``--dim NAME=VALUE``: fix a symbolic dimension of the model for ``npu-sim run`` and
``npu-sim compile``.

The NPU compiles static shapes: a model exported with dynamic axes (a batch named ``batch``, a
sequence named ``sequence``) stays on the CPU until those dims are fixed, as the partitioner's
reason says ("dynamic dimension 'batch' on input 'x'; set a dim override"). Each ``--dim`` is
``SessionOptions.add_free_dimension_override_by_name``, as in code; ``run`` also generates its
inputs at those sizes.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_dim_option(parser: argparse.ArgumentParser) -> None:
    """Give a command the repeatable ``--dim NAME=VALUE`` option."""
    parser.add_argument("--dim", action="append", default=[], type=dim, metavar="NAME=VALUE",
                        help="fix the model's symbolic dimension NAME to VALUE (repeatable), "
                             "so the NPU can compile what depends on it")


def dim(text: str) -> tuple[str, int]:
    """``NAME=VALUE`` parsed; anything else is a usage error naming it."""
    name, sep, value = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (batch=1), got {text!r}")
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: VALUE must be an integer >= 0, got "
                                         f"{value!r}")
    return name, number


def fix_dims(options: Any, dims: list[tuple[str, int]]) -> dict[str, int]:
    """Add each ``(name, value)`` to ``options`` (an ``ep.SessionOptions``) as a free dimension
    override; the overrides as a dict, the last value of a name repeated winning."""
    fixed = dict(dims)
    for name, value in fixed.items():
        options.add_free_dimension_override_by_name(name, value)
    return fixed


def session_dims(model: Any, session: Any) -> dict[str, int]:
    """The size ``session`` gives each symbolic dim of ``model``'s inputs: an EPContext model
    compiled with ``--dim`` declares its inputs at the sizes compiled, while the source model
    that describes them (``npu-sim run`` generates inputs from it) still names them."""
    shapes = {arg.name: arg.shape for arg in session.get_inputs()}
    found: dict[str, int] = {}
    for vi in model.graph.input:
        for d, size in zip(vi.type.tensor_type.shape.dim, shapes.get(vi.name, ()),
                           strict=False):
            if d.dim_param and isinstance(size, int):
                found[d.dim_param] = size
    return found
