"""Allocator throughput: malloc/free operations per second for each HBM strategy.

A steady-state churn on an npu-m HBM: fill to a few thousand live blocks of mixed sizes, then
alternate frees of random live blocks with new allocations. Every strategy replays the same
seeded sequence; the ratio column is against ``first_fit`` measured in the same run.

    python bench/bench_allocator.py [--live 4000] [--ops 200000] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import random
import time

from figures import Figure, bench_main, info

from npu_sim import DeviceConfig
from npu_sim.hbm import ALLOCATORS, Hbm

QUICK = ["--live", "500", "--ops", "5000"]


def churn(strategy: str, live: int, ops: int, seed: int = 0) -> tuple[float, dict]:
    """Run the workload; returns (ops per second, final stats)."""
    rng = random.Random(seed)
    sizes = [rng.choice((512, 4096, 65536, 1 << 20, 3 << 20)) + rng.randrange(512)
             for _ in range(live + ops)]
    victims = [rng.random() for _ in range(ops)]
    hbm = Hbm(DeviceConfig.preset("npu-m"), strategy)
    bufs = [hbm.malloc(n) for n in sizes[:live]]
    start = time.perf_counter()
    for i in range(ops // 2):
        j = int(victims[i] * len(bufs))
        bufs[j], bufs[-1] = bufs[-1], bufs[j]
        hbm.free(bufs.pop())
        bufs.append(hbm.malloc(sizes[live + i]))
    elapsed = time.perf_counter() - start
    return (ops // 2 * 2) / elapsed, hbm.stats()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--live", type=int, default=4000, help="live blocks during the churn")
    p.add_argument("--ops", type=int, default=200_000, help="malloc + free calls timed")
    return p


def measure(args: argparse.Namespace) -> list[Figure]:
    results = {name: churn(name, args.live, args.ops) for name in ALLOCATORS}
    ref = results["first_fit"][0]
    print(f"{'strategy':<10} {'ops/s':>12} {'vs first_fit':>13} {'fragmentation':>14} "
          f"{'free blocks':>12}")
    for name, (rate, stats) in results.items():
        print(f"{name:<10} {rate:>12,.0f} {rate / ref:>12.2f}x {stats['hbm.fragmentation']:>14.3f}"
              f" {stats['hbm.free_blocks']:>12}")
    return [info("allocator", f"{name} malloc/free rate / first_fit", rate / ref)
            for name, (rate, _) in results.items() if name != "first_fit"]


def main() -> None:
    bench_main(parser(), measure, QUICK)


if __name__ == "__main__":
    main()
