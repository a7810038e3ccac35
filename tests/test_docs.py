"""README.md and docs/*.md say what the code does: every command of their ```sh blocks is run or
checked against the real code, the keys table is the app's bindings, links lead somewhere.

How each command line is checked (docs/development.md, "The documentation is tested"):

- Commands that only read recordings or simulate (`ddptui replay` (with --headless added),
  `summary`, `export`, `whatif`, `demo` (--headless added): through ddptui's own entry point,
  `ddptui.cli.main.main`, in this process; `python ...`, `demo/talk.sh` (dry run), shell lines
  such as the token file's: as processes) run for real, a page's in order in one scratch
  folder holding `demo/` (a folder of links to this checkout's files) and `examples/`, as a
  reader typing them would; each must exit 0 (or the status its `# exits N` marker says).
- Commands that start ranks (`ddptui [options]`, `ddptui run`, `verify`, `bench`, `torchrun`)
  are checked by the real parser and the checks a run makes before it starts any rank
  (`build_live`, `run.build`: models, strategies, --slow-rank, the batch split, GPUs, paths),
  without starting ranks: each would take 10 s or more here, and other tests run them. So are
  `serve` (it serves until stopped), what needs other hosts (`join`, `--nnodes`) and
  `attach` (a running job).
- A line ending in `# needs a GPU` or `# needs N GPUs` is checked as on a machine with that
  many GPUs; `test_gpu_commands_run` (marked gpu) runs the live ones for real, steps cut to 3,
  where there are that many.
- A command reading a file that is neither in the scratch folder nor in demo/ or examples/ must
  have it written by a block above it on the page (a command not run here, or a Python
  snippet): it is then parsed only.
"""
from __future__ import annotations

import contextlib
import glob
import io
import importlib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

import pytest

from ddptui.cli.main import SUBCOMMANDS, build_live, live_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
PAGES = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
IDS = [os.path.relpath(p, ROOT) for p in PAGES]
FENCE = re.compile(r"^```(\w*)\s*$")
SHELL = ("umask", "mkdir", "cd", "ls")  # lines run by bash as written


@dataclass
class Block:
    lang: str
    text: str
    line: int  # of the opening fence, 1-based


@dataclass
class Cmd:
    text: str  # the command, comment removed, continuation lines joined
    comment: str
    line: int
    block: int  # index of its block in the page

    @property
    def gpus(self) -> int:
        m = re.search(r"needs (a|\d+) GPUs?", self.comment)
        return 0 if not m else (1 if m.group(1) == "a" else int(m.group(1)))

    @property
    def exits(self) -> int:
        m = re.search(r"exits (\d+)", self.comment)
        return int(m.group(1)) if m else 0


def blocks(path: str) -> list[Block]:
    out, cur = [], None
    for i, line in enumerate(open(path, encoding="utf-8").read().splitlines(), 1):
        m = FENCE.match(line)
        if cur is None and m:
            cur = Block(m.group(1), "", i)
        elif cur is not None and line.strip() == "```":
            out.append(cur)
            cur = None
        elif cur is not None:
            cur.text += line + "\n"
    assert cur is None, f"{path}: a code block opened at line {cur.line} is never closed"
    return out


def split_comment(line: str) -> tuple[str, str]:
    """`cmd  # comment` -> (cmd, comment), a # inside quotes kept."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def commands(path: str) -> list[Cmd]:
    out = []
    for bi, b in enumerate(blocks(path)):
        if b.lang != "sh":
            continue
        pending, start = "", 0
        for j, raw in enumerate(b.text.splitlines(), b.line + 1):
            if not raw.strip():
                continue
            if raw.rstrip().endswith("\\"):
                pending, start = pending + raw.rstrip()[:-1] + " ", start or j
                continue
            text, comment = split_comment(pending + raw)
            out.append(Cmd(" ".join(text.split()), comment, start or j, bi))
            pending, start = "", 0
    return out


# -- running and checking -------------------------------------------------------------------

def scratch_folder(tmp_path) -> str:
    """A folder like a checkout's root: demo/ as links to this checkout's files (a probe or a
    recording written there stays here), examples/ linked."""
    demo = tmp_path / "demo"
    demo.mkdir()
    for name in os.listdir(os.path.join(ROOT, "demo")):
        os.symlink(os.path.join(ROOT, "demo", name), demo / name)
    os.symlink(os.path.join(ROOT, "examples"), tmp_path / "examples")
    return str(tmp_path)


def env_prefix(argv: list[str]) -> tuple[dict, list[str]]:
    env = {}
    while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
        k, _, v = argv.pop(0).partition("=")
        env[k] = v
    return env, argv


def run_real(argv: list[str], cwd: str, expect: int, env: dict | None = None, what: str = ""):
    e = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
    p = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=e, timeout=180)
    assert p.returncode == expect, f"{what}: exit {p.returncode}, expected {expect}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p


def script_args_known(script: str, args: list[str]) -> None:
    src = open(script, encoding="utf-8").read()
    for a in args:
        if a.startswith("--"):
            assert f'"{a.split("=")[0]}"' in src, f"{script} has no option {a}"


class Checker:
    def __init__(self, page: str, cwd: str, monkeypatch):
        self.page, self.cwd, self.mp = page, cwd, monkeypatch
        self.page_blocks = blocks(page)
        self.seen: list[str] = []  # the page's commands above this one, run or not

    def gpu_count(self, cmd: Cmd) -> None:
        self.mp.setenv("DDPTUI_GPU_COUNT", str(cmd.gpus))

    def exists(self, p: str) -> bool:
        return os.path.exists(os.path.join(self.cwd, p))

    def check(self, cmd: Cmd) -> None:
        what = f"{os.path.relpath(self.page, ROOT)}:{cmd.line}: {cmd.text}"
        try:
            self._check(cmd, what)
        finally:
            self.seen.append(cmd.text)

    def written_above(self, path_arg: str, cmd: Cmd) -> bool:
        """Named by a command above, or in a block above that is not a command (a snippet)."""
        name = path_arg.rstrip("/")
        return any(name in t for t in self.seen) or any(
            name in b.text for b in self.page_blocks[:cmd.block] if b.lang != "sh")

    def _check(self, cmd: Cmd, what: str) -> None:
        if cmd.text.split()[0] in SHELL:  # a shell line (the token file's)
            run_real(["bash", "-c", cmd.text], self.cwd, cmd.exits, what=what)
            return
        env, argv = env_prefix(shlex.split(cmd.text))
        head = argv[0]
        self.mp.chdir(self.cwd)
        self.gpu_count(cmd)
        if head in ("ddptui", "bin/ddptui"):
            self.ddptui(argv[1:], cmd, env, what)
        elif head in ("bin/test", "bin/setup"):
            p = os.path.join(ROOT, head)
            assert os.access(p, os.X_OK), f"{what}: {head} is not an executable script"
            for a in argv[1:]:
                assert a.startswith("-") or os.path.exists(os.path.join(ROOT, a)), f"{what}: no {a}"
        elif head in ("pip", ".venv/bin/pip"):
            self.pip(argv[1:], what)
        elif head in ("python", ".venv/bin/python"):
            self.python(argv[1:], cmd, env, what)
        elif head == "torchrun":
            from torch.distributed.run import get_args_parser
            a = get_args_parser().parse_args(argv[1:])
            script = os.path.join(ROOT, a.training_script)
            assert os.path.isfile(script), f"{what}: no script {a.training_script}"
            script_args_known(script, a.training_script_args)
        elif head == "demo/talk.sh":
            run_real(["bash", "demo/talk.sh"] + argv[1:], self.cwd, cmd.exits, {"DDPTUI_TALK_DRY_RUN": "1"}, what)
        else:
            pytest.fail(f"{what}: tests/test_docs.py does not know how to check {head!r}")

    def pip(self, args: list[str], what: str) -> None:
        assert args[0] == "install", what
        tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
        extras = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]["optional-dependencies"]
        targets = [a for a in args[1:] if not a.startswith("-")]
        assert targets, what
        for t in targets:
            m = re.fullmatch(r"\.(?:\[([\w,]+)\])?", t)
            assert m, f"{what}: installs {t}, not this checkout"
            for x in (m.group(1) or "").split(","):
                assert not x or x in extras, f"{what}: no extra {x!r} in pyproject.toml"

    def python(self, args: list[str], cmd: Cmd, env: dict, what: str) -> None:
        if args[0] == "-c" and "hta" in args[1] and importlib.util.find_spec("hta") is None:
            if os.environ.get("CI"):
                pytest.fail(f"{what}: HTA is not installed (CI installs the hta extra)")
            return  # HTA's extra is not installed here: the rest of the page still runs
        if args[0] == "-m":
            assert importlib.util.find_spec(args[1]) is not None, f"{what}: no module {args[1]}"
            files = [a for a in args[2:] if not a.startswith("-") and not a.isdigit()]
            if files and not os.path.exists(os.path.join(self.cwd, files[0])) and self.written_above(files[0], cmd):
                return  # (it reads what a command above, checked but not run, would write)
        elif args[0] != "-c":
            assert os.path.isfile(os.path.join(ROOT, args[0])), f"{what}: no {args[0]}"
            args = [os.path.join(ROOT, args[0])] + args[1:]
        run_real([sys.executable] + args, self.cwd, cmd.exits, env, what)

    def ddptui(self, args: list[str], cmd: Cmd, env: dict, what: str) -> None:
        verb = args[0] if args and args[0] in SUBCOMMANDS else None
        rest = args[1:] if verb else args
        if verb is None:
            if "--help" in rest or "--version" in rest:
                run_real([sys.executable, "-m", "ddptui.cli.main"] + rest, self.cwd, 0, env, what)
            elif "--nnodes" in rest:  # node 0 of several: its parser (the rendezvous needs the hosts)
                live_parser().parse_args(rest)
            else:
                build_live(rest)
            return
        mod = importlib.import_module(f"ddptui.cli.{verb}")
        if "--help" in rest:
            run_real([sys.executable, "-m", "ddptui.cli.main", verb, "--help"], self.cwd, 0, env, what)
            return
        if verb == "run":
            a, opts, plan, run = mod.build(rest)
            script_args_known(os.path.abspath(a.script), a.args)
            return
        if verb == "verify":
            a = mod.parser().parse_args(rest)
            build_live(["--headless", "--no-record", "--gpus", str(a.gpus), "--device", a.device,
                        "--model", a.model, "--strategies", a.strategies, "--steps", str(a.steps),
                        "--batch-size", str(a.batch_size)] + (["--ranks", str(a.ranks)] if a.ranks else []))
            return
        if verb == "bench":
            a = mod.parser().parse_args(rest)
            mod.parse_models(a.models)
            mod.parse_bench_strategies(a.strategies)
            return
        if verb in ("serve", "join", "attach"):  # (they need a browser, other hosts, a running job)
            a = mod.parser().parse_args(rest)
            f = getattr(a, "file", None)
            assert f is None or self.exists(f), f"{what}: no {f}"
            return
        # replay, summary, export, whatif, demo: read recordings or simulate; run for real
        a = mod.parser().parse_args(rest)
        f = getattr(a, "file", None)
        if f is not None and not self.exists(f) and not cmd.exits:
            assert self.written_above(f, cmd), \
                f"{what}: reads {f}, which is not in demo/ or examples/ and nothing above on the page writes"
            return  # written by a command not run here: parsed only
        if verb in ("replay", "demo") and "--headless" not in rest and "--seed-table" not in rest:
            rest = rest + ["--headless"]  # the UI needs a terminal: the same path, no drawing
        self.in_process([verb] + rest, cmd.exits, env, what)

    def in_process(self, argv: list[str], expect: int, env: dict, what: str) -> None:
        """`ddptui ARGV` through its real entry point, in this process (cwd: the scratch
        folder): the same code as the command, without a Python start-up (0.4 s) each."""
        from ddptui.cli.main import main
        for k, v in env.items():
            self.mp.setenv(k, v)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
        assert code == expect, f"{what}: exit {code}, expected {expect}\n{out.getvalue()[-2000:]}\n{err.getvalue()[-3000:]}"


# -- the tests ------------------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_command_works_as_written(page, tmp_path, monkeypatch):
    cmds = commands(page)
    if page != README and os.path.basename(page) == "README.md":
        return  # the docs' index has no commands
    assert cmds, f"{page}: no ```sh command: show the reader one"
    c = Checker(page, scratch_folder(tmp_path), monkeypatch)
    for cmd in cmds:
        c.check(cmd)


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_python_snippets_compile(page):
    for b in blocks(page):
        if b.lang == "python":
            compile(b.text, f"{page}:{b.line}", "exec")
        else:
            assert b.lang in ("sh", "text", ""), f"{page}:{b.line}: a ```{b.lang} block: use sh, python or text"
            assert b.lang, f"{page}:{b.line}: say what the block holds: ```sh, ```python or ```text"


def test_the_readme_is_short_and_has_what_a_newcomer_needs():
    text = open(README, encoding="utf-8").read()
    assert len(text.splitlines()) <= 250
    cmds = [c.text for c in commands(README)]
    assert "bin/test" in cmds  # the command CI runs (.ci/run)
    assert "ddptui --gpus 2 --model xlarge" in cmds
    assert "![" in text and "demo/screenshots/" in text
    for page in PAGES[1:]:
        assert os.path.relpath(page, ROOT) in text or os.path.basename(page) == "README.md", \
            f"README.md does not link {os.path.relpath(page, ROOT)}"


KEY_NAMES = {"space": "space", "←": "left", "→": "right", "+": "plus", "-": "minus",
             "[": "left_square_bracket", "]": "right_square_bracket", "?": "question_mark",
             "Ctrl-C": "ctrl+c"}


def test_the_keys_table_is_the_apps_bindings():
    from ddptui.ui.app import DdpApp
    text = open(README, encoding="utf-8").read()
    table = text.split("## Keys", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for row in table.splitlines():
        if row.startswith("| `"):
            for k in re.findall(r"`([^`]+)`", row.split("|")[1]):
                documented.add(KEY_NAMES.get(k, k))
    bound = {b.key.split(",")[0] for b in DdpApp.BINDINGS}
    assert documented == bound, f"README keys {sorted(documented - bound)} not bound; " \
                                f"bound but not in README's table: {sorted(bound - documented)}"


def _slug(heading: str) -> str:
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def _anchors(path: str) -> set[str]:
    out, fenced = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(_slug(line.lstrip("#")))
    return out


@pytest.mark.parametrize("page", PAGES + [os.path.join(ROOT, "demo", "README.md"),
                                          os.path.join(ROOT, "benchmarks", "README.md")],
                         ids=IDS + ["demo/README.md", "benchmarks/README.md"])
def test_links_lead_somewhere(page):
    text = open(page, encoding="utf-8").read()
    for target, anchor in re.findall(r"\]\(([^)#\s]*)(#[^)\s]*)?\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        dest = os.path.normpath(os.path.join(os.path.dirname(page), target)) if target else page
        assert os.path.exists(dest), f"{page}: a link to {target}, which does not exist"
        if anchor and dest.endswith(".md"):
            assert anchor[1:] in _anchors(dest), f"{page}: no heading {anchor} in {target or 'itself'}"


@pytest.mark.parametrize("page", PAGES[1:], ids=IDS[1:])
def test_each_page_opens_with_its_question(page):
    lines = [x for x in open(page, encoding="utf-8").read().splitlines() if x.strip()]
    assert lines[0].startswith("# ")
    first = " ".join(lines[1:4])
    assert first.startswith("**") and re.match(r"\*\*[^*]+\?\*\*", first), \
        f"{page}: open with the question the page answers, in bold"


def _known_options() -> set[str]:
    opts = set(live_parser()._option_string_actions)
    for verb in SUBCOMMANDS:
        opts |= set(importlib.import_module(f"ddptui.cli.{verb}").parser()._option_string_actions)
    for src in glob.glob(os.path.join(ROOT, "benchmarks", "*.py")) + glob.glob(os.path.join(ROOT, "examples", "*.py")):
        opts |= set(re.findall(r"[\"'](--[a-z][a-z0-9-]*)[\"']", open(src, encoding="utf-8").read()))
    return opts


def test_options_named_in_prose_exist():
    """Every `--option` the pages name in backticks is an option of ddptui (or of a benchmark
    or example script they point to)."""
    known = _known_options()
    for page in PAGES:
        text = re.sub(r"```.*?```", "", open(page, encoding="utf-8").read(), flags=re.S)
        for span in re.findall(r"`([^`]+)`", text):
            if span.startswith("--"):
                opt = re.split(r"[ =\[]", span)[0]
                assert opt in known, f"{page}: `{span}` names {opt}, which nothing here has"


@pytest.mark.gpu
def test_gpu_commands_run(tmp_path):
    """The live runs on lines marked `# needs a GPU` / `# needs N GPUs`, for real on this
    machine's GPUs where it has that many: headless, 3 steps, not recorded unless the line
    records (`verify` lines stay parsed only: the GPU pass runs verify itself)."""
    import torch
    have = torch.cuda.device_count()
    ran = 0
    for i, page in enumerate(PAGES):
        where = tmp_path / f"page{i}"
        where.mkdir()
        cwd = scratch_folder(where)
        for cmd in commands(page):
            argv = shlex.split(cmd.text)
            args = argv[1:]
            if not cmd.gpus or cmd.gpus > have or argv[0] != "ddptui" or (args and args[0] in SUBCOMMANDS):
                continue
            if "--steps" in args:
                args[args.index("--steps") + 1] = "3"
            else:
                args += ["--steps", "3"]
            args += [] if "--headless" in args else ["--headless"]
            args += [] if "--record" in args else ["--no-record"]
            p = subprocess.run([sys.executable, "-m", "ddptui.cli.main"] + args, capture_output=True, text=True,
                               cwd=cwd, env=dict(os.environ, PYTHONPATH=ROOT), timeout=240)
            assert p.returncode == 0, f"{page}:{cmd.line}: {cmd.text}\n{p.stderr[-3000:]}"
            ran += 1
    if not ran:
        pytest.skip(f"no documented GPU command fits {have} GPU(s)")
