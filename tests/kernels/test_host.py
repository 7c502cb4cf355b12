"""npu_sim.kernels.host reads MLAS's kernel gates as the Linux kernel reports the CPU.

The gates themselves are checked against the installed onnxruntime by the tests that compare
bits (test_mlas.py, test_quant.py); this holds LLVM's feature detection to the flags Linux lists
(which it lists only where the OS saves the registers they need), on the host that runs it.
"""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from npu_sim.kernels import host

CPUINFO = Path("/proc/cpuinfo")


def _flags() -> set[str]:
    for line in CPUINFO.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not CPUINFO.exists(),
                    reason="Linux's x86 CPU flags are what this compares with")
def test_the_gates_agree_with_linuxs_cpu_flags() -> None:
    flags = _flags()
    assert "avx2" in flags or "sse2" in flags  # the flags were read
    assert host.MLAS_AVX512F == ("avx512f" in flags)
    vnni = "avx_vnni" in flags or {"avx512f", "avx512bw", "avx512dq", "avx512vl",
                                   "avx512_vnni"} <= flags
    assert host.U8S8_SATURATES == ("avx2" in flags and not vnni)
