"""A bounded, seeded fuzz of the whole command line (issue 44): every flag of every command and every environment
variable tpusim reads, given junk (random bytes, unicode digits, 5000-digit numbers, 1e309, format strings, /dev/zero,
mutated valid values), in this process through ``tpusim.cli.main``. Each command line must end as a user expects:
exit 0, 1 or 2 (argparse's own 2 included), one line of error, no traceback and no hang (a per-line alarm).

The work a valid command line would start (recording a script, a sweep on Dask, the validation cases) is replaced
by ``WouldRun``: everything tpusim checks before that work still runs for real. The seed and the counts are fixed,
so a failure names a command line that fails again."""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import time
from pathlib import Path

import pytest
from factories import training_trace

from tpusim import envvars
from tpusim.cli.main import build_parser, main
from tpusim.eager.modes import get_mode
from tpusim.output import write_atomic
from tpusim.pricing import price
from tpusim.report import RunInfo, build_report, report_json
from tpusim.slice.topology import build_slice
from tpusim.trace.records import write_trace

SEED = 44
LINES_PER_COMMAND = 40
ENV_LINES = 120
ALARM_S = 20                      # one command line: more is a hang
SKIPPED_CHOICES = {"--target": {"pjrt"}, "--compiler": {"xla", "auto"}}   # real JAX / XLA processes: not here
# environment variables tpusim reads beside its own (TorchTPU's and Cloud TPU's)
OTHER_ENV = ("ACCELERATOR_TYPE", "TPU_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS", "TORCH_TPU_TOPOLOGY",
             "TORCH_TPU_DEFER_AND_FUSE", "TORCH_TPU_LAUNCH_BLOCKING", "TPU_DEFER_AND_FUSE", "TPU_LAUNCH_BLOCKING")

JUNK = ("", " ", "-", "--", "-5", "-5ms", "0", "-0", "1e309", "nan", "inf", "-inf", "1" * 5000, "9" * 30, "²", "٨٣",
        "\u200b4", "\u202e2d:2x2", "%s%n%x", "{}", "{0}", "[]", "null", "/dev/zero", "/dev/null", "/", ".", "..",
        "~nosuchuser/x", "a" * 300, "2d:2x2;rm -rf", "\t\n", "\x1b[2J", "ÿ", "𝟘", "v5p\x7f", "tp=q", "x=tp,,",
        "1.5", "3", "64", "10000000000", "0x10", "1_000", "1e-400")
VALID = ("2d:2x2", "3d:2x2x2", "2d:4x4", "v5p", "v6e", "v5e", "strict", "fused", "debug", "all", "strict,fused",
         "1GiB", "4096", "34MB", "all_reduce", "all_gather", "tp=x,fsdp=y", "default", "x+@(0,0,0)", "(0,0,0)",
         "12ms", "0.5s", "f64,host-sync", "1", "2", "on", "off", "one", "model", "sim", "wrap", "x")


class WouldRun(Exception):
    """The command line is valid: the heavy work it asks for would start here."""


def _would_run(*args, **kwargs):
    raise WouldRun


def _junk_bytes(rng: random.Random) -> str:
    return bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 12))).decode("utf-8", "surrogateescape")


def _mutated(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randrange(1, 3)):
        where = rng.randrange(len(chars) + 1)
        what = rng.choice("0123456789xd:,;=.-+ ²٨\u200bé" + "".join(chars))
        if chars and rng.random() < 0.5:
            chars[min(where, len(chars) - 1)] = what
        else:
            chars.insert(where, what)
    return "".join(chars)


def junk_value(rng: random.Random, choices=None, skipped: set[str] = frozenset()) -> str:
    """One value for a flag: a valid choice now and then, else junk, random bytes or a mutated valid value."""
    kind = rng.random()
    if choices and kind < 0.3:
        allowed = [c for c in choices if c not in skipped]
        if allowed:
            return rng.choice(allowed)
    if kind < 0.45:
        return rng.choice(VALID)
    if kind < 0.7:
        return rng.choice(JUNK)
    if kind < 0.8:
        return _junk_bytes(rng)
    return _mutated(rng, rng.choice(VALID))


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def command_line(rng: random.Random, name: str, sub: argparse.ArgumentParser, places: dict[str, str]) -> list[str]:
    """``name``, its positionals (real files most of the time), then one to three flags with fuzzed values."""
    argv = [name]
    for action in sub._actions:
        if action.option_strings:
            continue
        if action.nargs == "?" and rng.random() < 0.5:
            continue
        real = places.get(name) if action.dest != "kind" else "all_reduce"
        if action.dest == "spec":
            real = "2d:2x2"
        argv.append(real if real is not None and rng.random() < 0.8 else junk_value(rng))
    flags = [a for a in sub._actions if a.option_strings and a.option_strings[0] not in ("-h", "--help")]
    for action in rng.sample(flags, min(len(flags), rng.randrange(1, 4))):
        flag = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(flag)
        elif flag == "--out":                           # a folder under the test's own one
            argv += [flag, "out/" + junk_value(rng).replace("/", "_").lstrip(".") + "x"]
        else:
            argv += [flag, junk_value(rng, action.choices, SKIPPED_CHOICES.get(flag, set()))]
    if name == "validate" and not any(a in argv for a in ("--case", "--explain", "--fit", "--list")):
        argv += ["--case", junk_value(rng)]             # never every case
    return argv


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A report folder (compare, sweep) and a script (run, check), the heavy work replaced, the cwd a scratch one."""
    trace, slice_ = training_trace(), build_slice("3d:1x1x1")
    folder = tmp_path / "run"
    folder.mkdir()
    timelines = {"strict": price(trace, topology=slice_, mode=get_mode("strict"))}
    write_atomic(folder / "report.json", report_json(build_report(RunInfo("model.py"), trace, slice_, timelines)))
    write_trace(trace, folder / "program.jsonl")
    (tmp_path / "model.py").write_text("import torch\n")
    import tpusim.run.pipeline
    import tpusim.sweep
    import tpusim.validate
    import tpusim.validate.fit

    monkeypatch.setattr(tpusim.run.pipeline, "_record_and_report", _would_run)
    monkeypatch.setattr(tpusim.run.pipeline, "_jax_device", _would_run)
    for module, names in ((tpusim.sweep, ("sweep", "sweep_script")), (tpusim.validate, ("run_cases", "explain")),
                          (tpusim.validate.fit, ("fit", "leave_one_family_out"))):
        for name in names:
            monkeypatch.setattr(module, name, _would_run)
    monkeypatch.chdir(tmp_path)
    for key in [k for k in os.environ if k.startswith("TPUSIM_") or k in OTHER_ENV]:
        monkeypatch.delenv(key)
    run = str(folder)
    return {"compare": run, "sweep": run, "run": str(tmp_path / "model.py"), "check": str(tmp_path / "model.py")}


@pytest.fixture(autouse=True)
def _environment_restored():
    """What a fuzzed command writes into os.environ itself (a run exports its slice for the script) must not reach
    the next test in this process: monkeypatch restores only what it set."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang


def ends_cleanly(argv: list[str], capsys, seen: collections.Counter) -> str:
    """Run ``argv``; '' when it ended as a user expects, else what went wrong. ``seen`` counts how lines ended
    (accepted, refused by tpusim, refused by argparse), so a fuzz that only ever reaches argparse shows."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(ALARM_S)
    began = time.monotonic()
    try:
        code = main(argv)
    except SystemExit as stop:                          # argparse: --help (0) or a bad flag (2)
        code = stop.code
        seen["argparse"] += 1
    except WouldRun:
        code = 0
        seen["would run"] += 1
    except Hang:
        return f"no end within {ALARM_S} s"
    except BaseException as error:  # noqa: BLE001 (what escaped is the finding)
        return f"{type(error).__name__}: {error}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, err = capsys.readouterr()
    seen[{0: "accepted", 1: "failed", 2: "refused"}.get(code, "other")] += 1
    if code not in (0, 1, 2):
        return f"exit {code}"
    if "Traceback" in out + err:
        return "a traceback: " + (out + err)[-300:]
    if code == 2 and err.strip() and not err.rstrip().splitlines()[-1].split(": error: ", 1)[-1]:
        return "an empty error"
    return "" if time.monotonic() - began < ALARM_S else "too slow"


def test_every_flag_of_every_command_ends_cleanly(places, capsys):
    rng = random.Random(SEED)
    failures, seen = [], collections.Counter()
    for name, sub in _commands().items():
        for _ in range(LINES_PER_COMMAND):
            argv = command_line(rng, name, sub, places)
            if problem := ends_cleanly(argv, capsys, seen):
                failures.append(f"{argv!r}: {problem}")
    assert not failures, "\n".join(failures[:10])
    lines = LINES_PER_COMMAND * len(_commands())
    assert seen["would run"] + seen["accepted"] > lines // 10 and seen["refused"] > lines // 4, seen


def test_every_environment_variable_ends_cleanly(places, capsys, monkeypatch):
    rng = random.Random(SEED + 1)
    names = [v.name for v in envvars.VARIABLES] + list(OTHER_ENV)
    commands = (["run", places["run"], "--quiet"], ["check", places["check"]], ["chips"],
                ["topology", "2d:2x2"], ["collective", "all_reduce", "--bytes", "1MiB", "--topology", "2d:2x2"])
    failures, seen = [], collections.Counter()
    for _ in range(ENV_LINES):
        chosen = {name: junk_value(rng).replace("\x00", "") for name in rng.sample(names, rng.randrange(1, 3))}
        with monkeypatch.context() as env:
            for name, value in chosen.items():
                env.setenv(name, value)
            argv = list(rng.choice(commands))
            if problem := ends_cleanly(argv, capsys, seen):
                failures.append(f"{chosen!r} {argv!r}: {problem}")
    assert not failures, "\n".join(failures[:10])
    assert seen["refused"] > ENV_LINES // 10 and seen["would run"] + seen["accepted"] > ENV_LINES // 10, seen
