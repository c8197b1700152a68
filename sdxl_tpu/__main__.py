"""Command line: `python -m sdxl_tpu make-tiny DIR`."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sdxl_tpu", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    tiny = commands.add_parser("make-tiny", help="write a tiny random SDXL checkpoint in diffusers format")
    tiny.add_argument("directory")
    tiny.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if args.command == "make-tiny":
        from .tiny import write_tiny_checkpoint

        try:
            path = write_tiny_checkpoint(args.directory, seed=args.seed)
        except OSError as e:
            print(f"error: cannot write {args.directory}: {e.strerror or e}", file=sys.stderr)
            return 1
        print(f"wrote tiny SDXL checkpoint to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
