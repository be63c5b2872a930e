"""The pytest plugin for users' CI (entry point ``tpusim`` in the ``pytest11`` group: loaded by any pytest
run where tpusim is installed).

- ``@pytest.mark.tpu(chip=..., topology=..., mode=..., numerics=...)`` and the ``tpu`` fixture: the test runs
  with the simulated "tpu" device configured so; ``tpu.assert_cpu_equal(fn, *args)`` runs ``fn`` on CPU and
  on "tpu" and asserts equal results (``torch.testing.assert_close``).
- ``tpusim_run(script, *args, topology=..., chip=..., mode=...)``: the script run by ``tpusim run`` in a fresh
  process, returning a ``RunReport`` with
  step time, HBM peak and lint findings for budget assertions; ``report.assert_budgets(...)`` fails with the
  same words as ``tpusim check`` (tpusim/testing/budgets.py).

Importing this module imports neither torch nor the backend: a pytest run that never asks for ``tpu``
pays nothing. One process holds one device configuration once a tensor exists (chip, numerics): tests
asking for another chip after that fail with a message saying how to split them.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tpusim.errors import TpusimError
from tpusim.testing.budgets import Budgets, evaluate, lint_code, parse_hbm, parse_lint_list, parse_seconds

if TYPE_CHECKING:
    from tpusim.report.schema import Report, WarningEntry

MARKER = ("tpu(chip=None, topology=None, mode=None, numerics='on'): run the test on tpusim's simulated 'tpu' "
          "device with this chip generation, slice, eager mode and numerics (the `tpu` fixture)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked ``tpu`` gets the ``tpu`` fixture even when it does not name it."""
    for item in items:
        names = getattr(item, "fixturenames", None)
        if item.get_closest_marker("tpu") is not None and names is not None and "tpu" not in names:
            names.append("tpu")


@dataclass
class TpuDevice:
    """What a ``tpu`` test gets: the device, the chip and mode it runs with, and the CPU-equality helper."""

    chip: str
    mode: str
    numerics: bool
    topology: tuple[int, ...] | None
    device: Any = field(default=None)      # torch.device("tpu")

    def to_tpu(self, value: Any) -> Any:
        """Tensors (in lists, tuples, dicts) moved to "tpu", modules copied there; anything else unchanged."""
        import copy

        import torch

        if isinstance(value, torch.nn.Module):
            return copy.deepcopy(value).to(self.device)
        if isinstance(value, list | tuple):
            return type(value)(self.to_tpu(v) for v in value)
        if isinstance(value, dict):
            return {k: self.to_tpu(v) for k, v in value.items()}
        return _map_tensors(value, lambda t: t.to(self.device))

    def assert_cpu_equal(self, fn: Callable[..., Any], *args: Any, rtol: float | None = None,
                         atol: float | None = None, **kwargs: Any) -> Any:
        """``fn(*args)`` on CPU and on "tpu" (tensor args moved there): equal results within
        ``torch.testing.assert_close``'s tolerances for the dtype (or rtol/atol). Returns the tpu result.
        With numerics off the tpu values do not exist: shapes and dtypes are compared."""
        __tracebackhide__ = True
        import torch

        expected = fn(*args, **kwargs)
        got = fn(*self.to_tpu(list(args)), **self.to_tpu(kwargs))
        if not self.numerics:
            _same_shapes(expected, got)
            return got
        torch.testing.assert_close(_map_tensors(got, lambda t: t.cpu()), expected, rtol=rtol, atol=atol,
                                   msg=lambda text: f"tpu ({self.chip}, {self.mode} mode) differs from CPU: {text}")
        return got


def _map_tensors(value: Any, fn: Callable[[Any], Any]) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, list | tuple):
        return type(value)(_map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value


def _same_shapes(expected: Any, got: Any) -> None:
    import torch

    if isinstance(expected, torch.Tensor):
        assert (tuple(got.shape), got.dtype) == (tuple(expected.shape), expected.dtype), \
            f"tpu result {tuple(got.shape)} {got.dtype} != CPU {tuple(expected.shape)} {expected.dtype}"
    elif isinstance(expected, list | tuple):
        assert len(got) == len(expected), f"tpu returned {len(got)} values, CPU {len(expected)}"
        for e, g in zip(expected, got):
            _same_shapes(e, g)


@pytest.fixture
def tpu(request: pytest.FixtureRequest) -> Iterator[TpuDevice]:
    """The simulated "tpu" device configured by the test's ``tpu`` marker (defaults: the environment's)."""
    marker = request.node.get_closest_marker("tpu")
    options = dict(marker.kwargs) if marker is not None else {}
    unknown = set(options) - {"chip", "topology", "mode", "numerics"}
    if unknown:
        pytest.fail(f"@pytest.mark.tpu: unknown option(s) {', '.join(sorted(unknown))}; accepted: chip, topology, "
                    f"mode, numerics", pytrace=False)
    problem = None
    try:
        device = _configure(options)
    except TpusimError as error:
        problem = f"@pytest.mark.tpu({_options_text(options)}): {error}"
    if problem is not None:                 # outside the except: no "during handling" chain in the output
        pytest.fail(problem, pytrace=False)
    from tpusim.eager import state as eager

    previous = eager.set_eager_mode(device.mode)
    try:
        yield device
    finally:
        eager.set_eager_mode(previous)


def _options_text(options: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in options.items())


def _configure(options: dict[str, Any]) -> TpuDevice:
    """The backend configured for ``options`` (only what they change: another chip or numerics while an
    earlier test's tensor lives is refused by tpusim.backend.configure, with the reason)."""
    import torch

    import tpusim.backend as backend
    from tpusim.backend.plumbing.state import STATE
    from tpusim.eager import state as eager
    from tpusim.eager.modes import get_mode
    from tpusim.slice.topology import build_slice, load_chip_arg

    current = STATE.config
    default = backend.load_config()          # what the environment asks for: a test's marker leaves the rest so
    numerics = options.get("numerics", "on" if default.numerics else "off")
    if numerics not in ("on", "off", True, False):
        raise TpusimError(f"numerics={numerics!r}; accepted: 'on', 'off'")
    numerics = numerics in ("on", True)
    chip = load_chip_arg(options["chip"]) if options.get("chip") else default.chip
    topology = default.topology if chip.name == default.chip.name else None
    if options.get("topology"):
        topology = tuple(build_slice(options["topology"], chip=chip.name).dims)
    if (chip.name, numerics, topology) != (current.chip.name, current.numerics, current.topology):
        try:
            backend.configure(backend.load_config(chip=chip, numerics=numerics, topology=topology))
        except TpusimError as error:
            raise TpusimError(f"{error}. A tensor an earlier test made on the tpu device ({current.chip.name}, "
                              f"numerics {'on' if current.numerics else 'off'}) is still alive (a module-level "
                              f"variable or a session fixture holds it): free it, run this test in its own "
                              f"pytest process (-k/-m), or price it with the tpusim_run fixture") from None
    mode = get_mode(options["mode"]).name if options.get("mode") else eager.get_eager_mode()
    return TpuDevice(chip=chip.name, mode=mode, numerics=numerics, topology=topology, device=torch.device("tpu"))


@dataclass(frozen=True, repr=False)
class RunReport:
    """A ``tpusim run`` of a script: its report.json and the numbers budgets are written against."""

    report: Report                          # report.json, typed (tpusim/report/schema.py)
    folder: Path
    exit_code: int
    output: str

    def __repr__(self) -> str:              # pytest prints it in assertion details: short, not the whole report
        run = self.report.run
        return f"RunReport({run.script} on {run.topology} {run.chip}, report {self.folder})"

    @property
    def mode(self) -> str:
        """The mode the properties read: the first one priced."""
        return next(iter(self.report.modes))

    @property
    def step_time_s(self) -> float:
        """Median steady-state step time of the first mode priced, seconds (an error when no steps are marked:
        ``total_s`` is then the whole program's time)."""
        step = self.report.modes[self.mode].step_time_median_s
        if step is None:
            raise TpusimError(f"{self.report.run.script} marked no steps, so it has no step time: call "
                              f"optimizer.step() or tpusim.backend.step() once per step, or read total_s")
        return step

    @property
    def total_s(self) -> float:
        """The whole program's simulated time in the first mode priced, seconds."""
        return self.report.modes[self.mode].total_s

    @property
    def hbm_peak_bytes(self) -> int:
        return self.report.modes[self.mode].hbm.peak_bytes

    @property
    def hbm_peak_fraction(self) -> float:
        """The HBM peak as a share of one chip's capacity."""
        return self.report.modes[self.mode].hbm.peak_fraction

    @property
    def hfu(self) -> float:
        """HFU (every FLOP run over the peak of the dtypes used): report.json's ``hfu``, as ``tpusim run`` labels
        it."""
        return self.report.modes[self.mode].hfu

    @property
    def mfu(self) -> float | None:
        """MFU (6 x params x tokens over the same peak): None unless the tokens per step and an optimizer's
        parameters are known (``--tokens-per-step``)."""
        head = self.report.modes[self.mode].headline
        return head.model_flops_utilisation if head else None

    @property
    def lint_codes(self) -> set[str]:
        return {w.code for w in self.report.warnings}

    def lint(self, code: str) -> list[WarningEntry]:
        """The report's findings for one lint code (``f64`` and other aliases accepted)."""
        wanted = lint_code(code)
        return [w for w in self.report.warnings if w.code == wanted]

    def assert_budgets(self, max_step_time: str | float | None = None, max_hbm: str | float | None = None,
                       fail_on: str | None = None) -> None:
        """``tpusim check``'s budgets on this run; AssertionError listing each that failed."""
        __tracebackhide__ = True            # the failure points at the user's test line, not at this helper
        budgets = Budgets(None if max_step_time is None else parse_seconds(str(max_step_time)),
                          None if max_hbm is None else parse_hbm(str(max_hbm)),
                          parse_lint_list(fail_on) if fail_on else ())
        failed = [c for c in evaluate(self.report, budgets) if not c.passed]
        assert not failed, "tpusim budget failed:\n" + "\n".join(f"  {c.name}: {c.message}" for c in failed)


def run_script(script: str | Path, *args: str, out: Path, cwd: Path | None = None, topology: str | None = None,
               chip: str | None = None, mode: str | None = None, numerics: str = "on", placement: str | None = None,
               timeout_s: float = 600.0, check: bool = True) -> RunReport:
    """``python -m tpusim run`` in a fresh process; its bad input, a timeout or (``check``) a failed script
    fail the test with tpusim's own message."""
    from tpusim.report.load import load_report
    from tpusim.run.options import RunOptions, modes_of

    try:
        options = RunOptions(script=str(script), script_args=args, chip=chip, topology=topology,
                             numerics=numerics, placement=placement, out=str(out), quiet=True,
                             **({} if mode is None else {"modes": modes_of(mode)}))
    except TpusimError as error:
        pytest.fail(f"tpusim run {script}: {error}", pytrace=False)
    command = options.argv()
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"tpusim run {script}: still running after {timeout_s:g} s (timeout_s=...)", pytrace=False)
    output = done.stdout + done.stderr
    if not (out / "report.json").is_file():
        pytest.fail(f"tpusim run {script} wrote no report (exit code {done.returncode}):\n"
                    f"{done.stderr.strip()[-2000:]}", pytrace=False)
    report, folder = load_report(out)
    result = RunReport(report, folder, done.returncode, output)
    if check and not report.complete:
        pytest.fail(f"tpusim run {script}: the script failed (exit code {done.returncode}):\n"
                    f"{done.stderr.strip()[-2000:]}", pytrace=False)
    return result


@pytest.fixture
def tpusim_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
               ) -> Callable[..., RunReport]:
    """``tpusim_run("train.py", "--batch", "8", topology="3d:4x4x4", chip="v5p", mode="fused")`` -> RunReport.
    A relative script path is found from the current folder, else from the test file's folder."""
    def run(script: str | Path, *args: str, **options: Any) -> RunReport:
        path = Path(script)
        if not path.is_absolute() and not path.exists():
            path = Path(request.path).parent / path
        return run_script(path, *args, out=tmp_path_factory.mktemp("tpusim-run"), **options)

    return run
