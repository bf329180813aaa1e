"""The `colibri` command line: one subcommand per job, each defined next to the
code it drives (a module exposing `add_parser(subparsers)` that sets
`func=handler`). Errors the user can act on become one line and the error's
exit status (2, or what the command documents, e.g. `colibri verify`).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from .errors import ColibriError

# Modules that contribute subcommands, in the order `colibri -h` lists them.
SUBCOMMAND_MODULES = (
    "colibri.model.convert",   # convert, imatrix
    "colibri.model.inspect",   # info, verify
    "colibri.model.stream_plan",  # plan
    "colibri.model.run",       # run
    "colibri.model.generate",  # tokenize, generate
    "colibri.device.fw_cli",   # fw keygen|pack|ota|verify|info|flash-init|install|boot|...
)


class OneLineArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, as every other error of
    the CLI: argparse's own prints the whole usage block first. Subcommand
    parsers inherit the class (add_subparsers makes them of the parent's)."""

    def error(self, message):
        sys.stdout.flush()
        prog = self.prog.removeprefix("colibri").strip()
        where = f"{prog}: " if prog else ""
        self.exit(2, f"colibri: error: {where}{message}: see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        prog="colibri",
        description="Convert Mixture-of-Experts checkpoints to .colibri files, "
                    "inspect them and run them (the C runtime or the numpy reference).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real missing dependency, not an absent module
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ColibriError as exc:
        sys.stdout.flush()  # a report printed before the error stays before it on 2>&1
        # the C runtime's errors say what is wrong; the CLI adds what to do
        advice = getattr(exc, "advice", "")
        print(f"colibri: error: {exc}" + (f": {advice}" if advice else ""), file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("colibri: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader of our output went away (`colibri info ... | head`):
        # as a C tool killed by SIGPIPE, stop quietly; stdout goes to
        # /dev/null so the interpreter's flush at exit does not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
