"""The manual's `tpusim sweep` page (docs/commands/sweep.md): each example block runs as a user would paste it (in a
fresh folder beside examples/), and the notebook notebooks/sweep.ipynb executes and prints what its Parquet file
holds."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SWEEP_PAGE = ROOT / "docs" / "commands" / "sweep.md"


def readme_block(name: str) -> str:
    """The fenced block right after ``<!-- name -->`` in docs/commands/sweep.md."""
    found = re.search(rf"<!-- {name} -->\n```\w*\n(.*?)```", SWEEP_PAGE.read_text(), re.S)
    assert found, f"docs/commands/sweep.md has no block marked <!-- {name} -->"
    return found.group(1)


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    return tmp_path


def _bash(block: str, cwd: Path) -> subprocess.CompletedProcess:
    env_bin = str(Path(sys.executable).parent)           # `python` is this venv's
    return subprocess.run(["bash", "-e", "-c", f'export PATH="{env_bin}:$PATH"\n{block}'], cwd=cwd,
                          capture_output=True, text=True, timeout=1200)


@pytest.mark.slow      # records examples/mlp.py, then 8 + 480 + 8 points on local clusters: minutes on 2 cores
def test_the_readme_sweeps_run_as_written(user_folder: Path) -> None:
    done = _bash(readme_block("sweep-example"), user_folder)
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(user_folder / "sweeps" / "mlp" / "sweep.csv")
    assert len(table) == 8 and (table.status == "ok").sum() == 6          # v6e has no 3D torus: 2 invalid
    assert (user_folder / "sweeps" / "mlp" / "sweep.html").is_file()
    assert "Pareto front (step time vs chips):" in done.stdout

    done = _bash(readme_block("sweep-grid-example"), user_folder)
    assert done.returncode == 0, done.stderr
    grid = pd.read_parquet(user_folder / "sweeps" / "grid" / "sweep.parquet")
    assert len(grid) == 480 and (grid.status == "ok").sum() == 384 and (grid.status == "invalid").sum() == 96
    assert "480 points" in done.stdout

    done = subprocess.run([sys.executable, "-c", readme_block("sweep-python-example")], cwd=user_folder,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "step_time_s" in done.stdout and "pareto" in done.stdout


@pytest.mark.slow      # four recordings of examples/transformer.py, 8 points: a few minutes on 2 cores
def test_the_readme_script_argument_sweep_runs_as_written(user_folder: Path) -> None:
    done = _bash(readme_block("sweep-script-example"), user_folder)
    assert done.returncode == 0, done.stderr
    table = pd.read_parquet(user_folder / "sweeps" / "transformer" / "sweep.parquet")
    assert len(table) == 4 * 2 and (table.status == "ok").all()          # 4 recordings x 2 topologies
    assert sorted(set(zip(table.batch, table.seq))) == [(4, 64), (4, 128), (16, 64), (16, 128)]
    assert (table.tokens_per_s_per_chip * table.step_time_s * table.chips).round().tolist() == \
        (table.batch * table.seq).astype(float).tolist()
    assert "per batch, seq" in done.stdout and len(list((user_folder / "sweeps" / "transformer" /
                                                         "recordings").iterdir())) == 4


@pytest.mark.slow      # records examples/mlp.py and sweeps 18 points in a Jupyter kernel
def test_the_sweep_notebook_prints_its_parquet_table() -> None:
    import nbformat
    from nbclient import NotebookClient

    path = ROOT / "notebooks" / "sweep.ipynb"
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    folder = Path(re.search(r"recording: (\S+)", text).group(1)).parent
    saved = pd.read_parquet(folder / "sweep" / "sweep.parquet")
    ok = saved[saved.status == "ok"]
    assert len(saved) == 18 and len(ok) == 14                 # v5e, v6e: no 3d:2x2x2
    for row in ok.itertuples():
        shown = re.search(rf"^{row.chip} +{re.escape(row.topology)} +{row.mode} +chips +{row.chips} +step "
                          rf"([0-9.]+) ms", text, re.M)
        assert float(shown.group(1)) == pytest.approx(row.step_time_s * 1e3, abs=1e-4)
    assert any("image/png" in o.get("data", {}) for o in outputs)
