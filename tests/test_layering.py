"""The layering contract of ARCHITECTURE.md's "Packages", enforced on the source.

Every import of every .py file under ranks/ and ddptui/ is read with `ast` (module level and
inside functions alike; relative imports resolved to absolute module names) and checked:

- `ranks` (the worker side) never imports `ddptui`, `textual` or `rich`.
- The pipeline's stages import only downward, lowest first: ranks < ddptui.ingest <
  ddptui.model < ddptui.recording < ddptui.reports < ddptui.live < ddptui.ui < ddptui.cli.
  A module may import its own stage. `ddptui/__init__.py` and `ddptui/__main__.py` are the
  top and may import anything; any stage may import `ddptui` itself (`__version__`: Python
  runs ddptui/__init__.py before any ddptui module anyway, and it imports nothing), never
  `ddptui.__main__`. Every other module of ddptui/ belongs to a stage.
- Only `ddptui.ui` (and its subpackages) import `textual`. One exception, from the code:
  `ddptui.cli.serve` serves the UI in a browser through textual-serve (`textual_serve`, a
  separate package, which only it imports) and its tab processes run the UI with `TabDriver`,
  a subclass of textual's WebDriver made inside a function (`_tab_driver`), so serve.py may
  import `textual` inside functions, never at module level.
- No import cycles between modules of ddptui/ and ranks/, imports inside functions included
  (moving an import into a function hides a cycle from Python, not from the design: two
  modules that need each other share a third both import). An import's edge goes to the
  module it names (`from . import x` to the submodule x when there is one, else to the
  package), not to the packages above it.
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("ranks", "ddptui")
STAGES = ("ranks", "ddptui.ingest", "ddptui.model", "ddptui.recording", "ddptui.reports",
          "ddptui.live", "ddptui.ui", "ddptui.cli")  # lowest first
TOP = ("ddptui", "ddptui.__main__")  # may import anything
TEXTUAL_FUNCTION_LEVEL_OK = ("ddptui.cli.serve",)  # TabDriver (see the docstring)
TEXTUAL_SERVE_OK = ("ddptui.cli.serve",)
# the tests share one reading of the packages (the module's `tree`): on one pytest-xdist worker
pytestmark = pytest.mark.xdist_group("layering")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    file: str  # relative to ROOT
    line: int
    target: str  # the imported module, absolute (the submodule where a name is one)
    text: str  # the import statement as written
    top_level: bool  # runs when the module is imported (not inside a function)

    def where(self) -> str:
        return f"{self.file}:{self.line}: {self.text}"


def _modules(root: str = ROOT) -> dict[str, str]:
    """Module name -> file (relative to root) of every .py file under the packages."""
    out: dict[str, str] = {}
    for pkg in PACKAGES:
        for d, dirs, files in os.walk(os.path.join(root, pkg)):
            dirs[:] = sorted(x for x in dirs if not x.startswith((".", "__pycache__")))
            for f in sorted(files):
                if not f.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(d, f), root)
                parts = rel[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts.pop()
                out[".".join(parts)] = rel
    return out


def _is_package(module: str, modules: dict[str, str]) -> bool:
    return modules.get(module, "").endswith("__init__.py")


def _resolve(node: ast.ImportFrom, module: str, modules: dict[str, str]) -> str:
    """The absolute module a `from ... import` names (before its names)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not _is_package(module, modules):
        base = base[:-1]  # a module's relative imports start from its package
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


# the lines as ast numbers them: only \r, \n and \r\n end one (not str.splitlines' \f, \v...);
# ast's own splitter (_splitlines_no_ff) is a loop in Python over every character
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def _split(src: str) -> list[str]:
    return _LINE.findall(src)


def _imports_of(module: str, file: str, modules: dict[str, str], root: str = ROOT) -> list[Import]:
    with open(os.path.join(root, file), encoding="utf-8") as f:
        src = f.read()
    tree = ast.parse(src, filename=file)
    out: list[Import] = []
    # the source's lines split once (ast.get_source_segment splits the whole file again at
    # every call: a file's imports cost its size each, ~20 s over the packages on 2 cores)
    lines = [ln.encode() for ln in _split(src)]

    def segment(node: ast.AST) -> str:  # (ast.get_source_segment's: the offsets are UTF-8 bytes)
        first, last = node.lineno - 1, node.end_lineno - 1
        if first == last:
            return lines[first][node.col_offset:node.end_col_offset].decode()
        return b"".join([lines[first][node.col_offset:], *lines[first + 1:last],
                         lines[last][:node.end_col_offset]]).decode()

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                text = " ".join(segment(child).split())
                if isinstance(child, ast.Import):
                    targets = [a.name for a in child.names]
                else:
                    base = _resolve(child, module, modules)
                    targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                               for a in child.names]
                for t in dict.fromkeys(targets):
                    out.append(Import(module, file, child.lineno, t, text, top))
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, inner)

    visit(tree, True)
    return out


def all_imports(root: str = ROOT) -> tuple[dict[str, str], list[Import]]:
    modules = _modules(root)
    return modules, [i for m, f in modules.items() for i in _imports_of(m, f, modules, root)]


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def stage_of(module: str) -> int | None:
    """The index in STAGES of the stage a module belongs to (the longest prefix), or None."""
    found = [i for i, s in enumerate(STAGES) if _under(module, s)]
    return max(found, key=lambda i: len(STAGES[i])) if found else None


# -- the rules: each returns the offending imports as lines "file:line: import -> why" ----------
def ranks_violations(imports: list[Import]) -> list[str]:
    return [f"{i.where()}  (ranks imports {i.target})" for i in imports
            if _under(i.module, "ranks") and any(_under(i.target, p) for p in ("ddptui", "textual", "rich"))]


def stage_violations(imports: list[Import], modules: dict[str, str]) -> list[str]:
    out = []
    for m in sorted(modules):
        if m not in TOP and stage_of(m) is None:
            out.append(f"{modules[m]}:1: module {m} is in no stage (add it to one of {STAGES})")
    for i in imports:
        if i.module in TOP or not any(_under(i.target, p) for p in PACKAGES):
            continue
        if i.target == "ddptui":  # the package itself: __version__
            continue
        src, dst = stage_of(i.module), stage_of(i.target)
        if dst is None or (src is not None and dst > src):
            what = STAGES[dst] if dst is not None else i.target
            out.append(f"{i.where()}  ({STAGES[src] if src is not None else i.module} imports {what}, "
                       "a stage above it)")
    return out


# ranks/'s rooms, lowest first: the protocol (its top-level modules), the instrument core, the
# built-in workers, users' scripts; a room imports its own and those below it
ROOMS = ("ranks", "ranks.core", "ranks.builtin", "ranks.scripts")


def room_of(module: str) -> int | None:
    found = [i for i, r in enumerate(ROOMS) if _under(module, r)]
    return max(found) if found else None


def room_violations(imports: list[Import]) -> list[str]:
    out = []
    for i in imports:
        a, b = room_of(i.module), room_of(i.target)
        if a is not None and b is not None and b > a:
            out.append(f"{i.where()}  ({ROOMS[a]} imports {i.target}, a room above it)")
    return out


def textual_violations(imports: list[Import]) -> list[str]:
    out = []
    for i in imports:
        if _under(i.target, "textual") and not _under(i.module, "ddptui.ui"):
            if not (i.module in TEXTUAL_FUNCTION_LEVEL_OK and not i.top_level):
                out.append(f"{i.where()}  ({i.module} imports textual outside ddptui.ui)")
        if _under(i.target, "textual_serve") and i.module not in TEXTUAL_SERVE_OK:
            out.append(f"{i.where()}  ({i.module} imports textual_serve)")
    return out


def cycles(imports: list[Import], modules: dict[str, str]) -> list[str]:
    """Each import cycle among the project's modules (imports inside functions included), once,
    as the chain of imports that closes it."""
    edges: dict[str, list[Import]] = {m: [] for m in modules}
    for i in imports:
        if i.target in modules and i.target != i.module:
            edges[i.module].append(i)
    out: list[str] = []
    seen: set[frozenset[str]] = set()
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[Import] = []

    def dfs(m: str) -> None:
        state[m] = 1
        for e in edges[m]:
            t = e.target
            if state.get(t) == 1:
                start = next(k for k, p in enumerate(path + [e]) if p.module == t)
                chain = (path + [e])[start:]
                key = frozenset(c.module for c in chain)
                if key not in seen:
                    seen.add(key)
                    out.append(" -> ".join(c.module for c in chain) + f" -> {t}: "
                               + "; ".join(c.where() for c in chain))
            elif t not in state:
                path.append(e)
                dfs(t)
                path.pop()
        state[m] = 2

    for m in sorted(modules):
        if m not in state:
            dfs(m)
    return out


def _fail(rule: str, found: list[str], what: str = "offending import(s)") -> str:
    return f"{rule}: {len(found)} {what}:\n  " + "\n  ".join(found)


# -- the tests ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tree() -> tuple[dict[str, str], list[Import]]:
    """(the modules, their imports): read once, when a test first needs them (read at import,
    they cost every pytest process that collects this module 1.5 s)."""
    return all_imports()


def test_the_packages_are_read(tree):
    MODULES, IMPORTS = tree
    assert {"ranks", "ranks.seams", "ddptui", "ddptui.cli.main", "ddptui.ui.app"} <= set(MODULES)
    assert any(i.target == "ranks.seams" for i in IMPORTS)


def test_ranks_never_import_ddptui_textual_or_rich(tree):
    MODULES, IMPORTS = tree
    found = ranks_violations(IMPORTS)
    assert not found, _fail("ranks must not import ddptui, textual or rich", found)


def test_stages_import_only_downward(tree):
    MODULES, IMPORTS = tree
    found = stage_violations(IMPORTS, MODULES)
    assert not found, _fail(f"a stage imports only its own and those below it ({' < '.join(STAGES)})",
                            found)


def test_ranks_rooms_import_only_downward(tree):
    MODULES, IMPORTS = tree
    assert {"ranks.core.recorder", "ranks.builtin.worker", "ranks.scripts.user"} <= set(MODULES)
    found = room_violations(IMPORTS)
    assert not found, _fail(f"ranks/'s rooms import only their own and those below ({' < '.join(ROOMS)})",
                            found)
    # (and the rule catches one that does not)
    bad = Import("ranks.core.recorder", "ranks/core/recorder.py", 1, "ranks.builtin.strategies",
                 "from ranks.builtin import strategies", True)
    assert room_violations([bad])


def test_only_the_ui_imports_textual(tree):
    MODULES, IMPORTS = tree
    found = textual_violations(IMPORTS)
    assert not found, _fail("only ddptui.ui imports textual (and ddptui.cli.serve textual_serve, "
                            "and textual inside functions for its TabDriver)", found)


def test_no_import_cycles(tree):
    MODULES, IMPORTS = tree
    found = cycles(IMPORTS, MODULES)
    assert not found, _fail("no import cycles (imports inside functions included)", found, "cycle(s)")


def test_the_checks_catch_what_they_forbid(tmp_path):
    """Each rule fails on a tree that breaks it, naming the file, line and import."""
    files = {
        "ranks/__init__.py": "",
        "ranks/a.py": "import os\n\n\ndef f():\n    from ddptui.model import store\n",
        "ranks/b.py": "from . import c\n",
        "ranks/c.py": "from .b import x\n",
        "ranks/d.py": "import os\n\n\ndef f():\n    from . import e\n",
        "ranks/e.py": "from .d import y\n",
        "ddptui/__init__.py": "",
        "ddptui/model/__init__.py": "",
        "ddptui/model/store.py": "from ..live import session\nfrom ddptui import __version__\n",
        "ddptui/live/__init__.py": "",
        "ddptui/live/session.py": "from ddptui.model import store\nimport textual.app\n",
        "ddptui/cli/__init__.py": "",
        "ddptui/cli/serve.py": "import textual\n\n\ndef g():\n    from textual.drivers import web_driver\n",
        "ddptui/extra.py": "",
    }
    for rel, src in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(src)
    modules, imports = all_imports(str(tmp_path))
    assert modules["ranks"] == os.path.join("ranks", "__init__.py")
    assert ranks_violations(imports) == [
        "ranks/a.py:5: from ddptui.model import store  (ranks imports ddptui.model.store)"]
    assert sorted(stage_violations(imports, modules)) == [
        "ddptui/extra.py:1: module ddptui.extra is in no stage (add it to one of "
        f"{STAGES})",
        "ddptui/model/store.py:1: from ..live import session  "
        "(ddptui.model imports ddptui.live, a stage above it)",
        "ranks/a.py:5: from ddptui.model import store  (ranks imports ddptui.model, a stage above it)"]
    assert textual_violations(imports) == [
        "ddptui/cli/serve.py:1: import textual  (ddptui.cli.serve imports textual outside ddptui.ui)",
        "ddptui/live/session.py:2: import textual.app  (ddptui.live.session imports textual outside ddptui.ui)"]
    assert sorted(cycles(imports, modules)) == [
        "ddptui.live.session -> ddptui.model.store -> ddptui.live.session: "
        "ddptui/live/session.py:1: from ddptui.model import store; "
        "ddptui/model/store.py:1: from ..live import session",
        "ranks.b -> ranks.c -> ranks.b: ranks/b.py:1: from . import c; ranks/c.py:1: from .b import x",
        "ranks.d -> ranks.e -> ranks.d: ranks/d.py:5: from . import e; ranks/e.py:1: from .d import y"]
