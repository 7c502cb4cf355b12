"""``firmware_model.replay.conflicts_ordered``: the check that a program's conflicting kernel
accesses are ordered by dependencies (what makes its schedule replayable), against its
definition checked pair by pair, on random dependency graphs and arena layouts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from firmware_model.replay import conflicts_ordered


def pairwise(spans, ancestors) -> bool:
    """The definition: every two spans sharing a byte, one writing, by two commands, ordered."""
    for lo, hi, i, writes in spans:
        for lo2, hi2, j, writes2 in spans:
            if i < j and (writes or writes2) and lo < hi2 and lo2 < hi and \
                    not ancestors[j] >> i & 1:
                return False
    return True


@st.composite
def programs(draw):
    """A random DAG of n commands (each depending on some earlier ones; ancestors closed) and
    accesses of them to a few small byte ranges, so that ranges overlap often."""
    n = draw(st.integers(1, 12))
    ancestors: list[int] = []
    for i in range(n):
        deps = draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        reach = 0
        for d in deps:
            reach |= ancestors[d] | 1 << d
        ancestors.append(reach)
    spans = []
    for _ in range(draw(st.integers(0, 16))):
        lo = draw(st.integers(0, 12))
        spans.append((lo, lo + draw(st.integers(1, 6)), draw(st.integers(0, n - 1)),
                      draw(st.booleans())))
    return spans, ancestors


@given(programs())
def test_the_check_is_its_definition(program) -> None:
    spans, ancestors = program
    assert conflicts_ordered(spans, ancestors) == pairwise(spans, ancestors)


def test_a_long_chain_through_two_buffers() -> None:
    """Kernel k reads buffer k % 2 and writes the other, each depending on the one before (a
    deep model's arena reuse). Checking every pair of overlapping spans was quadratic in the
    kernels (1.4 s of a 2,000-kernel chain's first run); 20,000 would take minutes that way."""
    n = 20_000
    ancestors = [(1 << i) - 1 for i in range(n)]  # a chain: every earlier command
    spans = [span for k in range(n) for span in ((64 * (k % 2), 64 * (k % 2) + 64, k, False),
                                                 (64 - 64 * (k % 2), 128 - 64 * (k % 2), k,
                                                  True))]
    assert conflicts_ordered(spans, ancestors)
    ancestors[n // 2] &= ~(1 << (n // 2 - 1))  # one kernel no longer after the one before it
    assert not conflicts_ordered(spans, ancestors)
