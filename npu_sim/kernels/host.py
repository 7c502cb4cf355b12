"""Which of onnxruntime's MLAS kernels this host runs, read from its instruction sets.

MLAS picks a kernel per routine once, from CPUID and the registers the OS saves
(``platform.cpp``), and some routines give other bits on another kernel. The kernels that follow
onnxruntime's values to the bit (:mod:`.mlas`) take the branch the host's MLAS takes, so the
same test passes against the installed onnxruntime on an AVX2 machine and on an AVX-512 one.

LLVM reads the same CPUID bits and the same OS state (XCR0) that MLAS does (``avx512f`` only
where the OS saves the ZMM registers), and numba has it loaded already: the answer costs nothing.
``tests/kernels/test_host.py`` holds it to the flags Linux lists.
"""

from __future__ import annotations

import platform

import llvmlite.binding as llvm


def _features() -> frozenset[str]:
    """The host's CPU features LLVM reports as present (none where it cannot tell)."""
    try:
        found = llvm.get_host_cpu_features()
    except RuntimeError:  # LLVM has no feature detection for this host
        return frozenset()
    return frozenset(name for name, on in found.items() if on)


FEATURES = _features()
_X86_64 = platform.machine().lower() in ("x86_64", "amd64")

MLAS_AVX512F = _X86_64 and "avx512f" in FEATURES
"""MLAS's AVX-512F kernels of Gelu (erf) and SiLU run here: CPUID's AVX512F with the OS saving
the ZMM state (MLAS's gate). They keep a NaN input's bits and clamp SiLU's logistic at 1;
elsewhere the generic kernels (MLAS's logistic, then a multiply) quiet a signalling NaN and
leave the logistic's 1.0000001 of [17.48, 18) unclamped."""

_VNNI = "avxvnni" in FEATURES or {"avx512f", "avx512bw", "avx512dq", "avx512vl",
                                  "avx512vnni"} <= FEATURES
U8S8_SATURATES = _X86_64 and "avx2" in FEATURES and not _VNNI
"""MLAS's uint8 x int8 GEMM sums each pair of products in int16 with saturation (AVX2's
``vpmaddubsw``, used where neither AVX-VNNI nor AVX-512 VNNI is there), so onnxruntime's
MatMulInteger, QLinearMatMul and QLinearConv of uint8 activations and int8 weights differ from
the exact sums where a pair passes 32767 (onnxruntime's quantization guide: use ``reduce_range``
or U8U8 on such hosts). The NPU accumulates exactly, as ONNX defines; the tests use this to
know where the installed onnxruntime can be compared with."""
