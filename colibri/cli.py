"""The `colibri` command line: one subcommand per job, each defined next to the
code it drives (a module exposing `add_parser(subparsers)` that sets
`func=handler`). Errors the user can act on become one line and the error's
exit status (2, or what the command documents, e.g. `colibri verify`).
"""
from __future__ import annotations

import argparse
import importlib
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
        print(f"colibri: error: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("colibri: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
