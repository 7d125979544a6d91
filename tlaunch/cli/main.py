"""The ``tlaunch`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import tlaunch

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from tlaunch.demo import run_demo

    return run_demo(args.hosts, args.producers)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``tlaunch``."""
    parser = argparse.ArgumentParser(
        prog="tlaunch", description="Launch Launchpad-style programs on one host or many."
    )
    parser.add_argument("--version", action="version", version=f"tlaunch {tlaunch.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the consumer/producer demo (test hosts if possible, else local)")
    demo.add_argument(
        "--hosts", type=int, default=3, help="test hosts to use when they can be made (default 3)"
    )
    demo.add_argument("--producers", type=int, default=6, help="producer nodes (default 6)")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tlaunch``; returns the exit code."""
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
