"""A prepared kernel (``registry.Kernel.prepare``) computes, on every call, exactly what its
values function computes from the operands' current contents: the same bits, run after run,
with or without ``out=``; and preparing refuses what the values function refuses."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from npu_sim.epilogue import Step, encode
from npu_sim.errors import KernelError
from npu_sim.kernels.registry import lookup
from tests.kernels import random_array, seeds

FUSED = [{}, {"activation": "Relu"}, encode([Step("HardSigmoid", gate=True)]),
         encode([Step("Sigmoid", gate=True)]), encode([Step("Add", operand=3)])]


@st.composite
def convs(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], dict, dict, bool]:
    """A Conv's input and weight shapes, attributes, fused epilogue, and whether it has a bias:
    1x1, 3x3 and 5x5, grouped and depthwise, strided and padded."""
    n, k = draw(st.integers(1, 2)), draw(st.sampled_from([1, 3, 5]))
    group = draw(st.sampled_from([1, 2, 4]))
    depthwise = draw(st.booleans())
    c = group * draw(st.integers(1, 3)) if not depthwise else draw(st.integers(1, 6))
    group = c if depthwise else group
    m = group * draw(st.integers(1, 3))
    size = draw(st.integers(k, 9))
    attrs = {"strides": [draw(st.integers(1, 2))] * 2, "pads": [draw(st.integers(0, k // 2))] * 4,
             "group": group}
    return (n, c, size, size), (m, c // group, k, k), attrs, draw(st.sampled_from(FUSED)), \
        draw(st.booleans())


def _operands(seed: int, x_shape, w_shape, fused: dict, bias: bool) -> list[np.ndarray | None]:
    x = random_array(seed, x_shape, np.float32)
    w = random_array(seed + 1, w_shape, np.float32, -1, 1)
    b = random_array(seed + 2, w_shape[:1], np.float32) if bias else None
    operands = [x, w, b]
    if tuple(fused.get("epilogue", ())) == ("Add",):  # the residual, sized by the caller
        operands.append(np.zeros(0, np.float32))
    return operands


@settings(max_examples=60, deadline=None)
@given(case=convs(), seed=seeds, into=st.booleans())
@example(case=((1, 4, 6, 6), (8, 4, 1, 1), {"strides": [2, 2], "pads": [0] * 4, "group": 1}, {},
               True), seed=0, into=True)  # strided 1x1: its columns are copies, made per call
def test_a_prepared_conv_gives_the_values_bits_on_every_call(case, seed, into):
    x_shape, w_shape, attrs, fused, bias = case
    attrs = {**attrs, **fused}
    kernel = lookup("Conv")
    operands = _operands(seed, x_shape, w_shape, fused, bias)
    if len(operands) > 3:
        (shape_of,) = kernel.values(operands[:3], {k: v for k, v in attrs.items()
                                                    if not k.startswith("epilogue")})
        operands[3] = random_array(seed + 3, shape_of.shape, np.float32)
    want_shape = kernel.values(operands, dict(attrs))[0].shape
    out = [np.empty(want_shape, np.float32)] if into else None
    run = kernel.prepare(operands, dict(attrs), out)
    for call in range(3):  # new contents in the same arrays, as a schedule's operands get
        for k, array in enumerate(operands):
            if array is not None:
                array[...] = random_array(seed + 10 * call + k, array.shape, np.float32)
        (want,) = kernel.values(operands, dict(attrs))
        (got,) = run()
        assert got.tobytes() == want.tobytes()
        if into:
            assert got is out[0]


@pytest.mark.parametrize("operands, attrs", [
    ([np.zeros((1, 3, 5, 5), np.float32), np.zeros((4, 2, 3, 3), np.float32)], {}),
    ([np.zeros((1, 3, 5, 5), np.float32), np.zeros((4, 3, 3, 3), np.float32),
      np.zeros(5, np.float32)], {}),
    ([np.zeros((1, 3, 5, 5), np.float32), np.zeros((4, 3, 3, 3), np.float16)], {}),
    ([np.zeros((1, 3, 2, 2), np.float32), np.zeros((4, 3, 3, 3), np.float32)], {}),
    ([np.zeros((1, 3, 5, 5), np.float32)], {}),
])
def test_preparing_refuses_what_the_values_function_refuses(operands, attrs):
    kernel = lookup("Conv")
    with pytest.raises(KernelError) as by_values:
        kernel.values(operands, dict(attrs))
    with pytest.raises(KernelError) as by_prepare:
        kernel.prepare(operands, dict(attrs))()
    assert str(by_prepare.value) == str(by_values.value)


def test_a_prepared_conv_decodes_its_epilogue_once(monkeypatch) -> None:
    """An epilogue no fused loop takes (a broadcast residual) is decoded when the launch is
    prepared, not again on every run; the run applies it all the same."""
    from npu_sim.kernels import epilogue

    x = random_array(1, (1, 4, 5, 5), np.float32)
    w = random_array(2, (6, 4, 1, 1), np.float32, -1, 1)
    b = random_array(3, (6,), np.float32)
    r = random_array(4, (1, 6, 1, 1), np.float32)
    attrs = {"group": 1, **encode([Step("Add", operand=3)])}
    conv = lookup("Conv")
    run = conv.prepare([x, w, b, r], attrs, None)
    want = conv.values([x, w, b, r], attrs)[0]
    monkeypatch.setattr(epilogue, "decode", lambda *a: pytest.fail("decoded on a run"))
    np.testing.assert_array_equal(run()[0], want)


def _same_on_every_call(op: str, operands: list[np.ndarray | None], attrs: dict, seed: int,
                        into: bool) -> None:
    """``op`` prepared once gives the values function's bits on calls with new contents in the
    same arrays, into ``out=`` when it is given."""
    kernel = lookup(op)
    want_shape = kernel.values(operands, dict(attrs))[0].shape
    out = [np.empty(want_shape, operands[0].dtype)] if into else None
    run = kernel.prepare(operands, dict(attrs), out)
    for call in range(3):
        for k, array in enumerate(operands):
            if array is not None:
                array[...] = random_array(seed + 10 * call + k, array.shape, array.dtype)
        (want,) = kernel.values(operands, dict(attrs))
        (got,) = run()
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        if into and want.dtype == np.float32:
            assert got is out[0]


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 6), k=st.integers(1, 40), n=st.integers(1, 40),
       trans=st.tuples(st.booleans(), st.booleans()), c=st.sampled_from([None, "row", "full"]),
       alpha=st.sampled_from([1.0, 0.5]), beta=st.sampled_from([1.0, 2.0]),
       fused=st.sampled_from([{}, {"activation": "Relu"},
                              encode([Step("HardSigmoid", gate=True, params=(1 / 6, 0.5))])]),
       dtype=st.sampled_from([np.float32, np.float16]), seed=seeds, into=st.booleans())
def test_a_prepared_gemm_gives_the_values_bits_on_every_call(m, k, n, trans, c, alpha, beta,
                                                             fused, dtype, seed, into):
    a = random_array(seed, (k, m) if trans[0] else (m, k), dtype)
    b = random_array(seed + 1, (n, k) if trans[1] else (k, n), dtype, -1, 1)
    cc = None if c is None else random_array(seed + 2, (n,) if c == "row" else (m, n), dtype)
    attrs = {"transA": int(trans[0]), "transB": int(trans[1]), "alpha": alpha, "beta": beta,
             **fused}
    _same_on_every_call("Gemm", [a, b, cc], attrs, seed, into)


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(0, 9), min_size=3, max_size=5),
       dtype=st.sampled_from([np.float32, np.float16]), seed=seeds, into=st.booleans())
def test_a_prepared_global_average_pool_gives_the_values_bits_on_every_call(shape, dtype, seed,
                                                                           into):
    _same_on_every_call("GlobalAveragePool", [random_array(seed, tuple(shape), dtype)], {},
                        seed, into)


def test_preparing_a_gemm_refuses_what_the_values_function_refuses() -> None:
    gemm = lookup("Gemm")
    for operands in ([np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32)],
                     [np.zeros((2, 3), np.float32), np.zeros((3, 5), np.float32),
                      np.zeros((3,), np.float32)]):
        with pytest.raises(KernelError) as by_values:
            gemm.values(operands, {})
        with pytest.raises(KernelError) as by_prepare:
            gemm.prepare(operands, {})()
        assert str(by_prepare.value) == str(by_values.value)
