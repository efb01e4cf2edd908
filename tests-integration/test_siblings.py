"""calibrax 0.1.14 and datarax 0.1.17, installed from the package index beside our built wheels.

Both siblings import substrax (``substrax.typing``, ``.records``, ``.rng``, ``.devices``,
``.checkpoint``). One module-scoped fixture takes this checkout's wheels from the run's one
``uv build --all-packages`` (the ``built_packages`` fixture of tests-integration/conftest.py, or
``SUBSTRAX_WHEELS``), creates a fresh Python 3.12 environment (``uv venv --python 3.12``) and
installs the wheels with the two pinned sibling releases and whatever they require, resolved by
uv from the package index: what a user gets from ``pip install substrax calibrax datarax``. Each
test then runs one sibling code path that goes through substrax in that environment
(``programs/sibling_paths.py``) with 8 emulated CPU devices, and asserts on what it saw. datarax's
``IteratorCheckpoint`` also saves an iterator state of NumPy int64 and uint64 values through our
store and restores it exactly, with x64 off and then on (``programs/datarax_iterator_state.py``).

The versions are pinned: a newer sibling release is a deliberate bump of ``SIBLINGS``.
"""

import json
import os
import shutil
import subprocess
from itertools import chain
from pathlib import Path
from typing import Any

import pytest


pytestmark = [pytest.mark.xdist_group("siblings"), pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests-integration" / "programs" / "sibling_paths.py"
ITERATOR_STATE = ROOT / "tests-integration" / "programs" / "datarax_iterator_state.py"
SIBLINGS = ("calibrax==0.1.14", "datarax==0.1.17")
OUR_DISTRIBUTIONS = {
    "substrax",
    "substrax-runtime",
    "substrax-mesh",
    "substrax-spmd",
    "substrax-checkpoint",
    "substrax-tracking",
    "substrax-compute",
    "substrax-testing",
}


def _clean_env() -> dict[str, str]:
    """This process's environment without the workspace's venv and jax settings."""
    return {
        key: value
        for key, value in os.environ.items()
        if key not in {"VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "PYTHONPATH"}
        and not key.startswith(("JAX_", "XLA_"))
    }


def _uv(*args: str, cwd: Path) -> str:
    uv = shutil.which("uv")
    assert uv is not None, "uv must be on PATH to build the siblings' environment"
    result = subprocess.run(
        [uv, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=_clean_env(),
    )
    assert result.returncode == 0, f"uv {' '.join(args)} failed:\n{result.stderr[-4000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def sibling_python(tmp_path_factory: pytest.TempPathFactory, built_packages: Path) -> Path:
    """A fresh 3.12 environment: our wheels, calibrax 0.1.14, datarax 0.1.17 and their needs."""
    where = tmp_path_factory.mktemp("siblings")
    built = sorted(built_packages.glob("*.whl"))
    assert len(built) == len(OUR_DISTRIBUTIONS), [wheel.name for wheel in built]
    venv = where / "venv"
    _uv("venv", "--python", "3.12", str(venv), cwd=where)
    python = venv / "bin" / "python"
    # The wheels by path: their dependencies on each other resolve to these files, never to a
    # release of the same name on the index.
    _uv("pip", "install", "--python", str(python), *map(str, built), *SIBLINGS, cwd=where)
    return python


def _installed(python: Path) -> dict[str, str]:
    listing = _uv("pip", "list", "--python", str(python), "--format", "json", cwd=python.parent)
    return {entry["name"]: entry["version"] for entry in json.loads(listing)}


def _report(python: Path, program: Path, *args: str, work: Path, **env: str) -> dict[str, Any]:
    """Run ``program`` in the siblings' environment from ``work``; the JSON line it printed last."""
    result = subprocess.run(
        [str(python), str(program), *args],
        cwd=work,  # not the checkout, so `substrax` can only come from the environment
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=_clean_env() | {"JAX_PLATFORMS": "cpu", **env},
    )
    assert result.returncode == 0, f"{program.name} {args[0]} failed:\n{result.stderr[-4000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def _check(python: Path, check: str, work: Path) -> dict[str, Any]:
    devices = "--xla_force_host_platform_device_count=8"
    report = _report(python, PROGRAM, check, str(work), work=work, XLA_FLAGS=devices)
    assert report.pop("check") == check
    return report


def test_environment_holds_our_wheels_and_the_pinned_siblings(sibling_python: Path) -> None:
    installed = _installed(sibling_python)
    assert installed["calibrax"] == "0.1.14"
    assert installed["datarax"] == "0.1.17"
    assert {name: installed[name] for name in OUR_DISTRIBUTIONS} == dict.fromkeys(
        OUR_DISTRIBUTIONS, "0.2.0"
    )
    found = subprocess.run(
        [str(sibling_python), "-c", "import substrax.checkpoint as m, sys; print(m.__file__)"],
        cwd=sibling_python.parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=_clean_env(),
    )
    assert Path(found.stdout.strip()).is_relative_to(sibling_python.parents[1])


def test_calibrax_bootstrap_takes_its_key_through_key_from(
    sibling_python: Path, tmp_path: Path
) -> None:
    report = _check(sibling_python, "calibrax-bootstrap", tmp_path)
    assert report["lower"] < report["value"] < report["upper"]
    assert 2.7 < report["value"] < 3.3  # the mean of 200 draws from N(3, 1)
    assert report["samples_shape"] == [500]
    assert report["repeatable"] is True
    assert report["raw_key_same_as_typed"] is True  # a PRNGKey(7) is the same key as key(7)
    assert report["sample_stream_differs_from_key"] is True
    assert report["default_stream_used"] is True
    refusals = report["refusals"]
    assert refusals["int seed"][0] == "TypeError"
    assert "there is no default seed" in refusals["int seed"][1]
    assert refusals["no stream"][0] == "MissingRngStreamError"
    assert "nnx.Rngs(sample=...)" in refusals["no stream"][1]


def test_calibrax_hardware_detection_sees_the_devices_through_substrax(
    sibling_python: Path, tmp_path: Path
) -> None:
    report = _check(sibling_python, "calibrax-hardware", tmp_path)
    assert report["platform"] == "cpu"
    assert report["count"] == 8
    assert report["device_kinds"] == ["cpu"]  # distinct kinds
    # A CPU is not in calibrax's table: no spec, and the roofline says which device it saw.
    assert report["detected_spec"] is None
    assert report["analyzer_spec"] is None
    assert "no roofline figures for the accelerator in use (cpu)" in report["refused"]
    assert report["tpu_v5p"] == "tpu_v5p"


def test_calibrax_records_read_back_through_read_record(
    sibling_python: Path, tmp_path: Path
) -> None:
    report = _check(sibling_python, "calibrax-records", tmp_path)
    assert report["run_round_trip"] is True
    assert report["timestamp_aware"] is True
    assert report["metric_type"] == "Metric"
    assert report["samples"] == [1.5, 2.0]
    assert report["direction"] == "MetricDirection"
    assert report["result_round_trip"] is True
    assert report["refusals"] == {
        "metric value not a number": "ValidationError",
        "run without its id": "ValidationError",
    }


def test_datarax_iterator_checkpoint_resumes_a_pipeline_in_a_new_process(
    sibling_python: Path, tmp_path: Path
) -> None:
    saved = _check(sibling_python, "datarax-checkpoint-save", tmp_path)
    assert saved["steps"] == [3]
    # Different records in each batch: the source shuffles (one permutation per epoch).
    assert sorted(chain.from_iterable(saved["served"])) != list(range(12))
    restored = _check(sibling_python, "datarax-checkpoint-restore", tmp_path)
    assert restored["store"] == "OrbaxCheckpointStore"
    assert restored["is_orbax_store"] is True
    assert restored["latest"] == 3
    assert restored["epoch"] == 0
    assert restored["extra"] == {"note": "after three batches"}
    # The restored pipeline serves what the saved one served next, into the following epoch.
    assert restored["next"] == saved["next"]
    epoch_one = [*chain.from_iterable(saved["served"]), *chain.from_iterable(saved["next"][:2])]
    assert sorted(epoch_one) == list(range(20))


def test_datarax_seeded_streams_come_from_rngs_from_seed(
    sibling_python: Path, tmp_path: Path
) -> None:
    report = _check(sibling_python, "datarax-prng", tmp_path)
    assert report["seeded_matches_substrax"] is True
    assert report["no_seed_is_seed_zero"] is True
    assert report["seeds_differ"] is True
    assert report["streams_differ"] is True
    assert report["streams"] == ["augment", "default", "dropout", "params", "shuffling"]
    assert report["record_keys_distinct"] == 6


def test_datarax_sharding_with_substrax_placement(sibling_python: Path, tmp_path: Path) -> None:
    report = _check(sibling_python, "datarax-sharding", tmp_path)
    assert report["devices"] == 8
    assert report["process_count"] == 1
    assert report["process_rows"] == 32  # one process keeps every row
    assert report["placed_shards"] == 8
    assert report["placed_spec"] == "P('data',)"
    assert report["placed_equal"] is True
    assert report["batch_shards"] == [8, 8]
    assert report["batch_rows_per_device"] is True
    # datarax's prefetcher puts each batch on the data-parallel sharding substrax made.
    assert report["prefetched_spec"] == "P('data',)"
    assert report["prefetched_shards"] == 8


def _iterator_state(
    python: Path, mode: str, root: Path, work: Path, *, x64: bool
) -> dict[str, Any]:
    """Run programs/datarax_iterator_state.py (``save`` or ``restore`` under ``root``)."""
    x64_flag = "1" if x64 else "0"
    report = _report(python, ITERATOR_STATE, mode, str(root), work=work, JAX_ENABLE_X64=x64_flag)
    assert report["datarax"] == "0.1.17"
    assert Path(report["substrax"]).is_relative_to(python.parents[1])
    assert report["restored"] == report["saved"]
    restored = report["restored"]
    assert restored["order"][:2] == ["ndarray", "int64"]
    assert restored["seed"][:2] == ["uint64", "uint64"]
    assert restored["position"] == ["int", "", repr(2**40 + 3)]
    return report


def test_datarax_iterator_state_with_int64_arrays_restores_exactly(
    sibling_python: Path, tmp_path: Path
) -> None:
    report = _iterator_state(sibling_python, "save", tmp_path / "pipeline", tmp_path, x64=False)
    assert report["x64"] is False


def test_datarax_iterator_state_saved_with_x64_off_restores_with_x64_on(
    sibling_python: Path, tmp_path: Path
) -> None:
    root = tmp_path / "pipeline"
    _iterator_state(sibling_python, "save", root, tmp_path, x64=False)
    report = _iterator_state(sibling_python, "restore", root, tmp_path, x64=True)
    assert report["x64"] is True
