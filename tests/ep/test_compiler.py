"""compile_partition end to end: program structure, dependencies, tiling, and replayed values.

:func:`replay` is an independent executor of a compiled Program: real arena and weights byte
arrays laid out by the TensorDescs, commands unpacked from the packed stream and run one at a
time in a *random* order that respects their deps. If emission missed a data dependency or an
anti-dependency created by arena reuse, some order reads a tensor before it is written or after
it was overwritten, and the values stop matching.
"""

from __future__ import annotations

import importlib
import random

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from ep import errors
from ep.npusim.compiler import compile_partition
from ep.npusim.compiler.ir import SubGraph
from firmware_model.commands import MAX_DEPS, Kernel, Nop, pack, unpack
from firmware_model.program import Program, Region
from npu_sim import dtypes, kernels
from npu_sim.config import DeviceConfig
from npu_sim.cost import op_cost
from tests.ep.graphgen import random_dags, random_feeds
from tests.ep.npusim_graphs import (
    as_fused,
    conv_bn_relu,
    matmul_add,
    model,
    ort_run,
    residual_block,
)

F = TensorProto.FLOAT
NPU_M = DeviceConfig.preset("npu-m")


def _view(mem: bytearray, desc) -> np.ndarray:
    n = desc.nbytes
    return np.frombuffer(mem, dtypes.to_numpy(desc.dtype), desc.size, desc.offset).reshape(
        desc.shape) if n else np.zeros(desc.shape, dtypes.to_numpy(desc.dtype))


def replay(program: Program, inputs, order_seed: int | None = None) -> list[np.ndarray]:
    """Run ``program`` command by command in a random dependency-respecting order."""
    arena = bytearray(program.arena_bytes)
    weights = bytearray(program.weights_bytes)
    for i, blob in program.weights.items():
        off = program.tensors[i].offset
        weights[off:off + len(blob)] = blob
    mem = {Region.ARENA: arena, Region.WEIGHTS: weights}

    def read(i):
        d = program.tensors[i]
        return _view(mem[d.region], d).copy()

    for i, x in zip(program.inputs, inputs, strict=True):
        _view(arena, program.tensors[i])[...] = x
    cmds = {c.cmd_id: c for c in unpack(program.commands)}
    done: set[int] = set()
    rnd = random.Random(order_seed)
    while len(done) < len(cmds):
        ready = [c for c in cmds.values() if c.cmd_id not in done and set(c.deps) <= done]
        assert ready, "dependency cycle"
        cmd = ready[rnd.randrange(len(ready))] if order_seed is not None else ready[0]
        if isinstance(cmd, Kernel):
            launch = program.launches[cmd.launch]
            ins = [read(t) if t >= 0 else None for t in launch.inputs]
            outs = kernels.lookup(launch.op).values(ins, launch.attrs)
            for t, value in zip(launch.outputs, outs, strict=False):
                _view(arena, program.tensors[t])[...] = value
        done.add(cmd.cmd_id)
    return [read(i) for i in program.outputs]


def compiled(m, config=NPU_M):
    return compile_partition(as_fused(m), config)


@settings(max_examples=40)
@given(random_dags(max_nodes=14), st.integers(0, 2**32 - 1))
def test_any_valid_command_order_gives_the_same_values(m, seed):
    program = compiled(m).program
    feeds = random_feeds(m, 0)
    expected = ort_run(m, feeds)
    ins = [feeds[program.tensors[i].name] for i in program.inputs]
    for k in range(3):
        got = replay(program, ins, order_seed=seed + k)
        for e, g in zip(expected, got, strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def _branches_with_reuse():
    """a = Neg(x); b = Relu(a); c = Tanh(x); y = Add(b, c).

    ``a`` dies after Relu, so ``c`` can take its memory; Tanh does not depend on Relu through
    data, only through that reuse (an anti-dependency).
    """
    nodes = [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Tanh", ["x"], ["c"]), helper.make_node("Add", ["b", "c"], ["y"])]
    return model(nodes, [("x", F, (64, 4))], [("y", F, (64, 4))])


def test_reuse_creates_anti_dependencies_the_replay_needs():
    m = _branches_with_reuse()
    cp = compiled(m)
    assert cp.report.arena.peak < cp.report.arena.no_reuse
    assert cp.report.anti_dependencies > 0
    # Control: with only the data dependencies, some order breaks the values, so the replay
    # (and the property test above) can see a missing anti-dependency.
    p = cp.program
    data_only = []
    producers = {t: c.cmd_id for c in unpack(p.commands) if isinstance(c, Kernel)
                 for t in p.launches[c.launch].outputs}
    for c in unpack(p.commands):
        deps = tuple(sorted({producers[t] for t in p.launches[c.launch].inputs
                             if t in producers}))
        data_only.append(Kernel(c.cmd_id, deps=deps, launch=c.launch, core_mask=c.core_mask))
    broken = Program(p.name, p.tensors, p.launches, pack(data_only), p.inputs, p.outputs,
                     p.weights, p.arena_bytes, p.hardware_architecture)
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    (expected,) = ort_run(m, {"x": x})

    def matches(program, seed):
        return np.allclose(replay(program, [x], order_seed=seed)[0], expected, atol=1e-6)

    assert not all(matches(broken, s) for s in range(30))
    assert all(matches(p, s) for s in range(30))


def _ancestors(commands) -> dict[int, set[int]]:
    """Command id -> every command it follows through its deps (commands come in order)."""
    found: dict[int, set[int]] = {}
    for c in commands:
        found[c.cmd_id] = set().union(*({d} | found[d] for d in c.deps))
    return found


@settings(max_examples=40)
@given(random_dags(max_nodes=14))
def test_no_dependency_of_a_command_is_implied_by_another(m):
    # Emission keeps the transitive reduction: a dependency another one already implies is
    # dropped, whatever the data and arena-reuse dependencies were.
    commands = unpack(compiled(m).program.commands)
    ancestors = _ancestors(commands)
    for c in commands:
        for d in c.deps:
            assert not any(d in ancestors[e] for e in c.deps if e != d), (c, d)


def test_a_chain_reusing_its_memory_keeps_one_dependency_per_command():
    # Each Neg's output takes the memory of a buffer two steps back: anti-dependencies on
    # every earlier occupant, all implied by the step before.
    n = 40
    nodes = [helper.make_node("Neg", ["x" if k == 0 else f"t{k - 1}"],
                              ["y" if k == n - 1 else f"t{k}"]) for k in range(n)]
    cp = compiled(model(nodes, [("x", F, (64, 4))], [("y", F, (64, 4))]))
    assert cp.report.anti_dependencies > n
    commands = unpack(cp.program.commands)
    assert [c.deps for c in commands] == [()] + [(k,) for k in range(n - 1)]


@settings(max_examples=60)
@given(st.data(), st.integers(1, 30), st.integers(1, 200), st.sampled_from([1, 7, 1 << 21]))
def test_earlier_occupants_masks_are_the_or_over_every_overlapping_dead_buffer(
        data, count, launches, words_at_once):
    """``emit._occupants`` (array operations, pairs gathered in slices of at most
    ``_WORDS`` words) against the definition, pair by pair: a buffer's mask ORs the masks of
    the other buffers that died before it was written and overlap its aligned range."""
    from ep.npusim.compiler.memplan import Buffer, align_up

    emit = importlib.import_module("ep.npusim.compiler.emit")  # the package's emit is a function

    spans = data.draw(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20),
                                         st.integers(0, 300), st.integers(0, 6)),
                               min_size=count, max_size=count))
    buffers = [Buffer(key=10 + 3 * k, size=size, first=min(a, b), last=max(a, b))
               for k, (a, b, size, _) in enumerate(spans)]
    offsets = {b.key: 64 * at for b, (_, _, _, at) in zip(buffers, spans, strict=True)}
    touched = data.draw(st.lists(st.integers(0, 2**launches - 1), min_size=count,
                                 max_size=count))
    want = []
    for b in buffers:
        lo, hi = offsets[b.key], offsets[b.key] + align_up(max(b.size, 1), 64)
        mask = 0
        for o, t in zip(buffers, touched, strict=True):
            o_lo, o_hi = offsets[o.key], offsets[o.key] + align_up(max(o.size, 1), 64)
            if o.key != b.key and o.last < b.first and o_lo < hi and lo < o_hi:
                mask |= t
        want.append(mask)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(emit, "_WORDS", words_at_once)
        patch.setattr(emit, "_ROWS", 4)  # several blocks of rows
        assert emit._occupants(buffers, offsets, 64, touched, launches) == want


def test_commands_respect_the_descriptor_dependency_limit():
    # One Sum reading 12 tensors, each produced by its own node: 12 deps need a Nop join.
    nodes = [helper.make_node("Neg", ["x"], [f"t{k}"]) for k in range(12)]
    nodes.append(helper.make_node("Sum", [f"t{k}" for k in range(12)], ["y"]))
    m = model(nodes, [("x", F, (2, 2))], [("y", F, (2, 2))])
    program = compiled(m).program
    cmds = unpack(program.commands)
    assert all(len(c.deps) <= MAX_DEPS for c in cmds)
    assert any(isinstance(c, Nop) for c in cmds)
    x = np.ones((2, 2), np.float32)
    np.testing.assert_allclose(replay(program, [x], 1)[0], -12 * x)


def test_program_structure_and_report():
    m = residual_block()
    cp = compiled(m)
    p, r = cp.program, cp.report
    assert p.hardware_architecture == "npu-m"
    # the residual Add and the Relu after it run in the second Conv's epilogue
    assert [launch.op for launch in p.launches] == ["Conv", "Conv"]
    assert p.launches[0].attrs["activation"] == "Relu"
    assert p.launches[1].attrs["epilogue"] == ("Add", "Relu")
    for launch in p.launches:
        for value in launch.attrs.values():
            assert isinstance(value, (int, float, str, bytes, tuple))
    for t in p.tensors:
        assert t.offset % NPU_M.hbm_alignment == 0
        if t.region == Region.ARENA:
            assert t.offset + t.nbytes <= p.arena_bytes
    assert {p.tensors[i].region for i in (*p.inputs, *p.outputs)} == {Region.ARENA}
    assert set(p.weights) == {i for i, t in enumerate(p.tensors) if t.region == Region.WEIGHTS}
    assert r.arena.lower_bound <= p.arena_bytes == r.arena.peak <= r.arena.no_reuse
    for entry, cmd in zip(r.launches, [c for c in unpack(p.commands) if isinstance(c, Kernel)],
                          strict=True):
        assert bin(cmd.core_mask).count("1") == entry["cores"]
        assert entry["core_mask"] == cmd.core_mask
        assert 1 <= entry["cores"] <= NPU_M.cores
        assert entry["sram_bytes"] <= NPU_M.sram_bytes_per_core


def test_tiles_fit_sram_on_a_small_core():
    small = NPU_M.replace(sram_bytes_per_core=16 * 1024)
    cp = compiled(matmul_add(m=256, k=512, n=256), small)
    (entry,) = cp.report.launches
    assert entry["op"] == "Gemm"
    tile = entry["tile"]
    assert tile["m"] < 256 or tile["k"] < 512 or tile["n"] < 256
    assert entry["sram_bytes"] <= small.sram_bytes_per_core


def test_small_op_stays_on_one_core_and_big_one_splits():
    cp = compiled(model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, (2, 4))],
                        [("y", F, (2, 4))]))
    assert cp.report.launches[0]["cores"] == 1
    big = compiled(conv_bn_relu(c_in=64, c_out=64, hw=56))
    assert big.report.launches[0]["cores"] == NPU_M.cores


def test_core_split_follows_the_cost_model_not_the_outer_rows():
    # One outer row of 64 Ki elements: the vector unit splits elements, so Softmax gains from a
    # second core (the cost model's split, which the device prices the launch with).
    x = (1, 1 << 16)
    cp = compiled(model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", F, x)],
                        [("y", F, x)], opset=13))
    (entry,) = cp.report.launches
    assert entry["cores"] > 1
    assert entry["cycles"] < entry["cycles_one_core"]


def test_independent_branches_run_on_disjoint_cores():
    # Two 1x1 convs of x, each with 2 * array_rows output pixels (two row folds of the array),
    # 64 output channels (one column fold) and a 16-step reduction (too short for a K split to
    # pay against the array's skew): the cost model gains nothing past 2 cores. Both are ready
    # at once: list scheduling gives them disjoint cores of the 4. (They join in a Sub: an Add
    # would run in the second Conv's epilogue, making it wait for the first.)
    width = NPU_M.array_rows
    r = np.random.default_rng(0)
    w1, w2 = (r.normal(size=(64, 16, 1, 1)).astype(np.float32) for _ in range(2))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]),
             helper.make_node("Conv", ["x", "w2"], ["b"]),
             helper.make_node("Sub", ["a", "b"], ["y"])]
    m = model(nodes, [("x", F, (1, 16, 2, width))], [("y", F, (1, 64, 2, width))],
              {"w1": w1, "w2": w2})
    launches = compiled(m).report.launches
    conv_a, conv_b = launches[0], launches[1]
    assert conv_a["cores"] == conv_b["cores"] == 2
    assert conv_a["split"] == conv_b["split"] == "M"
    assert conv_a["core_mask"] & conv_b["core_mask"] == 0


def test_views_alias_their_input():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Identity", ["f"], ["y"])]
    m = model(nodes, [("x", F, (2, 3, 4))], [("y", F, (2, 12))])
    cp = compiled(m)
    p = cp.program
    assert [launch.op for launch in p.launches] == ["Relu"]
    assert cp.report.views_aliased == 2
    by_name = {t.name: t for t in p.tensors}
    assert by_name["y"].offset == by_name["r"].offset
    x = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(replay(p, [x])[0], np.maximum(x, 0).reshape(2, 12))


def test_symbolic_dimension_is_an_error_naming_the_tensor():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    m = model(nodes, [("x", F, ("batch", 4))], [("y", F, ("batch", 4))])
    with pytest.raises(errors.Fail, match="'x'.*'batch'"):
        compiled(m)
    cp = compile_partition(as_fused(m), NPU_M, dim_overrides={"batch": 3})
    assert cp.program.input_descs()[0].shape == (3, 4)


def test_graph_input_reused_only_after_its_readers():
    m = _branches_with_reuse()
    p = compiled(m).program
    x_desc = p.input_descs()[0]
    cmds = [c for c in unpack(p.commands) if isinstance(c, Kernel)]
    readers = {c.cmd_id for c in cmds if 0 in p.launches[c.launch].inputs}
    for c in cmds:
        launch = p.launches[c.launch]
        for t in launch.outputs:
            d = p.tensors[t]
            if d.offset == x_desc.offset and c.cmd_id not in readers:
                assert readers <= set(c.deps) | {c.cmd_id}


def test_subgraph_import_keeps_opset_for_softmax():
    nodes = [helper.make_node("Softmax", ["x"], ["y"])]
    m = model(nodes, [("x", F, (2, 3, 4))], [("y", F, (2, 3, 4))], opset=11)
    fused = as_fused(m)
    g = SubGraph.from_fused(fused.graph, fused.opset_imports)
    assert g.nodes[0].attrs["_opset"] == 11
    assert isinstance(onnx.helper.make_opsetid("", 11), onnx.OperatorSetIdProto)


def _launch_cost(cp, i, config=NPU_M):
    """What the cost model prices launch ``i`` of ``cp`` at, on the cores the compiler chose."""
    program, entry = cp.program, cp.report.launches[i]
    launch = program.launches[i]
    spec = [dtypes.TensorSpec(t.shape, t.dtype) for t in program.tensors]
    ins = [spec[t] if t >= 0 else None for t in launch.inputs]
    return op_cost(config, launch.op, ins, [spec[t] for t in launch.outputs], launch.attrs,
                   entry["cores"])


def test_the_reported_tiles_are_the_ones_the_cycles_were_priced_with():
    r = np.random.default_rng(0)
    w = r.normal(size=(16, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["t"]),
             helper.make_node("Relu", ["t"], ["y"])]
    m = model(nodes, [("x", F, (1, 16, 8, 8))], [("y", F, (1, 4, 10, 10))], {"w": w})
    for graph in (m, conv_bn_relu(c_in=16, c_out=32, hw=20), matmul_add(m=64, k=256, n=128)):
        cp = compiled(graph)
        for i, entry in enumerate(cp.report.launches):
            cost = _launch_cost(cp, i)
            assert entry["tile"] == dict(cost.tile) and entry["sram_bytes"] == cost.sram_bytes
            assert (entry["cycles"], entry["split"]) == (cost.total_cycles, cost.split)
    # ConvTranspose's GEMM: 64 input pixels x (4 channels x 3x3 kernel) over 16 channels.
    convt = compiled(m).report.launches[0]
    assert convt["op"] == "ConvTranspose"
    assert convt["tile"]["k"] <= 16 and convt["tile"]["n"] <= 36 and convt["tile"]["m"] <= 64


def test_a_transformer_projection_splits_its_columns_over_every_core():
    # GPT-2 small's QKV projection at 128 tokens, float32: 128 rows are two row folds of the
    # 64-row array (a row split gains 2x at most); 2304 columns split four ways.
    cp = compiled(matmul_add(m=128, k=768, n=2304))
    (entry,) = cp.report.launches
    assert (entry["op"], entry["cores"], entry["split"]) == ("Gemm", NPU_M.cores, "N")
    assert entry["cycles"] < entry["cycles_one_core"] / 3
