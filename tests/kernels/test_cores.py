"""cores.split: every part once, on the caller and the helper threads, errors handed back."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim.kernels import cores


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 40))
def test_every_part_runs_once(parts: int) -> None:
    seen: list[int] = []
    cores.split(parts, seen.append)  # list.append is atomic under the GIL
    assert sorted(seen) == list(range(parts))


@pytest.mark.skipif(cores.THREADS < 2, reason="one core: no helper thread to meet")
def test_a_helper_runs_parts_beside_the_caller(monkeypatch) -> None:
    """Part 0 waits until part 1 has started: only two threads at once get past it (the host
    is taken as idle, whatever else runs beside the tests)."""
    monkeypatch.setattr(cores, "_others_running", lambda helpers: False)
    _fresh(cores.team())
    assert _threads_meeting() == 2


def _threads_meeting(split=cores.split) -> int:
    """How many threads ran the two parts of a split whose part 0 waits for part 1 to start
    (``split``: :func:`cores.split`, or a :class:`cores.Choice`'s ``run``)."""
    started = threading.Event()
    threads: set[int] = set()

    def part(k: int) -> None:
        threads.add(threading.get_ident())
        if k == 1:
            started.set()
        elif not started.wait(10):
            raise AssertionError("part 1 never ran beside part 0")

    split(2, part)
    return len(threads)


def test_an_error_in_a_part_reaches_the_caller_and_the_next_split_works() -> None:
    def part(k: int) -> None:
        if k == 3:
            raise ValueError("part 3")

    with pytest.raises(ValueError, match="part 3"):
        cores.split(8, part)
    seen: list[int] = []
    cores.split(8, seen.append)
    assert sorted(seen) == list(range(8))


@pytest.mark.skipif(cores.THREADS < 2, reason="one core: no helper thread to meet")
def test_the_lowest_failing_part_is_the_error_raised(monkeypatch) -> None:
    """Part 1 fails first (on the helper, while part 0 waits), part 0 fails after it: the error
    raised is part 0's, as the serial loop would raise."""
    monkeypatch.setattr(cores, "_others_running", lambda helpers: False)
    _fresh(cores.team())
    one_failed = threading.Event()

    def part(k: int) -> None:
        if k == 1:
            one_failed.set()
            raise ValueError("part 1")
        one_failed.wait(10)
        raise ValueError("part 0")

    with pytest.raises(ValueError, match="part 0"):
        cores.split(2, part)


@pytest.mark.skipif(cores.THREADS < 2, reason="one core: no helper thread to meet")
def test_a_helper_keeps_the_callers_numpy_error_callback(monkeypatch) -> None:
    monkeypatch.setattr(cores, "_others_running", lambda helpers: False)
    _fresh(cores.team())
    calls: list[str] = []
    started = threading.Event()

    def part(k: int) -> None:
        if k == 1:
            started.set()
        else:
            started.wait(10)
        np.divide(np.ones(1), np.zeros(1))

    with np.errstate(divide="call", call=lambda kind, flag: calls.append(kind)):
        cores.split(2, part)
    assert calls == ["divide by zero"] * 2


@pytest.mark.parametrize("affinity, quota, threads", [
    (2, None, 2), (64, None, cores.MAX_THREADS), (64, 1.5, 1), (64, 3.0, 3), (8, 0.5, 1),
    (1, None, 1)])
def test_the_thread_count_keeps_to_the_affinity_the_quota_and_the_cap(affinity, quota,
                                                                       threads) -> None:
    """A 64-CPU container with a quota of 1.5 CPUs gets no helper; without a quota, the cap."""
    assert cores.usable_threads(affinity, quota) == threads


def test_a_split_inside_a_part_runs_serially() -> None:
    inner: list[tuple[int, int]] = []
    cores.split(4, lambda k: cores.split(3, lambda j: inner.append((k, j))))
    assert sorted(inner) == [(k, j) for k in range(4) for j in range(3)]


def test_splits_from_several_threads_at_once_all_complete() -> None:
    results: dict[int, list[int]] = {}

    def caller(t: int) -> None:
        for _ in range(50):
            seen: list[int] = []
            cores.split(5, seen.append)
            results.setdefault(t, []).append(len(seen))

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {t: [5] * 50 for t in range(3)}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
@pytest.mark.skipif(cores.THREADS < 2, reason="one core: no helper thread to meet")
def test_a_forked_child_splits_with_helpers_of_its_own() -> None:
    """The parent's helper threads do not exist in a forked child: it starts its own, and a
    part really runs on one of them (with the parent's team, part 0 would wait for part 1 in
    vain)."""
    cores.split(4, lambda k: None)  # the parent's helpers exist before the fork
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        assert pool.apply(_split_in_child) == 2


def _split_in_child() -> int:
    cores._others_running = lambda helpers: False  # the child's copy: its host counts idle
    return _threads_meeting()


@pytest.mark.skipif(cores.THREADS < 2, reason="one core: no helper thread to meet")
def test_late_helpers_make_the_next_splits_run_on_the_caller(monkeypatch) -> None:
    """Every split counts as late (LATE 0): after STRIKES of them the next REST splits run all
    their parts on the calling thread and the helpers stop spinning, then it tries again."""
    helpers = cores.team()
    _fresh(helpers)
    monkeypatch.setattr(cores, "_others_running", lambda helpers: False)
    monkeypatch.setattr(cores, "LATE", 0.0)
    monkeypatch.setattr(cores, "REST", 3)
    for _ in range(cores.STRIKES):
        cores.split(2, lambda k: None)
    assert helpers.rest == 3 and helpers.spin == 0
    caller = threading.get_ident()
    for _ in range(3):
        threads: list[int] = []
        cores.split(4, lambda k, seen=threads: seen.append(threading.get_ident()))
        assert threads == [caller] * 4
    assert helpers.rest == 0 and helpers.spin == helpers.spins
    _fresh(helpers)


@pytest.mark.skipif(cores.THREADS < 2, reason="one core: no helper thread to meet")
def test_a_busy_host_runs_the_next_splits_on_the_caller(monkeypatch) -> None:
    """Another process holds a core: each split runs on the caller, and after STRIKES of them
    so do the next REST, with the helpers not spinning."""
    helpers = cores.team()
    _fresh(helpers)
    monkeypatch.setattr(cores, "_others_running", lambda helpers: True)
    caller = threading.get_ident()
    for n in range(cores.STRIKES):
        threads: list[int] = []
        cores.split(4, lambda k, seen=threads: seen.append(threading.get_ident()))
        assert threads == [caller] * 4
        assert (helpers.rest, helpers.spin) == ((cores.REST, 0) if n == cores.STRIKES - 1 else
                                                (0, helpers.spins))
    _fresh(helpers)


def _fresh(helpers) -> None:
    """Helpers as after start: no late splits counted, no rest (earlier tests block parts on
    purpose, which counts as late)."""
    helpers.strikes = helpers.rest = 0
    helpers.spin = helpers.spins


def test_a_choice_keeps_running_whole_a_launch_that_splitting_slows(monkeypatch) -> None:
    """A split that costs 20 ms more than running the parts: after its first trials (clear
    enough to end early), each running every part once, the choice runs the launch whole, on
    the caller, and splits no more."""
    splits: list[int] = []

    def slow_split(parts: int, work) -> None:
        splits.append(parts)
        time.sleep(0.02)
        for k in range(parts):
            work(k)

    monkeypatch.setattr(cores, "split", slow_split)
    choice = cores.Choice()
    seen: list[int] = []
    for n in range(2 * cores.EARLY):  # every whole call far faster than every split one
        assert choice.whole is None
        seen.clear()
        choice.run(3, seen.append)
        assert sorted(seen) == [0, 1, 2]
        assert len(splits) == n // 2 + 1  # split first, then whole, in turn
    assert choice.whole is True
    seen.clear()
    choice.run(4, lambda k: seen.append(threading.get_ident()))
    assert seen == [threading.get_ident()] * 4 and len(splits) == cores.EARLY


@pytest.mark.parametrize("split_ms, whole_ms, whole", [
    ([10, 12, 11, 11, 10], [11, 10, 12, 10, 11], True),  # level medians: whole
    ([10, 9, 10, 11, 9], [11, 10, 12, 10, 11], False),
    ([10, 30, 10, 10, 10], [13, 14, 13, 13, 13], False),  # one slow split call: no early call
])
def test_a_choice_with_no_clear_winner_times_every_trial(monkeypatch, split_ms, whole_ms,
                                                         whole) -> None:
    """Timings that never put one way :data:`cores.CLEAR` times below the other in every call
    run all ``2 * TRIALS`` trials, then the lower median wins (whole on a tie)."""
    monkeypatch.setattr(cores, "split", cores.serial)
    durations = iter(ms / 1e3 for pair in zip(split_ms, whole_ms, strict=True) for ms in pair)
    clock = [0.0]

    def perf_counter() -> float:  # each call's start, then its end a scripted time later
        clock[0] += next(durations) if len(ticks) % 2 else 0.0
        ticks.append(clock[0])
        return clock[0]

    ticks: list[float] = []
    monkeypatch.setattr(cores, "time", types.SimpleNamespace(perf_counter=perf_counter))
    choice = cores.Choice()
    for _ in range(2 * cores.TRIALS):
        assert choice.whole is None
        choice.run(2, lambda k: None)
    assert choice.whole is whole


@pytest.mark.skipif(cores.THREADS < 2, reason="one core: no helper thread to meet")
def test_a_choice_keeps_splitting_a_launch_that_gains_from_it(monkeypatch) -> None:
    """Two parts of 20 ms each that release the GIL (a sleep): split, they take one part's
    time and whole two, so the choice keeps the split, and later calls meet a helper."""
    monkeypatch.setattr(cores, "_others_running", lambda helpers: False)
    _fresh(cores.team())
    choice = cores.Choice()
    for _ in range(2 * cores.EARLY):  # split, every call about half the whole time
        assert choice.whole is None
        choice.run(2, lambda k: time.sleep(0.02))
    assert choice.whole is False
    assert _threads_meeting(choice.run) == 2
    _fresh(cores.team())


@pytest.mark.skipif(cores.THREADS < 2, reason="one core: no helper threads to start")
def test_where_no_thread_can_start_every_split_runs_on_its_caller(monkeypatch) -> None:
    """Python 3.12+ starts no thread once the interpreter is exiting (a session run from an
    ``atexit`` handler): the helpers' first start fails there, and every split then runs on
    its caller, each part once, in order."""
    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(cores, "_team", None)
    monkeypatch.setattr(cores, "_no_threads", False)
    monkeypatch.setattr(threading.Thread, "start", refused)
    threads: set[int] = set()
    seen: list[int] = []

    def part(k: int) -> None:
        threads.add(threading.get_ident())
        seen.append(k)

    cores.split(6, part)
    assert cores.team() is None and cores._no_threads
    cores.split(5, part)
    assert seen == [*range(6), *range(5)]
    assert threads == {threading.get_ident()}
