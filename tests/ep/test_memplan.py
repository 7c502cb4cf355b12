"""The arena planner: no two tensors alive at once share memory; figures are consistent."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ep.npusim.compiler.memplan import (
    Buffer,
    align_up,
    lower_bound,
    plan_arena,
    plan_weights,
)


@st.composite
def buffer_sets(draw):
    n = draw(st.integers(0, 40))
    steps = draw(st.integers(1, 30))
    buffers = []
    for key in range(n):
        first = draw(st.integers(-1, steps))
        last = draw(st.integers(first, steps))
        size = draw(st.one_of(st.integers(1, 4096), st.integers(4096, 1 << 22)))
        buffers.append(Buffer(key, size, first, last))
    return buffers


@settings(max_examples=150)
@given(buffer_sets(), st.sampled_from([1, 64, 512, 4096]))
def test_plan_never_overlaps_live_buffers(buffers, alignment):
    plan = plan_arena(buffers, alignment)
    assert set(plan.offsets) == {b.key for b in buffers}
    spans = {}
    for b in buffers:
        off = plan.offsets[b.key]
        assert off % alignment == 0
        spans[b.key] = (off, off + align_up(b.size, alignment))
        assert spans[b.key][1] <= plan.peak
    for i, a in enumerate(buffers):
        for b in buffers[i + 1:]:
            if a.first <= b.last and b.first <= a.last:  # alive at the same time
                (a0, a1), (b0, b1) = spans[a.key], spans[b.key]
                assert a1 <= b0 or b1 <= a0, (a, b, spans[a.key], spans[b.key])
    assert plan.lower_bound <= plan.peak <= plan.no_reuse
    assert plan.no_reuse == sum(align_up(b.size, alignment) for b in buffers)


@settings(max_examples=100)
@given(buffer_sets())
def test_lower_bound_is_the_largest_live_total(buffers):
    steps = range(-1, 32)
    by_step = [sum(align_up(b.size, 512) for b in buffers if b.first <= s <= b.last)
               for s in steps]
    assert lower_bound(buffers, 512) == max(by_step, default=0)


def test_chain_reuses_two_slots():
    # A chain a0 -> a1 -> ... : each buffer lives from its producer to its one reader.
    buffers = [Buffer(k, 1000, k - 1, k) for k in range(10)]
    plan = plan_arena(buffers, 512)
    assert plan.peak == plan.lower_bound == 2 * 1024
    assert plan.no_reuse == 10 * 1024


def test_best_fit_takes_the_tightest_gap():
    # Two long-lived buffers leave a 1024 hole at [0, 1024) and a large free top; a short
    # buffer of 1000 bytes alive meanwhile goes into the hole, not above.
    buffers = [Buffer(0, 4096, 0, 9), Buffer(1, 1024, 0, 3), Buffer(2, 2048, 0, 9),
               Buffer(3, 1000, 5, 6)]
    plan = plan_arena(buffers, 512)
    assert plan.offsets[3] == plan.offsets[1]
    assert plan.peak == plan.lower_bound


def test_weights_are_aligned_and_stored_once_per_content():
    w = {"a": np.ones((3, 3), np.float32), "b": np.arange(5, dtype=np.int8),
         "c": np.ones((3, 3), np.float32)}
    plan = plan_weights(w, 512)
    assert plan.offsets["a"] == plan.offsets["c"] == 0
    assert plan.offsets["b"] == 512
    assert plan.distinct == 2 and plan.total_bytes == 1024
    assert plan.blobs["b"] == bytes(range(5))


def test_weights_that_differ_only_inside_are_stored_apart():
    # Same length and the same first and last bytes: only a full comparison tells them apart.
    a = np.zeros(4096, np.float32)
    b = a.copy()
    b[2000] = 1.0
    w = {"a": a, "b": b, "a2": a.copy(), "b2": b.copy(), "empty": np.zeros(0, np.float32),
         "empty2": np.zeros((0, 3), np.float32)}
    plan = plan_weights(w, 512)
    assert plan.offsets["a"] == plan.offsets["a2"] == 0
    assert plan.offsets["b"] == plan.offsets["b2"] == a.nbytes
    assert plan.offsets["empty"] == plan.offsets["empty2"] == 2 * a.nbytes
    assert plan.distinct == 3 and plan.total_bytes == 2 * a.nbytes + 512


@pytest.mark.parametrize("alignment", [1, 512])
def test_empty_arena(alignment):
    plan = plan_arena([], alignment)
    assert plan.peak == plan.lower_bound == plan.no_reuse == 0
    assert plan.ratio == 1.0
