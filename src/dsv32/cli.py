"""The ``dsv32`` command. Each subcommand is a thin wrapper over a library function.

Command groups are added by one ``_add_<group>`` function each; keep the work itself in the library.
"""

from __future__ import annotations

import argparse
import sys


def _add_model(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="inspect model configs and checkpoints")
    msub = p.add_subparsers(dest="model_cmd", required=True)
    info = msub.add_parser("info", help="total and per-token-active parameter counts (meta device)")
    info.add_argument("config", help="config.json (HF or reference inference format) or a checkpoint dir")

    def run_info(args: argparse.Namespace) -> int:
        from dsv32.model import ModelConfig, describe_parameters

        print(describe_parameters(ModelConfig.from_pretrained(args.config)))
        return 0

    info.set_defaults(func=run_info)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsv32", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_model(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
