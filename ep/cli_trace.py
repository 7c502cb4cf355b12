"""The trace subcommands of ``npu-sim``: export, replay, report, diff, sweep.

Each ``add_<name>`` registers one subcommand on the parser :func:`ep.cli.build_parser` builds.
Every one reads a ``.trace.jsonl`` file (``docs/trace_format.md``); a file that is not a valid
trace prints the :class:`~npu_sim.errors.TraceError` (naming the line and what is wrong) and
exits with status 1. ``--json`` prints the machine-readable form instead of text.

- ``npu-sim export TRACE --format perfetto|ort -o FILE``
- ``npu-sim replay TRACE [--device PRESET_OR_FILE] [--mode elastic|recorded] [-o OUT]``
- ``npu-sim report TRACE [--top N] [--plot DIR]``
- ``npu-sim diff A B``
- ``npu-sim sweep TRACE --grid FILE [-o STEM] [--workers N] [--ray [ADDRESS]]``

Elastic replays and sweeps here re-decide each launch's core split with the compiler's rule
(:func:`ep.traces.compiler_split`), as a re-compilation for the new device would.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

from ep import cli_progress
from ep.traces import compiler_split
from npu_sim.config import DeviceConfig
from npu_sim.errors import ConfigError, TraceError
from npu_sim.trace import analysis, export, load, save
from npu_sim.trace.exporters import EXPORTERS
from npu_sim.trace.retime import MODES, replay


def _device(value: str) -> DeviceConfig:
    try:
        return DeviceConfig.named(value)
    except ConfigError as exc:
        raise TraceError("--device", exc.message) from None


def _print_json(value: Any, out: TextIO) -> None:
    print(json.dumps(value, indent=1, default=str), file=out)


# -- export --------------------------------------------------------------------------------------


def add_export(commands: argparse._SubParsersAction) -> None:
    """Register ``npu-sim export``."""
    p = commands.add_parser("export", help="export a trace for Perfetto or ORT profile tools",
                            description="Write TRACE as Chrome/Perfetto trace JSON (open it at "
                                        "ui.perfetto.dev) or as an ONNX Runtime profile.")
    p.add_argument("trace", help="a .trace.jsonl file")
    p.add_argument("--format", required=True, choices=sorted(EXPORTERS))
    p.add_argument("-o", "--output", required=True, help="the file to write")
    p.set_defaults(handler=_export)


def _export(args: argparse.Namespace, out: TextIO) -> int:
    path = export(load(args.trace), args.format, args.output)
    print(f"wrote {path}", file=out)
    return 0


# -- replay --------------------------------------------------------------------------------------


def add_replay(commands: argparse._SubParsersAction) -> None:
    """Register ``npu-sim replay``."""
    p = commands.add_parser("replay", help="re-time a trace under another device config",
                            description="Replay TRACE: 'recorded' gives back the recorded "
                                        "timeline; 'elastic' re-prices every record under "
                                        "--device with the device's own cost model.")
    p.add_argument("trace", help="a .trace.jsonl file")
    p.add_argument("--device", default=None,
                   help="preset or .json/.toml config (default: the recording's)")
    p.add_argument("--mode", default="elastic", choices=MODES)
    p.add_argument("-o", "--output", default=None, help="write the re-timed trace here")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=_replay)


def _replay(args: argparse.Namespace, out: TextIO) -> int:
    trace = load(args.trace)
    config = _device(args.device) if args.device else trace.config
    with cli_progress.phase(f"{args.mode} replay of {len(trace.records):,} records"):
        result = replay(trace, config, args.mode, split=compiler_split)
    summary = {"mode": result.mode, "config": config.name, "makespan_cycles": result.makespan,
               "makespan_us": result.microseconds, "recorded_cycles": trace.makespan,
               "recorded_us": trace.config.cycles_to_us(trace.makespan),
               "utilization": result.utilization, "energy": result.energy,
               "flags": list(result.flags)}
    if args.output:
        summary["output"] = str(save(result.as_trace(trace), args.output))
    if args.json:
        _print_json(summary, out)
        return 0
    print(f"{args.mode} replay on {config.name}: {result.makespan:,} cycles = "
          f"{result.microseconds:.2f} us (recorded on {trace.config.name}: "
          f"{trace.makespan:,} cycles = {summary['recorded_us']:.2f} us)", file=out)
    print("utilization: " + ", ".join(f"{e} {100 * u:.0f}%"
                                      for e, u in result.utilization.items()), file=out)
    for flag in result.flags:
        print(f"flag: {flag}", file=out)
    if args.output:
        print(f"wrote {summary['output']}", file=out)
    return 0


# -- report / diff ---------------------------------------------------------------------------


def add_report(commands: argparse._SubParsersAction) -> None:
    """Register ``npu-sim report``."""
    p = commands.add_parser("report", help="utilization, overlap, critical path, roofline",
                            description="Analyse TRACE: per-engine utilization, DMA/compute "
                                        "overlap, the critical path, the top operators and "
                                        "each operator's place on the roofline.")
    p.add_argument("trace", help="a .trace.jsonl file")
    p.add_argument("--top", type=int, default=10, help="operators to list (default 10)")
    p.add_argument("--plot", default=None, metavar="DIR",
                   help="write timeline, roofline and utilization PNGs (needs npu-sim[plot])")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=_report)


def _report(args: argparse.Namespace, out: TextIO) -> int:
    trace = load(args.trace)
    rep = analysis.report(trace, top=args.top)
    if args.plot:
        from npu_sim.trace.plots import plot_all

        rep["plots"] = [str(p) for p in plot_all(trace, args.plot)]
    if args.json:
        _print_json(rep, out)
    else:
        print(analysis.format_report(rep), file=out)
        for path in rep.get("plots", []):
            print(f"wrote {path}", file=out)
    return 0


def add_diff(commands: argparse._SubParsersAction) -> None:
    """Register ``npu-sim diff``."""
    p = commands.add_parser("diff", help="compare two traces operator by operator")
    p.add_argument("a", help="the reference .trace.jsonl")
    p.add_argument("b", help="the .trace.jsonl to compare with it")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=_diff)


def _diff(args: argparse.Namespace, out: TextIO) -> int:
    d = analysis.diff(load(args.a), load(args.b))
    if args.json:
        _print_json(d, out)
    else:
        print(analysis.format_diff(d), file=out)
    return 0


# -- sweep ---------------------------------------------------------------------------------------


def add_sweep(commands: argparse._SubParsersAction) -> None:
    """Register ``npu-sim sweep``."""
    p = commands.add_parser("sweep", help="replay a trace under a grid of device configs",
                            description="Replay TRACE under every config of --grid (JSON or "
                                        "TOML, see docs/trace_format.md) and write a CSV and a "
                                        "JSON table of makespan, utilization and energy.")
    p.add_argument("trace", help="a .trace.jsonl file")
    p.add_argument("--grid", required=True, help="the grid file (.json or .toml)")
    p.add_argument("-o", "--output", default="sweep", help="table stem (default: sweep)")
    p.add_argument("--workers", type=int, default=None, help="local processes (default: CPUs)")
    p.add_argument("--ray", nargs="?", const=True, default=None, metavar="ADDRESS",
                   help="run on Ray (a local instance, or the cluster at ADDRESS)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(handler=_sweep)


def _sweep(args: argparse.Namespace, out: TextIO) -> int:
    from npu_sim.trace.sweep import read_grid, sweep, write_table

    trace = load(args.trace)
    configs, mode = read_grid(args.grid, trace.config)
    with cli_progress.phase(f"sweep of {len(configs)} configs", total=len(configs)) as step:
        rows = sweep(trace, configs, mode, workers=args.workers, ray=args.ray,
                     split=compiler_split, progress=step)
    csv_path, json_path = write_table(rows, args.output)
    if args.json:
        _print_json(rows, out)
        return 0
    best = min(rows, key=lambda r: r["makespan"])
    print(f"{len(rows)} configs ({mode}): makespan {min(r['makespan'] for r in rows):,} .. "
          f"{max(r['makespan'] for r in rows):,} cycles; best "
          + ", ".join(f"{k}={v}" for k, v in best.items() if k not in (
              "makespan", "microseconds", "core_utilization", "dma_utilization", "flags",
              "config_digest") and not k.startswith("energy")), file=out)
    print(f"wrote {csv_path} and {json_path}", file=out)
    return 0


# -- npu-sim run --trace -------------------------------------------------------------------------


def profiling(trace_path: str | None) -> Any:
    """Session options that profile into ``trace_path``'s folder (None: no profiling)."""
    from ep import SessionOptions

    options = SessionOptions()
    if trace_path:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(trace_path).with_name(
            Path(trace_path).name.removesuffix(".jsonl").removesuffix(".trace") + "_profile"))
    return options


def save_profile(session: Any, trace_path: str) -> str:
    """End ``session``'s profiling; move its trace to ``trace_path``. A line saying where."""
    import os

    profile = session.end_profiling()
    recorded = profile.removesuffix(".json") + ".trace.jsonl"
    if not os.path.exists(recorded):
        raise TraceError(trace_path, "the session recorded no trace (no partition ran on the "
                                     "NPU)")
    os.replace(recorded, trace_path)
    return f"trace: {trace_path} (ONNX Runtime profile: {profile})"
