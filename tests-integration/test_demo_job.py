"""The README's demo command: ``uv run substrax-compute run demo`` runs examples/ on this machine.

The repository's own pyproject declares the ``demo`` job; the run goes through the console
script, the local backend and the worker, and its outputs are fetched outside the working tree.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from substrax.examples import discover_examples


ROOT = Path(__file__).resolve().parents[1]


def test_demo_job_runs_every_example_and_fetches_the_outputs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env["SUBSTRAX_STATE_DIR"] = str(tmp_path / "state")
    script = Path(sys.executable).parent / "substrax-compute"
    result = subprocess.run(
        [str(script), "run", "demo", "--into", str(tmp_path / "fetched")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (run_dir,) = (tmp_path / "fetched").iterdir()
    assert f"{run_dir.name} succeeded; outputs in {run_dir}" in result.stdout

    manifest = json.loads((run_dir / "manifest.json").read_text())
    examples = discover_examples(ROOT / "examples")
    expected = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in examples]
    assert [task["name"] for task in manifest["tasks"]] == expected
    assert {task["status"] for task in manifest["tasks"]} == {"succeeded"}
    quick_start = run_dir / "examples.quick_start" / "quick_start"
    assert (quick_start / "logs" / "plots" / "index.html").exists()
    assert any((quick_start / "checkpoints").iterdir())
    assert not (ROOT / "quick_start").exists()
    # The run ends with the results table: one row per example, each from its summary.json.
    results = result.stdout[result.stdout.index("Results (from each task's summary.json") :]
    rows = results.splitlines()[3:]
    assert [row.split()[0] for row in rows] == expected, results
    assert "Note:" not in results
