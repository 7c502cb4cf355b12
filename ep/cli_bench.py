"""``npu-sim bench``: every benchmark of ``bench/``, one table (``python -m bench``).

The benchmarks are scripts of the source checkout, not part of the installed package (they
need onnx's test data, torch and transformers for some models, and minutes of machine time), so
``npu-sim bench`` runs the ``bench/`` folder of a checkout: the one beside the ``ep`` package
(an editable install or ``PYTHONPATH`` pointing at a checkout) or the one ``--dir`` names.
Installed from a wheel without a checkout it says so in one line and exits with status 1.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import TextIO

from ep.errors import NoSuchFile


def add_bench(commands: argparse._SubParsersAction) -> None:
    """Register ``npu-sim bench``."""
    p = commands.add_parser(
        "bench", help="run every benchmark of bench/ and print one table (needs a checkout)",
        description="Run every benchmark of a source checkout's bench/ folder (python -m "
                    "bench), each in its own process, and print one table: each figure, its "
                    "target, pass or falls short. Exit status 1 if a benchmark fails.")
    p.add_argument("--quick", action="store_true",
                   help="small sizes: a smoke run of every bench (figures not comparable)")
    p.add_argument("--only", default=None, metavar="NAMES",
                   help="comma-separated benches, e.g. allocator,dma")
    p.add_argument("--json", action="store_true",
                   help='print {"figures": [...], "failed": {...}} instead of the table')
    p.add_argument("--dir", default=None, metavar="CHECKOUT",
                   help="the source checkout whose bench/ to run (default: the one this "
                        "package is in)")
    p.set_defaults(handler=bench)


def bench_folder(checkout: str | None) -> Path:
    """The ``bench/`` folder to run; :class:`ep.errors.NoSuchFile` if there is none."""
    root = Path(checkout) if checkout else Path(__file__).resolve().parent.parent
    folder = root / "bench"
    if not (folder / "__main__.py").is_file():
        where = f"{root} has no bench/__main__.py" if checkout else \
            f"this installation ({root}) is not a source checkout"
        raise NoSuchFile(f"{where}: the benchmarks ship with the source, not the wheel; clone "
                         "the repository and run `npu-sim bench --dir CHECKOUT` (or `python -m "
                         "bench` in it)")
    return folder


def bench(args: argparse.Namespace, out: TextIO) -> int:
    """Handler of ``npu-sim bench``: ``python -m bench`` in the checkout; its exit status."""
    folder = bench_folder(args.dir)
    argv = [sys.executable, "-m", "bench", *(["--quick"] if args.quick else []),
            *(["--only", args.only] if args.only else []), *(["--json"] if args.json else [])]
    root = str(folder.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run(argv, cwd=root, env=env, stdout=subprocess.PIPE, text=True,
                          check=False)
    out.write(proc.stdout)
    return proc.returncode
