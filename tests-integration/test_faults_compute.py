"""Faults of substrax-compute seen as a user meets them: secrets in the upload, bad paths, bad TOML.

A real git project in a temporary directory holds a ``.env``, the managed ``.substrax.env``, an
``id_rsa``, a git-ignored data directory, a ``.substraxignore``'d notebook and a job that asks for
one secret file by name. The upload set is read from what Modal's own ``Mount`` selects and from
the archive SkyPilot's own upload code builds of the task's workdir; no cloud is reached. The
command line runs as a subprocess, as a user runs it.
"""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from substrax.compute import ModalBackend, SkyPilotBackend, read_compute_config, resolve_job


PYPROJECT = """\
[project]
name = "faults"
version = "0"

[tool.substrax.compute]
backend = "local"

[tool.substrax.compute.backends.modal]
outputs_volume = "faults-outputs"

[tool.substrax.compute.backends.skypilot]
outputs_bucket = "gs://faults-outputs"

[tool.substrax.compute.jobs.train]
commands = { fit = ["python", "fit.py"] }
timeout_seconds = 60
probe_devices = false
include_files = ["config/.env.remote"]
"""
# The refusals below use a job without ``include_files``, so that each one meets the fault it
# names on a release that predates ``include_files`` too.
PLAIN = PYPROJECT.replace('include_files = ["config/.env.remote"]\n', "")
LOCK = """\
version = 1

[[package]]
name = "substrax-compute"
version = "0.2.0"
source = { registry = "https://pypi.org/simple" }
"""
FILES = {
    "pyproject.toml": PYPROJECT,
    "uv.lock": LOCK,
    "fit.py": "print('fit')\n",
    "src/model.py": "WIDTH = 8\n",
    ".gitignore": "data/\n",
    "notes.md": "not tracked yet, not ignored\n",
    "data/train.csv": "x,y\n1,2\n",
    ".env": "WANDB_API_KEY=secret\n",
    ".substrax.env": "JAX_PLATFORMS=cuda\n",
    "id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\n",
    "config/.env.remote": "REMOTE=1\n",
    ".substraxignore": "scratch.ipynb\n",
    "scratch.ipynb": "{}\n",
}
TRACKED = ("pyproject.toml", "uv.lock", "fit.py", "src/model.py", ".gitignore", ".substraxignore")
EXPECTED = [
    ".gitignore",
    ".substraxignore",
    "config/.env.remote",
    "fit.py",
    "notes.md",
    "pyproject.toml",
    "src/model.py",
    "uv.lock",
]
HELD_BACK = [".env", ".substrax.env", "id_rsa"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "project"
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for args in (["init", "-q"], ["add", *TRACKED], ["commit", "-q", "-m", "init"]):
        subprocess.run([*git, *args], cwd=root, check=True, capture_output=True, timeout=60)
    return root


def _cli(*args: str, cwd: Path, state: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env["SUBSTRAX_STATE_DIR"] = str(state)
    return subprocess.run(
        [sys.executable, "-m", "substrax.compute.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_modal_image_holds_exactly_the_upload_set(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modal = pytest.importorskip("modal", reason="the modal SDK (substrax-compute[modal]) is absent")
    built = []
    original = modal.mount._Mount._add_local_dir

    def recorder(*args: object, **kwargs: object) -> object:
        built.append(original(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(modal.mount._Mount, "_add_local_dir", staticmethod(recorder))
    config = read_compute_config(project)
    spec = resolve_job(config, "train", project=project)
    backend = ModalBackend({**config.backends["modal"], "state_dir": str(tmp_path / "modal")})
    plan = backend.plan(spec, project=project, run_id="train-faults")
    (mount,) = built
    selected = modal.mount._select_files(mount._entries)
    uploaded = sorted(str(remote.relative_to("/project")) for _local, remote in selected)
    assert uploaded == EXPECTED
    assert list(plan.upload.held_back) == HELD_BACK


def test_the_skypilot_workdir_syncs_exactly_the_upload_set(project: Path, tmp_path: Path) -> None:
    pytest.importorskip("sky", reason="SkyPilot (substrax-compute[skypilot]) is absent")
    from sky.data import storage_utils

    config = read_compute_config(project)
    spec = resolve_job(config, "train", project=project)
    backend = SkyPilotBackend(
        {**config.backends["skypilot"], "state_dir": str(tmp_path / "skypilot")}
    )
    task = backend.build_task(spec, project=project, run_id="train-faults")
    archive = tmp_path / "workdir.zip"
    storage_utils.zip_files_and_folders([str(task.workdir)], archive)
    with zipfile.ZipFile(archive) as opened:
        names = [name for name in opened.namelist() if not name.endswith("/")]
    prefix = str(task.workdir).lstrip("/") + "/"
    assert sorted(name.removeprefix(prefix) for name in names) == EXPECTED


@pytest.mark.parametrize("backend", ["modal", "skypilot"])
def test_dry_run_lists_the_upload_with_its_total_size(
    project: Path, tmp_path: Path, backend: str
) -> None:
    result = _cli("run", "train", "--backend", backend, "--dry-run", cwd=project, state=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    listed = [line.split()[-1] for line in result.stdout.splitlines() if line.endswith(
        tuple(EXPECTED + HELD_BACK + ["data/train.csv", "scratch.ipynb"])
    ) and not line.startswith("Held back")]  # fmt: skip
    assert listed == EXPECTED
    total = sum((project / name).stat().st_size for name in EXPECTED)
    assert f"Would upload {len(EXPECTED)} file(s)" in result.stdout
    assert f"({total} bytes) from {project}" in result.stdout
    assert f"Held back as secrets: {', '.join(HELD_BACK)}" in result.stdout
    assert not (tmp_path / "compute" / "runs").exists() or not any(
        (tmp_path / "compute" / "runs").iterdir()
    )


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Submitted" not in result.stdout
    return result.stderr


def test_malformed_pyproject_names_the_file_and_line(project: Path, tmp_path: Path) -> None:
    pyproject = project / "pyproject.toml"
    pyproject.write_text(PLAIN.replace('backend = "local"', "backend = local"))
    err = _one_line(_cli("run", "train", cwd=project, state=tmp_path))
    assert err.startswith(f"substrax-compute: error: {pyproject}:6:11: not valid TOML: "), err


def test_malformed_lock_names_the_file(project: Path, tmp_path: Path) -> None:
    (project / "pyproject.toml").write_text(PLAIN)
    (project / "uv.lock").write_text("[[package]\n")
    err = _one_line(_cli("run", "train", "--backend", "modal", cwd=project, state=tmp_path))
    assert err.startswith(f"substrax-compute: error: {project / 'uv.lock'}:1:"), err


def test_into_a_plain_file_is_refused_naming_it(project: Path, tmp_path: Path) -> None:
    (project / "pyproject.toml").write_text(PLAIN)
    target = tmp_path / "outputs.txt"
    target.write_text("keep me")
    err = _one_line(_cli("run", "train", "--into", str(target), cwd=project, state=tmp_path))
    assert err.startswith(f"substrax-compute: error: --into {target} is a file, not a directory"), (
        err
    )
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("command", [["run", "train"], ["list"], ["status"]])
def test_a_state_directory_that_is_a_file_is_refused(
    project: Path, tmp_path: Path, command: list[str]
) -> None:
    (project / "pyproject.toml").write_text(PLAIN)
    state = tmp_path / "state"
    state.write_text("a file")
    err = _one_line(_cli(*command, cwd=project, state=state))
    assert err.startswith(
        f"substrax-compute: error: the state directory ($SUBSTRAX_STATE_DIR) {state} is a file"
    ), err


def test_an_unknown_platform_is_refused_naming_it_and_the_valid_ones(
    project: Path, tmp_path: Path
) -> None:
    (project / "pyproject.toml").write_text(
        PLAIN.replace(
            "probe_devices = false", 'probe_devices = false\nruntime = { platforms = ["cdua"] }'
        )
    )
    err = _one_line(_cli("run", "train", cwd=project, state=tmp_path))
    assert err.startswith(
        "substrax-compute: error: tool.substrax.compute.jobs.train.runtime.platforms: "
        "JaxRuntime.platforms entry 'cdua' is not a platform jax knows "
        "(use one of: cpu, cuda, gpu, METAL, oneapi, proxy, rocm, tpu)"
    ), err
