"""Fused epilogues: elementwise steps an array op applies to its output before writing it.

A compiler folds the elementwise ops that follow a Conv, ConvTranspose, Gemm or MatMul into
that launch, so their work runs on the vector unit as the array's output tiles drain, and the
intermediate tensors never make a round trip through HBM. A fused ``activation`` (one function,
attributes ``activation`` / ``activation_params``) comes first; the *epilogue* follows it, a
sequence of steps, each one of:

- an activation ``act``: ``y = act(y)`` (``Relu``, ``Clip``, ``HardSigmoid``, ...);
- a gate ``Gate:act``: ``y = y * act(y)`` -- SiLU is ``Gate:Sigmoid``, hard-swish as torch
  exports it is ``Gate:HardSigmoid``;
- a binary step ``Add`` or ``Mul`` with another operand of the launch (a residual, a scale),
  which broadcasts to ``y``'s shape: ``y = y + r`` or ``y = y * r``.

Steps compute in float32 in the order given, each exactly as its standalone kernel would, so a
fused float32 launch gives the same values as the unfused ops. The launch's attributes encode
them (only attribute types the context binary stores: strings, ints, floats):

- ``epilogue``: strings, one per step (``"Relu"``, ``"Gate:Sigmoid"``, ``"Add"``);
- ``epilogue_args``: ints, one per step: how many params an activation or gate takes from
  ``epilogue_params``, or the launch input index of a binary step's operand;
- ``epilogue_params``: floats, the activations' params concatenated (omitted when empty).

A Conv may also take a *prologue*: ``input_scale`` (int), the input index of a per-channel
scale ``s`` (shape ``(1, C, 1, ...)`` or any shape broadcasting so) that multiplies the input
``X`` before the convolution -- the squeeze-excite scale fused into the Conv that reads the
scaled map. Since ``conv(X * s) = conv_{W * s}(X)`` per input channel (zero padding stays
zero), the kernel scales the weights, not the map: the same value up to float32 rounding of
the three-way products (well inside the float32 tolerance), with C x M x K multiplies instead
of C x H x W.

This module is the format only, shared by the kernels (values), the cost model (cycles) and the
compiler (which writes it); it never touches tensor data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import KernelError

GATE = "Gate:"
BINARY = ("Add", "Mul")
ACTIVATIONS = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
               "Gelu")
"""Activations a step may apply (the fusable activations of :mod:`npu_sim.kernels.activations`)."""
GATES = ("Sigmoid", "HardSigmoid")
"""Activations a gate may apply."""
ATTRIBUTES = frozenset({"epilogue", "epilogue_args", "epilogue_params", "input_scale"})
"""The launch attributes this format adds; a reader that ignored them would compute other values."""


@dataclass(frozen=True)
class Step:
    """One epilogue step: ``op`` with ``params`` (activation, gate) or ``operand`` (binary)."""

    op: str
    gate: bool = False
    params: tuple[float, ...] = ()
    operand: int = -1

    @property
    def name(self) -> str:
        """The step's name in the ``epilogue`` attribute."""
        return GATE + self.op if self.gate else self.op


def encode(steps: Sequence[Step]) -> dict[str, Any]:
    """The launch attributes for ``steps`` (empty for no steps)."""
    if not steps:
        return {}
    attrs: dict[str, Any] = {
        "epilogue": tuple(s.name for s in steps),
        "epilogue_args": tuple(s.operand if s.op in BINARY else len(s.params) for s in steps),
    }
    params = tuple(p for s in steps for p in s.params)
    if params:
        attrs["epilogue_params"] = params
    return attrs


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def decode(op: str, attrs: Mapping[str, Any]) -> tuple[Step, ...]:
    """The steps encoded in ``attrs`` of a launch of ``op``; a malformed encoding raises
    :class:`~npu_sim.errors.KernelError` naming the attribute, the value and what is valid."""
    names = attrs.get("epilogue")
    if names is None:
        return ()
    names = [_text(n) for n in ([names] if isinstance(names, (str, bytes)) else names)]
    args = [int(a) for a in attrs.get("epilogue_args", ())]
    params = [float(p) for p in attrs.get("epilogue_params", ())]
    if len(args) != len(names):
        raise KernelError(op, "", f"epilogue_args={args} has {len(args)} entries; expected one "
                                  f"per epilogue step ({len(names)}: {names})")
    steps, used = [], 0
    for name, arg in zip(names, args, strict=True):
        gate = name.startswith(GATE)
        base = name[len(GATE):] if gate else name
        if base in BINARY and not gate:
            if arg < 0:
                raise KernelError(op, "", f"epilogue step {name} has operand index {arg}; "
                                          f"expected an input index >= 0")
            steps.append(Step(base, operand=arg))
            continue
        if base not in (GATES if gate else ACTIVATIONS):
            valid = [*ACTIVATIONS, *BINARY, *(GATE + g for g in GATES)]
            raise KernelError(op, "", f"epilogue step {name!r} is unknown; expected one of "
                                      f"{valid}")
        if arg < 0 or used + arg > len(params):
            raise KernelError(op, "", f"epilogue step {name} takes {arg} params but "
                                      f"epilogue_params has {len(params) - used} left")
        steps.append(Step(base, gate, tuple(params[used:used + arg])))
        used += arg
    if used != len(params):
        raise KernelError(op, "", f"epilogue_params has {len(params)} values; the steps "
                                  f"{names} take {used}")
    return tuple(steps)


def input_scale(op: str, attrs: Mapping[str, Any]) -> int:
    """The input index of the prologue's per-channel scale, or -1 for none."""
    value = attrs.get("input_scale")
    if value is None:
        return -1
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise KernelError(op, "", f"input_scale={value!r}; expected an input index >= 0")
    return value


def operands(op: str, attrs: Mapping[str, Any]) -> tuple[int, ...]:
    """Input indices of the epilogue's and prologue's operands (read besides the product's)."""
    scale = input_scale(op, attrs)
    steps = tuple(s.operand for s in decode(op, attrs) if s.operand >= 0)
    return steps + ((scale,) if scale >= 0 else ())
