"""The loader's memo of validated program structures (``firmware_model.validate.MEMO``): a
program made of the very objects that passed before skips the structural checks, and gets the
same commands and, for its weights and its device (core masks, semaphores), the same errors as
a full validation."""

from __future__ import annotations

import dataclasses
import importlib
from types import MappingProxyType

import numpy as np
import pytest

from firmware_model import commands as fc
from firmware_model.program import KernelLaunch, Program, Region, TensorDesc, reloc
from firmware_model.validate import MEMO, validate, validate_structure
from npu_sim.errors import InvalidCommand
from npu_sim.kernels import registry
from tests.forking import finishes_after_fork, needs_fork

V = importlib.import_module("firmware_model.validate")  # the module (the package exports the
# function ``validate`` under the same name)


@pytest.fixture(autouse=True)
def empty_memo():
    MEMO.clear()
    yield
    MEMO.clear()


def program(op: str = "Relu", core_mask: int = 0b10, launch: int = 0) -> Program:
    tensors = (TensorDesc("x", (1, 8), "float32", Region.ARENA, 0),
               TensorDesc("w", (8,), "float32", Region.WEIGHTS, 0),
               TensorDesc("y", (1, 8), "float32", Region.ARENA, 64))
    stream = fc.pack([fc.Dma(1, reloc(Region.ARENA, 0), reloc(Region.ARENA, 64), 32),
                      fc.Kernel(2, launch, core_mask, deps=(1,)), fc.Signal(3, 2, 1),
                      fc.Wait(4, 2, 1, deps=(3,))])
    # read-only attrs, as a context binary's decoder gives them (only such programs are kept)
    return Program("p", tensors, (KernelLaunch(op, (0, 1), (2,), MappingProxyType({}), "n"),),
                   stream, (0,), (2,), {1: np.arange(8, dtype=np.float32).tobytes()}, 128)


def outcome(p: Program, **device) -> list[fc.Command] | str:
    try:
        return validate(p, **{"cores": 2, "semaphores": 4, **device})
    except InvalidCommand as exc:
        return exc.message


def test_the_same_structure_validates_once_and_gives_the_same_commands():
    p = program()
    first = validate(p, cores=2, semaphores=4)
    assert len(MEMO._items) == 1
    again = dataclasses.replace(p, weights={1: bytes(32)})  # the same structure objects
    second = validate(again, cores=2, semaphores=4)
    assert second == first and second is not first
    MEMO.clear()
    assert validate(again, cores=2, semaphores=4) == first


@pytest.mark.parametrize("weights", [{1: bytes(31)}, {}, {1: bytes(32), 0: bytes(32)}])
def test_weights_are_checked_on_every_load_with_the_full_validations_errors(weights):
    p = program()
    validate(p, cores=2, semaphores=4)
    bad = dataclasses.replace(p, weights=weights)
    memoized = outcome(bad)
    MEMO.clear()
    assert isinstance(memoized, str) and memoized == outcome(bad)


@pytest.mark.parametrize(("device", "problem"), [
    ({"cores": 1}, "core_mask 0x2 names cores beyond the device's 1"),
    ({"semaphores": 2}, "semaphore 2 out of range [0, 2)"),
])
def test_the_device_is_checked_on_every_load_with_the_full_validations_errors(device, problem):
    p = program(core_mask=0b10)
    validate(p, cores=2, semaphores=4)
    bad = dataclasses.replace(p, weights={1: bytes(31)})
    memoized = outcome(bad, **device)
    MEMO.clear()
    assert isinstance(memoized, str) and problem in memoized and memoized == outcome(bad, **device)


def test_a_structure_validated_alone_serves_every_device_and_weights():
    p = program()
    validate_structure(dataclasses.replace(p, weights={}))
    assert len(MEMO._items) == 1
    got = validate(p, cores=2, semaphores=4)
    narrow = outcome(p, cores=1)
    MEMO.clear()
    assert got == validate(p, cores=2, semaphores=4) and narrow == outcome(p, cores=1)
    assert "core_mask" in narrow


def test_a_kernel_unregistered_since_is_reported():
    registry.register_kernel("MemoProbe", lambda inputs, attrs: [inputs[0]])
    p = program(op="MemoProbe")
    try:
        validate(p, cores=2, semaphores=4)
    finally:
        registry.unregister_kernel("MemoProbe")
    got = outcome(p)
    assert isinstance(got, str) and "unknown kernels: MemoProbe" in got


def test_a_structure_holding_mutable_values_is_not_kept():
    p = program()
    shaped = dataclasses.replace(p, tensors=(dataclasses.replace(p.tensors[0], shape=[1, 8]),
                                             *p.tensors[1:]))
    listed = dataclasses.replace(p, launches=(KernelLaunch("Relu", [0, 1], (2,),
                                                           MappingProxyType({}), "n"),))
    compiled = dataclasses.replace(p, launches=(KernelLaunch("Relu", (0, 1), (2,), {}, "n"),))
    for q in (shaped, listed, compiled):
        validate(q, cores=2, semaphores=4)
    assert len(MEMO._items) == 0


def test_a_structure_with_problems_is_not_kept():
    p = program(launch=3)
    assert isinstance(outcome(p), str)
    validate_structure(p)  # reports nothing
    assert len(MEMO._items) == 0


def test_the_memo_is_bounded_in_entries_and_estimated_bytes(monkeypatch):
    for _ in range(MEMO.entries + 5):
        validate(program(), cores=2, semaphores=4)
    assert len(MEMO._items) == MEMO.entries
    assert MEMO._bytes == MEMO.entries * V._footprint(next(iter(MEMO._items.values())))

    one = V._footprint(next(iter(MEMO._items.values())))
    small = V._Memo(entries=100, max_bytes=4 * one)
    monkeypatch.setattr(V, "MEMO", small)
    kept = [program() for _ in range(6)]  # each its own structure
    for p in kept:
        validate(p, cores=2, semaphores=4)
    assert len(small._items) == 4 and small._bytes == 4 * one  # the oldest two dropped
    assert small.get(kept[0]) is None and small.get(kept[5]) is not None
    tiny = V._Memo(entries=100, max_bytes=4 * one - 1)  # an entry over a quarter: not kept
    monkeypatch.setattr(V, "MEMO", tiny)
    validate(kept[0], cores=2, semaphores=4)
    assert len(tiny._items) == 0 and tiny._bytes == 0


@needs_fork
def test_a_child_forked_while_the_memo_is_locked_still_validates():
    p = program()
    validate(p, cores=2, semaphores=4)
    assert finishes_after_fork(MEMO._lock, lambda: validate(p, cores=2, semaphores=4))


def test_a_hit_skips_the_structural_checks_and_a_miss_runs_them(monkeypatch):
    calls: list[str] = []
    structural = ["_check_tensors", "_check_io", "_check_launches", "_check_commands"]

    def counting(name: str):
        real = getattr(V, name)

        def counted(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return counted

    for name in structural:
        monkeypatch.setattr(V, name, counting(name))
    p = program()
    first = validate(p, cores=2, semaphores=4)  # a miss: every check
    assert calls == structural
    calls.clear()
    again = dataclasses.replace(p, weights={1: bytes(32)})  # the same structure objects
    assert validate(again, cores=2, semaphores=4) == first  # a hit: none of them
    assert calls == []
    other = program()  # equal, but other objects: a miss
    assert validate(other, cores=2, semaphores=4) == first
    assert calls == structural
