"""Schedule replay (firmware_model/replay.py) is invisible: a replayed run leaves exactly what the
full simulation leaves.

Each case loads one compiled program on two devices, one simulating every run
(``LoadedProgram.replay = False``) and one replaying after its first run, runs both several
times and compares everything a user can observe: outputs bit for bit, cycles, the clock, every
counter, every trace record (all fields), ring positions (the next submission's completion seq)
and the IOVAs of host mappings. Faults that come from values (a Gather index out of range) fall
back to the simulation and are reported exactly as without replay.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ep.npusim.compiler import compile_partition
from firmware_model import (
    Barrier,
    Firmware,
    Kernel,
    KernelLaunch,
    Nop,
    Program,
    TensorDesc,
    pack,
)
from firmware_model import replay as R
from firmware_model.program import Region
from npu_sim import DeviceConfig
from npu_sim.device import Device
from npu_sim.errors import DeviceFault
from tests.ep import npusim_graphs as G

CONFIG = DeviceConfig.preset("npu-m")


def chain(n: int = 12) -> onnx.ModelProto:
    ops = ["Relu", "Sigmoid", "Tanh", "Abs", "Neg"]
    nodes = [helper.make_node(ops[i % len(ops)], [f"t{i - 1}" if i else "x"], [f"t{i}"])
             for i in range(n)]
    shape = (1, 64, 8, 8)
    return G.model(nodes, [("x", G.F, shape)], [(f"t{n - 1}", G.F, shape)])


def gather() -> onnx.ModelProto:
    table = helper.make_tensor("table", TensorProto.FLOAT, [10, 4],
                               np.arange(40, dtype=np.float32).tolist())
    nodes = [helper.make_node("Gather", ["table", "idx"], ["g"], axis=0),
             helper.make_node("Relu", ["g"], ["y"])]
    g = helper.make_graph(nodes, "gather", [helper.make_tensor_value_info(
        "idx", TensorProto.INT64, [3])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [3, 4])], [table])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


MODELS = {
    "chain": chain,
    "conv_bn_relu": G.conv_bn_relu,
    "residual_block": G.residual_block,
    "matmul_add": lambda: G.matmul_add(act="Relu"),
    "qdq_conv": G.qdq_conv,
}


def program_of(m: onnx.ModelProto) -> Program:
    return compile_partition(G.as_fused(m), CONFIG).program


def feeds(program: Program, seed: int) -> list[np.ndarray]:
    r = np.random.default_rng(seed)
    out = []
    for t in program.input_descs():
        if t.dtype == "int64":
            out.append(r.integers(0, 10, t.shape).astype(np.int64))
        elif t.dtype.startswith(("uint", "int")):
            out.append(r.integers(0, 100, t.shape).astype(t.dtype))
        else:
            out.append(r.standard_normal(t.shape).astype(np.float32))
    return out


class Twin:
    """The same program loaded on a simulating device and on a replaying one."""

    def __init__(self, *programs: Program, functional: bool = True) -> None:
        self.sides = []
        for replay in (False, True):
            fw = Firmware(Device(CONFIG), ring_entries=16)
            loaded = [fw.load(p, functional=functional) for p in programs]
            for lp in loaded:
                lp.replay = replay
            self.sides.append((fw, loaded))

    def run(self, which: int, inputs, *, functional: bool = True) -> list:
        results = []
        for _, loaded in self.sides:
            try:
                results.append(("ok", loaded[which].run(inputs, functional=functional)))
            except DeviceFault as exc:
                results.append(("fault", str(exc), exc.status, exc.command_id))
        assert_same(results[0], results[1])
        self.assert_same_state()
        return results[1]

    def assert_same_state(self) -> None:
        (fa, la), (fb, lb) = self.sides
        assert fa.device.now == fb.device.now
        assert fa.stats() == fb.stats()
        assert [a.last_run_cycles for a in la] == [b.last_run_cycles for b in lb]
        assert [dataclasses.asdict(r) for r in fa.device.trace.records] == \
            [dataclasses.asdict(r) for r in fb.device.trace.records]
        assert fa.device.trace.next_id == fb.device.trace.next_id
        assert fa.device.map_host(np.zeros(3)) == fb.device.map_host(np.zeros(3))


def assert_same(a, b) -> None:
    assert a[0] == b[0], (a, b)
    if a[0] == "fault":
        assert a == b
        return
    for x, y in zip(a[1], b[1], strict=True):
        if x is None:
            assert y is None
        else:
            assert x.dtype == y.dtype and x.shape == y.shape
            assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_replayed_runs_match_the_simulation(name: str) -> None:
    program = program_of(MODELS[name]())
    twin = Twin(program)
    for seed in range(4):
        twin.run(0, feeds(program, seed))
    assert R.replayable(twin.sides[1][1][0])
    assert any(twin.sides[1][1][0]._schedules.values())  # it did replay


@pytest.mark.parametrize("name", ["chain", "residual_block"])
def test_timing_only_replay_matches(name: str) -> None:
    program = program_of(MODELS[name]())
    twin = Twin(program, functional=False)
    for _ in range(3):
        assert twin.run(0, None, functional=False)[1] == [None]


def test_the_ring_positions_move_as_in_the_simulation() -> None:
    program = program_of(chain(30))  # longer than the 16-slot ring: streamed in refills
    twin = Twin(program)
    for seed in range(3):
        twin.run(0, feeds(program, seed))
    seqs = [fw.run([Nop(0)])[0].seq for fw, _ in twin.sides]
    assert seqs[0] == seqs[1]
    twin.assert_same_state()


def test_two_programs_interleaved_on_one_device() -> None:
    a, b = program_of(chain(5)), program_of(G.residual_block())
    twin = Twin(a, b)
    for seed in range(3):
        twin.run(0, feeds(a, seed))
        twin.run(1, feeds(b, seed))


def test_a_value_fault_falls_back_to_the_exact_simulation() -> None:
    program = program_of(gather())
    twin = Twin(program)
    good = [np.array([0, 3, 9], np.int64)]
    loaded = twin.sides[1][1][0]
    for _ in range(4):  # until the schedule for the next run's state is recorded
        twin.run(0, good)
    assert loaded._schedules.get(R.key(loaded, True, 0)) is not None
    fault = twin.run(0, [np.array([0, 42, 1], np.int64)])
    assert fault[0] == "fault" and fault[2] == "KERNEL_FAULT"
    twin.run(0, good)  # the device stays usable, and replay resumes
    twin.run(0, [np.array([1, 2, 3], np.int64)])


def test_a_kernel_registered_again_is_not_replayed_from_the_old_one() -> None:
    from npu_sim.kernels import registry

    program = program_of(chain(3))
    twin = Twin(program)
    twin.run(0, feeds(program, 0))
    twin.run(0, feeds(program, 0))
    before = twin.run(0, feeds(program, 0))[1][0]
    old = registry.lookup("Tanh")
    registry.register_kernel("Tanh", lambda xs, attrs: [np.tanh(xs[0]) + np.float32(1)],
                             cycles=old.cycles, replace=True)
    try:
        after = twin.run(0, feeds(program, 0))[1][0]
        assert not np.array_equal(before, after)  # the new kernel ran on both sides
    finally:
        registry.register_kernel("Tanh", old.values, cycles=old.cycles, replace=True)
    twin.run(0, feeds(program, 0))


def racy(commands: list) -> Program:
    """Launch 0 reads tensor a, launch 1 overwrites a: they conflict unless ordered."""
    f = "float32"
    tensors = tuple(TensorDesc(name, (4,), f, Region.ARENA, 64 * k)
                    for k, name in enumerate("abc"))
    launches = (KernelLaunch("Relu", (0,), (1,)), KernelLaunch("Neg", (2,), (0,)))
    return Program("racy", tensors, launches, pack(commands), (0, 2), (1,), {}, 256)


@pytest.mark.parametrize(("commands", "ordered"), [
    ([Kernel(0, 0, 0), Kernel(1, 1, 0, deps=(0,))], True),
    ([Kernel(0, 0, 0), Nop(1, deps=(0,)), Kernel(2, 1, 0, deps=(1,))], True),
    ([Kernel(0, 0, 0), Barrier(1), Kernel(2, 1, 0)], True),
    ([Kernel(0, 0, 0), Kernel(1, 1, 0)], False),
])
def test_only_programs_whose_conflicts_are_ordered_are_replayed(commands, ordered) -> None:
    fw = Firmware(Device(CONFIG))
    loaded = fw.load(racy(commands))
    assert R.replayable(loaded) is ordered
    twin = Twin(racy(commands))
    for seed in range(3):
        twin.run(0, [np.full(4, seed - 1.5, np.float32), np.full(4, seed + 1.0, np.float32)])
    assert any(twin.sides[1][1][0]._schedules.values()) is ordered


def test_timing_only_replay_follows_a_kernel_priced_anew() -> None:
    from npu_sim.cost import op_cost
    from npu_sim.kernels import registry

    program = program_of(chain(3))
    twin = Twin(program, functional=False)
    for _ in range(4):
        twin.run(0, None, functional=False)
    cycles = twin.sides[1][1][0].last_run_cycles
    old = registry.lookup("Tanh")

    def slower(config, in_specs, out_specs, attrs, cores=1):
        cost = op_cost(config, "Tanh", in_specs, out_specs, attrs, cores=cores)
        return dataclasses.replace(cost, total_cycles=2 * cost.total_cycles + 1000)

    registry.register_kernel("Tanh", old.values, cycles=slower, replace=True)
    try:
        twin.run(0, None, functional=False)
        assert twin.sides[1][1][0].last_run_cycles > cycles
        registry.unregister_kernel("Tanh")
        fault = twin.run(0, None, functional=False)  # the simulation reports the missing kernel
        assert fault[0] == "fault"
    finally:
        registry.register_kernel("Tanh", old.values, cycles=old.cycles, replace=True)
    twin.run(0, None, functional=False)
