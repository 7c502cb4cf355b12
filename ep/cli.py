"""The ``npu-sim`` command line.

One program with subcommands, each registered by a small ``add_<name>`` function that adds its
parser and sets ``handler``; :func:`main` parses and dispatches. Subcommands:

- ``npu-sim run [MODEL]``: the main job (:mod:`ep.cli_run`). Run a model (default: the bundled
  ``tiny_cnn``) on the simulated NPU with CPU fallback and print the partitioning, the simulated
  latency, throughput and per-engine utilization; ``--check`` compares with onnxruntime CPU
  (always done for the bundled model) and exits with status 1 on a mismatch.
- ``npu-sim compile MODEL``: an EPContext model and its context binary (:mod:`ep.cli_compile`).
- ``npu-sim devices``: every device preset with its key figures.
- ``npu-sim inspect FILE``: everything a context binary or an EPContext model holds
  (:mod:`ep.cli_inspect`).
- ``npu-sim export | replay | report | diff | sweep``: traces (:mod:`ep.cli_trace`); ``run
  --trace FILE`` records one.
- ``npu-sim bench``: every benchmark of a source checkout, one table (:mod:`ep.cli_bench`).

``--json`` on ``run``, ``inspect``, ``devices``, ``replay``, ``report``, ``diff``, ``sweep`` and
``bench`` prints one JSON document instead of text. Exit status: 0 success; 1 a model or file
error, printed as one line on stderr with what to do next when the error says
(:mod:`ep.cli_errors`), the traceback only with ``--debug``; 2 a usage error; 130 interrupted.
Work that can take more than a couple of seconds shows a progress line on a terminal
(:mod:`ep.cli_progress`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from ep import cli_bench, cli_compile, cli_errors, cli_inspect, cli_run, cli_trace
from ep.errors import OrtError
from npu_sim.config import MAC_DTYPES, PRESETS, DeviceConfig
from npu_sim.errors import NpuSimError

Handler = Callable[[argparse.Namespace, TextIO], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status:
    0 success, 1 a model or file error (one line on stderr, the traceback with ``--debug``),
    2 a usage error (argparse's message), 130 interrupted."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args, sys.stdout)
    except BrokenPipeError:  # `npu-sim inspect ... | head`: the reader left; no error to show
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (OrtError, NpuSimError, OSError) as exc:
        if args.debug:
            raise
        hint = cli_errors.next_step(exc, args)
        print(f"npu-sim {args.command}: {cli_errors.message(exc)}"
              + (f" -- next: {hint}" if hint else ""), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"npu-sim {args.command}: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="npu-sim", description="Tools for the simulated NPU and its execution provider.")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)
    cli_run.add_run(commands)
    cli_compile.add_compile(commands)
    _add_devices(commands)
    cli_inspect.add_inspect(commands)
    cli_trace.add_export(commands)
    cli_trace.add_replay(commands)
    cli_trace.add_report(commands)
    cli_trace.add_diff(commands)
    cli_trace.add_sweep(commands)
    cli_bench.add_bench(commands)
    for sub in commands.choices.values():  # --debug after the subcommand too
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help="show the full traceback of an error")
    return parser


# -- devices ----------------------------------------------------------------------------------


def _add_devices(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("devices", help="list every device preset with its key figures",
                            description="Print every DeviceConfig preset: cores, array, "
                                        "dataflow, clock, peak TOPS per dtype, memory and links.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=_devices)


def device_figures(config: DeviceConfig) -> dict[str, object]:
    """The key figures of ``config``, as ``npu-sim devices`` prints them."""
    return {
        "cores": config.cores,
        "array": f"{config.array_rows}x{config.array_cols}",
        "dataflow": config.dataflow,
        "clock_ghz": config.clock_ghz,
        "peak_tops": {dtype: round(config.peak_tops(dtype), 3) for dtype in MAC_DTYPES},
        "hbm_gib": config.hbm_bytes / 2**30,
        "hbm_gbps": config.hbm_gbps,
        "host_link_gbps": config.host_link_gbps,
        "dma_channels": config.dma_channels,
        "sram_mib_per_core": config.sram_bytes_per_core / 2**20,
    }


def _devices(args: argparse.Namespace, out: TextIO) -> int:
    figures = {name: device_figures(DeviceConfig.preset(name)) for name in PRESETS}
    if args.json:
        print(json.dumps(figures), file=out)
        return 0
    head = ("preset", "cores", "array", "dataflow", "GHz", "peak TOPS",
            "HBM", "host link", "DMA", "SRAM/core")
    rows = [(name, str(f["cores"]), f["array"], f["dataflow"], f"{f['clock_ghz']:g}",
             " ".join(f"{d} {t:g}" for d, t in f["peak_tops"].items()),
             f"{f['hbm_gib']:g} GiB @ {f['hbm_gbps']:g} GB/s", f"{f['host_link_gbps']:g} GB/s",
             str(f["dma_channels"]), f"{f['sram_mib_per_core']:g} MiB")
            for name, f in figures.items()]
    cli_inspect.table(rows, head, out, indent=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
