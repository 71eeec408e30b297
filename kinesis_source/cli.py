"""The ``kinesis-ddb`` command."""

from __future__ import annotations

import argparse
import sys

from . import __version__


def _demo(_args: argparse.Namespace) -> int:
    print(
        "The kinesis-ddb demo is not built yet: it arrives with the DynamoDB checkpoint store.\n"
        "Until then, `./dev test` runs the end-to-end tests against a local moto server."
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kinesis-ddb`` console script."""
    parser = argparse.ArgumentParser(prog="kinesis-ddb", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kinesis-ddb {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the local demo")
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
