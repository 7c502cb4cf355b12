"""Splitting a GEMM over cores along M, N or K, and the SRAM tiling the cost model reports.

Expected values are worked out by hand from the formulas in ``docs/cost_model.md``.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from npu_sim import DeviceConfig, TensorSpec
from npu_sim.config import PRESETS
from npu_sim.cost import op_cost
from npu_sim.cost.systolic import ACC_BYTES

# A 4-core os32 (32x32 arrays, stationary load exposed, 32 lanes) with HBM fast enough that
# compute decides.
OS32X4 = DeviceConfig.preset("os32").replace(cores=4, hbm_gbps=4096.0)
CONFIGS = [DeviceConfig.preset(p) for p in sorted(PRESETS)]


def matmul(config, m, k, n, dtype="float16", cores=None):
    a, b, y = TensorSpec((m, k), dtype), TensorSpec((k, n), dtype), TensorSpec((m, n), dtype)
    return op_cost(config, "MatMul", [a, b], [y], {}, cores)


def test_column_split_by_hand():
    # 32x100 @ 100x128: one row fold, so splitting rows gains nothing; four column folds, one
    # per core: a single fold of 100 + 62 cycles, less the exposed count's last cycle.
    cost = matmul(OS32X4, 32, 100, 128)
    assert (cost.engine, cost.split, cost.cores) == ("array", "N", 4)
    assert cost.compute_cycles == 100 + 62 - 1
    # Each core fetches only its quarter of B; A is broadcast: every byte crosses HBM once.
    assert cost.hbm_bytes == 2 * (32 * 100 + 100 * 128 + 32 * 128)
    assert dict(cost.tile)["n"] <= 128 // 4


def test_reduction_split_by_hand():
    # 32x4096 @ 4096x32: one fold of outputs; each core reduces 1024 steps (1024 + 62 - 1
    # cycles), then the 4 partial sums of the 32x32 outputs are added: each core adds 3
    # partials into its 256 outputs, 768 lane-operations over 32 lanes = 24 cycles.
    cost = matmul(OS32X4, 32, 4096, 32)
    assert (cost.engine, cost.split, cost.cores) == ("array", "K", 4)
    assert cost.compute_cycles == (1024 + 62 - 1) + 24
    partials = 2 * 3 * 32 * 32 * ACC_BYTES  # written by 3 cores, read back once
    assert cost.hbm_bytes == 2 * (32 * 4096 + 4096 * 32 + 32 * 32) + partials
    assert "reduction split over 4 cores" in cost.notes


def test_decode_step_splits_columns():
    # M = 1 (a decode step): rows cannot split; 128 columns over 4 cores run on the vector
    # units, 512 * 32 MACs per core over 32 lanes = 512 cycles.
    cost = matmul(OS32X4, 1, 512, 128)
    assert (cost.split, cost.cores, cost.compute_cycles) == ("N", 4, 512)
    assert matmul(OS32X4, 1, 512, 128, cores=1).compute_cycles == 4 * 512


def test_one_core_is_the_row_schedule():
    cost = matmul(OS32X4, 100, 300, 70, cores=1)
    assert (cost.split, cost.cores) == ("M", 1)


@given(config=st.sampled_from(CONFIGS), m=st.integers(1, 2048), k=st.integers(1, 2048),
       n=st.integers(1, 2048), dtype=st.sampled_from(("int8", "float16", "float32")),
       cores=st.integers(1, 8))
def test_the_priced_tile_fits_sram_and_the_split(config, m, k, n, dtype, cores):
    cores = min(cores, config.cores)
    a, b = TensorSpec((m, k), dtype), TensorSpec((k, n), dtype)
    out = TensorSpec((m, n), "int32" if dtype == "int8" else dtype)
    cost = op_cost(config, "MatMulInteger" if dtype == "int8" else "MatMul", [a, b], [out], {},
                   cores)
    tile = dict(cost.tile)
    assert cost.sram_bytes <= config.sram_bytes_per_core
    per_core = {"M": (-(-m // cost.cores), n, k), "N": (m, -(-n // cost.cores), k),
                "K": (m, n, -(-k // cost.cores))}[cost.split]
    assert all(t <= p for t, p in zip((tile["m"], tile["n"], tile["k"]), per_core, strict=True))


def test_conv_transpose_tiles_its_own_gemm():
    # ConvTranspose as col2im: rows = input pixels (1*8*8), cols = M/group * kernel (4*3*3),
    # reduction = C/group (16). B (the float32 weights, 2304 bytes) fits and stays resident;
    # two tiles of A stream beside it, and a 32-bit accumulator tile.
    x, w = TensorSpec((1, 16, 8, 8)), TensorSpec((16, 4, 3, 3))
    y = TensorSpec((1, 4, 10, 10))
    cost = op_cost(OS32X4, "ConvTranspose", [x, w], [y], {}, 1)
    assert dict(cost.tile) == {"m": 64, "n": 36, "k": 16}
    assert cost.sram_bytes == 16 * 36 * 4 + 2 * 64 * 16 * 4 + 64 * 36 * ACC_BYTES
