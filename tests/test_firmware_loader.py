"""The program loader: validation of malformed programs, load/run/unload end to end."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from firmware_model import (
    Dma,
    Firmware,
    Kernel,
    KernelLaunch,
    Nop,
    Program,
    Region,
    Signal,
    TensorDesc,
    pack,
    reloc,
    run_program,
)
from npu_sim import DeviceConfig
from npu_sim.device import Device
from npu_sim.errors import DeviceFault, HbmOutOfMemory, InvalidCommand
from tests.kernel_fixtures import fixed_cycles, registered_kernels
from tests.ortref import run_ort

SHAPE = (4, 16)
NB = 4 * 16 * 4  # bytes of one float32 tensor of SHAPE
W = np.linspace(-2.0, 2.0, 64, dtype=np.float32).reshape(SHAPE)


def two_kernel_program(weights: bytes | None = W.tobytes()) -> Program:
    """out = Relu(x + w): DMA w from WEIGHTS into the arena, then Add, then Relu."""
    t = [
        TensorDesc("x", SHAPE, "float32", Region.ARENA, 0),
        TensorDesc("w", SHAPE, "float32", Region.WEIGHTS, 0),
        TensorDesc("w_arena", SHAPE, "float32", Region.ARENA, NB),
        TensorDesc("sum", SHAPE, "float32", Region.ARENA, 2 * NB),
        TensorDesc("out", SHAPE, "float32", Region.ARENA, 3 * NB),
    ]
    launches = (KernelLaunch("Add", (0, 2), (3,), node="add"),
                KernelLaunch("Relu", (3,), (4,), node="relu"))
    commands = pack([Dma(1, reloc(Region.WEIGHTS, 0), reloc(Region.ARENA, NB), NB),
                     Kernel(2, 0, 0, deps=(1,)), Kernel(3, 1, 0b1, deps=(2,))])
    return Program("add_relu", tuple(t), launches, commands, (0,), (4,),
                   {} if weights is None else {1: weights}, 4 * NB)


@pytest.fixture
def dev():
    return Device("npu-s")


def reference(x: np.ndarray) -> np.ndarray:
    (s,) = run_ort("Add", [x, W])
    (out,) = run_ort("Relu", [s])
    return out


def test_small_program_loads_and_runs_end_to_end(dev):
    fw = Firmware(dev)
    loaded = fw.load(two_kernel_program())
    assert dev.hbm.stats()["hbm.allocations"] == 2  # arena + weights
    rng = np.random.default_rng(0)
    for _ in range(2):  # twice: a second run sees no stale state
        x = rng.standard_normal(SHAPE).astype(np.float32)
        (out,) = loaded.run([x])
        np.testing.assert_array_equal(out, reference(x))
        assert loaded.last_run_cycles > 0
    # relocation patched the DMA to the real region addresses
    dma = loaded.commands[0]
    assert (dma.src, dma.dst) == (loaded.weights.address, loaded.arena.address + NB)
    loaded.unload()
    assert dev.hbm.stats()["hbm.bytes_in_use"] == 0
    with pytest.raises(InvalidCommand, match="was unloaded"):
        loaded.run([np.zeros(SHAPE, np.float32)])


def test_timing_only_run_charges_the_same_cycles_and_returns_none(dev):
    fw = Firmware(dev)
    loaded = fw.load(two_kernel_program())
    loaded.run([np.ones(SHAPE, np.float32)])
    functional_cycles = loaded.last_run_cycles
    kernels = dev.stats()["compute.kernels"]
    assert loaded.run(None, functional=False) == [None]
    assert loaded.last_run_cycles == functional_cycles
    assert dev.stats()["compute.kernels"] == kernels + 2


def test_timing_only_load_needs_no_weights_but_cannot_compute_values(dev):
    loaded = Firmware(dev).load(two_kernel_program(weights=None), functional=False)
    assert loaded.run(None, functional=False) == [None]
    with pytest.raises(InvalidCommand, match="loaded timing-only"):
        loaded.run([np.ones(SHAPE, np.float32)])


@pytest.mark.parametrize("ring_entries", [8, 256])
def test_a_run_longer_than_the_submission_ring_is_streamed(dev, ring_entries):
    good = two_kernel_program()
    cmds = [Dma(1, reloc(Region.WEIGHTS, 0), reloc(Region.ARENA, NB), NB),
            Kernel(2, 0, 0, deps=(1,)), *[Nop(10 + i, deps=(10 + i - 1,) if i else (2,))
                                          for i in range(300)],
            Kernel(3, 1, 0b1, deps=(2, 309))]  # deps reach back across many refills
    fw = Firmware(dev, ring_entries=ring_entries)
    loaded = fw.load(dataclasses.replace(good, commands=pack(cmds)))
    x = np.linspace(-1.0, 1.0, 64, dtype=np.float32).reshape(SHAPE)
    (out,) = loaded.run([x])
    np.testing.assert_array_equal(out, reference(x))
    assert fw.stats()["fw.doorbells"] > 305 // ring_entries  # weights, then the run in refills
    assert fw.free_slots() == ring_entries


def test_run_program_convenience_loads_runs_and_unloads(dev):
    x = np.full(SHAPE, 0.5, np.float32)
    (out,) = run_program(dev, two_kernel_program(), [x])
    np.testing.assert_array_equal(out, reference(x))
    assert dev.hbm.stats()["hbm.bytes_in_use"] == 0


@pytest.mark.parametrize("inputs, text", [
    ([np.ones((4, 15), np.float32)], r"input 0 'x': expected shape \(4, 16\) float32, got "
                                     r"shape \(4, 15\) float32"),
    ([np.ones(SHAPE, np.float16)], r"expected shape \(4, 16\) float32, got shape \(4, 16\) "
                                   r"float16"),
    ([[1.0] * 64], "got list"),
    ([], r"takes 1 inputs \(x\), got 0"),
])
def test_run_checks_its_inputs(dev, inputs, text):
    loaded = Firmware(dev).load(two_kernel_program())
    with pytest.raises(InvalidCommand, match=text):
        loaded.run(inputs)
    (out,) = loaded.run([np.ones(SHAPE, np.float32)])  # nothing was left half done
    np.testing.assert_array_equal(out, reference(np.ones(SHAPE, np.float32)))


def test_a_fault_during_a_run_is_typed_and_leaves_the_device_usable(dev):
    def fail(ins, attrs):
        raise ValueError("bad values")

    with registered_kernels({"fwtest.LoaderFail": (fail, fixed_cycles(1))}):
        good = two_kernel_program()
        bad = dataclasses.replace(good, launches=(good.launches[0],
                                                  KernelLaunch("fwtest.LoaderFail", (3,), (4,))))
        fw = Firmware(dev)
        loaded = fw.load(bad)
        with pytest.raises(DeviceFault, match="bad values") as info:
            loaded.run([np.ones(SHAPE, np.float32)])
        assert (info.value.status, info.value.command_id) == ("KERNEL_FAULT", 3)
        assert not dev.host_map._arrays  # input/output mappings were released
        loaded.unload()
        x = np.ones(SHAPE, np.float32)
        np.testing.assert_array_equal(fw.load(good).run([x])[0], reference(x))


# -- validation ---------------------------------------------------------------------------------

def _tensor(p: Program, i: int, **changes) -> Program:
    tensors = list(p.tensors)
    tensors[i] = dataclasses.replace(tensors[i], **changes)
    return dataclasses.replace(p, tensors=tuple(tensors))


def _cmds(p: Program, cmds) -> Program:
    return dataclasses.replace(p, commands=pack(cmds))


GOOD = two_kernel_program()
MALFORMED = {
    "tensor past the arena": (_tensor(GOOD, 4, offset=4 * NB), "ends past the arena of 1024"),
    "misaligned offset": (_tensor(GOOD, 3, offset=2 * NB + 2),
                          "offset 514 is not a multiple of its float32 itemsize 4"),
    "bad dtype": (_tensor(GOOD, 3, dtype="float8"), "dtype 'float8'"),
    "absolute region": (_tensor(GOOD, 3, region=Region.ABSOLUTE),
                        "tensors live in ARENA or WEIGHTS"),
    "input out of range": (dataclasses.replace(GOOD, inputs=(7,)),
                           r"input 0: tensor index 7 out of range \[0, 5\)"),
    "input in weights": (dataclasses.replace(GOOD, inputs=(1,)), "must live in the ARENA"),
    "overlapping inputs": (dataclasses.replace(
        _tensor(GOOD, 2, shape=(8,), offset=8), inputs=(0, 2)), "inputs 'x' and 'w_arena' overlap"),
    "missing weight": (two_kernel_program(weights=None), "weight tensor 1 'w' has no bytes"),
    "short weight": (two_kernel_program(weights=b"\0" * 10), "expected 256 bytes, got 10"),
    "stray weight": (dataclasses.replace(GOOD, weights={1: W.tobytes(), 3: b"x"}),
                     "entry for tensor 3, which is not a WEIGHTS tensor"),
    "unknown kernels": (dataclasses.replace(GOOD, launches=(
        KernelLaunch("Frobnicate", (0,), (3,)), KernelLaunch("Zork", (3,), (4,)))),
        "unknown kernels: Frobnicate, Zork; registered: .*Relu"),
    "launch input index": (dataclasses.replace(GOOD, launches=(
        KernelLaunch("Relu", (9,), (3,)), GOOD.launches[1])), r"input tensor index 9"),
    "launch writes weights": (dataclasses.replace(GOOD, launches=(
        KernelLaunch("Relu", (0,), (1,)), GOOD.launches[1])), "read-only WEIGHTS region"),
    "command bytes": (dataclasses.replace(GOOD, commands=GOOD.commands + b"\x09" + bytes(63)),
                      "command stream: descriptor at byte 192 .*unknown opcode 9"),
    "dep not earlier": (_cmds(GOOD, [Kernel(2, 0, 0, deps=(3,)), Kernel(3, 1, 0)]),
                        "command 2: depends on 3, not an earlier command"),
    "duplicate id": (_cmds(GOOD, [Kernel(2, 0, 0), Kernel(2, 1, 0)]), "cmd_id used twice"),
    "launch index": (_cmds(GOOD, [Kernel(2, 5, 0)]), "launch index 5 out of range"),
    "core mask": (_cmds(GOOD, [Kernel(2, 0, 0b1000)]), "core_mask 0x8 names cores beyond"),
    "semaphore": (_cmds(GOOD, [Signal(2, 64, 1)]), r"semaphore 64 out of range \[0, 64\)"),
    "host dma": (_cmds(GOOD, [Dma(1, reloc(Region.HOST, 0), reloc(Region.ARENA, 0), 4)]),
                 "region HOST"),
    "absolute dma": (_cmds(GOOD, [Dma(1, 0x1000, reloc(Region.ARENA, 0), 4)]),
                     "region ABSOLUTE"),
    "dma past region": (_cmds(GOOD, [Dma(1, reloc(Region.WEIGHTS, 128), reloc(Region.ARENA, 0),
                                         256)]), r"\[128, 384\) runs past the WEIGHTS region"),
    "dma into weights": (_cmds(GOOD, [Dma(1, reloc(Region.ARENA, 0), reloc(Region.WEIGHTS, 0),
                                          4)]), "writes the read-only WEIGHTS"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_loader_rejects_malformed_programs_before_touching_hbm(dev, case):
    program, text = MALFORMED[case]
    with pytest.raises(InvalidCommand, match=text):
        Firmware(dev).load(program)
    assert dev.hbm.stats()["hbm.alloc_calls"] == 0


def test_all_problems_are_reported_together(dev):
    bad = _tensor(dataclasses.replace(GOOD, inputs=(7,)), 3, dtype="float8")
    with pytest.raises(InvalidCommand) as info:
        Firmware(dev).load(bad)
    assert len(info.value.problems) == 2
    assert "(2 problems)" in str(info.value)
    # Each problem names the bad value and what would be valid.
    dtype_problem, index_problem = sorted(info.value.problems, key=lambda p: "index" in p)
    assert "dtype 'float8'" in dtype_problem and "expected one of ['float32'" in dtype_problem
    assert f"tensor index 7 out of range [0, {len(bad.tensors)})" in index_problem
    assert all(p in str(info.value) for p in info.value.problems)


def test_identical_weights_may_share_a_range_different_ones_may_not(dev):
    shared = TensorDesc("w2", SHAPE, "float32", Region.WEIGHTS, 0)
    same = dataclasses.replace(GOOD, tensors=GOOD.tensors + (shared,),
                               weights={1: W.tobytes(), 5: W.tobytes()})
    x = np.ones(SHAPE, np.float32)
    np.testing.assert_array_equal(Firmware(dev).load(same).run([x])[0], reference(x))
    other = dataclasses.replace(same, weights={1: W.tobytes(), 5: bytes(NB)})
    with pytest.raises(InvalidCommand, match="weight tensors 'w' and 'w2' overlap"):
        Firmware(dev).load(other)


def test_bad_records_deep_in_a_long_program_are_named_as_alone(dev):
    """validate passes over sound tensors, launches and disjoint weights without labelling
    them; a bad one among many good ones is still named, with the message it has alone."""
    extra = [TensorDesc(f"a{k}", (4,), "float32", Region.ARENA, 16 * k) for k in range(30)]
    extra.append(TensorDesc("late", SHAPE, "float32", Region.ARENA, 4 * NB))  # past the arena
    extra += [TensorDesc(f"v{k}", (4,), "float32", Region.WEIGHTS, NB + 16 * k)
              for k in range(20)]
    extra.append(TensorDesc("v_last", (8,), "float32", Region.WEIGHTS, NB + 16 * 19 - 16))
    tensors = GOOD.tensors + tuple(extra)
    weights = {1: W.tobytes(), **{i: bytes(16) for i in range(36, 56)}, 56: bytes(range(32))}
    launches = (*[GOOD.launches[0]] * 40, KernelLaunch("Relu", (0,), (1,), node="late"),
                *[GOOD.launches[1]] * 20)
    long = dataclasses.replace(GOOD, tensors=tensors, launches=launches, weights=weights)
    with pytest.raises(InvalidCommand) as info:
        Firmware(dev).load(long)
    assert info.value.problems == [
        f"tensor 35 'late': [{4 * NB}, {5 * NB}) ends past the arena of {4 * NB} bytes",
        f"weight tensors 'v18' and 'v_last' overlap ([{NB + 16 * 18}, {NB + 16 * 19}) and "
        f"[{NB + 16 * 18}, {NB + 16 * 20})); only identical contents may share a range",
        f"weight tensors 'v19' and 'v_last' overlap ([{NB + 16 * 19}, {NB + 16 * 20}) and "
        f"[{NB + 16 * 18}, {NB + 16 * 20})); only identical contents may share a range",
        "launch 40 (Relu, node 'late'): writes tensor 'w' in the read-only WEIGHTS region",
    ]
    assert dev.hbm.stats()["hbm.alloc_calls"] == 0


def test_out_of_memory_during_load_frees_what_was_allocated():
    dev = Device(DeviceConfig.preset("os32").replace(hbm_bytes=1 << 20))
    big = _tensor(dataclasses.replace(GOOD, arena_bytes=4 * NB), 1, shape=(300_000,))
    big = dataclasses.replace(big, weights={1: bytes(1_200_000)})
    with pytest.raises(HbmOutOfMemory, match=r"npu\.hbm: cannot allocate 1\.1 MiB \(free \d+"
                                             r"(\.\d)? KiB, largest block ") as info:
        Firmware(dev).load(big)
    # The request is the weights blob rounded up to the HBM alignment (512 on os32), and the
    # error reports what was free and the largest block, so exhaustion reads as such.
    assert info.value.nbytes == 1_200_128
    assert info.value.largest_free_block <= info.value.free_bytes < info.value.nbytes
    assert dev.hbm.stats()["hbm.bytes_in_use"] == 0


def test_outputs_may_alias_each_other_an_input_and_a_weight(dev):
    """Outputs are only read back, so ONNX's aliases load: the same tensor twice (an output also
    reshaped into another output), an output over an input, a weight (Identity of an
    initializer). Inputs stay exclusive (see the malformed cases)."""
    aliased = dataclasses.replace(GOOD, outputs=(4, 4, 0, 1))
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    out, again, x_back, w_back = Firmware(dev).load(aliased).run([x])
    np.testing.assert_array_equal(out, reference(x))
    np.testing.assert_array_equal(again, out)
    np.testing.assert_array_equal(x_back, x)
    np.testing.assert_array_equal(w_back, W)
