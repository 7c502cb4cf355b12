"""``Device.memcpy_h2d_chain`` is ``memcpy_h2d_async`` once per copy, each behind the previous.

The chain is how the firmware streams a program's weights (one transfer per weight); it checks
the buffer and the dependency once instead of per copy and skips re-validating the mapping it
has just made. Everything observable must be what the per-copy calls give: the same host
mappings, transfers, chunks, cycles, trace records, counters, HBM contents, and faults. Each
test runs both on two identical devices and compares them.
"""

from __future__ import annotations

import json
import mmap
import re

import numpy as np
import pytest
import simpy
from hypothesis import example, given, settings
from hypothesis import strategies as st

from npu_sim import Device, DeviceConfig
from npu_sim.config import MiB
from npu_sim.errors import DmaFault

SMALL = DeviceConfig.preset("os32").replace(hbm_bytes=4 * MiB, dma_chunk_bytes=4096,
                                            dma_channels=3)


def per_copy(dev: Device, dst, copies, *, after=None, share=False):
    """The reference: what the firmware did before the chain existed."""
    arrivals, last = [], after
    for host, offset in copies:
        last = dev.memcpy_h2d_async(dst, host, offset, deps=[] if last is None else [last],
                                    share=share)
        arrivals.append(last)
    return arrivals


def chained(dev: Device, dst, copies, *, after=None, share=False):
    return dev.memcpy_h2d_chain(dst, copies, after=after, share=share)


def host_arrays() -> list[np.ndarray]:
    """Weights as the firmware sees them: read-only views of a file mapping (immutable, so HBM
    refers to them) and of bytes, a writable array (copied), one of several chunks, one empty."""
    rng = np.random.default_rng(7)
    mapping = mmap.mmap(-1, 3 * 4096)
    mapping.write(rng.bytes(3 * 4096))
    mapped = np.frombuffer(memoryview(mapping).toreadonly(), np.uint8)
    return [mapped[:5000], np.frombuffer(rng.bytes(700), np.uint8),
            rng.integers(0, 256, 9000, dtype=np.uint8), mapped[5000:5000], mapped[8192:],
            np.frombuffer(rng.bytes(3), np.uint8)]


def run(start, *, share: bool, competing: bool, uploads_only: bool = False):
    """Both sides' observable results: arrival times, trace, counters, HBM bytes, mappings.
    ``uploads_only``: without the empty copy, so every copy is a DMA upload (the chain maps
    them in one loop, :meth:`HostMap.map_uploads`)."""
    dev = Device(SMALL)
    buf = dev.malloc(64 * 1024)
    hosts = host_arrays()
    offsets = [0, 8192, 12288, 24576, 32768, 40960]
    if uploads_only:
        del hosts[3], offsets[3]
    first = dev.memcpy_h2d_async(buf, np.ones(2048, np.uint8), 60 * 1024)
    if competing:  # a run's own transfer racing the chain for channels and the link
        dev.memcpy_h2d_async(buf, np.full(10_000, 3, np.uint8), 45 * 1024)
    arrivals = start(dev, buf, list(zip(hosts, offsets, strict=True)), after=first, share=share)
    dev.synchronize()
    records = [(r.kind, r.engine, r.scope, r.name, r.start, r.end, r.deps, r.work, r.submit,
                r.ready) for r in dev.trace.records]
    return ([(e.ok, dev.env.now) for e in arrivals], records, dev.stats(), dev.now,
            bytes(dev.hbm.read(buf.address, buf.nbytes)), len(dev.host_map._arrays))


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("competing", [False, True])
def test_a_chain_is_the_per_copy_transfers(share, competing):
    want = run(per_copy, share=share, competing=competing)
    got = run(chained, share=share, competing=competing)
    assert got == want
    assert want[2]["dma.transfers"] == 1 + competing + 5  # the empty copy moves nothing
    assert want[-1] == 0  # every mapping is released once its transfer lands


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("competing", [False, True])
def test_a_chain_of_uploads_only_is_the_per_copy_transfers(share, competing):
    want = run(per_copy, share=share, competing=competing, uploads_only=True)
    got = run(chained, share=share, competing=competing, uploads_only=True)
    assert got == want
    assert want[2]["dma.transfers"] == 1 + competing + 5


def test_a_chain_waits_for_each_previous_copy():
    dev = Device(SMALL)
    buf = dev.malloc(64 * 1024)
    arrivals = chained(dev, buf, [(np.ones(8192, np.uint8), 0), (np.ones(8192, np.uint8), 8192)])
    dev.synchronize()
    first, second = [r for r in dev.trace.records if r.work["transfer"] == 1], \
        [r for r in dev.trace.records if r.work["transfer"] == 2]
    assert max(r.end for r in first) <= min(r.ready for r in second)
    assert all(e.ok for e in arrivals)


@pytest.mark.parametrize("case", ["unaligned", "outside", "freed", "foreign", "writable-2d"])
def test_a_chain_faults_as_the_per_copy_calls_do(case):
    def attempt(start):
        dev, other = Device(SMALL), Device(SMALL)
        buf = dev.malloc(16 * 1024)
        after = other.memcpy_h2d_async(other.malloc(64), np.ones(64, np.uint8)) \
            if case == "foreign" else None
        host = np.ones(64, np.uint8)
        offset = {"unaligned": 2, "outside": 16 * 1024 - 32}.get(case, 0)
        if case == "freed":
            dev.free(buf)
        if case == "writable-2d":
            host = np.ones((8, 8), np.uint8)[:, ::2]  # not C-contiguous
        before = dev.stats()
        with pytest.raises(DmaFault) as info:
            start(dev, buf, [(np.ones(64, np.uint8), 64), (host, offset)], after=after)
        dev.synchronize()
        scope, message = info.value.args  # device ids differ between the two devices
        return scope, re.sub(r"device(_id=| )\d+", r"device\1N", message), \
            dev.stats()["dma.transfers"] - before["dma.transfers"]

    assert attempt(chained) == attempt(per_copy)


def test_freeing_the_buffer_in_flight_fails_the_chain_as_it_fails_a_copy():
    def attempt(start):
        dev = Device(SMALL)
        buf = dev.malloc(64 * 1024)
        arrivals = start(dev, buf, [(np.ones(32 * 1024, np.uint8), 0),
                                    (np.ones(4096, np.uint8), 32 * 1024)])
        dev.free(buf)
        with pytest.raises(DmaFault) as info:
            dev.synchronize()
        return info.value.args, [e.ok for e in arrivals if e.triggered], dev.now

    assert attempt(chained) == attempt(per_copy)


def test_numpy_integer_offsets_reach_the_trace_as_ints():
    """Offsets may be numpy integers (the firmware's come from arrays); the trace records an
    int address, as it does for an int offset, and a profile of them is JSON."""
    def records(start, offsets):
        dev = Device(SMALL)
        buf = dev.malloc(64 * 1024)
        hosts = [np.ones(4096, np.uint8), np.ones(100, np.uint8)]  # aligned, then not
        start(dev, buf, list(zip(hosts, offsets, strict=True)))
        dev.synchronize()
        return [r.work for r in dev.trace.records]

    want = records(per_copy, [0, 4100])
    for start in (per_copy, chained):
        got = records(start, [np.int64(0), np.int64(4100)])
        assert got == want
        assert json.dumps(got) == json.dumps(want)
        assert all(type(work[key]) is int for work in got for key in ("src", "dst"))


def test_an_empty_chain_checks_and_queues_nothing():
    """No copies, as no per-copy call: even a freed buffer and a foreign ``after`` pass."""
    dev, other = Device(SMALL), Device(SMALL)
    buf = dev.malloc(4096)
    dev.free(buf)
    foreign = other.memcpy_h2d_async(other.malloc(64), np.ones(64, np.uint8))
    assert chained(dev, buf, [], after=foreign) == per_copy(dev, buf, [], after=foreign) == []
    dev.synchronize()
    assert dev.stats()["dma.transfers"] == 0 and dev.now == 0


def contended(start, sizes, channels, chunk, waiters, free_at, late_after, early=()):
    """Everything observable, in the order it happened, when two chains and a run's own
    transfers race: a waiter on an arrival issues a transfer the moment it is processed (so
    the next upload and that transfer ask for a channel at the same cycle), a second chain
    waits behind the first, a third starts after the clock ran (behind a processed event or
    none), and the first chain's buffer may be freed while its uploads are in flight. The
    arrivals in ``early`` get, before the clock runs, a callback issuing a transfer, or an
    AllOf made outside any process that a process waits on."""
    config = SMALL.replace(dma_channels=channels, dma_chunk_bytes=chunk)
    dev = Device(config)
    env = dev.env
    buf, spare = dev.malloc(256 * 1024), dev.malloc(256 * 1024)
    rng = np.random.default_rng(len(sizes))
    mapping = mmap.mmap(-1, sum(sizes) + 64)
    mapping.write(rng.bytes(len(mapping)))
    whole = np.frombuffer(memoryview(mapping).toreadonly(), np.uint8)
    log: list[tuple] = []
    offsets = np.cumsum([0] + [-(-n // 64) * 64 for n in sizes])
    hosts = [whole[o:o + n] for o, n in zip(offsets, sizes, strict=False)]
    first = start(dev, buf, list(zip(hosts, offsets.tolist(), strict=False)), share=True)
    second = start(dev, spare, [(np.full(n, k, np.uint8), 4 * k) for k, n in enumerate(sizes)],
                   after=first[-1])
    for name, arrivals in (("first", first), ("second", second)):
        for k, arrival in enumerate(arrivals):
            arrival.callbacks.append(lambda e, name=name, k=k: log.append(
                ("landed", name, k, env.now, e.ok, len(dev.trace.records))))

    def issue(k):
        log.append(("early", k, env.now, len(dev.trace.records)))
        dev.memcpy_d2d_async(spare, spare, 1024, 220 * 1024, 0)

    def waiter_on(condition, k):
        try:
            yield condition
        except DmaFault:
            return
        issue(k)

    def waiter(k, hops, condition):
        """Wait for upload ``k`` (as a kernel does, through an AllOf, or directly), then for
        ``hops`` more events at the same cycle, and issue a transfer: some land on the cycle
        and event turn at which the chain starts its next upload."""
        try:
            yield simpy.AllOf(env, [first[k]]) if condition else first[k]
        except DmaFault as fault:
            log.append(("waiter failed", k, env.now, fault.args))
            return
        for _ in range(hops):
            yield env.timeout(0)
        log.append(("waiter", k, env.now, len(dev.trace.records)))
        if k % 2:  # a run's own transfers, issued as the upload's successor starts
            dev.memcpy_h2d_async(spare, np.full(3000, k, np.uint8), 128 * 1024)
        else:
            dev.memcpy_d2d_async(spare, spare, 2048, 200 * 1024, 0)

    for k, hops, condition in waiters:
        env.process(waiter(k % len(first), hops, condition))
    for k, condition in early:
        arrival = first[k % len(first)]
        if condition:
            env.process(waiter_on(simpy.AllOf(env, [arrival]), k))
        else:
            arrival.callbacks.append(lambda e, k=k: e.ok and issue(k))
    if free_at is not None:
        env.run(until=free_at)
        dev.free(buf)
    failures: list[tuple] = []

    def drain() -> None:  # a failed transfer nobody waited for raises; the clock goes on
        while True:
            try:
                dev.synchronize()
                return
            except DmaFault as fault:
                failures.append((env.now, fault.args))

    drain()
    late = start(dev, spare, [(np.ones(5000, np.uint8), 0), (np.ones(64, np.uint8), 8192)],
                 after=second[-1] if late_after else None)
    drain()
    records = [(r.id, r.kind, r.engine, r.scope, r.name, r.start, r.end, r.deps, r.work,
                r.submit, r.ready) for r in dev.trace.records]
    return (log, failures, [(e.triggered, e.ok if e.triggered else None) for e in first + late],
            records, dev.stats(), dev.now, bytes(dev.hbm.read(spare.address, spare.nbytes)),
            len(dev.host_map._arrays))


@settings(max_examples=150, deadline=None)
# a run's transfer asking for the one channel on the turn the second chain starts
@example(sizes=[1], channels=1, chunk=4096, waiters=[(0, 0, False)], free_at=None,
         late_after=False, early=[])
# a callback, and an AllOf made outside a process, on the first arrival before the clock runs
@example(sizes=[4096, 4096], channels=1, chunk=4096, waiters=[], free_at=None,
         late_after=False, early=[(0, False)])
@example(sizes=[4096, 4096], channels=1, chunk=4096, waiters=[], free_at=None,
         late_after=False, early=[(0, True)])
@example(sizes=[5000, 9000, 64], channels=1, chunk=4096,  # and with a failure cascading
         waiters=[(0, 0, False), (1, 1, True), (2, 2, False)], free_at=1500, late_after=True,
         early=[])
@given(sizes=st.lists(st.integers(1, 20_000), min_size=1, max_size=6),
       channels=st.integers(1, 3), chunk=st.sampled_from([4096, 8192]),
       waiters=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.booleans()),
                        max_size=6),
       free_at=st.one_of(st.none(), st.integers(1, 3000)), late_after=st.booleans(),
       early=st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=3))
def test_contending_chains_take_the_per_copy_turns(sizes, channels, chunk, waiters, free_at,
                                                   late_after, early):
    """The chain drives its transfers without a simpy process each; the simulator must still
    process every event in the per-copy order, which same-cycle contention makes visible."""
    args = (sizes, channels, chunk, waiters, free_at, late_after, early)
    assert contended(chained, *args) == contended(per_copy, *args)


@pytest.mark.parametrize("share", [False, True])
def test_a_device_dropped_with_uploads_pending_lets_go_of_their_host_bytes(share):
    """A device nobody refers to never runs its clock again: the chains still pending on it
    release their arrivals and host bytes with it, not at a later cyclic collection (their
    arrivals' callbacks refer to them, which refer to the arrivals)."""
    import gc
    import weakref

    dev = Device(SMALL)
    host = np.arange(3 * 4096, dtype=np.uint8)
    if share:
        host.flags.writeable = False  # immutable bytes: HBM may refer to them
    gone = weakref.ref(host)
    buf = dev.malloc(host.size)
    arrivals = dev.memcpy_h2d_chain(buf, [(host, 0)], share=share)
    assert not arrivals[0].processed  # never simulated
    enabled = gc.isenabled()
    gc.disable()
    try:
        del dev, buf, arrivals, host
        assert gone() is None, "the pending upload kept its host bytes until a collection"
    finally:
        if enabled:
            gc.enable()
