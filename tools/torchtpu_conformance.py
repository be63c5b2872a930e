"""TorchTPU conformance: how much of TorchTPU's own public repository runs unchanged on tpusim.

Why: tpusim promises that scripts written for Google's TorchTPU run here as they are. TorchTPU ships its
own proof material (pytest files for its notebooks, marimo notebooks, tutorial and distributed examples);
running that material untouched, each file in its own process, measures the promise and gives the work
list of what still fails, by the error that ended each run (the "first error" column: a worker's
error rather than torchrun's wrapper around it, the first failing command of a shell script).

Three groups, each file in its own subprocess with a timeout (the process group is killed, so nothing
hangs), its output kept in a log file:

  tests      docs/notebooks/tests/test_*.py     ``python -m pytest -q -rA FILE`` (cwd docs/notebooks);
                                                counts of passed/failed/errors from pytest's summary
  notebooks  docs/notebooks/*.py                ``python FILE`` (cwd docs/notebooks); marimo notebooks
  examples   examples/tutorials/**, examples/distributed/**
             every entry point (a ``__main__``) under ``python FILE``; a torchrun worker (a file a
             launch.sh / launch.py starts through torchrun, or one that calls init_process_group) also
             under ``torchrun --standalone --nproc_per_node N FILE``; every entry point under
             ``python -m tpusim run FILE --ranks all --topology 2d:2x2 --compiler model``; every launch
             shell script under ``bash SCRIPT`` (they start the workers through TorchTPU's
             singlehost_wrapper and torchrun)

A run whose file needs something no checkout can give (Google-internal modules such as
``torch.google``, a repository module missing from the public copy, the network, several hosts) is
listed as skip with the reason (``--no-skip`` runs it anyway).

Stand-ins (``--no-standins`` turns them off): TorchTPU's notebooks need marimo, its examples absl and
portpicker, and its notebook tests a conftest.py (fixtures ``device``, ``setup_sys_path``) that the
public copy lacks. When such a module is not installed, a minimal stand-in written into the log folder
is put on PYTHONPATH, so a run measures tpusim rather than the environment; the report names each.

The runs import the checkout's ``examples``/``tests`` packages through an import root in the log folder
that links only those (and ``docs``), so ``import torch_tpu`` never reaches TorchTPU's own package (which
needs a real TPU): it finds tpusim's compatibility package, or whatever ``--pythonpath`` puts first.

Usage:

    python tools/torchtpu_conformance.py --checkout /tmp/torch_tpu_ref --json /tmp/conformance.json
    python tools/torchtpu_conformance.py --checkout DIR --group tests --group notebooks
    python tools/torchtpu_conformance.py --checkout DIR --only fsdp --launcher torchrun --list
    python tools/torchtpu_conformance.py --checkout DIR --pythonpath /path/to/torch_tpu_compat   # a shim under test

The 2 shared cores of a workstation run one process at a time; use --group to split a long run.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

GROUPS = ("tests", "notebooks", "examples")
WORKER_ALONE = "expected: a torchrun worker run alone lacks RANK/WORLD_SIZE, on TorchTPU too"
LAUNCHERS = ("pytest", "python", "torchrun", "tpusim", "bash")
NOTEBOOKS = Path("docs/notebooks")
NOTEBOOK_TESTS = NOTEBOOKS / "tests"
EXAMPLE_ROOTS = (Path("examples/tutorials"), Path("examples/distributed"))
NOTEBOOK_HELPERS = {"tpu_utils.py": "helper module the notebooks import, not a notebook"}
REPO_PACKAGES = ("examples", "tests")   # top-level modules a file may import from the checkout itself
HIDDEN_PACKAGE = "torch_tpu"            # never on the runs' path: tpusim's own compatibility must answer

# Static skip rules: (regex over the file's text, reason). The first match skips every launcher of that file.
TEXT_RULES: tuple[tuple[str, str], ...] = (
    (r"^\s*(from|import)\s+torch\.google\b", "needs torch.google (Google-internal, not in public PyTorch)"),
    (r"fetch_openml\(", "downloads MNIST from OpenML (no network here)"),
    (r"from_pretrained\(\s*(MODEL_PATH|model_dir|\"[\w.-]+/[\w.-]+\")",
     "downloads a Hugging Face model (no network here)"),
    (r"-m torch_tpu\._internal\.distributed\.launchers\.multihost_wrapper",
     "multi-host launcher (needs several TPU VMs)"),
)

_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)\b")
_PYTEST_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)(?:\s+-\s+(.*))?$")
_PYTEST_SITE = re.compile(r"^(\S+\.py):(\d+): (\w+)")
_RANK_PREFIX = re.compile(r"^\[(?:rank|default) ?\d+\]:? ?")    # torchrun's "[rank0]:", tpusim's "[rank 0] "
_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::.*)?$")
# python -m NAME that cannot import NAME prints one line, not a traceback.
_RUNPY_ERROR = re.compile(r": Error while finding module specification for '([^']+)' \((\w+: .*)\)$")
WRAPPERS = ("ChildFailedError", "RankCrashed", "CalledProcessError", "SystemExit")  # errors that only relay
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
_TORCHRUN_TARGET = re.compile(r"(?:torchrun|torch\.distributed\.run)\b[^\n]*?(\S+\.py)")


@dataclass
class Run:
    """One planned run: a file of the checkout under one launcher."""

    group: str
    file: str                      # relative to the checkout
    launcher: str
    command: list[str]
    cwd: str
    skip: str | None = None
    expected_failure: str = ""     # why this run fails on TorchTPU too (shown beside a failure)


@dataclass
class Result:
    """What one run did: outcome pass/fail/skip, the first error it printed and where its log is."""

    group: str
    file: str
    launcher: str
    command: list[str]
    cwd: str
    outcome: str
    reason: str = ""
    returncode: int | None = None
    seconds: float = 0.0
    timed_out: bool = False
    first_error: str = ""
    error_site: str = ""
    traceback_tail: list[str] = field(default_factory=list)
    log: str = ""
    tests: dict[str, int] = field(default_factory=dict)
    test_results: list[dict[str, str]] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- reading files

def imported_modules(source: str) -> set[str]:
    """Every module name a Python source imports (absolute imports), or nothing when it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def has_main(source: str) -> bool:
    """True for a script: it has an ``if __name__ == "__main__":`` block."""
    return re.search(r"^if __name__ == ['\"]__main__['\"]\s*:", source, re.M) is not None


def module_file(checkout: Path, module: str) -> Path | None:
    """The checkout's file or package for a dotted module name, or None when the checkout has none."""
    base = checkout.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py", base):
        if candidate.exists():
            return candidate
    return None


def missing_repo_module(checkout: Path, source: str) -> str | None:
    """The first ``examples.*``/``tests.*`` module the source imports that the checkout lacks.

    ``from pkg import name`` needs ``pkg/name`` when ``pkg`` is a folder without ``__init__.py`` (a namespace
    package, as TorchTPU's examples are); from a module or a regular package ``name`` may be an attribute.
    """
    wanted: list[str] = []
    for module in imported_modules(source):
        if module.split(".")[0] not in REPO_PACKAGES:
            continue
        parent = module_file(checkout, module.rpartition(".")[0]) if "." in module else None
        if parent is not None and (parent.suffix == ".py" or parent.name == "__init__.py"):
            continue                        # an attribute of a module: not checked
        wanted.append(module)
    return next((m for m in sorted(wanted) if module_file(checkout, m) is None), None)


def static_skip(checkout: Path, path: Path, source: str) -> str | None:
    """Why a file cannot run anywhere outside Google (a repository module the public copy lacks, then
    TEXT_RULES), or None."""
    missing = missing_repo_module(checkout, source)
    if missing:
        return f"imports {missing}, absent from the public checkout"
    return next((reason for pattern, reason in TEXT_RULES if re.search(pattern, source, re.M)), None)


def torchrun_targets(checkout: Path, script: Path) -> list[Path]:
    """The Python files a launch shell script starts through torchrun (``./x.py`` from the script's folder,
    ``./examples/...`` from the checkout's root, as TorchTPU's scripts are written)."""
    text = script.read_text(errors="replace").replace("\\\n", " ")
    targets = []
    for match in _TORCHRUN_TARGET.finditer(text):
        target = match.group(1)
        base = checkout if target.startswith("./examples/") else script.parent
        targets.append((base / target).resolve())
    return targets


def launched_workers(checkout: Path, source: str) -> list[Path]:
    """The modules a launch.py hands to a torchrun-like call (``torchrun(mod.fn, ...)``, ``dist_run(n, mod.fn)``)."""
    aliases: dict[str, str] = {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in REPO_PACKAGES:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    workers = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name not in ("torchrun", "dist_run"):
            continue
        for arg in node.args:
            if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id in aliases:
                found = module_file(checkout, aliases[arg.value.id])
                if found is not None:
                    workers.append(found.resolve())
    return workers


# ----------------------------------------------------------------------------------------------------- planning

@dataclass
class Settings:
    """The knobs of a whole run, from the command line."""

    checkout: Path
    import_root: Path
    report_dir: Path
    nproc: int
    topology: str
    skips: bool


def plan_tests(s: Settings) -> list[Run]:
    """One pytest run per notebook test file, from docs/notebooks so its imports resolve."""
    folder = s.checkout / NOTEBOOK_TESTS
    runs = []
    for path in sorted(folder.glob("test_*.py")):
        command = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                   str(path.relative_to(s.checkout / NOTEBOOKS))]
        runs.append(Run("tests", str(path.relative_to(s.checkout)), "pytest", command,
                        str(s.checkout / NOTEBOOKS)))
    return runs


def plan_notebooks(s: Settings) -> list[Run]:
    """One ``python NOTEBOOK.py`` run per notebook; helper modules are listed as skip."""
    runs = []
    for path in sorted((s.checkout / NOTEBOOKS).glob("*.py")):
        relative = str(path.relative_to(s.checkout))
        skip = NOTEBOOK_HELPERS.get(path.name)
        if skip is None and s.skips:
            skip = static_skip(s.checkout, path, path.read_text(errors="replace"))
        runs.append(Run("notebooks", relative, "python", [sys.executable, path.name], str(path.parent), skip))
    return runs


def example_files(checkout: Path) -> list[Path]:
    """Every .py and .sh file under the example folders, sorted."""
    files: list[Path] = []
    for root in EXAMPLE_ROOTS:
        files.extend(p for p in (checkout / root).rglob("*") if p.suffix in (".py", ".sh") and p.is_file())
    return sorted(files)


def plan_examples(s: Settings) -> list[Run]:
    """Entry points under python, torchrun (workers) and tpusim run; launch scripts under bash."""
    files = example_files(s.checkout)
    workers: set[Path] = set()
    unstartable: dict[Path, str] = {}        # launch script -> why the worker it starts cannot run
    for path in files:
        if path.suffix == ".sh":
            for target in torchrun_targets(s.checkout, path):
                name = str(target.relative_to(s.checkout))
                if not target.exists():
                    unstartable[path] = f"starts {name}, absent from the public checkout"
                    continue
                workers.add(target)
                why = static_skip(s.checkout, target, target.read_text(errors="replace"))
                if why:
                    unstartable[path] = f"starts {name}, which {why}"
        else:
            workers.update(launched_workers(s.checkout, path.read_text(errors="replace")))
    runs = []
    for path in files:
        relative = str(path.relative_to(s.checkout))
        source = path.read_text(errors="replace")
        skip = static_skip(s.checkout, path, source) if s.skips else None
        if path.suffix == ".sh":
            if s.skips and skip is None:
                skip = unstartable.get(path)
            cwd = s.import_root if "./examples/" in source else path.parent
            runs.append(Run("examples", relative, "bash", ["bash", str(path)], str(cwd), skip))
            continue
        if not has_main(source):
            runs.append(Run("examples", relative, "python", [], str(path.parent), "library module (no __main__)"))
            continue
        is_worker = path.resolve() in workers or "init_process_group" in source
        report = s.report_dir / relative.replace("/", "__")
        commands = [("python", [sys.executable, path.name])]
        if is_worker:
            commands.append(("torchrun", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                          f"--nproc_per_node={s.nproc}", path.name]))
        commands.append(("tpusim", [sys.executable, "-m", "tpusim", "run", path.name, "--ranks", "all",
                                    "--topology", s.topology, "--compiler", "model", "--out", str(report)]))
        runs.extend(Run("examples", relative, launcher, command, str(path.parent), skip,
                        WORKER_ALONE if is_worker and launcher == "python" else "")
                    for launcher, command in commands)
    return runs


# ----------------------------------------------------------------------------------------------- stand-ins

MARIMO_STANDIN = '''"""Stand-in for marimo (not installed): App.run() runs the notebook's cells as marimo does.

Each enabled cell's body (without its closing ``return``) runs in one namespace shared by every cell, the
notebook module's own, in dependency order: a cell waits for the cells that define its parameters. A
disabled cell does not run. Tracebacks point at the notebook's own lines.
"""
import ast
import inspect
import textwrap


class _Anything:
    def __init__(self, text=""):
        self._text = text

    def __call__(self, *args, **kwargs):
        return _Anything()

    def __getattr__(self, name):
        return _Anything()

    def __str__(self):
        return self._text


def md(text):
    return _Anything(text)


class _Output:
    def append(self, value):
        print(value)

    replace = append

    def clear(self):
        pass


output = _Output()


def __getattr__(name):
    return _Anything()


class _Cell:
    def __init__(self, fn):
        lines, first = inspect.getsourcelines(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
        body = tree.body[0].body
        self.defs = []
        if body and isinstance(body[-1], ast.Return):
            value = body.pop().value
            items = value.elts if isinstance(value, ast.Tuple) else [value] if value is not None else []
            self.defs = [item.id for item in items if isinstance(item, ast.Name)]
        module = ast.Module(body=body or [ast.Pass()], type_ignores=[])
        ast.increment_lineno(module, first - 1)
        self.code = compile(module, fn.__code__.co_filename, "exec")
        self.refs = list(inspect.signature(fn).parameters)
        self.scope = fn.__globals__


class App:
    def __init__(self, *args, **kwargs):
        self._cells = []

    def cell(self, fn=None, **options):
        def add(f):
            if not options.get("disabled"):
                self._cells.append(_Cell(f))
            return f
        return add(fn) if fn is not None else add

    def function(self, fn=None, **options):
        return fn if fn is not None else (lambda f: f)

    def run(self):
        owner = {}
        for index, cell in enumerate(self._cells):
            for name in cell.defs:
                owner.setdefault(name, index)
        done, pending = set(), list(range(len(self._cells)))
        while pending:
            ready = [i for i in pending
                     if all(owner.get(r, i) == i or owner[r] in done for r in self._cells[i].refs)]
            if not ready:
                raise RuntimeError("marimo stand-in: the remaining cells depend on each other in a cycle")
            for i in ready:
                cell = self._cells[i]
                exec(cell.code, cell.scope)
                done.add(i)
                pending.remove(i)
'''

ABSL_APP = '''"""Stand-in for absl.app (absl-py not installed)."""
import sys

from absl import flags


def run(main, argv=None, **kwargs):
    sys.exit(main(flags.FLAGS(sys.argv if argv is None else argv)))
'''

ABSL_FLAGS = '''"""Stand-in for absl.flags (absl-py not installed): --name=value, --name, --noname."""


class _Flags:
    def __init__(self):
        self.__dict__["_values"], self.__dict__["_parse"] = {}, {}

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __call__(self, argv):
        rest = list(argv[:1])
        for arg in argv[1:]:
            name, eq, value = arg[2:].partition("=")
            if arg.startswith("--") and name in self._values:
                self._values[name] = self._parse[name](value) if eq else True
            elif arg.startswith("--no") and not eq and arg[4:] in self._values:
                self._values[arg[4:]] = False
            else:
                rest.append(arg)
        return rest


FLAGS = _Flags()


def _define(parse):
    def define(name, default, help=None, **kwargs):
        FLAGS._values[name], FLAGS._parse[name] = default, parse
    return define


DEFINE_bool = DEFINE_boolean = _define(lambda v: v.lower() in ("1", "true", "yes"))
DEFINE_string = _define(str)
DEFINE_integer = _define(int)
DEFINE_float = _define(float)
'''

ABSL_LOGGING = '''"""Stand-in for absl.logging (absl-py not installed): Python's logging."""
import logging

debug, info, warning, error, exception, fatal = (logging.debug, logging.info, logging.warning,
                                                 logging.error, logging.exception, logging.critical)
warn = warning


def use_python_logging(*args, **kwargs):
    pass


def set_verbosity(*args, **kwargs):
    pass


def vlog(level, msg, *args):
    logging.debug(msg, *args)
'''

ABSLTEST = '''"""Stand-in for absl.testing.absltest (absl-py not installed): unittest."""
import unittest


class TestCase(unittest.TestCase):
    def assertStartsWith(self, actual, prefix, msg=None):
        self.assertTrue(str(actual).startswith(prefix), msg or f"{actual!r} does not start with {prefix!r}")


main = unittest.main
'''

PORTPICKER = '''"""Stand-in for portpicker (not installed): a free TCP port from the OS."""
import socket


def pick_unused_port(*args, **kwargs):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]
'''

NOTEBOOK_FIXTURES = '''"""Stand-in for TorchTPU's docs/notebooks/tests conftest.py (absent from its public copy)."""
import sys
from pathlib import Path

import pytest


@pytest.fixture
def device():
    from torch_tpu import api
    return api.tpu_device()


@pytest.fixture
def setup_sys_path(request):
    folder = str(Path(request.path).resolve().parent.parent)
    sys.path.insert(0, folder)
    yield folder
    sys.path.remove(folder)
'''

# module name -> {file under the stand-in folder: source}; installed only where the module is missing.
STANDINS: dict[str, dict[str, str]] = {
    "marimo": {"marimo/__init__.py": MARIMO_STANDIN},
    "absl": {"absl/__init__.py": "", "absl/app.py": ABSL_APP, "absl/flags.py": ABSL_FLAGS,
             "absl/logging.py": ABSL_LOGGING, "absl/testing/__init__.py": "",
             "absl/testing/absltest.py": ABSLTEST},
    "portpicker": {"portpicker.py": PORTPICKER},
}
FIXTURE_PLUGIN = "torchtpu_notebook_fixtures"


def install_standins(folder: Path, checkout: Path) -> list[str]:
    """Write the stand-ins this environment needs into ``folder``; return their names."""
    used = []
    for module, files in STANDINS.items():
        if importlib.util.find_spec(module) is not None:
            continue
        for name, source in files.items():
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(source)
        used.append(module)
    if not (checkout / NOTEBOOK_TESTS / "conftest.py").exists():
        (folder / f"{FIXTURE_PLUGIN}.py").write_text(NOTEBOOK_FIXTURES)
        used.append(f"{FIXTURE_PLUGIN} (pytest fixtures device, setup_sys_path)")
    return used


def make_import_root(checkout: Path, folder: Path) -> Path:
    """A folder linking only the checkout's examples/, tests/ and docs/: what the files import or start by
    path (``examples.distributed...``, ``./examples/...``), never torch_tpu/."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in (*REPO_PACKAGES, "docs"):
        entry, link = checkout / name, folder / name
        if entry.exists() and not link.exists():
            link.symlink_to(entry.resolve())
    return folder


def run_environment(import_root: Path, standins: Path | None, extra: Iterable[Path] = ()) -> dict[str, str]:
    """The runs' environment: this one, with ``extra`` folders, the import root and the stand-ins first on
    PYTHONPATH (in that order)."""
    env = dict(os.environ)
    paths = [str(p) for p in extra] + [str(import_root)] + ([str(standins)] if standins else [])
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and HIDDEN_PACKAGE not in Path(p).parts]
    env["PYTHONPATH"] = os.pathsep.join(paths + kept)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # COLUMNS: pytest's short summary keeps each message's first line whole instead of cutting it at 80.
    env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1", MPLBACKEND="Agg",
               COLUMNS="400")
    env.setdefault("OMP_NUM_THREADS", "1")
    if _tpusim_reads("TPUSIM_COMPILER"):
        env["TPUSIM_COMPILER"] = "model"
    return env


def _tpusim_reads(name: str) -> bool:
    """True when tpusim's table of environment variables (tpusim/envvars.py) has ``name``."""
    try:
        from tpusim.envvars import VARIABLES
    except ImportError:
        return False
    return any(var.name == name for var in VARIABLES)


# ----------------------------------------------------------------------------------------------- running

def _kill_group(proc: subprocess.Popen) -> None:
    """Stop what is left of the run's process group (it was started in a session of its own): SIGTERM, a
    5 s grace, then SIGKILL for the rest, workers a launcher left behind included."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        if sig == signal.SIGTERM:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    if proc.poll() is None:
        proc.wait()


def log_name(run: Run) -> str:
    """The run's log file name: its path and launcher, flattened."""
    return f"{run.file.replace('/', '__')}.{run.launcher}.log"


def execute(run: Run, env: dict[str, str], timeout: float, logs: Path) -> Result:
    """Run one planned command with a timeout; read its outcome from its exit status and output."""
    result = Result(run.group, run.file, run.launcher, run.command, run.cwd, "skip", reason=run.skip or "")
    if run.skip:
        return result
    log = logs / run.group / log_name(run)
    log.parent.mkdir(parents=True, exist_ok=True)
    result.log = str(log)
    start = time.monotonic()
    with log.open("w") as out:
        out.write(f"$ (cd {run.cwd} && {' '.join(run.command)})\n")
        out.flush()
        proc = subprocess.Popen(run.command, cwd=run.cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            result.returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            result.timed_out = True
        except KeyboardInterrupt:
            _kill_group(proc)
            raise
        finally:
            _kill_group(proc)
    result.seconds = round(time.monotonic() - start, 1)
    text = log.read_text(errors="replace").partition("\n")[2]     # without the command line written above
    judge(result, text, timeout, run.expected_failure)
    return result


def judge(result: Result, text: str, timeout: float, expected_failure: str = "") -> None:
    """Fill in outcome, counts and the first error of a finished run from its output."""
    if result.launcher == "pytest":
        result.tests, result.test_results = parse_pytest(text)
    result.first_error, result.error_site, result.traceback_tail = first_error(text, result.launcher)
    if result.timed_out:
        result.outcome = "fail"
        result.first_error = f"timed out after {timeout:g} s" + (f" ({result.first_error})" if result.first_error
                                                                  else "")
        return
    counts = result.tests
    ok = result.returncode == 0
    if ok and result.launcher == "bash" and "ChildFailedError" in text:
        ok = False                          # TorchTPU's launch scripts echo torchrun's failure and exit 0
        result.reason = "torchrun failed inside the script, which still exited 0"
    if result.launcher == "pytest":
        if ok and not counts.get("passed") and counts.get("skipped"):
            result.outcome, result.reason = "skip", "every test skipped itself"
            return
        ok = ok and counts.get("passed", 0) > 0 and not counts.get("failed") and not counts.get("errors")
    result.outcome = "pass" if ok else "fail"
    if not ok and not result.reason and re.search(r"\b(RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT)\b",
                                                  result.first_error):
        result.reason = expected_failure
    if ok:
        result.first_error = result.error_site = ""
        result.traceback_tail = []
    elif not result.first_error:
        result.first_error = f"exit status {result.returncode}"


def parse_pytest(text: str) -> tuple[dict[str, int], list[dict[str, str]]]:
    """pytest's final counts ({"passed": n, "failed": n, "errors": n, ...}) and its -rA short summary lines."""
    counts: dict[str, int] = {}
    summary = [line for line in text.splitlines() if re.search(r"\b(passed|failed|errors?|no tests ran)\b", line)
               and re.search(r" in [\d.]+s", line)]
    if summary:
        for number, word in _PYTEST_COUNT.findall(summary[-1]):
            counts["errors" if word.startswith("error") else word] = int(number)
    results = []
    for line in text.splitlines():
        match = _PYTEST_LINE.match(line.strip())
        if match:
            results.append({"outcome": match.group(1).lower(), "test": match.group(2),
                            "message": (match.group(3) or "").strip()})
    return counts, results


def _outside_python(path: str) -> bool:
    """True for a file that is not part of Python's or the environment's installed libraries."""
    return "site-packages" not in path and not path.startswith((sys.base_prefix, sys.prefix))


def first_error(text: str, launcher: str) -> tuple[str, str, list[str]]:
    """The error that ended a run, where it was raised (file:line) and the traceback's last lines.

    pytest: the first FAILED/ERROR line of the short summary (with the first ``E`` line when the summary
    has no message, as for a collection error) and the first failure site outside Python's libraries.
    Otherwise: the exception line of the last traceback, unless it is a launcher's wrapper (torchrun's
    ChildFailedError, ...), when the workers' error before it is the one that counts. A shell script runs
    one program after another, so there the first error is the cause of the rest.
    """
    lines = [_RANK_PREFIX.sub("", line.rstrip()) for line in text.splitlines()]
    lines = [f"{m.group(2)} (python -m {m.group(1)})" if (m := _RUNPY_ERROR.search(line)) else line
             for line in lines]
    if launcher == "pytest":
        failed = next((line for line in lines if re.match(r"^(FAILED|ERROR) ", line)), "")
        start = next((i for i, line in enumerate(lines) if line.startswith("E  ")), None)
        if failed and " - " not in failed and start is not None:
            failed += " - " + lines[start][1:].strip()
        sites = [f"{m.group(1)}:{m.group(2)}" for m in map(_PYTEST_SITE.match, lines) if m]
        site = next((x for x in sites if _outside_python(x)), sites[0] if sites else "")
        tail = lines[max(0, start - 6):start + 6] if start is not None else []
        return failed, site, tail
    candidates = [i for i, line in enumerate(lines) if _EXCEPTION.match(line)]
    real = [i for i in candidates if lines[i].split(":")[0].rsplit(".", 1)[-1] not in WRAPPERS]
    index = (real[0] if launcher == "bash" else real[-1]) if real else (candidates[0] if candidates else None)
    if index is None:
        index = next((i for i, line in enumerate(lines) if re.match(r"^(tpusim: )?error\b", line, re.I)), None)
    if index is None:
        return "", "", []
    block_start = max((i for i in range(index) if lines[i].startswith("Traceback")), default=max(0, index - 8))
    frames = [m for m in map(_FRAME.match, lines[block_start:index]) if m]
    site = f"{frames[-1].group(1)}:{frames[-1].group(2)}" if frames else ""
    return lines[index], site, lines[max(block_start, index - 8):index + 1]


# ----------------------------------------------------------------------------------------------- reporting

def summary_lines(results: Iterable[Result]) -> list[str]:
    """One line per group: outcomes per launcher, and for tests the test counts."""
    lines = []
    by_group: dict[str, list[Result]] = {}
    for r in results:
        by_group.setdefault(r.group, []).append(r)
    for group in GROUPS:
        rows = by_group.get(group, [])
        if not rows:
            continue
        outcomes = Counter(r.outcome for r in rows)
        per_launcher = ", ".join(
            f"{launcher} {sum(r.outcome == 'pass' for r in rows if r.launcher == launcher)}/"
            f"{sum(r.outcome != 'skip' for r in rows if r.launcher == launcher)}"
            for launcher in LAUNCHERS if any(r.launcher == launcher for r in rows))
        line = (f"{group}: {len(rows)} runs: {outcomes['pass']} pass, {outcomes['fail']} fail, "
                f"{outcomes['skip']} skip (passed/ran per launcher: {per_launcher})")
        if group == "tests":
            totals: Counter[str] = Counter()
            for r in rows:
                totals.update(r.tests)
            line += (f"; tests {totals['passed']} passed, {totals['failed']} failed, {totals['errors']} errors, "
                     f"{totals['skipped']} skipped")
        lines.append(line)
    return lines


def table(results: Iterable[Result], width: int = 110) -> str:
    """The results as a fixed-width table: group, file, launcher, outcome (pytest: passed/failed/errors
    counts), then the first error line, or a skip's reason, with any note in brackets."""
    rows = [("group", "file", "launcher", "outcome", "first error / reason")]
    for r in results:
        outcome = r.outcome
        if r.launcher == "pytest" and r.tests:
            outcome += " " + "/".join(f"{r.tests.get(k, 0)}{k[0]}" for k in ("passed", "failed", "errors"))
        detail = r.reason if r.outcome == "skip" else r.first_error[:width] + (f" [{r.reason}]" if r.reason else "")
        rows.append((r.group, r.file, r.launcher, outcome, detail))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(widths[i]) if i < 4 else cell for i, cell in enumerate(row)).rstrip()
                     for row in rows)


# --------------------------------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python tools/torchtpu_conformance.py",
        description="Run TorchTPU's own notebook tests, notebooks and examples unchanged on tpusim, each in its "
                    "own process, and report pass/fail/skip per file and launcher with the first error.",
        epilog="Example: python tools/torchtpu_conformance.py --checkout /tmp/torch_tpu_ref --group tests "
               "--json /tmp/tests.json   (logs stay in --log-dir; a run's log name is its path with / as __)")
    parser.add_argument("--checkout", required=True, type=Path,
                        help="a TorchTPU checkout (its docs/notebooks and examples are read; torch_tpu/ is never "
                             "imported)")
    parser.add_argument("--group", action="append", choices=GROUPS,
                        help="run only this group (repeat for several; default all three, in order)")
    parser.add_argument("--launcher", action="append", choices=LAUNCHERS,
                        help="run only this launcher (repeat for several; default all)")
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="run only files whose path contains TEXT (repeatable)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run before its process group "
                        "is killed (default 300)")
    parser.add_argument("--log-dir", type=Path, help="where the logs go (default: a new temporary folder)")
    parser.add_argument("--json", type=Path, help="also write every result as JSON to this file")
    parser.add_argument("--nproc", type=int, default=4, help="torchrun --nproc_per_node for workers (default 4, "
                        "the chips of 2d:2x2)")
    parser.add_argument("--topology", default="2d:2x2", help="tpusim run --topology (default 2d:2x2)")
    parser.add_argument("--pythonpath", action="append", default=[], type=Path, metavar="DIR",
                        help="put DIR first on the runs' PYTHONPATH, e.g. a torch_tpu compatibility package "
                             "under test (repeatable)")
    parser.add_argument("--no-skip", action="store_true", help="also run files the static rules skip")
    parser.add_argument("--no-standins", action="store_true",
                        help="do not stand in for missing marimo/absl/portpicker or the notebook tests' fixtures")
    parser.add_argument("--list", action="store_true", help="print the plan (commands, skips) and run nothing")
    return parser.parse_args(argv)


def plan(s: Settings, args: argparse.Namespace) -> list[Run]:
    """Every run of the chosen groups, filtered by --launcher and --only."""
    planners = {"tests": plan_tests, "notebooks": plan_notebooks, "examples": plan_examples}
    runs = [run for group in (args.group or GROUPS) for run in planners[group](s)]
    if args.launcher:
        runs = [r for r in runs if r.launcher in args.launcher]
    if args.only:
        runs = [r for r in runs if any(text in r.file for text in args.only)]
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    checkout = args.checkout.resolve()
    if not (checkout / NOTEBOOKS).is_dir() and not any((checkout / root).is_dir() for root in EXAMPLE_ROOTS):
        print(f"error: {checkout} has neither docs/notebooks nor examples/: pass a TorchTPU checkout "
              "(e.g. a clone of github.com/google-pytorch/torch_tpu)", file=sys.stderr)
        return 2
    logs = (args.log_dir or Path(tempfile.mkdtemp(prefix="torchtpu-conformance-"))).resolve()
    logs.mkdir(parents=True, exist_ok=True)
    settings = Settings(checkout, make_import_root(checkout, logs / "import-root"), logs / "tpusim-reports",
                        args.nproc, args.topology, not args.no_skip)
    standins: list[str] = []
    standin_dir = None
    if not args.no_standins:
        standin_dir = logs / "standins"
        standins = install_standins(standin_dir, checkout)
    env = run_environment(settings.import_root, standin_dir, [p.resolve() for p in args.pythonpath])
    runs = plan(settings, args)
    for run in runs:
        if run.launcher == "pytest" and any(FIXTURE_PLUGIN in name for name in standins):
            run.command[4:4] = ["-p", FIXTURE_PLUGIN]
    if args.list:
        for run in runs:
            print(f"{run.group:9} {run.launcher:8} {run.file}  " + (f"skip({run.skip})" if run.skip else
                                                                   f"(cd {run.cwd} && {' '.join(run.command)})"))
        return 0
    print(f"logs: {logs}" + (f"; stand-ins: {', '.join(standins)}" if standins else "")
          + (f"; PYTHONPATH first: {', '.join(map(str, args.pythonpath))}" if args.pythonpath else ""), flush=True)
    results = []
    for run in runs:
        result = execute(run, env, args.timeout, logs)
        results.append(result)
        print(f"  {result.outcome:4} {result.seconds:6.1f}s {run.launcher:8} {run.file}"
              + (f"  {result.first_error[:100]}" if result.outcome != "pass" else ""), flush=True)
    print()
    print(table(results))
    print()
    for line in summary_lines(results):
        print(line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "checkout": str(checkout), "logs": str(logs), "standins": standins, "timeout_s": args.timeout,
            "pythonpath": [str(p) for p in args.pythonpath],
            "summary": summary_lines(results), "results": [asdict(r) for r in results]}, indent=1))
        print(f"json: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
