"""The ``dsv32`` command. Each subcommand is a thin wrapper over a library function.

Every command group lives in a module of this package with one ``add(sub)`` function; keep the work
itself in the library. Errors are handled here, once for every command: the project's typed errors
(:class:`dsv32.errors.DSV32Error`) and the usual user mistakes (a missing or unreadable file,
malformed JSON/TOML, a bad flag value) print one line, ``dsv32 <command>: <what is wrong>``, and
exit with code 2. Anything else is a bug and keeps its traceback; ``--debug`` shows the traceback of
every error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import tomllib

from dsv32.errors import DSV32Error

# The command groups, in the order ``dsv32 --help`` lists them: ``dsv32.cli.<name>.add(sub)``.
GROUPS = ("model", "chat", "dsa", "rl", "agent", "serve", "envs", "synth", "eval", "sft", "posttrain", "view")

USAGE_EXIT = 2


class UsageError(DSV32Error, ValueError):
    """Flags that do not fit together (an option of another backend, a missing one)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the command and pointing to its ``--help``."""

    def error(self, message: str, prog: str | None = None):  # type: ignore[override]
        prog = prog or self.prog
        self.exit(USAGE_EXIT, f"{prog}: {message} (see '{prog} --help')\n")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """Unknown arguments are reported by the command they were given to."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}", getattr(parsed, "prog", None))
        return parsed


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dsv32", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show the traceback of any error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    for name in GROUPS:
        importlib.import_module(f"dsv32.cli.{name}").add(sub)
    return parser


def command(p: argparse.ArgumentParser, run) -> None:
    """Make ``run(args) -> exit code`` the action of parser ``p`` (its prog names it in errors)."""
    p.set_defaults(func=run, prog=p.prog)
    p.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show the traceback of any error"
    )


def flag_overrides(args: argparse.Namespace, keys: dict[str, str]) -> list[str]:
    """The ``--set SECTION.FIELD=VALUE`` overrides, then one ``key=value`` for every flag in ``keys``
    (flag attribute → recipe key) that was given, so a flag wins over ``--set``."""
    given = ((flag, getattr(args, flag, None)) for flag in keys)
    return [*args.set, *(f"{keys[flag]}={value}" for flag, value in given if value is not None)]


def report_to_arg(p: argparse.ArgumentParser) -> None:
    """``--report-to`` of a training command: the recipe's ``report_to`` (:mod:`dsv32.trackers`)."""
    p.add_argument(
        "--report-to",
        metavar="TRACKERS",
        help="mirror metrics.jsonl into tensorboard, wandb, mlflow, trackio (comma-separated) or none; "
        "offline, under <out>/trackers/",
    )


def number_type(kind, test, allowed: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {allowed}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {allowed}")
        return value

    parse.__name__ = allowed  # argparse names the type in its messages
    return parse


# Flag types that check their range where the flag is parsed.
positive_int = number_type(int, lambda v: v >= 1, "an integer >= 1")
non_negative_int = number_type(int, lambda v: v >= 0, "an integer >= 0")
non_negative_float = number_type(float, lambda v: v >= 0 and v != float("inf"), "a number >= 0")
probability = number_type(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
positive_float = number_type(float, lambda v: 0 < v < float("inf"), "a number > 0")


def add_backend(
    p: argparse.ArgumentParser,
    kinds: tuple[str, ...],
    *,
    default: str,
    help: str,
    before: str | None = None,
) -> None:
    """``--backend KIND``, and ``--backend local CKPT`` for a local model (smollm2, a native V3.2
    checkpoint, an HF directory): one spelling for every command that runs a model. Sets
    ``args.backend`` and ``args.checkpoint`` (None unless local). ``before`` names the command's
    positional argument, which must come before ``--backend`` (the option takes the words after it)."""

    class Backend(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            kind, *rest = values
            if kind not in kinds:
                parser.error(f"argument --backend: {kind!r} is not one of {', '.join(kinds)}")
            if kind == "local" and not rest:
                parser.error(
                    "argument --backend: local needs the model to load: --backend local CKPT "
                    "(smollm2, a native V3.2 checkpoint or an HF directory)"
                )
            expected = 1 if kind == "local" else 0
            if len(rest) > expected:
                extra = " ".join(rest[expected:])
                hint = f" (put the {before} before --backend)" if before else ""
                parser.error(f"argument --backend: unexpected {extra!r} after it{hint}")
            namespace.backend = kind
            namespace.checkpoint = rest[0] if rest else None

    p.add_argument(
        "--backend", nargs="+", action=Backend, default=default, metavar=("KIND", "CKPT"), help=help
    )
    p.set_defaults(checkpoint=None)


def check_backend_flags(args: argparse.Namespace) -> None:
    """``--base-url`` and ``--model`` name an OpenAI-compatible endpoint: both for ``--backend
    openai``, neither for another backend (UsageError)."""
    if args.backend == "openai" and not (args.base_url and args.model):
        raise UsageError("--backend openai needs --base-url URL and --model NAME")
    if args.backend != "openai" and (args.base_url or args.model):
        raise UsageError(
            "--base-url and --model are for --backend openai (a local model is --backend local CKPT)"
        )


def user_error(err: BaseException) -> str | None:
    """The one-line message for a mistake the user can fix, or None for a bug."""
    if isinstance(err, DSV32Error):
        return str(err)
    if isinstance(err, json.JSONDecodeError):
        where = f" in {err.doc_path}" if getattr(err, "doc_path", None) else ""
        return f"malformed JSON{where}: {err.msg} at line {err.lineno}, column {err.colno}"
    if isinstance(err, tomllib.TOMLDecodeError):
        return f"malformed TOML: {err}"
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 text: {err}"
    if isinstance(err, FileNotFoundError):
        return f"no such file or directory: {err.filename}" if err.filename else str(err)
    if isinstance(err, IsADirectoryError):
        return f"is a directory, expected a file: {err.filename or err}"
    if isinstance(err, NotADirectoryError):
        return f"not a directory: {err.filename or err}"
    if isinstance(err, PermissionError):
        return f"permission denied: {err.filename or err}"
    if isinstance(err, OSError):
        return f"{err.strerror or err}: {err.filename}" if err.filename else str(err)
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for chatty in ("httpx", "httpx2", "httpcore", "httpcore2"):  # the openai client logs each request
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{args.prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        message = user_error(err)
        if message is None or args.debug:
            raise
        print(f"{args.prog}: {' '.join(message.split())}", file=sys.stderr)
        return USAGE_EXIT


if __name__ == "__main__":
    sys.exit(main())
