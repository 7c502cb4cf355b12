"""The command processor: dependency order, concurrency, faults, rings, semaphores, barriers."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firmware_model import (
    Barrier,
    Dma,
    Firmware,
    Kernel,
    KernelLaunch,
    Nop,
    Program,
    Region,
    RingOverflow,
    Signal,
    Status,
    TensorDesc,
    Wait,
    pack,
)
from npu_sim.device import Device
from npu_sim.errors import ConfigError, DeviceFault, InvalidCommand, KernelError
from tests.kernel_fixtures import registered_kernels

TILE = 256  # bytes per test tensor (64 float32)


def _cycles(config, ins, outs, attrs, cores=1):
    return SimpleNamespace(total_cycles=int(attrs["cycles"]))


def _fail(ins, attrs):
    raise ValueError("boom")


@pytest.fixture(scope="module", autouse=True)
def test_kernels():
    with registered_kernels({"fwtest.Copy": (lambda ins, attrs: [ins[0].copy()], _cycles),
                             "fwtest.Fail": (_fail, _cycles)}):
        yield


def make_program(cycles: list[int], ops: list[str] | None = None) -> Program:
    """Launch k runs ``ops[k]`` (default fwtest.Copy) from tensor 0 into tensor k+1 and takes
    ``cycles[k]`` cycles."""
    ops = ops or ["fwtest.Copy"] * len(cycles)
    tensors = [TensorDesc(f"t{i}", (TILE // 4,), "float32", Region.ARENA, i * TILE)
               for i in range(len(cycles) + 1)]
    launches = [KernelLaunch(op, (0,), (k + 1,), {"cycles": c}, node=f"n{k}")
                for k, (c, op) in enumerate(zip(cycles, ops, strict=True))]
    return Program("test", tuple(tensors), tuple(launches), b"", (0,), (1,), {},
                   TILE * len(tensors))


@pytest.fixture
def rig():
    dev = Device("npu-s")  # 2 cores, 2 DMA channels
    fw = Firmware(dev, queues=2, ring_entries=64, semaphores=4)
    src, dst = dev.malloc(1 << 20), dev.malloc(1 << 20)
    prog = fw.load(make_program([300, 500, 700, 10], ["fwtest.Copy"] * 3 + ["fwtest.Fail"]))
    return SimpleNamespace(dev=dev, fw=fw, src=src, dst=dst, prog=prog)


def by_id(completions):
    return {c.cmd_id: c for c in completions}


# -- dependency order and concurrency ---------------------------------------------------------

NODE = st.one_of(
    st.tuples(st.just("nop")),
    st.tuples(st.just("dma"), st.integers(1, 1 << 14).map(lambda n: 4 * n)),
    st.tuples(st.just("kernel"), st.integers(0, 2), st.integers(0, 3)),
)


@st.composite
def dags(draw, min_size=1, max_size=12, reach=0):
    """A random command DAG; with ``reach``, every 5th command also depends on one at least
    ``reach`` positions earlier (across ring refills when ``reach`` is the ring size)."""
    nodes = draw(st.lists(NODE, min_size=min_size, max_size=max_size))
    cycles = draw(st.lists(st.integers(1, 5000), min_size=3, max_size=3))
    cmds = []
    for i, node in enumerate(nodes):
        deps = draw(st.lists(st.integers(0, i - 1), max_size=min(i, 7), unique=True)) \
            if i else []
        if reach and i >= reach and i % 5 == 0:
            far = draw(st.integers(0, i - reach))
            deps = [*deps, far] if far not in deps else deps
        cmd_id = 100 + i
        deps = tuple(100 + d for d in deps)
        if node[0] == "nop":
            cmds.append(Nop(cmd_id, deps=deps))
        elif node[0] == "dma":
            cmds.append(("dma", cmd_id, node[1], deps))
        else:
            cmds.append(Kernel(cmd_id, node[1], node[2], deps=deps))
    return cmds, cycles


def run_dag(spec, cycles, ring_entries=256):
    """Run a ``dags()`` case; check that every command started exactly when its deps were met
    and the trace links each command to its deps. Returns the completions by id and the
    firmware."""
    dev = Device("npu-s")
    fw = Firmware(dev, ring_entries=ring_entries)
    src, dst = dev.malloc(1 << 16), dev.malloc(1 << 16)
    prog = fw.load(make_program(cycles))
    cmds = [Dma(c[1], src.address, dst.address, c[2], deps=c[3]) if isinstance(c, tuple) else c
            for c in spec]
    t0 = dev.now
    done = by_id(fw.run(cmds, program=prog))
    assert all(c.status is Status.OK for c in done.values())
    for cmd in cmds:
        c = done[cmd.cmd_id]
        ready = max([t0] + [done[d].end for d in cmd.deps])
        assert c.start == ready  # starts exactly when its deps are met: no false serialisation
        assert c.end >= c.start
        if isinstance(cmd, Kernel):
            assert c.end - c.start >= cycles[cmd.launch]
    # The trace holds one command record per command, listing its deps' records.
    records = [r for r in dev.trace.records if r.kind == "command" and r.start >= t0
               and r.work["cmd_id"] >= 100]
    rid = {r.work["cmd_id"]: r for r in records}
    assert set(rid) == {c.cmd_id for c in cmds}
    for cmd in cmds:
        assert {rid[d].id for d in cmd.deps} <= set(rid[cmd.cmd_id].deps)
    return done, fw


@settings(max_examples=40)
@given(dags())
def test_random_dag_runs_in_dependency_order_without_waiting_for_unrelated_commands(case):
    run_dag(*case)


@settings(max_examples=20)
@given(dags(min_size=100, max_size=160, reach=8))
def test_a_dag_many_times_the_ring_streams_with_every_dependency_respected(case):
    spec, cycles = case
    done, fw = run_dag(spec, cycles, ring_entries=8)
    assert fw.stats()["fw.doorbells"] >= len(spec) // 8  # it went through in refills
    assert fw.free_slots() == 8
    # run_dag checked that streaming adds no time (each command starts when its deps are met);
    # and it is deterministic: the same submission gives the same cycles, command by command.
    again, _ = run_dag(spec, cycles, ring_entries=8)
    assert {i: (c.start, c.end) for i, c in done.items()} == \
        {i: (c.start, c.end) for i, c in again.items()}


def test_dma_overlaps_an_independent_kernel(rig):
    t0 = rig.dev.now
    done = by_id(rig.fw.run([Dma(1, rig.src.address, rig.dst.address, 1 << 20),
                             Kernel(2, 2, 0b01)], program=rig.prog))
    dma, kern = done[1], done[2]
    assert dma.start == kern.start == t0
    assert kern.end - kern.start >= 700 and dma.end - dma.start > 700
    assert max(dma.start, kern.start) < min(dma.end, kern.end)  # the intervals overlap
    engines = {r.engine for r in rig.dev.trace.records if r.start < kern.end and r.end > t0
               and r.kind in ("dma", "kernel")}
    assert "core0" in engines and any(e.startswith("dma") for e in engines)


def test_kernels_on_disjoint_cores_run_together_and_share_a_core_in_turn(rig):
    done = by_id(rig.fw.run([Kernel(1, 1, 0b01), Kernel(2, 1, 0b10), Kernel(3, 1, 0b01)],
                            program=rig.prog))
    assert done[1].end == done[2].end  # cores 0 and 1 in parallel
    assert done[3].end - done[1].end >= 500  # core 0 was busy: launch 3 queued behind launch 1


def test_kernel_values_land_in_the_arena(rig):
    data = np.arange(TILE // 4, dtype=np.float32)
    rig.dev.hbm.write(rig.prog.base(Region.ARENA), data)
    rig.fw.run([Kernel(1, 0, 0), Kernel(2, 1, 0, deps=(1,))], program=rig.prog)
    for out in (1, 2):
        address, _ = rig.prog.operand(out)
        np.testing.assert_array_equal(rig.dev.hbm.read(address, TILE).view(np.float32), data)


# -- faults ---------------------------------------------------------------------------------

def bad_opcode(rig):
    raw = struct.pack("<BBHI8I", 42, 0, 0, 2, *[0] * 8) + bytes(24)
    return pack([Nop(1)]) + raw + pack([Nop(3, deps=(2,))])


FAULTS = {
    "INVALID_OPCODE": (bad_opcode, 2, [3], "unknown opcode 42"),
    "MISSING_DEPENDENCY": (lambda r: [Nop(1), Nop(2, deps=(7,)), Nop(3, deps=(2,))], 2, [3],
                           "depends on command 7"),
    "DMA_FAULT": (lambda r: [Dma(1, r.src.address, r.dst.address + (1 << 20) - 64, 128),
                             Kernel(2, 0, 0, deps=(1,))], 1, [2], "not inside one live"),
    "KERNEL_FAULT": (lambda r: [Kernel(1, 0, 0), Kernel(2, 3, 0), Nop(3, deps=(2,))], 2, [3],
                     "boom"),
    "INVALID_LAUNCH": (lambda r: [Kernel(1, 9, 0), Barrier(2), Nop(3)], 1, [2, 3],
                       "launch index 9 out of range"),
    "INVALID_SEMAPHORE": (lambda r: [Signal(1, 4, 1), Nop(2, deps=(1,))], 1, [2],
                          "semaphore 4 out of range"),
    "DUPLICATE_ID": (lambda r: [Nop(1), Nop(1), Nop(3, deps=(1,))], 1, [3], "already used"),
    "WAIT_TIMEOUT": (lambda r: [Wait(1, 0, 5), Nop(2, deps=(1,))], 1, [2], "semaphore 0 >= 5"),
}


@pytest.mark.parametrize("status", sorted(FAULTS))
def test_each_fault_posts_a_status_raises_typed_and_leaves_the_device_usable(rig, status):
    build, faulted, cancelled, text = FAULTS[status]
    in_use = rig.dev.hbm.stats()["hbm.bytes_in_use"]
    faults_before = rig.fw.stats()["fw.faults"]
    sub = rig.fw.submit(build(rig), program=rig.prog)
    with pytest.raises(DeviceFault) as info:
        rig.fw.wait(sub)
    err = info.value
    assert (err.status, err.command_id) == (status, faulted)
    assert text in str(err)
    statuses = {c.cmd_id: c.status for c in sub.completions}
    assert statuses[faulted] is Status[status]
    assert all(statuses[i] is Status.CANCELLED for i in cancelled)
    assert rig.fw.stats()["fw.faults"] == faults_before + 1
    assert rig.dev.hbm.stats()["hbm.bytes_in_use"] == in_use  # nothing leaked
    # The device stays usable: the next submission on the same queue runs normally.
    done = rig.fw.run([Dma(1, rig.src.address, rig.dst.address, 4096), Kernel(2, 0, 0)],
                      program=rig.prog)
    assert [c.status for c in done] == [Status.OK, Status.OK]


@pytest.mark.parametrize("build, text", [
    (lambda r: [Kernel(1, 0, 0)], "without a loaded program"),
    (lambda r: [Kernel(1, 0, 0b100)], "core_mask 0x4 names cores beyond the device's 2"),
])
def test_invalid_launches(rig, build, text):
    program = None if "without" in text else rig.prog
    with pytest.raises(DeviceFault, match=text) as info:
        rig.fw.run(build(rig), program=program)
    assert info.value.status == "INVALID_LAUNCH"


def test_kernel_of_an_unloaded_program_is_an_invalid_launch(rig):
    rig.prog.unload()
    with pytest.raises(DeviceFault, match="was unloaded") as info:
        rig.fw.run([Kernel(1, 0, 0)], program=rig.prog)
    assert info.value.status == "INVALID_LAUNCH"
    assert rig.fw.run([Nop(1)])[0].ok


# -- rings, doorbell, polling -----------------------------------------------------------------

def test_raw_write_overflow_is_refused_whole_and_clears_once_fetched():
    dev = Device("os32")
    fw = Firmware(dev, ring_entries=8)
    with pytest.raises(RingOverflow, match="9 commands does not fit"):
        fw.submit([Nop(i) for i in range(9)], stream=False)
    assert fw.free_slots() == 8
    assert fw.stats()["fw.doorbells"] == fw.stats()["fw.submissions"] == 0
    first = fw.submit([Nop(i) for i in range(5)], stream=False)
    with pytest.raises(RingOverflow, match="4 commands does not fit the submission ring: 3 of 8"):
        fw.submit([Nop(i) for i in range(4)], stream=False)
    fw.wait(first)
    assert fw.free_slots() == 8
    assert len(fw.run([Nop(i) for i in range(8)], stream=False)) == 8


def test_fetching_frees_slots_before_the_commands_complete():
    dev = Device("os32")
    fw = Firmware(dev, ring_entries=8)
    blocked = fw.submit([Wait(0, 0, 1)] + [Nop(i, deps=(0,)) for i in range(1, 8)],
                        stream=False)
    dev.env.run()  # everything fetched; nothing can complete before semaphore 0 is signalled
    assert fw.poll() == [] and fw.free_slots() == 8
    more = fw.submit([Nop(i) for i in range(7)] + [Signal(7, 0, 1)], stream=False)
    assert all(c.ok for c in fw.wait(more))
    assert all(c.ok for c in fw.wait(blocked))


def test_raw_write_behind_a_streaming_submission_is_refused_and_writes_nothing():
    dev = Device("os32")
    fw = Firmware(dev, ring_entries=8)
    streaming = fw.submit([Nop(i) for i in range(20)])
    assert fw.free_slots() == 0 and fw.stats()["fw.doorbells"] == 1  # first refill written
    with pytest.raises(RingOverflow, match="cannot be written raw: 12 descriptors of earlier"):
        fw.submit([Nop(1)], stream=False)
    assert fw.stats()["fw.submissions"] == 1
    after = fw.submit([Nop(i, deps=(i - 1,) if i else ()) for i in range(10)])  # queued behind
    assert [c.cmd_id for c in fw.wait(after)] == list(range(10))
    assert fw.wait(streaming)[-1].cmd_id == 19
    assert [s.first for s in (streaming, after)] == [0, 20]


def test_a_fault_in_an_early_refill_cancels_dependents_in_later_ones(rig):
    fw = Firmware(rig.dev, ring_entries=8)
    prog = fw.load(make_program([300, 500, 700, 10], ["fwtest.Copy"] * 3 + ["fwtest.Fail"]))
    in_use = rig.dev.hbm.stats()["hbm.bytes_in_use"]
    cmds = [Nop(0), Kernel(1, 3, 0), Nop(2)] + [Nop(i) for i in range(3, 30)] + \
        [Nop(30, deps=(1,)), Nop(31, deps=(2, 30)), Kernel(32, 0, 0, deps=(2,)), Barrier(33),
         Nop(34)]
    sub = fw.submit(cmds, program=prog)
    with pytest.raises(DeviceFault, match="boom") as info:
        fw.wait(sub)
    assert (info.value.status, info.value.command_id) == ("KERNEL_FAULT", 1)
    statuses = {c.cmd_id: c.status for c in sub.completions}
    assert [i for i, s in statuses.items() if s is Status.CANCELLED] == [30, 31, 33, 34]
    assert all(statuses[i] is Status.OK for i in [0, 2, *range(3, 30), 32])
    assert fw.stats()["fw.doorbells"] >= 35 // 8
    assert rig.dev.hbm.stats()["hbm.bytes_in_use"] == in_use
    again = fw.run([Nop(i, deps=(i - 1,) if i else ()) for i in range(25)] + [Kernel(25, 0, 0)],
                   program=prog)
    assert all(c.ok for c in again) and len(again) == 26


def test_completions_wait_for_the_host_to_drain_a_full_completion_ring():
    dev = Device("os32")
    fw = Firmware(dev, ring_entries=8)
    sub = fw.submit([Nop(i, deps=(i - 1,) if i else ()) for i in range(20)])
    dev.env.run()  # the host does not poll: 8 entries posted, the rest held back
    assert fw.stats()["fw.commands"] == 20  # every command ran; dependents did not wait
    got = fw.poll()
    assert [c.cmd_id for c in got] == list(range(8))
    assert fw.poll() == []  # held entries are posted only once the clock runs again
    dev.env.run()
    assert [c.cmd_id for c in fw.poll()] == list(range(8, 16))
    assert [c.cmd_id for c in fw.wait(sub)] == list(range(20))


def test_poll_returns_completions_once_the_clock_has_run():
    dev = Device("os32")
    fw = Firmware(dev)
    sub = fw.submit([Nop(1), Nop(2, deps=(1,))])
    assert fw.poll() == [] and not sub.done  # nothing runs until the clock does
    dev.env.run()
    got = fw.poll()
    assert [c.cmd_id for c in got] == [1, 2] and sub.done
    assert fw.poll() == []
    stats = fw.stats()
    assert stats["fw.commands"] == 2 and stats["fw.doorbells"] == 1
    assert stats["device.cycles"] == dev.now  # the device's counters come along
    fw.reset_stats()
    assert fw.stats()["fw.commands"] == 0


def test_submit_rejects_a_bad_queue():
    fw = Firmware(Device("os32"), queues=2)
    with pytest.raises(InvalidCommand, match=r"queue=2; expected an integer in \[0, 2\)"):
        fw.submit([Nop(1)], queue=2)


# -- semaphores and barriers --------------------------------------------------------------------

def test_semaphores_count_signals_across_queues(rig):
    waiter = rig.fw.submit([Wait(1, 2, 2), Nop(2, deps=(1,))], queue=1)
    signaller = rig.fw.submit([Dma(1, rig.src.address, rig.dst.address, 1 << 16),
                               Signal(2, 2, 1, deps=(1,)), Kernel(3, 0, 0, deps=(2,)),
                               Signal(4, 2, 1, deps=(3,))], queue=0, program=rig.prog)
    w = by_id(rig.fw.wait(waiter))
    s = by_id(rig.fw.wait(signaller))
    assert s[2].end < s[4].end
    assert w[1].end == s[4].end  # one signal of 1 did not satisfy >= 2; the second did
    assert w[2].start == w[1].end
    assert rig.fw.semaphores[2] == 2


def test_barrier_orders_everything_before_it_against_everything_after(rig):
    done = by_id(rig.fw.run([Dma(1, rig.src.address, rig.dst.address, 1 << 18),
                             Kernel(2, 0, 0b01), Barrier(3), Kernel(4, 1, 0b10), Nop(5)],
                            program=rig.prog))
    before = max(done[1].end, done[2].end)
    assert done[3].end == before
    assert done[4].start == before and done[5].start == before


def test_firmware_arguments_are_validated():
    dev = Device("os32")
    with pytest.raises(ConfigError, match=r"queues=0 is invalid; expected an integer in \[1, "):
        Firmware(dev, queues=0)
    with pytest.raises(ConfigError, match=r"ring_entries=0 is invalid; expected an integer in "):
        Firmware(dev, ring_entries=0)
    with pytest.raises(ConfigError, match="semaphores=-1 is invalid"):
        Firmware(dev, semaphores=-1)


def test_kernel_error_type_is_reported_by_name(rig):
    # A kernel raising KernelError itself keeps its message.
    def bad(ins, attrs):
        raise KernelError("fwtest.Bad", "n", "shape (3,) is not supported")

    with registered_kernels({"fwtest.Bad": (bad, _cycles)}):
        prog = rig.fw.load(make_program([5], ["fwtest.Bad"]))
        with pytest.raises(DeviceFault, match=r"shape \(3,\) is not supported"):
            rig.fw.run([Kernel(1, 0, 0)], program=prog)
