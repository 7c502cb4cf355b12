"""``python -m ep.testing.fuzz --seed S --count N --workers W --out DIR``: a fuzzing campaign.

Writes ``DIR/results.json`` (every model's outcome, the summary) and ``DIR/results.md`` (the
table), and ``DIR/repro/<index>.onnx.txt`` for every failure, minimized (ONNX text, inputs from
``ep.testing.fuzz.build.feeds(model, feed_seed)``; the seed is in the first line). With
``--docs docs/conformance.md`` the table replaces the fuzzing block of that file. Exit status 0
when every model gave onnxruntime's result.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .campaign import markdown, run_campaign, summarize

BEGIN, END = "<!-- fuzz:begin -->", "<!-- fuzz:end -->"
HEADING = "## Differential fuzzing"


def write_docs(path: Path, table: str) -> None:
    """Replace the fuzzing block of ``path`` (appended, with a heading, if it has none)."""
    text = path.read_text() if path.exists() else ""
    block = f"{BEGIN}\n{table}{END}"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n{HEADING}\n\n{block}\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ep.testing.fuzz", description=__doc__)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--start", type=int, default=0, help="index of the first model")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per model")
    parser.add_argument("--memory-mb", type=int, default=4096, help="address space per worker")
    parser.add_argument("--max-nodes", type=int, default=24)
    parser.add_argument("--no-minimize", action="store_true")
    parser.add_argument("--docs", type=Path, help="a markdown file to put the table in")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    results = run_campaign(args.seed, args.count, args.workers, args.start, args.out,
                           args.timeout, args.memory_mb, not args.no_minimize,
                           max_nodes=args.max_nodes)
    seconds = time.perf_counter() - started
    summary = summarize(results)
    table = markdown(summary, args.seed, args.start, seconds, args.workers)
    (args.out / "results.json").write_text(json.dumps(
        {"seed": args.seed, "summary": summary, "results": results}, indent=1))
    (args.out / "results.md").write_text(table)
    repro = args.out / "repro"
    for r in results:
        if "reproducer" in r:
            repro.mkdir(exist_ok=True)
            (repro / f"{r['index']}.onnx.txt").write_text(
                f"# feed_seed {r['feed_seed']}, optimize {r.get('optimized', True)}: "
                f"{r['outcome']}: {r['detail'][:200]}\n"
                + r["reproducer"])
    if args.docs:
        write_docs(args.docs, table)
    print(table)
    return 0 if summary["onnxruntime_result"] == summary["models"] else 1


if __name__ == "__main__":
    sys.exit(main())
