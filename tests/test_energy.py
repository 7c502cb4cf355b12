"""Energy: per-action energies in the config, energy per launch, per DMA chunk and per run."""

import json
import math
import pickle

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from onnx import TensorProto, helper

import ep
from ep.npusim.runtime import combine_stats, run_energy
from npu_sim import Device, DeviceConfig, TensorSpec
from npu_sim.config import ENERGY_FIELDS, HOROWITZ_45NM_PJ, PRESETS, scaled_energy
from npu_sim.cost import op_cost
from npu_sim.cost.energy import DYNAMIC, array_sram_bytes
from npu_sim.errors import ConfigError

NPU_M = DeviceConfig.preset("npu-m")
OS32 = DeviceConfig.preset("os32")
CONFIGS = [DeviceConfig.preset(p) for p in sorted(PRESETS)]


def gemm(config, m, k, n, dtype, cores=1):
    """A MatMul launch; int8 is QLinearMatMul (int8 in and out, scalar scales and zero points)."""
    a, b, y = TensorSpec((m, k), dtype), TensorSpec((k, n), dtype), TensorSpec((m, n), dtype)
    if dtype == "int8":
        scale, zero = TensorSpec((), "float32"), TensorSpec((), "int8")
        return op_cost(config, "QLinearMatMul", [a, scale, zero, b, scale, zero, scale, zero],
                       [y], {}, cores)
    return op_cost(config, "MatMul", [a, b], [y], {}, cores)


# -- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ENERGY_FIELDS)
@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "1.0", True, 2e6])
def test_energy_fields_are_validated(field, bad):
    with pytest.raises(ConfigError) as info:
        NPU_M.replace(**{field: bad})
    assert info.value.field == field and info.value.valid == "a number in [0.0, 1000000.0]"
    assert field in str(info.value)


def test_a_config_file_from_before_energy_loads_with_the_defaults(tmp_path):
    old = {k: v for k, v in NPU_M.to_dict().items() if k not in ENERGY_FIELDS}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert DeviceConfig.from_file(tmp_path / "old.json") == NPU_M
    (tmp_path / "old.toml").write_text('preset = "npu-l"\nhbm_gbps = 2000.0\n')
    loaded = DeviceConfig.from_file(tmp_path / "old.toml")
    assert loaded.hbm_pj_per_byte == DeviceConfig.preset("npu-l").hbm_pj_per_byte


def test_defaults_scale_horowitz_by_node_and_voltage():
    # os32 is Horowitz's own node (45 nm, 0.9 V): the figures unscaled.
    assert OS32.int8_mac_pj == pytest.approx(0.3) and OS32.float32_mac_pj == pytest.approx(4.6)
    assert OS32.sram_read_pj_per_byte == pytest.approx(2.5)
    # npu-m is 16 nm at 0.8 V: (16/45) * (0.8/0.9)**2 of each on-chip figure.
    scale = (16 / 45) * (0.8 / 0.9) ** 2
    for name, at45 in HOROWITZ_45NM_PJ.items():
        assert getattr(NPU_M, name) == pytest.approx(at45 * scale, rel=1e-3)
    assert NPU_M.leakage_pj_per_core_cycle == pytest.approx(0.1 * 64 * 64 * NPU_M.float16_mac_pj,
                                                            rel=1e-3)
    same = scaled_energy(45, 0.9, pes=1, dram_pj_per_byte=1.0, host_link_pj_per_byte=2.0)
    assert (same["hbm_pj_per_byte"], same["host_link_pj_per_byte"]) == (1.0, 2.0)


def test_mac_energy_by_dtype():
    assert NPU_M.mac_pj("uint8") == NPU_M.mac_pj("int8") < NPU_M.mac_pj("float16")
    assert NPU_M.mac_pj("float16") < NPU_M.mac_pj("float32") == NPU_M.mac_pj("float64")
    assert NPU_M.mac_pj("bool") == NPU_M.mac_pj("int8")
    assert NPU_M.mac_pj("int64") == NPU_M.mac_pj("float32")


# -- one launch ----------------------------------------------------------------------------------


def test_gemm_energy_by_hand_on_os32():
    # float16 A[64,100] @ B[100,64] on os32 (output-stationary 32x32): 409 600 MACs at 1.5 pJ;
    # the array reads A once per column fold (2) and B once per row fold (2); 33 792 bytes
    # cross HBM (A + B in, C out), written to / read from SRAM on the way.
    cost = gemm(OS32, 64, 100, 64, "float16")
    a = b = 64 * 100 * 2
    c = 64 * 64 * 2
    assert array_sram_bytes(OS32, 64, 64, 100, 2, 2, 2) == (2 * a + 2 * b, c)
    e = cost.energy
    assert e["array"] == pytest.approx(409_600 * 1.5)
    assert e["vector"] == 0
    assert e["hbm"] == pytest.approx((a + b + c) * 162.5)
    assert e["sram_read"] == pytest.approx((2 * a + 2 * b + c) * 2.5)
    assert e["sram_write"] == pytest.approx((c + a + b) * 2.5)
    assert e["leakage"] == pytest.approx(cost.total_cycles * 153.6)
    assert cost.energy_pj == pytest.approx(math.fsum(e.values()))
    assert cost.dynamic_energy_pj == pytest.approx(cost.energy_pj - e["leakage"])


def test_dataflow_changes_what_the_array_reads():
    # Weight-stationary reads B once and streams A per column fold; partial sums of the 4
    # reduction folds go back to SRAM 3 times.
    ws = OS32.replace(dataflow="ws")
    read, written = array_sram_bytes(ws, 64, 64, 100, 2, 2, 2)
    partial = 64 * 64 * 4 * 3
    assert (read, written) == (64 * 100 * 2 + 2 * 64 * 100 * 2 + partial, 64 * 64 * 2 + partial)


def test_int8_beats_float16_beats_float32_for_the_same_gemm():
    for config in CONFIGS:
        e = [gemm(config, 256, 512, 256, d).energy for d in ("int8", "float16", "float32")]
        for lo, hi in zip(e, e[1:], strict=False):
            assert lo["array"] < hi["array"]
            assert math.fsum(lo.values()) < math.fsum(hi.values())


@given(config=st.sampled_from(CONFIGS), m=st.integers(8, 300), k=st.integers(8, 300),
       n=st.integers(8, 300))
def test_narrower_dtypes_take_less_energy(config, m, k, n):
    # From 8 up the operands outweigh QLinearMatMul's scalar scales and zero points.
    e8, e16, e32 = (gemm(config, m, k, n, d).dynamic_energy_pj
                    for d in ("int8", "float16", "float32"))
    assert e8 < e16 < e32


@given(config=st.sampled_from(CONFIGS), m=st.integers(1, 200), k=st.integers(1, 200),
       n=st.integers(1, 200), dm=st.integers(0, 100), dk=st.integers(0, 100),
       dn=st.integers(0, 100), dtype=st.sampled_from(("int8", "float16", "float32")))
def test_more_work_never_takes_less_energy(config, m, k, n, dm, dk, dn, dtype):
    small, big = gemm(config, m, k, n, dtype), gemm(config, m + dm, k + dk, n + dn, dtype)
    # The MACs cost the same on the array or the vector units; bytes and leakage follow the
    # schedule, which may change with the shape, so the monotone figures are the sums.
    macs = [c.energy["array"] + c.energy["vector"] for c in (small, big)]
    assert macs[0] <= macs[1] + 1e-9
    assert small.dynamic_energy_pj <= big.dynamic_energy_pj + 1e-9
    assert small.energy_pj <= big.energy_pj + 1e-9


@given(config=st.sampled_from(CONFIGS), size=st.integers(1, 1 << 16), extra=st.integers(0, 4096))
def test_vector_energy_grows_with_the_elements(config, size, extra):
    def relu(elements):
        x = TensorSpec((elements,), "float32")
        return op_cost(config, "Exp", [x], [x], {}, 1)

    small, big = relu(size), relu(size + extra)
    assert small.energy["vector"] == pytest.approx(size * 4 * config.float32_mac_pj)
    assert small.dynamic_energy_pj <= big.dynamic_energy_pj


def test_a_view_has_no_dynamic_energy():
    x, y = TensorSpec((4, 256), "float16"), TensorSpec((1024,), "float16")
    cost = op_cost(NPU_M, "Reshape", [x, TensorSpec((1,), "int64")], [y], {})
    assert cost.dynamic_energy_pj == 0
    assert cost.energy["leakage"] == pytest.approx(cost.total_cycles
                                                   * NPU_M.leakage_pj_per_core_cycle)


def test_the_compiler_launches_no_view():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Relu", ["f"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ep.InferenceSession(model.SerializeToString(),
                                  providers=["NpuSimExecutionProvider"])
    session.run(None, {"x": np.ones((2, 3, 4), np.float32)})
    stats = session.get_run_stats()["NpuSimExecutionProvider"]
    assert stats["counters"]["compute.kernels"] == 2  # the two Relus; Flatten is an alias


# -- launches and transfers on a device ----------------------------------------------------------


def test_launch_energy_lands_in_the_trace_and_adds_up_in_the_counters():
    dev = Device("npu-m")
    a, b = TensorSpec((128, 256), "float16"), TensorSpec((256, 64), "float16")
    c, r = TensorSpec((128, 64), "float16"), TensorSpec((128, 64), "float16")
    buf = {name: dev.malloc(spec.nbytes) for name, spec in zip("abcr", (a, b, c, r), strict=True)}
    first = dev.compute.execute("MatMul", [(buf["a"].address, a), (buf["b"].address, b)],
                                [(buf["c"].address, c)], {}, cores=[0, 1], functional=False)
    dev.compute.execute("Relu", [(buf["c"].address, c)], [(buf["r"].address, r)], {},
                        cores=[2], functional=False, deps=[first])
    dev.synchronize()
    costs = [op_cost(NPU_M, "MatMul", [a, b], [c], {}, 2), op_cost(NPU_M, "Relu", [c], [r], {}, 1)]
    records = dev.trace.records
    for record, cost in zip(records, costs, strict=True):
        assert record.work["energy"] == pytest.approx(dict(cost.energy))
    s = dev.stats()
    for name in DYNAMIC:
        assert s[f"compute.energy_fj.{name}"] / 1000 == pytest.approx(
            math.fsum(cost.energy[name] for cost in costs))
    assert s["core.0.energy_fj"] == s["core.1.energy_fj"]
    assert s["core.0.energy_fj"] / 1000 == pytest.approx(
        costs[0].dynamic_energy_pj / 2)
    assert s["core.2.energy_fj"] / 1000 == pytest.approx(costs[1].dynamic_energy_pj)
    assert s["core.3.energy_fj"] / 1000 == 0


@example(shapes=[(1, 1, 3, 1)]).via("a few hundred pJ: the rounding above 1e-6 relative")
@example(shapes=[(1, 1, 1, 2)]).via("a share per core rounded")
@given(shapes=st.lists(st.tuples(st.integers(1, 96), st.integers(1, 96), st.integers(1, 96),
                                 st.integers(1, 4)), min_size=1, max_size=4))
def test_device_energy_is_the_sum_of_its_launches(shapes):
    dev = Device("npu-m")
    costs = []
    for m, k, n, cores in shapes:
        a, b, c = TensorSpec((m, k), "float16"), TensorSpec((k, n), "float16"), \
            TensorSpec((m, n), "float16")
        bufs = [dev.malloc(s.nbytes) for s in (a, b, c)]
        dev.compute.execute("MatMul", [(bufs[0].address, a), (bufs[1].address, b)],
                            [(bufs[2].address, c)], {}, cores=list(range(cores)),
                            functional=False)
        costs.append(op_cost(NPU_M, "MatMul", [a, b], [c], {}, cores))
    dev.synchronize()
    s = dev.stats()
    # The counters are whole femtojoules (npu_sim.cost.energy.femtojoules): each launch rounds
    # each component, and each of its cores' shares, once, by at most 0.5 fJ (a small launch's
    # few hundred pJ then differ from the exact sum by more than approx's default 1e-6).
    exact_fj = math.fsum(c.dynamic_energy_pj for c in costs) * 1000
    components = sum(s[f"compute.energy_fj.{name}"] for name in DYNAMIC)
    shares = sum(s[f"core.{i}.energy_fj"] for i in range(NPU_M.cores))
    slack = 1e-9 * exact_fj  # the float sums' own error
    assert abs(components - exact_fj) <= 0.5 * len(DYNAMIC) * len(shapes) + slack
    assert abs(shares - exact_fj) <= 0.5 * sum(cores for *_, cores in shapes) + slack


def test_dma_energy_by_hand():
    dev = Device("npu-m")
    x = np.zeros(3 * 1024 * 1024, np.uint8)
    buf = dev.malloc(x.nbytes)
    other = dev.malloc(x.nbytes)
    dev.memcpy_h2d_async(buf, x)
    dev.synchronize()
    dev.memcpy_d2d_async(other, buf, x.nbytes)
    dev.synchronize()
    n = x.nbytes
    s = dev.stats()
    assert s["dma.energy_fj.dma"] / 1000 == pytest.approx(2 * n * NPU_M.dma_pj_per_byte)
    assert s["dma.energy_fj.host_link"] / 1000 == pytest.approx(
        n * NPU_M.host_link_pj_per_byte)
    assert s["dma.energy_fj.hbm"] / 1000 == pytest.approx(3 * n * NPU_M.hbm_pj_per_byte)
    total = math.fsum(math.fsum(r.work["energy"].values()) for r in dev.trace.records)
    per_channel = math.fsum(s[f"dma.{ch}.energy_fj"] for ch in range(NPU_M.dma_channels)) / 1000
    assert total == pytest.approx(per_channel)


# -- a run ---------------------------------------------------------------------------------------


def _mlp() -> bytes:
    rng = np.random.default_rng(0)
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [64, 128],
                            rng.normal(size=64 * 128).astype(np.float32))
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [128, 10],
                            rng.normal(size=128 * 10).astype(np.float32))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 10])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_run_energy_adds_up_over_launches_transfers_and_engines():
    session = ep.InferenceSession(_mlp(), providers=["NpuSimExecutionProvider"])
    session.run(None, {"x": np.ones((32, 64), np.float32)})
    stats = session.get_run_stats()["NpuSimExecutionProvider"]
    energy = stats["energy"]
    records = session._providers[0].runtime.device.trace.records
    traced = math.fsum(v for r in records if "energy" in r.work
                       for k, v in r.work["energy"].items() if k != "leakage")
    assert energy["dynamic_pj"] == pytest.approx(traced)
    assert energy["static_pj"] == pytest.approx(
        NPU_M.cores * stats["cycles"] * NPU_M.leakage_pj_per_core_cycle)
    assert energy["total_pj"] == pytest.approx(math.fsum(energy["by_engine"].values()))
    assert energy["total_pj"] == pytest.approx(math.fsum(energy["by_component"].values()))
    seconds = stats["cycles"] / (NPU_M.clock_ghz * 1e9)
    assert energy["average_power_w"] == pytest.approx(energy["total_pj"] * 1e-12 / seconds)
    assert energy["tops_per_w"] == pytest.approx(
        2 * stats["counters"]["compute.macs"] / energy["total_pj"])


def test_run_energy_is_additive_over_partitions():
    def counters(scale):
        return {"compute.macs": 1000 * scale, "compute.energy_fj.array": 10_000 * scale,
                "dma.energy_fj.hbm": 5_000 * scale, "core.0.energy_fj": 10_000 * scale,
                "dma.0.energy_fj": 5_000 * scale}

    runs = {"a": {"cycles": 100, "counters": counters(1)},
            "b": {"cycles": 300, "counters": counters(2)}}
    whole = combine_stats(runs, NPU_M)["energy"]
    parts = [run_energy(NPU_M, r["cycles"], r["counters"]) for r in runs.values()]
    for key in ("total_pj", "dynamic_pj", "static_pj"):
        assert whole[key] == pytest.approx(sum(p[key] for p in parts))


def test_a_cost_is_read_only_and_pickles():
    cost = gemm(NPU_M, 64, 64, 64, "float16")
    with pytest.raises(TypeError):
        cost.energy["array"] = 0.0  # shared through the cache: must not change
    again = pickle.loads(pickle.dumps(cost))
    assert again == cost and dict(again.energy) == dict(cost.energy)
