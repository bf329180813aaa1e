"""The import graph of the `colibri` package, read with `ast` (nothing is
imported): no cycles, and the layering colibri/__init__.py states (its
"part / may import" table, repeated as "May import:" in every subpackage's
docstring) holds for every import, at module level or inside a function.

A failure names the modules and the import; the fix is to move the shared
piece to the module it belongs to, not to hide the import in a function
(those count too).
"""
from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "colibri"
# Thin aliases of moved public paths: they import their new module, nothing
# imports them (colibri/__init__.py says which).
ALIASES = {"colibri.convert": "colibri.model.convert",
           "colibri.cbuild": "colibri.buildsteps.cbuild",
           "colibri.memory": "colibri.model.memory"}
# The code outside the package that must use the new paths, not the aliases.
USERS = ("tests", "bench", "scripts", "site_scons", "targets", "fuzz", "soak", "models")


def _modules() -> dict[str, tuple[Path, bool]]:
    """dotted name -> (file, is a package's __init__)."""
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The colibri module a dotted name lands in (its longest module prefix)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(path: Path, module: str, is_pkg: bool) -> list[tuple[str, int]]:
    """[(colibri module imported, line)] of every import statement in the
    file, wherever it stands. `from P import x` counts as an import of P.x
    when that is a module, else of P."""
    base = module if is_pkg else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = base.split(".")[:len(base.split(".")) - (node.level - 1)]
                mod = ".".join(pkg + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod
                       for a in node.names]
        else:
            continue
        for t in targets:
            if t == "colibri" or t.startswith("colibri."):
                r = _resolve(t)
                if r and r != module:
                    found.append((r, node.lineno))
    return found


@functools.cache
def graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first such import} (read once)."""
    g = {}
    for mod, (path, is_pkg) in MODULES.items():
        g[mod] = {}
        for target, line in imports_of(path, mod, is_pkg):
            g[mod].setdefault(target, line)
    return g


def cycles(g: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(g)))
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def layering() -> dict[str, set[str]]:
    """part -> the parts it may import, from colibri/__init__.py's table."""
    doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text()))
    table = doc.split("part         may import", 1)[1].split("\n\n", 1)[0]
    rules = {}
    for row in table.strip("\n").splitlines():
        part, allowed = row.split(None, 1)
        allowed = re.sub(r"\(.*?\)", "", allowed)
        rules[part] = {a.strip() for a in allowed.split(",") if a.strip() not in ("", "-")}
    return rules


def part_of(module: str) -> str | None:
    """colibri.model.convert -> model; colibri.runtime -> runtime; the
    package face and the aliases belong to no part."""
    if module == "colibri" or module in ALIASES:
        return None
    return module.split(".")[1]


def test_rules_cover_every_part_and_match_each_docstring():
    rules = layering()
    parts = {part_of(m) for m in MODULES} - {None}
    assert parts == set(rules), "colibri/__init__.py's table names every part, and no other"
    for mod, (path, is_pkg) in MODULES.items():
        if is_pkg and mod.count(".") == 1:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            m = re.search(r"^May import: (.*)$", doc, re.M)
            assert m, f"{path.relative_to(ROOT)}: the docstring says what it may import"
            stated = {a.strip() for a in m.group(1).split(",") if a.strip() != "-"}
            assert stated == rules[part_of(mod)], (
                f"{path.relative_to(ROOT)} says it may import {sorted(stated)}, "
                f"colibri/__init__.py {sorted(rules[part_of(mod)])}")


def test_no_import_cycles():
    g = graph()
    found = cycles(g)
    lines = [" -> ".join(c) + ": " + "; ".join(
        f"{a} imports {b} (line {g[a][b]})" for a in c for b in c if b in g[a]) for c in found]
    assert not found, "import cycles:\n" + "\n".join(lines)


def test_every_import_keeps_the_layering():
    rules, bad = layering(), []
    for mod, targets in graph().items():
        src = part_of(mod)
        for target, line in targets.items():
            dst = part_of(target)
            if target == "colibri.cli" and mod not in ALIASES:
                bad.append(f"{mod} (line {line}) imports colibri.cli: nothing imports the CLI")
            elif target in ALIASES:
                bad.append(f"{mod} (line {line}) imports the alias {target}: use "
                           f"{ALIASES[target]}")
            elif mod in ALIASES:
                if target != ALIASES[mod]:
                    bad.append(f"the alias {mod} imports {target}, not only {ALIASES[mod]}")
            elif src is not None and dst != src and dst not in rules[src]:
                bad.append(f"{mod} (line {line}) imports {target}: {src} may import only "
                           f"{', '.join(sorted(rules[src])) or 'nothing'}")
    assert not bad, "imports against colibri/__init__.py's layering:\n" + "\n".join(bad)


def test_the_reference_does_not_depend_on_the_converter():
    """The numpy reference is the golden truth: it stands on the file alone
    (colibri/model/__init__.py)."""
    truth = {"colibri.model.reference", "colibri.model.reference_encdec"}
    bad = [f"{m} imports {t}" for m in truth for t in graph()[m]
           if t not in truth and part_of(t) not in ("file", "errors")]
    assert not bad, "\n".join(bad)


def test_only_the_cli_imports_by_name():
    """importlib would hide an edge from this graph: only cli.py loads the
    subcommand modules that way."""
    hidden = [f"{p.relative_to(ROOT)}:{n.lineno}" for m, (p, _) in MODULES.items()
              if m != "colibri.cli"
              for n in ast.walk(ast.parse(p.read_text()))
              if isinstance(n, ast.Attribute) and n.attr == "import_module"
              or isinstance(n, ast.Name) and n.id == "__import__"]
    assert not hidden, "imports by name outside colibri/cli.py: " + ", ".join(hidden)


def test_code_outside_the_package_uses_the_new_paths():
    """tests, bench, scripts, the build, fuzz, soak and models import the
    modules where they are, not through the aliases."""
    old = [f"{p.relative_to(ROOT)}:{line}: {t}"
           for d in USERS for p in sorted((ROOT / d).rglob("*.py"))
           if p.resolve() != Path(__file__).resolve()
           for t, line in imports_of(p, "", False) if t in ALIASES]
    assert not old, "imports of an alias module:\n" + "\n".join(old)


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_each_alias_is_its_new_module(alias):
    """The old public paths still work: the alias's names are the new
    module's, and `python -m` runs the new module's main."""
    import importlib
    old, new = importlib.import_module(alias), importlib.import_module(ALIASES[alias])
    shared = [n for n in vars(old) if not n.startswith("_") and n != "sys"]
    assert shared and all(getattr(old, n) is getattr(new, n) for n in shared)
    if hasattr(new, "main"):
        r = subprocess.run([sys.executable, "-m", alias, "-h"], capture_output=True,
                           text=True, cwd=ROOT, timeout=60)
        assert r.returncode == 0 and "usage:" in r.stdout, r.stderr


# Where the tree names a module of the package by its path ("colibri/text/
# tokenizer.py" in a C comment, a doc page, a script), the file must exist:
# a module that moves takes its mentions with it.
MENTIONS = ("src", "firmware", "docs", "tests", "bench", "scripts", "site_scons",
            "targets", "fuzz", "soak", "models", "colibri")
MENTION_SUFFIXES = {".c", ".h", ".py", ".md", ".sh", ".txt", ".toml", ""}


def test_every_module_path_the_tree_names_exists():
    pattern = re.compile(r"\bcolibri/(?:[a-z_]+/)*[a-z_0-9]+\.py\b")
    files = [ROOT / "README.md", ROOT / "SConstruct"]
    files += [p for d in MENTIONS for p in sorted((ROOT / d).rglob("*"))
              if p.is_file() and p.suffix in MENTION_SUFFIXES and "__pycache__" not in p.parts]
    stale = sorted({f"{p.relative_to(ROOT)}: {m}"
                    for p in files if p.exists()
                    for m in pattern.findall(p.read_text(errors="replace"))
                    if not (ROOT / m).is_file()})
    assert not stale, "paths of modules that are not there:\n" + "\n".join(stale)
