"""``python -m bench``: run every benchmark of ``bench/`` and print one table of their figures.

Each ``bench_*.py`` runs in a process of its own (``python bench/bench_x.py --json``: its
thread pools, imports and peak memory do not leak into the next bench), its detail lines pass
through to stderr, and its figures (JSON on its stdout, ``bench/figures.py``) are gathered into
one table: each figure, its target, pass / falls short. ``--quick`` passes ``--quick`` on: small
sizes, a smoke test of the whole chain in a few minutes, whose figures are not the recorded
ones. ``--only allocator,dma`` runs some benches; ``--json`` prints the figures as one JSON
object ``{"figures": [...], "failed": {bench: message}}`` instead of the table, ``--markdown`` as
the Markdown table of ``docs/performance.md``.

Exit status: 0 when every bench ran (whether or not its figures meet their targets: the table
says), 1 when a bench failed (its last stderr line is reported), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from figures import Figure, markdown, table  # noqa: E402


def benches() -> dict[str, Path]:
    """Every bench of this folder by short name (``bench_dma.py`` -> ``dma``), sorted."""
    return {p.stem.removeprefix("bench_"): p for p in sorted(HERE.glob("bench_*.py"))}


def run_bench(path: Path, quick: bool, err: TextIO) -> list[Figure]:
    """Run one bench in its own process; its figures. Raises RuntimeError if it fails."""
    argv = [sys.executable, str(path), "--json", *(["--quick"] if quick else [])]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    last = ""
    assert proc.stderr is not None and proc.stdout is not None
    for line in proc.stderr:  # the bench's detail, as it comes
        err.write(f"  {line}")
        err.flush()
        last = line.strip() or last
    stdout = proc.stdout.read()
    if proc.wait() != 0:
        raise RuntimeError(last or f"exit status {proc.returncode}")
    try:
        return [Figure.from_dict(d) for d in json.loads(stdout.strip().splitlines()[-1])]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise RuntimeError(f"no figures on its stdout ({exc})") from exc


def main(argv: Sequence[str] | None = None, out: TextIO | None = None,
         err: TextIO | None = None) -> int:
    """Run the benches; print the table (or JSON). Returns the exit status."""
    out, err = out or sys.stdout, err or sys.stderr
    known = benches()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--only", default=None, metavar="NAMES",
                        help=f"comma-separated benches (of: {', '.join(known)})")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print JSON instead of the table")
    output.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    chosen = list(known) if args.only is None else [n.strip() for n in args.only.split(",")]
    unknown = [n for n in chosen if n not in known]
    if unknown:
        parser.error(f"unknown bench {', '.join(unknown)} (benches: {', '.join(known)})")
    found: list[Figure] = []
    failed: dict[str, str] = {}
    for name in chosen:
        print(f"bench {name}{' (quick)' if args.quick else ''} ...", file=err, flush=True)
        start = time.perf_counter()
        try:
            found += run_bench(known[name], args.quick, err)
        except RuntimeError as exc:
            failed[name] = str(exc)
        print(f"bench {name}: {'FAILED' if name in failed else 'done'} in "
              f"{time.perf_counter() - start:.0f} s", file=err, flush=True)
    if args.json:
        print(json.dumps({"figures": [f.to_dict() for f in found], "failed": failed}), file=out)
    else:
        print(markdown(found) if args.markdown else table(found), file=out)
        for name, message in failed.items():
            print(f"bench {name} FAILED: {message}", file=out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
