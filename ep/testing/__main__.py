"""``python -m ep.testing replay FOLDER [--providers A,B]``: rerun a saved comparison."""

from __future__ import annotations

import argparse
import sys

from .compare import Mismatch, replay


def main(argv: list[str] | None = None) -> int:
    """Replay a saved case; exit status 0 when the EP now matches onnxruntime, 1 otherwise."""
    parser = argparse.ArgumentParser(prog="python -m ep.testing")
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("replay", help="rerun assert_matches_onnxruntime on a saved case")
    rep.add_argument("folder")
    rep.add_argument("--providers", default=None,
                     help="comma-separated provider names instead of the saved ones")
    args = parser.parse_args(argv)
    providers = args.providers.split(",") if args.providers else None
    try:
        replay(args.folder, providers)
    except Mismatch as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{args.folder}: ep matches onnxruntime")
    return 0


if __name__ == "__main__":
    sys.exit(main())
