"""Replay computes a kernel straight into its output's arena bytes (``writes_into``), except
where those bytes overlap one of the kernel's inputs (the arena reuses memory): the values are
the simulation's, bit for bit, either way."""

from __future__ import annotations

import numpy as np

from firmware_model import Firmware, Kernel, KernelLaunch, Program, TensorDesc, pack
from firmware_model.program import Region
from npu_sim import DeviceConfig
from npu_sim.device import Device
from npu_sim.errors import KernelError
from npu_sim.kernels.conv import conv, prepare_conv
from tests.kernel_fixtures import fixed_cycles, registered_kernels

CONFIG = DeviceConfig.preset("npu-m")
SHAPE = (1, 4, 6, 6)
F = "float32"
seen: list[tuple[str, np.ndarray | None]] = []


def spy(inputs, attrs, out=None):
    seen.append((attrs["name"], None if out is None else out[0]))
    return conv(inputs, attrs, out=out)


def program() -> Program:
    """Launch a writes its output over its own input x (in place); launch b reads that output
    and writes disjoint bytes."""
    nbytes = 4 * int(np.prod(SHAPE))
    tensors = (TensorDesc("x", SHAPE, F, Region.ARENA, 0),
               TensorDesc("w", (4, 4, 3, 3), F, Region.ARENA, nbytes),
               TensorDesc("a", SHAPE, F, Region.ARENA, 0),
               TensorDesc("b", SHAPE, F, Region.ARENA, 2 * nbytes + 4 * 144))
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    launches = (KernelLaunch("SpyConv", (0, 1), (2,), {**attrs, "name": "a"}),
                KernelLaunch("SpyConv", (2, 1), (3,), {**attrs, "name": "b"}))
    commands = pack([Kernel(0, 0, 0), Kernel(1, 1, 0, deps=(0,))])
    return Program("into", tensors, launches, commands, (0, 1), (3,), {}, 3 * nbytes + 4 * 144)


def simulated_and_replayed(queues: int = 1) -> list:
    """:func:`program` loaded twice, on devices of their own (firmware of ``queues`` queues):
    simulating every run, and replaying recorded schedules."""
    sides = []
    for replay in (False, True):
        loaded = Firmware(Device(CONFIG), queues=queues).load(program())
        loaded.replay = replay
        sides.append(loaded)
    return sides


def test_replay_writes_into_outputs_that_overlap_no_input() -> None:
    with registered_kernels({"SpyConv": (spy, fixed_cycles(100))}, writes_into=True):
        sides = simulated_and_replayed()
        r = np.random.default_rng(0)
        address, spec = sides[1].operand(3)
        arena = sides[1].firmware.device.hbm.view(address, spec.nbytes)
        into = 0
        for _ in range(8):  # a schedule per DMA channel order is recorded, then replayed
            feeds = [r.standard_normal(SHAPE).astype(np.float32),
                     r.standard_normal((4, 4, 3, 3)).astype(np.float32)]
            seen.clear()
            (want,) = sides[0].run(feeds)
            assert [out for _, out in seen] == [None, None]  # the simulation never passes out=
            seen.clear()
            (got,) = sides[1].run(feeds)
            assert got.tobytes() == want.tobytes()
            (a_name, a_out), (b_name, b_out) = seen
            # the in-place launch never gets out=; the other, when replayed, its arena bytes
            assert (a_name, a_out, b_name) == ("a", None, "b")
            if b_out is not None:
                assert np.shares_memory(b_out, arena)
                into += 1
        assert into >= 4


def test_replay_prepares_each_launch_once_and_falls_back_when_it_cannot() -> None:
    """A kernel with ``prepare`` is prepared once per launch, for every schedule the program's
    runs cycle through, and its result called on every replayed run; a prepare that raises
    leaves the launch to the values function. Either way the values are the simulation's
    bits."""
    calls = {"prepare": 0, "run": 0, "values": 0}

    def values(inputs, attrs, out=None):
        calls["values"] += 1
        return conv(inputs, attrs, out=out)

    def counting(inputs, attrs, out=None):
        calls["prepare"] += 1
        run = prepare_conv(inputs, attrs, out)

        def counted():
            calls["run"] += 1
            return run()
        return counted

    def refusing(inputs, attrs, out=None):
        calls["prepare"] += 1
        raise KernelError("SpyConv", "", "cannot prepare")

    for prepare in (counting, refusing):
        calls.update(prepare=0, run=0, values=0)
        with registered_kernels({"SpyConv": (values, fixed_cycles(100))}, writes_into=True,
                                prepare=prepare):
            sides = simulated_and_replayed()
            r = np.random.default_rng(1)
            for _ in range(8):
                feeds = [r.standard_normal(SHAPE).astype(np.float32),
                         r.standard_normal((4, 4, 3, 3)).astype(np.float32)]
                (want,) = sides[0].run(feeds)
                (got,) = sides[1].run(feeds)
                assert got.tobytes() == want.tobytes()
        assert calls["prepare"] == 2  # two launches, each prepared once for every schedule
        if prepare is counting:
            schedules = (calls["values"] - 2 * 8) // 2  # the replaying side's simulated runs
            assert 1 <= schedules < 8  # one per recorded schedule, not one per run
            assert calls["run"] == 2 * (8 - schedules)  # every replayed launch ran prepared
        else:
            assert calls["run"] == 0
            assert calls["values"] == 2 * 8 * 2  # every launch of both sides


def test_a_kernel_registered_anew_is_prepared_anew() -> None:
    """The prepared steps call the kernels they were prepared with. Registered again, the
    kernel no longer replays the schedules recorded with the old one (those runs simulate);
    the schedules recorded since (here: runs on another queue) run the new one's prepared
    launches, never the old ones'."""
    sides: list = []
    r = np.random.default_rng(2)
    runs = {"old": 0, "new": 0}

    def counting(name):
        def prepare(inputs, attrs, out=None):
            run = prepare_conv(inputs, attrs, out)

            def counted():
                runs[name] += 1
                return run()
            return counted
        return prepare

    for queue, name in enumerate(("old", "new")):
        with registered_kernels({"SpyConv": (conv, fixed_cycles(100))}, writes_into=True,
                                prepare=counting(name)):
            sides = sides or simulated_and_replayed(2)  # loaded once, with the first kernel
            before = dict(runs)
            for _ in range(8):
                feeds = [r.standard_normal(SHAPE).astype(np.float32),
                         r.standard_normal((4, 4, 3, 3)).astype(np.float32)]
                (want,) = sides[0].run(feeds, queue=queue)
                (got,) = sides[1].run(feeds, queue=queue)
                assert got.tobytes() == want.tobytes()
            assert runs[name] > before[name]
            assert runs["old" if name == "new" else "new"] == before["old" if name == "new"
                                                                    else "new"]
