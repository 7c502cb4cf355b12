"""DMA simulation speed: simulated chunks per wall-clock second.

Many small transfers (h2d, then d2h after it) through an npu-m with a small chunk size, so the
run is dominated by the per-chunk simulation cost (simpy events, trace records, byte copies)
rather than by memcpy bandwidth. The ratio column is against one channel in the same run.

    python bench/bench_dma.py [--chunks 20000] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from figures import Figure, bench_main, info

from npu_sim import Device, DeviceConfig

QUICK = ["--chunks", "2048"]


def run(channels: int, chunks: int, chunk_bytes: int = 4096) -> tuple[float, int]:
    """Simulate ``chunks`` chunks; returns (chunks per wall-clock second, simulated cycles)."""
    cfg = DeviceConfig.preset("npu-m").replace(dma_chunk_bytes=chunk_bytes, dma_channels=channels)
    dev = Device(cfg)
    per_transfer = 16
    nbytes = per_transfer * chunk_bytes
    host = np.arange(nbytes, dtype=np.uint8)
    back = np.empty_like(host)
    buf = dev.malloc(nbytes)
    start = time.perf_counter()
    for _ in range(chunks // (2 * per_transfer)):
        up = dev.memcpy_h2d_async(buf, host)
        dev.memcpy_d2h_async(back, buf, deps=[up])
        dev.synchronize()
    elapsed = time.perf_counter() - start
    assert dev.stats()["dma.chunks"] == chunks // (2 * per_transfer) * 2 * per_transfer
    assert np.array_equal(back, host)
    return dev.stats()["dma.chunks"] / elapsed, dev.now


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunks", type=int, default=20_000, help="chunks simulated per run")
    return p


def measure(args: argparse.Namespace) -> list[Figure]:
    results = {k: run(k, args.chunks) for k in (1, 4, 16)}
    ref = results[1][0]
    print(f"{'channels':>8} {'chunks/s':>12} {'vs 1 channel':>13} {'sim cycles':>12}")
    for k, (rate, cycles) in results.items():
        print(f"{k:>8} {rate:>12,.0f} {rate / ref:>12.2f}x {cycles:>12,}")
    return [info("dma", f"{k} channels: simulated chunks/s / 1 channel", rate / ref)
            for k, (rate, _) in results.items() if k != 1]


def main() -> None:
    bench_main(parser(), measure, QUICK)


if __name__ == "__main__":
    main()
