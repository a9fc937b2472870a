"""The `fastload` command line; each subcommand imports what it needs only when it runs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastload", description="Fast data loading for PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="load a small built-in JPEG dataset and compare with torch DataLoader")
    demo.add_argument("--data", type=Path, help="an ImageNet-layout folder (default: make a demo dataset)")
    demo.add_argument("--epochs", type=int, default=2)
    demo.add_argument("--workers", type=int, default=2)
    demo.add_argument("--batch-size", type=int, default=64)
    demo.add_argument("--images", type=int, default=512, help="size of the generated dataset")
    demo.add_argument("--no-baseline", action="store_true", help="skip the torch DataLoader run")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = _build_parser().parse_args(argv)
    from fastload._errors import FastloadError

    try:
        if args.command == "demo":
            from fastload._demo import run_demo

            run_demo(args.data, args.epochs, args.workers, args.batch_size, args.images, not args.no_baseline)
    except FastloadError as e:
        print(f"fastload: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
