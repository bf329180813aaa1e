"""compile_commands.json for one target (clangd, clang-tidy, IDEs).

SCons's own compilation_db tool rebuilds its file on every run; this one is
generated from the exact compile commands of the build and rewritten only
when they change, so a second `scons` does nothing.
"""
from __future__ import annotations

import json


def render(entries, directory: str) -> str:
    """entries: (source, output, command) tuples, paths relative to
    `directory` (the repository). Sorted so the file is byte-stable."""
    items = [{"directory": directory, "file": src, "output": out, "command": cmd}
             for src, out, cmd in sorted(entries)]
    return json.dumps(items, indent=2) + "\n"
