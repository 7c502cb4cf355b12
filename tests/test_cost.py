"""The cycle cost model: systolic formulas, roofline bounds, monotonicity, refetch, multi-core.

Expected values here are derived by hand or from an independent statement of the formula, never
copied from the model's output.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim import DeviceConfig, TensorSpec
from npu_sim.config import DATAFLOWS, PRESETS
from npu_sim.cost import KNOWN_OPS, Cost, conv_cycles, gemm_cycles, op_cost
from npu_sim.errors import ConfigError, KernelError

OS32 = DeviceConfig.preset("os32")
CONFIGS = [DeviceConfig.preset(p).replace(dataflow=d) for p in PRESETS for d in DATAFLOWS]
MULTI = [DeviceConfig.preset(p) for p in PRESETS if PRESETS[p]["cores"] > 1]
FLOAT_DTYPES = ("float16", "bfloat16", "float32")

configs = st.sampled_from(CONFIGS)
dims = st.integers(1, 300)
sizes = st.integers(0, 300)
small = st.integers(1, 64)


def matmul(config, m, k, n, dtype="float16", batch=(), cores=None) -> Cost:
    """A MatMul launch; int8 goes through MatMulInteger (int32 output) as ONNX requires."""
    a, b = TensorSpec((*batch, m, k), dtype), TensorSpec((k, n), dtype)
    if dtype == "int8":
        return op_cost(config, "MatMulInteger", [a, b], [TensorSpec((*batch, m, n), "int32")],
                       {}, cores)
    return op_cost(config, "MatMul", [a, b], [TensorSpec((*batch, m, n), dtype)], {}, cores)


def conv(config, n, c, h, m, k, stride=1, pad=0, group=1, dtype="float16", cores=None) -> Cost:
    oh = (h + 2 * pad - k) // stride + 1
    return op_cost(
        config, "Conv",
        [TensorSpec((n, c, h, h), dtype), TensorSpec((m, c // group, k, k), dtype)],
        [TensorSpec((n, m, oh, oh), dtype)],
        {"strides": [stride, stride], "pads": [pad] * 4, "group": group}, cores,
    )


def io_bytes(m, k, n, dtype, batch=1) -> int:
    size = 1 if dtype == "int8" else {"float16": 2, "bfloat16": 2, "float32": 4}[dtype]
    out = 4 if dtype == "int8" else size
    return batch * (m * k * size + m * n * out) + k * n * size


# -- the systolic formulas --------------------------------------------------------------------


@given(m=st.integers(0, 2000), n=st.integers(0, 2000), k=st.integers(0, 2000),
       dtype=st.sampled_from(("int8", "uint8", *FLOAT_DTYPES)))
def test_os32_reproduces_scalesim_formula(m, n, k, dtype):
    # os32 exposes the stationary load: SCALE-Sim's count, to the last busy cycle (- 1).
    expected = math.ceil(m / 32) * math.ceil(n / 32) * (k + 62) - 1 if m and n and k else 0
    assert gemm_cycles(OS32, m, n, k, dtype) == expected


@given(n=st.integers(1, 3), c=st.integers(1, 8), h=st.integers(3, 40), m=st.integers(1, 8),
       kern=st.integers(1, 3), stride=st.integers(1, 3), pad=st.integers(0, 2),
       gsel=st.integers(0, 2))
def test_conv_cycles_is_the_gemm_mapping(n, c, h, m, kern, stride, pad, gsel):
    groups = [1, math.gcd(c, m), c][gsel] if gsel < 2 or c == m else 1
    oh = (h + 2 * pad - kern) // stride + 1
    per_group = (math.ceil(n * oh * oh / 32) * math.ceil((m // groups) / 32)
                 * (kern * kern * c // groups + 62)) - 1
    assert conv_cycles(OS32, n, c, h, h, m, kern, kern, stride, pad, groups) == groups * per_group
    if groups == 1:  # op_cost on the single os32 core prices exactly that compute...
        cost = conv(OS32, n, c, h, m, kern, stride, pad)
        if cost.engine == "array":
            assert cost.compute_cycles == per_group
        else:  # ...unless the 32 vector lanes beat the folds (same traffic, so less compute)
            assert cost.compute_cycles == math.ceil(cost.macs / 32) < per_group


def test_weight_and_input_stationary_by_hand():
    # 4x4 array, M=10, N=6, K=9. WS: ceil(9/4)=3 * ceil(6/4)=2 folds of 10+4+4-2 = 16 -> 96.
    # IS: ceil(9/4)=3 * ceil(10/4)=3 folds of 6+6 = 12 -> 108.
    base = OS32.replace(array_rows=4, array_cols=4, stationary_load="hidden")
    assert gemm_cycles(base.replace(dataflow="ws"), 10, 6, 9) == 96
    assert gemm_cycles(base.replace(dataflow="is"), 10, 6, 9) == 108
    assert gemm_cycles(base, 10, 6, 9) == 3 * 2 * (9 + 6)
    # Exposed (SCALE-Sim): each WS/IS fold also shifts its R = 4 stationary rows in, and the
    # count ends one cycle earlier: WS 6 folds of 10+8+4-2 = 20 -> 119, IS 9 of 16 -> 143.
    exposed = base.replace(stationary_load="exposed")
    assert gemm_cycles(exposed.replace(dataflow="ws"), 10, 6, 9) == 6 * 20 - 1
    assert gemm_cycles(exposed.replace(dataflow="is"), 10, 6, 9) == 9 * 16 - 1
    assert gemm_cycles(exposed, 10, 6, 9) == 3 * 2 * (9 + 6) - 1


@given(config=configs, m=dims, n=dims, k=dims)
def test_input_stationary_is_weight_stationary_of_the_transpose(config, m, n, k):
    # C^T = B^T A^T: IS on (m, n) holds what WS holds on (n, m).
    assert (gemm_cycles(config.replace(dataflow="is"), m, n, k)
            == gemm_cycles(config.replace(dataflow="ws"), n, m, k))


@given(m=dims, n=dims, k=st.integers(1, 3000))
def test_int8_rate_packs_the_reduction(m, n, k):
    # npu-m (os) does 4 int8 MACs per PE per cycle: the streamed K shrinks to ceil(K/4).
    npu_m = DeviceConfig.preset("npu-m")
    assert gemm_cycles(npu_m, m, n, k, "int8") == gemm_cycles(npu_m, m, n, -(-k // 4), "float16")
    assert gemm_cycles(npu_m, m, n, k, "float32") == gemm_cycles(npu_m, m, n, 4 * k, "float16")


# -- bounds and monotonicity ------------------------------------------------------------------


@given(config=configs, m=dims, n=dims, k=dims, batch=st.integers(1, 4),
       dtype=st.sampled_from(("int8", *FLOAT_DTYPES)))
def test_gemm_never_beats_the_roofline(config, m, n, k, batch, dtype):
    cost = matmul(config, m, k, n, dtype, batch=(batch,))
    macs = batch * m * n * k
    assert cost.macs == macs
    assert gemm_cycles(config, m, n, k, dtype) >= macs / batch / config.peak_macs_per_cycle(
        dtype, 1)
    bound = max(macs / config.peak_macs_per_cycle(dtype),
                io_bytes(m, k, n, dtype, batch) / config.hbm_bytes_per_cycle)
    assert cost.total_cycles >= bound
    assert cost.hbm_bytes >= io_bytes(m, k, n, dtype, batch)
    assert cost.total_cycles == max(cost.compute_cycles, cost.memory_cycles) + cost.overhead_cycles


@given(config=configs, n=st.integers(1, 4), c=small, h=st.integers(1, 40), m=small,
       kern=st.sampled_from((1, 3, 5)), stride=st.integers(1, 2),
       dtype=st.sampled_from(FLOAT_DTYPES), depthwise=st.booleans())
def test_conv_never_beats_the_roofline(config, n, c, h, m, kern, stride, dtype, depthwise):
    m, group = (c, c) if depthwise else (m, 1)
    pad = kern // 2
    cost = conv(config, n, c, h, m, kern, stride, pad, group, dtype)
    oh = (h + 2 * pad - kern) // stride + 1
    macs = n * oh * oh * m * (c // group) * kern * kern
    item = {"float16": 2, "bfloat16": 2, "float32": 4}[dtype]
    nbytes = item * (n * c * h * h + m * (c // group) * kern * kern + n * m * oh * oh)
    assert cost.macs == macs
    assert cost.total_cycles >= max(macs / config.peak_macs_per_cycle(dtype),
                                    nbytes / config.hbm_bytes_per_cycle)


@given(config=configs, m=dims, n=dims, k=dims, dm=st.integers(0, 200), dn=st.integers(0, 200),
       dk=st.integers(0, 200), dtype=st.sampled_from(("int8", *FLOAT_DTYPES)))
def test_more_gemm_work_never_takes_fewer_cycles(config, m, n, k, dm, dn, dk, dtype):
    assert gemm_cycles(config, m + dm, n + dn, k + dk, dtype) >= gemm_cycles(config, m, n, k, dtype)
    small_op = matmul(config, m, k, n, dtype)
    for bigger in ((m + dm, k, n), (m, k + dk, n), (m, k, n + dn), (m + dm, k + dk, n + dn)):
        assert matmul(config, *bigger, dtype).total_cycles >= small_op.total_cycles


@given(config=configs, m=small, k=small, n=small, batch=st.integers(1, 8), db=st.integers(0, 8))
def test_more_batch_never_takes_fewer_cycles(config, m, k, n, batch, db):
    # Batched B (attention-style) runs `batch` separate GEMMs.
    def bmm(b):
        return op_cost(config, "MatMul", [TensorSpec((b, m, k)), TensorSpec((b, k, n))],
                       [TensorSpec((b, m, n))], {})
    assert bmm(batch + db).total_cycles >= bmm(batch).total_cycles
    assert (matmul(config, m, k, n, "float32", (batch + db,)).total_cycles
            >= matmul(config, m, k, n, "float32", (batch,)).total_cycles)


@given(config=configs, n=st.integers(1, 3), c=small, h=st.integers(3, 30), m=small,
       dn=st.integers(0, 3), dc=st.integers(0, 40), dm=st.integers(0, 40))
def test_more_conv_work_never_takes_fewer_cycles(config, n, c, h, m, dn, dc, dm):
    base = conv(config, n, c, h, m, 3, pad=1).total_cycles
    assert conv(config, n + dn, c, h, m, 3, pad=1).total_cycles >= base
    assert conv(config, n, c + dc, h, m, 3, pad=1).total_cycles >= base
    assert conv(config, n, c, h, m + dm, 3, pad=1).total_cycles >= base
    # depthwise: channels grow together
    assert (conv(config, n, c + dc, h, c + dc, 3, pad=1, group=c + dc).total_cycles
            >= conv(config, n, c, h, c, 3, pad=1, group=c).total_cycles)


@settings(max_examples=30)
@given(preset=st.sampled_from(list(PRESETS)), dataflow=st.sampled_from(DATAFLOWS),
       m=st.integers(8, 300), n=st.integers(8, 300), k=st.integers(8, 300))
def test_narrower_dtypes_are_faster_where_the_rates_say_so(preset, dataflow, m, n, k):
    config = DeviceConfig.preset(preset).replace(dataflow=dataflow)
    order = ["int8", "float16", "float32"]
    cycles = [gemm_cycles(config, m, n, k, d) for d in order]
    rates = [config.macs_per_pe(d) for d in order]
    for i in range(len(order) - 1):
        assert cycles[i] < cycles[i + 1] if rates[i] > rates[i + 1] else cycles[i] == cycles[i + 1]
    # Whole launches, with int8 output (QLinearMatMul) so only the rate and the operand widths
    # differ (MatMulInteger's int32 output is wider than float16's).
    a8, b8 = TensorSpec((m, k), "int8"), TensorSpec((k, n), "int8")
    sc, zp = TensorSpec(()), TensorSpec((), "int8")
    int8 = op_cost(config, "QLinearMatMul", [a8, sc, zp, b8, sc, zp, sc, zp],
                   [TensorSpec((m, n), "int8")], {})
    totals = [int8.total_cycles] + [matmul(config, m, k, n, d).total_cycles for d in order[1:]]
    assert totals == sorted(totals)


def test_int8_beats_float16_beats_float32_on_a_compute_bound_gemm():
    npu_m = DeviceConfig.preset("npu-m")
    totals = [matmul(npu_m, 1024, 1024, 1024, d).total_cycles
              for d in ("int8", "float16", "float32")]
    assert totals[0] < totals[1] < totals[2]


# -- memory: the worked example, refetch ------------------------------------------------------


def test_worked_example_on_os32():
    # docs/cost_model.md: float16 MatMul 64x100 @ 100x64 on os32 (1 GHz, 64 B/cycle, 100-cycle
    # HBM latency, no launch overhead).
    cost = matmul(OS32, 64, 100, 64)
    assert cost.compute_cycles == 2 * 2 * (100 + 62) - 1        # 647
    assert cost.hbm_bytes == 2 * (64 * 100 + 100 * 64 + 64 * 64)  # 33792
    assert cost.memory_cycles == 33792 // 64                     # 528
    # fill: latency + first fold (32x100 of A + 100x32 of B, 2 B each) / 64; drain: 32x32x2 / 64
    assert cost.overhead_cycles == 100 + (2 * 32 * 100 * 2) // 64 + (32 * 32 * 2) // 64  # 332
    assert cost.total_cycles == 647 + 332
    assert (cost.engine, cost.refetch, cost.cores, cost.notes) == ("array", 1.0, 1, "")
    # The doc's second example: 2048x1024 @ 1024x256 holds B in 2 blocks and streams A twice.
    big = matmul(OS32, 2048, 1024, 256)
    assert big.compute_cycles == 64 * 8 * (1024 + 62) - 1
    assert big.total_cycles == 64 * 8 * (1024 + 62) - 1 + 100 + (2 * 32 * 1024 * 2) // 64 + 32
    assert big.refetch == pytest.approx(9.5 / 5.5)
    # ...and the first-layer convolution: Sr = 1024, Sc = 16, T = 27.
    assert conv_cycles(OS32, 1, 3, 32, 32, 16, 3, 3, 1, 1) == 32 * 1 * (27 + 62) - 1


@given(m=st.integers(1, 2000), k=st.integers(1, 2000), n=st.integers(1, 2000))
def test_refetch_exactly_when_neither_operand_fits_half_the_sram(m, k, n):
    cost = matmul(OS32, m, k, n)  # 512 KiB SRAM: a 256 KiB buffer holds a resident block
    buf = OS32.sram_bytes_per_core // 2
    fits = min(2 * m * k, 2 * k * n) <= buf
    if fits:
        assert cost.refetch == 1.0 and "re-fetched" not in cost.notes
        assert cost.hbm_bytes == io_bytes(m, k, n, "float16")
    else:
        assert cost.refetch > 1.0 and "re-fetched" in cost.notes
        assert cost.hbm_bytes == pytest.approx(cost.refetch * io_bytes(m, k, n, "float16"))


def test_refetch_note_names_the_operand_and_the_sizes():
    cost = matmul(OS32, 2048, 1024, 256)  # A 4 MiB, B 512 KiB: hold B blocks, stream A twice
    assert cost.notes.startswith("A re-fetched 2x: B 512.0 KiB > SRAM buffer 256.0 KiB")
    assert cost.hbm_bytes == 2 * 1024 * 256 + 2 * (2 * 2048 * 1024) + 2 * 2048 * 256
    fits = matmul(OS32, 64, 64, 64)
    assert (fits.refetch, fits.notes, fits.engine) == (1.0, "", "array")


# -- multi-core -------------------------------------------------------------------------------


@given(config=st.sampled_from(MULTI), m=st.integers(1, 600), k=dims, n=dims,
       batch=st.integers(1, 3), dtype=st.sampled_from(("int8", "float16", "float32")))
def test_more_cores_never_slower_and_never_superlinear(config, m, k, n, batch, dtype):
    one = matmul(config, m, k, n, dtype, (batch,), cores=1)
    for cores in range(2, config.cores + 1):
        many = matmul(config, m, k, n, dtype, (batch,), cores=cores)
        assert one.total_cycles / cores <= many.total_cycles <= one.total_cycles
        assert many.cores <= cores


@given(config=st.sampled_from(MULTI), n=st.integers(1, 4), c=small, h=st.integers(3, 30),
       m=small, depthwise=st.booleans())
def test_conv_split_over_cores_is_bounded(config, n, c, h, m, depthwise):
    m, group = (c, c) if depthwise else (m, 1)
    one = conv(config, n, c, h, m, 3, pad=1, group=group, cores=1)
    for cores in range(2, config.cores + 1):
        many = conv(config, n, c, h, m, 3, pad=1, group=group, cores=cores)
        assert one.total_cycles / cores <= many.total_cycles <= one.total_cycles


@given(config=st.sampled_from(MULTI), shape=st.lists(st.integers(1, 64), min_size=1, max_size=4),
       op=st.sampled_from(("Add", "Exp", "Softmax", "ReduceSum", "Transpose")))
def test_vector_split_over_cores_is_bounded(config, shape, op):
    x = TensorSpec(tuple(shape))
    out = TensorSpec((1,)) if op == "ReduceSum" else x
    inputs = [x, x] if op == "Add" else [x]
    one = op_cost(config, op, inputs, [out], {}, cores=1)
    assert one.total_cycles >= (x.nbytes + out.nbytes) / config.hbm_bytes_per_cycle
    for cores in range(2, config.cores + 1):
        many = op_cost(config, op, inputs, [out], {}, cores=cores)
        assert one.total_cycles / cores <= many.total_cycles <= one.total_cycles


# A 4-core os32 (32x32 arrays, 32 lanes) with HBM fast enough that compute decides: the bounds
# tests above cannot pin how work is split, these numbers are worked out by hand.
OS32X4 = OS32.replace(cores=4, hbm_gbps=4096.0)


def test_row_split_by_hand():
    # 129x100 @ 100x64: each core takes ceil(129/4) = 33 rows -> ceil(33/32) = 2 row folds
    # (flooring to 32 rows would give 1) x ceil(64/32) = 2 column folds of 100 + 62 cycles,
    # less the exposed count's last cycle.
    cost = matmul(OS32X4, 129, 100, 64)
    assert (cost.engine, cost.cores, cost.compute_cycles) == ("array", 4, 2 * 2 * (100 + 62) - 1)


def test_item_split_by_hand():
    # Batched B: 5 separate 32x64 @ 64x32 GEMMs of 1 fold (64 + 62 - 1 cycles, exposed). Row
    # split: every core does all 5 on 8 rows; item split: the busiest core does ceil(5/4) = 2.
    cost = op_cost(OS32X4, "MatMul", [TensorSpec((5, 32, 64)), TensorSpec((5, 64, 32))],
                   [TensorSpec((5, 32, 32))], {})
    assert (cost.engine, cost.cores, cost.compute_cycles) == ("array", 4, 2 * (64 + 62 - 1))


def test_vector_split_rounds_the_busiest_core_up():
    # Gelu (6 lane-cycles/element) on 16 elements over 3 cores: the busiest core has
    # ceil(16/3) = 6 elements = 36 lane-cycles = 2 cycles of 32 lanes (16*6/3 = 32 would be 1).
    x = TensorSpec((16,))
    cost = op_cost(OS32.replace(cores=3), "Gelu", [x], [x], {})
    assert (cost.engine, cost.cores, cost.compute_cycles) == ("vector", 3, 2)


def test_row_split_shrinks_the_resident_block_per_core():
    # float16 512x1024 @ 1024x256: A 1 MiB, B 512 KiB, both over os32's 256 KiB buffer. One
    # core holds B in 2 blocks and streams A twice; four cores each hold their 256 KiB of A,
    # stream B once, and nothing is re-fetched.
    a, b, out = 2 * 512 * 1024, 2 * 1024 * 256, 2 * 512 * 256
    cfg = OS32.replace(cores=4)
    one = matmul(cfg, 512, 1024, 256, cores=1)
    assert one.hbm_bytes == b + 2 * a + out and one.notes.startswith("A re-fetched 2x")
    four = matmul(cfg, 512, 1024, 256, cores=4)
    assert (four.hbm_bytes, four.refetch, four.notes) == (a + b + out, 1.0, "")


def test_vector_ops_by_hand_on_os32():
    # 32 lanes, 64 B/cycle. Add of two 1024-element float32 tensors: 1024/32 = 32 lane-cycles;
    # 3 x 4 KiB = 12 KiB moved = 192 memory cycles. Exp is 4 lane-cycles per element.
    x = TensorSpec((1024,))
    add = op_cost(OS32, "Add", [x, x], [x], {})
    assert (add.compute_cycles, add.memory_cycles, add.engine) == (32, 192, "vector")
    assert op_cost(OS32, "Exp", [x], [x], {}).compute_cycles == 4 * 32
    pool = op_cost(OS32, "MaxPool", [TensorSpec((1, 1, 64, 64))], [TensorSpec((1, 1, 32, 32))],
                   {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
    assert pool.compute_cycles == 32 * 32 * 9 // 32


def test_views_cost_only_the_launch():
    npu_m = DeviceConfig.preset("npu-m")
    for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"):
        cost = op_cost(npu_m, op, [TensorSpec((8, 16))], [TensorSpec((128,))], {})
        assert cost.engine == "none" and cost.hbm_bytes == 0
        assert cost.total_cycles == npu_m.launch_overhead_cycles


def test_fused_activation_overlaps_the_array():
    npu_m = DeviceConfig.preset("npu-m")
    plain = conv(npu_m, 1, 64, 28, 64, 3, pad=1)
    spec_args = ([TensorSpec((1, 64, 28, 28), "float16"), TensorSpec((64, 64, 3, 3), "float16")],
                 [TensorSpec((1, 64, 28, 28), "float16")])
    fused = op_cost(npu_m, "Conv", *spec_args, {"pads": [1] * 4, "activation": "Relu"})
    assert fused.total_cycles == plain.total_cycles  # relu hides under the array's folds
    with pytest.raises(KernelError, match="activation='Bogus'"):
        op_cost(npu_m, "Conv", *spec_args, {"pads": [1] * 4, "activation": "Bogus"})


# -- every op in the list, and the errors -----------------------------------------------------

X = TensorSpec((2, 8, 6, 6))
V = TensorSpec((8,))
I8 = TensorSpec((2, 8, 6, 6), "uint8")
SC, ZP = TensorSpec(()), TensorSpec((), "uint8")
EXAMPLES = {
    "Conv": ([X, TensorSpec((4, 8, 3, 3)), TensorSpec((4,))], [TensorSpec((2, 4, 4, 4))], {}),
    "ConvTranspose": ([X, TensorSpec((8, 4, 3, 3))], [TensorSpec((2, 4, 8, 8))], {}),
    "MatMul": ([TensorSpec((3, 5)), TensorSpec((5, 7))], [TensorSpec((3, 7))], {}),
    "Gemm": ([TensorSpec((5, 3)), TensorSpec((7, 5)), TensorSpec((7,))], [TensorSpec((3, 7))],
             {"transA": 1, "transB": 1}),
    "QLinearConv": ([I8, SC, ZP, TensorSpec((4, 8, 1, 1), "uint8"), SC, ZP, SC, ZP],
                    [TensorSpec((2, 4, 6, 6), "uint8")], {}),
    "ConvInteger": ([I8, TensorSpec((4, 8, 1, 1), "uint8")], [TensorSpec((2, 4, 6, 6), "int32")],
                    {}),
    "QLinearMatMul": ([TensorSpec((3, 5), "int8"), SC, ZP, TensorSpec((5, 7), "int8"), SC, ZP, SC,
                       ZP], [TensorSpec((3, 7), "int8")], {}),
    "MatMulInteger": ([TensorSpec((3, 5), "int8"), TensorSpec((5, 7), "int8")],
                      [TensorSpec((3, 7), "int32")], {}),
    "MaxPool": ([X], [TensorSpec((2, 8, 3, 3))], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "AveragePool": ([X], [TensorSpec((2, 8, 3, 3))], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "Resize": ([X, None, TensorSpec((4,))], [TensorSpec((2, 8, 12, 12))], {"mode": "linear"}),
    "Gather": ([X, TensorSpec((3,), "int64")], [TensorSpec((3, 8, 6, 6))], {}),
    "Slice": ([X, V, V], [TensorSpec((2, 8, 3, 6))], {}),
}
ONNX_OPS = (
    "Conv ConvTranspose MatMul Gemm BatchNormalization Relu LeakyRelu PRelu Clip Sigmoid "
    "HardSigmoid HardSwish Tanh Erf Gelu Softmax LogSoftmax LayerNormalization Add Sub Mul Div "
    "Pow Sqrt Exp Log Neg Abs Reciprocal Min Max Sum Mean MaxPool AveragePool GlobalAveragePool "
    "GlobalMaxPool LRN ReduceMean ReduceSum ReduceMax ReduceMin ReduceL2 Reshape Flatten "
    "Transpose Concat Split Slice Squeeze Unsqueeze Gather Expand Where Cast Identity Dropout "
    "Resize Pad QuantizeLinear DequantizeLinear QLinearConv QLinearMatMul MatMulInteger "
    "ConvInteger"
).split()


@pytest.mark.parametrize("op", ONNX_OPS)
def test_every_listed_op_is_priced(op):
    assert op in KNOWN_OPS
    inputs, outputs, attrs = EXAMPLES.get(op, ([X, X], [X], {"size": 3}))
    for config in (OS32, DeviceConfig.preset("npu-l")):
        cost = op_cost(config, op, inputs, outputs, attrs)
        assert cost.total_cycles >= config.launch_overhead_cycles
        assert cost.total_cycles == (max(cost.compute_cycles, cost.memory_cycles)
                                     + cost.overhead_cycles)
        assert cost.engine in ("array", "vector", "none") and cost.refetch >= 1.0


def test_errors_name_the_problem():
    with pytest.raises(KernelError, match="no cost model; known: .*Conv"):
        op_cost(OS32, "FancyOp", [X], [X], {})
    with pytest.raises(KernelError, match="K=5 != 6"):
        op_cost(OS32, "MatMul", [TensorSpec((3, 5)), TensorSpec((6, 7))], [TensorSpec((3, 7))], {})
    with pytest.raises(KernelError, match=r"cores=2 is invalid; expected an integer in \[1, 1\]"):
        op_cost(OS32, "Relu", [X], [X], {}, cores=2)
    with pytest.raises(KernelError, match="disagrees with the attributes"):
        op_cost(OS32, "Conv", *EXAMPLES["Conv"][:2], {"strides": [2, 2]})
    with pytest.raises(KernelError, match="no MAC rate"):
        op_cost(OS32, "MatMul", [TensorSpec((3, 5), "float64"), TensorSpec((5, 7), "float64")],
                [TensorSpec((3, 7), "float64")], {})
    with pytest.raises(KernelError, match="missing weights W"):
        op_cost(OS32, "Conv", [X], [X], {})
    with pytest.raises(KernelError, match="groups=3 must divide"):
        conv_cycles(OS32, 1, 8, 6, 6, 4, 3, 3, groups=3)
    with pytest.raises(KernelError, match="m=-1 is invalid"):
        gemm_cycles(OS32, -1, 2, 2)


def test_attribute_forms_price_the_same():
    import numpy as np

    inputs, outputs, _ = EXAMPLES["Conv"]
    as_list = op_cost(OS32, "Conv", inputs, outputs, {"strides": [1, 1], "pads": [0, 0, 0, 0]})
    as_numpy = op_cost(OS32, "Conv", inputs, outputs, {"strides": np.array([1, 1]),
                                                        "pads": (0, 0, 0, 0)})
    default = op_cost(OS32, "Conv", inputs, outputs, {})
    assert as_list == as_numpy == default



@given(m=sizes, n=sizes, k=sizes, rows=st.integers(1, 64), cols=st.integers(1, 64),
       flow=st.sampled_from(["os", "ws", "is"]))
def test_exposed_stationary_load_is_scalesim_exact(m, n, k, rows, cols, flow):
    """SCALE-Sim 3.0.0's stall-free counts (Sr = M output rows, Sc = N columns, T = K):
    OS ceil(Sr/R)*ceil(Sc/C)*(T+R+C-2) - 1, WS ceil(T/R)*ceil(Sc/C)*(Sr+2R+C-2) - 1,
    IS ceil(T/R)*ceil(Sr/C)*(Sc+2R+C-2) - 1; hidden drops the R and the - 1."""
    config = OS32.replace(array_rows=rows, array_cols=cols, dataflow=flow)
    r, c = rows, cols
    if not (m and n and k):
        assert gemm_cycles(config, m, n, k) == 0
        return
    folds, stream = {"os": (math.ceil(m / r) * math.ceil(n / c), k),
                     "ws": (math.ceil(k / r) * math.ceil(n / c), m),
                     "is": (math.ceil(k / r) * math.ceil(m / c), n)}[flow]
    load = 0 if flow == "os" else r
    assert gemm_cycles(config, m, n, k) == folds * (stream + load + r + c - 2) - 1
    hidden = config.replace(stationary_load="hidden")
    assert gemm_cycles(hidden, m, n, k) == folds * (stream + r + c - 2)


def test_stationary_load_is_validated_and_old_files_default_to_hidden(tmp_path):
    with pytest.raises(ConfigError, match=r"stationary_load.*'shadow'.*\['hidden', 'exposed'\]"):
        OS32.replace(stationary_load="shadow")
    old = tmp_path / "old.json"
    old.write_text('{"name": "mine", "dataflow": "ws"}')
    assert DeviceConfig.from_file(old).stationary_load == "hidden"
